"""statewright: the agent runtime and command-line interface."""
