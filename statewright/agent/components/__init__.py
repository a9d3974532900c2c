"""The agent's components, one module each; statewright/agent/runtime.py lists them in order.

Shared names (`statewright.component.Hive.provide` / ``get``):

``db``       the statedb `DB` (statedb.py)
``lb``       the `statewright.loadbalancer.LoadBalancer`: LB tables, writer, converter (lb.py)
``lb-maps``  the same load balancer once its maps are open and its reconciler runs (lb.py)
"""
