"""Network policy, the control-plane half: selectors over identity labels, the selector cache,
NetworkPolicy and CiliumNetworkPolicy parsing, the policy repository and the computation of
every local endpoint's policy into the ``policy-entries`` table (docs/policy.md)."""
