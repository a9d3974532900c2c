"""tables: the agent's schemas and write APIs (services, frontends, backends, node
addresses, devices)."""
