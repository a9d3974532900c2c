"""The agent's sources of LB state: the manifest directory and netlink.

Both come after the ``lb`` component and before ``maps`` in the component list: each
registers its initializer on the tables it fills while it starts, so the reconciler,
started later, prunes nothing before their initial state is in.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sources.node_address_selection import NodeAddressConfig
from statewright.agent.components.lb import LB
from statewright.agent.components.statedb import DATABASE
from statewright.agent.config import AgentConfig
from statewright.component import DEGRADED, DISABLED, OK, Component, Health, Hive, Provided

if TYPE_CHECKING:
    from sources.manifests import ManifestSource

log = logging.getLogger("statewright.agent.sources")


#: The manifest source, for the components that take more kinds from the manifests.
MANIFESTS: Provided[ManifestSource] = Provided("manifests")


@dataclass(frozen=True, slots=True)
class ManifestsConfig:
    """What the manifests component needs from the agent's configuration."""

    paths: tuple[str, ...] = ()
    interval: float = 1.0

    @classmethod
    def from_agent_config(cls, cfg: AgentConfig) -> ManifestsConfig:
        """The agent's ``manifests`` and ``manifests-interval``."""
        return cls(cfg.manifests, cfg.manifests_interval)


@dataclass(frozen=True, slots=True)
class NetlinkConfig:
    """What the netlink component needs from the agent's configuration."""

    enabled: bool = True
    node_addresses: NodeAddressConfig = field(default_factory=NodeAddressConfig)

    @classmethod
    def from_agent_config(cls, cfg: AgentConfig) -> NetlinkConfig:
        """The agent's ``netlink`` and ``node-addresses``."""
        return cls(cfg.netlink, cfg.node_addresses)


class ManifestsComponent(Component):
    """Kubernetes objects from the manifest directories (sources/manifests.py), polled."""

    name = "manifests"
    needs = (LB,)
    provides = (MANIFESTS,)

    def __init__(self, config: ManifestsConfig) -> None:
        self.config = config
        self.source: Any = None

    async def start(self, hive: Hive) -> None:
        """Register the ``manifests`` initializer and run the first poll before going on."""
        from sources.manifests import ManifestSource

        lb = hive.get(self, LB)
        source = ManifestSource(lb.writer, self.config.paths,
                                interval=self.config.interval)
        with lb.writer.write_txn() as txn:
            source.register_initializer(txn)
        self.source = source
        hive.provide(self, MANIFESTS, source)
        await hive.spawn(self, source.run)
        log.info("agent: manifest source on %s: %d file(s), %d error(s)",
                 ", ".join(self.config.paths), len(source.files), len(source.errors))

    def health(self) -> list[Health]:
        """Degraded with every configured path that does not exist and every rejected
        object's error; OK with the number of files, naming the empty ones."""
        src = self.source
        if src is None:
            return [Health(self.name, DEGRADED, "not started")]
        problems = [f"{p}: does not exist" for p in src.missing] + list(src.errors.values())
        if problems:
            return [Health(self.name, DEGRADED, "; ".join(problems))]
        empty = src.empty
        note = f"; empty (no objects): {', '.join(empty)}" if empty else ""
        return [Health(self.name, OK, f"{len(src.files)} file(s) from "
                       + ", ".join(self.config.paths) + note)]


class NetlinkComponent(Component):
    """Devices and node addresses from the kernel (sources/netlink.py, pyroute2)."""

    name = "netlink"
    needs = (DATABASE, LB)

    def __init__(self, config: NetlinkConfig) -> None:
        self.config = config
        self.source: Any = None
        self.error = ""

    async def start(self, hive: Hive) -> None:
        """Create the source (it registers its initializers) and start reading; a source
        that cannot be created leaves the agent running, Degraded."""
        if not self.config.enabled:
            return
        try:
            from sources.netlink import NetlinkSource

            self.source = NetlinkSource.create(
                hive.get(self, DATABASE), hive.get(self, LB).writer,
                self.config.node_addresses,
            )
        except (ImportError, OSError) as e:
            self.error = f"cannot create the netlink source: {e}"
            log.error("agent: %s", self.error)
            return
        await hive.spawn(self, self.source.run, wait_started=False)

    def health(self) -> list[Health]:
        """Disabled by configuration, Degraded until the first dump, else OK."""
        if not self.config.enabled:
            return [Health(self.name, DISABLED, "disabled by configuration")]
        if self.source is None:
            return [Health(self.name, DEGRADED, self.error or "not started")]
        ok, why = self.source.health()
        return [Health(self.name, OK if ok else DEGRADED, why)]
