"""kvstore mode: identities, remote endpoints and nodes through etcd (docs/cluster.md).

config.py (the etcd config file), etcd_client.py (the v3 JSON gateway over httpx),
session.py (the agent's lease and the keys it owns), watcher.py (a prefix watched with
resume, relist on compaction and a grace period for deletes), layout.py (Cilium's key
layout under ``cilium/state/``) and the three users: identities.py, ipcache.py, nodes.py.
"""
