"""Map stand-ins for the policy tests: every call passes through to the real map, after a
hook that can record the call or fail it."""

from __future__ import annotations

import errno
from collections.abc import Callable
from typing import Any

from bpf.errors import MapError


class HookedMap:
    """``m`` with `before_update` / `before_delete` called ahead of each write."""

    def __init__(self, m: Any) -> None:
        self.m = m

    def __getattr__(self, name: str) -> Any:
        return getattr(self.m, name)

    def before_update(self, key: Any, value: Any) -> None:
        """Called before each update; raise to fail it."""

    def before_delete(self, key: Any) -> None:
        """Called before each delete; raise to fail it."""

    def lookup(self, key: Any) -> Any:
        return self.m.lookup(key)

    def update(self, key: Any, value: Any, flags: int = 0) -> None:
        self.before_update(key, value)
        self.m.update(key, value, flags)

    def delete(self, key: Any) -> None:
        self.before_delete(key)
        self.m.delete(key)


class FailingWrites(HookedMap):
    """A map whose updates fail with ``err`` while ``failing`` (and ``when(key)``)."""

    def __init__(
        self, m: Any, *, failing: bool = True, err: int = errno.EBUSY,
        when: Callable[[Any], bool] = lambda key: True,
    ) -> None:
        super().__init__(m)
        self.failing = failing
        self.err = err
        self.when = when

    def before_update(self, key: Any, value: Any) -> None:
        if self.failing and self.when(key):
            raise MapError(self.m.name, "update", self.err)
