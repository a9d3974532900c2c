"""Tests of the statedb package: API semantics, error paths, watches, change iterators,
a hypothesis state machine against a dict model, a concurrency fuzz test and the show module."""
