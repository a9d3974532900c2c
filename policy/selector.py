"""Label selectors over security-identity labels, as Cilium evaluates them.

Identity labels are ``source:key=value`` strings (``k8s:app=web``, ``reserved:host``; see
tables/identities.py). A selector is a conjunction of requirements (Kubernetes'
``matchLabels`` and ``matchExpressions``: ``In``, ``NotIn``, ``Exists``,
``DoesNotExist``). A requirement's key carries a source: ``k8s:app`` matches only labels of
source ``k8s``; a key without a source (``app``) is Cilium's ``any:app`` and matches the
key from any source. Kubernetes label keys never contain ``:``, so the first ``:`` always
separates the source.

`Selector` is frozen and hashable: the selector cache keys on it, and two rules writing
the same selector share one cache entry.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from policy.errors import PolicyError

ANY_SOURCE = "any"
OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist")


def split_key(key: str) -> tuple[str, str]:
    """``(source, key)`` of a selector key; ``any`` when it has no source."""
    source, sep, rest = key.partition(":")
    if not sep:
        return ANY_SOURCE, key
    return source, rest


@dataclass(frozen=True, slots=True, order=True)
class Requirement:
    """One requirement: ``key`` (``source:key`` or ``any:key``), operator and values."""

    source: str
    key: str
    op: str
    values: tuple[str, ...] = ()

    def text(self) -> str:
        """Human-readable form (``k8s:app in (web)``)."""
        k = f"{self.source}:{self.key}"
        if self.op == "Exists":
            return k
        if self.op == "DoesNotExist":
            return f"!{k}"
        if self.op == "In" and len(self.values) == 1:
            return f"{k}={self.values[0]}"
        return f"{k} {self.op.lower()} ({','.join(self.values)})"


class LabelView:
    """An identity's labels grouped by key: key -> [(source, value)], for matching."""

    __slots__ = ("by_key",)

    def __init__(self, labels: Iterable[str]) -> None:
        by_key: dict[str, list[tuple[str, str]]] = {}
        for label in labels:
            source, _, rest = label.partition(":")
            key, _, value = rest.partition("=")
            by_key.setdefault(key, []).append((source, value))
        self.by_key = by_key

    def values(self, source: str, key: str) -> list[str]:
        """Values of ``key`` from ``source`` (any source for ``any``)."""
        pairs = self.by_key.get(key)
        if not pairs:
            return []
        if source == ANY_SOURCE:
            return [v for _, v in pairs]
        return [v for s, v in pairs if s == source]


def _match(req: Requirement, view: LabelView) -> bool:
    vals = view.values(req.source, req.key)
    if req.op == "In":
        return any(v in req.values for v in vals)
    if req.op == "NotIn":
        return not any(v in req.values for v in vals)
    if req.op == "Exists":
        return bool(vals)
    return not vals  # DoesNotExist


@dataclass(frozen=True, slots=True, order=True)
class Selector:
    """A conjunction of requirements; no requirement selects every identity."""

    requirements: tuple[Requirement, ...] = ()

    def matches(self, labels: LabelView | Iterable[str]) -> bool:
        """Whether an identity with ``labels`` is selected."""
        view = labels if isinstance(labels, LabelView) else LabelView(labels)
        return all(_match(r, view) for r in self.requirements)

    def index_pairs(self) -> list[tuple[str, str]]:
        """(key, value) pairs of which a selected identity must have one (the first ``In``
        requirement's), for the selector cache's index; empty when there is no such one."""
        for r in self.requirements:
            if r.op == "In":
                return [(r.key, v) for v in r.values]
        return []

    def with_requirements(self, *extra: Requirement) -> Selector:
        """This selector with more requirements (deduplicated, sorted)."""
        return Selector(tuple(sorted(set(self.requirements) | set(extra))))

    def text(self) -> str:
        """Human-readable form; ``{}`` for the selector of everything."""
        if not self.requirements:
            return "{}"
        return "{" + ", ".join(r.text() for r in self.requirements) + "}"


def label_requirement(key: str, value: str) -> Requirement:
    """The requirement ``key=value`` (``key`` may carry a source)."""
    source, k = split_key(key)
    return Requirement(source, k, "In", (value,))


def exists_requirement(key: str) -> Requirement:
    """The requirement that ``key`` exists (``key`` may carry a source)."""
    source, k = split_key(key)
    return Requirement(source, k, "Exists")


def parse_selector(
    doc: Any, obj: str, path: str, *, key_prefix: str = "", key_source: str | None = None
) -> Selector:
    """A Kubernetes ``LabelSelector`` (``matchLabels``, ``matchExpressions``) as a Selector.

    ``key_prefix`` is put in front of every key (``io.cilium.k8s.namespace.labels.`` for a
    namespace selector) and ``key_source`` replaces a key's missing source. PolicyError
    names ``obj`` and the field path when the document is malformed."""
    if doc is None:
        return Selector()
    if not isinstance(doc, Mapping):
        raise PolicyError("expected a label selector object", obj=obj, field=path)
    unknown = set(doc) - {"matchLabels", "matchExpressions"}
    if unknown:
        raise PolicyError(
            f"unknown field(s) {', '.join(sorted(map(str, unknown)))}", obj=obj, field=path
        )
    reqs: list[Requirement] = []

    def key_of(raw: Any, where: str) -> tuple[str, str]:
        if not isinstance(raw, str) or not raw or raw.startswith(":"):
            raise PolicyError(f"{raw!r} is not a label key", obj=obj, field=where)
        source, k = split_key(raw)
        if source == ANY_SOURCE and ":" not in raw and key_source is not None:
            source = key_source
        if not k:
            raise PolicyError(f"{raw!r} is not a label key", obj=obj, field=where)
        return source, key_prefix + k

    labels = doc.get("matchLabels") or {}
    if not isinstance(labels, Mapping):
        raise PolicyError("expected a mapping", obj=obj, field=f"{path}.matchLabels")
    for k, v in labels.items():
        where = f"{path}.matchLabels.{k}"
        if not isinstance(v, str):
            if isinstance(v, bool) or not isinstance(v, int):
                raise PolicyError("value must be a string", obj=obj, field=where)
            v = str(v)
        source, key = key_of(k, where)
        reqs.append(Requirement(source, key, "In", (v,)))
    exprs = doc.get("matchExpressions") or []
    if not isinstance(exprs, list):
        raise PolicyError("expected a list", obj=obj, field=f"{path}.matchExpressions")
    for i, e in enumerate(exprs):
        where = f"{path}.matchExpressions[{i}]"
        if not isinstance(e, Mapping):
            raise PolicyError("expected an object", obj=obj, field=where)
        source, key = key_of(e.get("key"), f"{where}.key")
        op = e.get("operator")
        if op not in OPERATORS:
            raise PolicyError(
                f"{op!r} is not one of {', '.join(OPERATORS)}", obj=obj, field=f"{where}.operator"
            )
        values = e.get("values") or []
        if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
            raise PolicyError("expected a list of strings", obj=obj, field=f"{where}.values")
        if op in ("In", "NotIn") and not values:
            raise PolicyError(f"{op} needs at least one value", obj=obj, field=f"{where}.values")
        if op in ("Exists", "DoesNotExist") and values:
            raise PolicyError(f"{op} takes no values", obj=obj, field=f"{where}.values")
        reqs.append(Requirement(source, key, op, tuple(sorted(set(values)))))
    return Selector(tuple(sorted(set(reqs))))
