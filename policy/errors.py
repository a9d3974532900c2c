"""The policy package's errors."""

from __future__ import annotations

from statedb.errors import InputError, StatewrightError


class PolicyError(InputError):
    """A malformed policy object: ``obj`` names it (``CiliumNetworkPolicy default/web``),
    ``field`` the path inside it (``spec.egress[0].toPorts[0].ports[1].port``). The policy
    is refused whole; no other policy changes."""

    http_status = 400


class PolicyTraceError(InputError):
    """A malformed ``policy trace`` request (labels, port or protocol)."""

    http_status = 400


class PolicyComputeError(StatewrightError):
    """The policy computation met a state it cannot represent (a bug or a table mismatch)."""

    http_status = 500
