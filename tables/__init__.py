"""tables: the agent's statedb schemas and their write APIs, one module per concept.

* Load balancing: ``services``, ``frontends``, ``backends`` (rows, indexes, tables),
  ``l3n4`` (the address type), ``lb_config`` (every LB option) and ``lb_writer``
  (``LBWriter``, the one write API that keeps the three tables consistent).
* The node: ``devices``, ``node_addresses``.
* Endpoints: ``endpoints`` (the local workloads), ``endpoint_entries`` (the desired lxc
  and ipcache map entries), ``endpoint_manager`` (create, change, delete, restore),
  ``identities`` and ``cluster_identities`` (security identities), ``ipam`` (pod
  addresses), ``state_dir`` (the state files they persist).
* Policy: ``policy_entries`` (the computed policy of every endpoint), ``policy_netns``
  (which endpoint a network namespace belongs to).
"""
