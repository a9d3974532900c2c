"""Observability: where map entries come from (`provenance`), what the agent would change
(`plan`) and what the datapath reports (events, the monitor)."""
