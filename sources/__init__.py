"""sources: what fills the tables (manifests, Kubernetes, netlink)."""
