"""Ops: the reconcilers' targets, turning table rows into Cilium-compatible BPF map entries.

Load balancing (the frontends reconciler):

* ``bpfops.lb_maps``: ``LBMaps`` - the LB map set (v4+v6 services, backends, rev-NAT,
  affinity, source ranges, maglev) opened through ``bpf.factory`` (``LBMaps.open(
  LBMapsConfig(backend=, pin_dir=, pin=, max_entries=, sizes=, maglev_table_size=),
  wrap=)``; ``sizes`` an ``bpf.catalog.LBMapSizes`` per map group) or
  ``LBMaps.in_memory()``; ``unwrapped()``, ``snapshot()``/``restore(any_proto=)``,
  ``set_maglev``/``maglev_tables``, ``is_empty()``.
* ``bpfops.frontend_ops``: ``FrontendOps(maps, LBOpsConfig, node=NodeView, to_spec=)`` with
  ``update/delete/prune`` and ``update_batch/delete_batch`` (reconciler Operations),
  ``reset_and_restore()``, ``service_id(addr)``, ``backend_id(addr)``,
  ``state_is_empty()``, ``state_summary()``, ``dump_lines()``; errors are ``LBOpsError``
  (``bpfops.errors``) naming the frontend. Its parts: ``bpfops.frontend_plan`` (what
  entries a frontend needs), ``bpfops.frontend_writer`` (``FrontendWriter``: one
  frontend's writes and the record of the maps), ``bpfops.frontend_round``
  (``RoundWriter``: a round map by map), ``bpfops.frontend_state`` (per-frontend
  records), ``bpfops.wildcards``, ``bpfops.frontend_restore`` (restore, prune),
  ``bpfops.node_view`` (``NodeView``, ``StaticNodeView``).
* ``bpfops.adapter``: the tables glue - ``frontend_ops_for(writer, maps, lb_config)``,
  ``reconciler_config(writer, ops, lb_config, **overrides)``, ``frontend_spec``,
  ``ops_config``, ``TablesNodeView``.
* ``bpfops.maps_dump``: ``dump_lines(maps)``, ``dump_text(maps)``, ``maps_empty(maps)`` - the
  corpus ``lb/maps-dump`` format.
* ``bpfops.model``: ``Addr``, ``FrontendSpec``, ``ServiceSpec``, ``BackendSpec``,
  ``LBOpsConfig``; ``bpfops.flags``: service flag bits and names; ``bpfops.ids``:
  ``IDAllocator`` (next-fit, wrap-around, restore reservations); ``bpfops.maglev``:
  ``Maglev`` (Cilium's table computation, MurmurHash3); ``bpfops.backend_states``: the
  backends' states as the maps need them.

Endpoints and policy:

* ``bpfops.keyed_map_ops``: ``KeyedMapOps``, one map entry per row (update only what
  differs, delete, prune); ``bpfops.endpoint_ops`` (``EndpointMapOps``, the endpoints map) and
  ``bpfops.ipcache_ops`` (``IPCacheOps``, the ipcache) build on it.
* ``bpfops.policy_ops``: ``PolicyOps`` (the per-endpoint policy maps) and
  ``PolicyNetnsOps`` (the ``policy_netns`` map).
"""
