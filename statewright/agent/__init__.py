"""The Statewright agent: configuration (config), the component runtime (runtime), the HTTP
API over a unix socket (api), its client (client) and the demo network namespace (demo_netns).

``statewright agent`` runs `runtime.Agent`; ``statewright status`` and friends talk to it
through `client.AgentClient`.
"""
