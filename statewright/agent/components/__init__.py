"""The agent's components, one module each; statewright/agent/runtime.py lists them in order.

Shared names (`statewright.component.Hive.provide` / ``get``):

``db``       the statedb `DB` (statedb.py)
``lb``       the `statewright.loadbalancer.LoadBalancer`: LB tables, writer, converter (lb.py)
``lb-maps``  the same load balancer once its maps are open and its reconciler runs (lb.py)
``k8s``      the Kubernetes source, when configured (kubernetes.py)
``endpoints`` the `tables.endpoint_manager.EndpointManager` (endpoints.py)
``policy``   the policy writer (policy.py)
``policy-maps`` the policy maps component itself (policy_maps.py)

Helpers: ``endpoint_schemas`` (the endpoint API's JSON Schemas), ``map_reconciler`` (the
reconciler of a table with a ``status`` field written into a map).
"""
