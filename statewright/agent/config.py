"""The agent's configuration: a YAML file, then command-line overrides, then defaults.

Every key of the YAML file may be spelled with ``-`` or ``_``; unknown keys are
refused (a typo must not be silently ignored). Example::

    pin-dir: /sys/fs/bpf/statewright
    backend: auto            # auto | kernel | memory
    manifests: [examples/manifests]
    cgroup: ""               # "": <cgroup2 mount>/statewright, created by the agent
    allow-root-cgroup: false # attaching to the root cgroup affects every process
    datapath: true
    node-name: node-1                 # default: $NODE_NAME, else the host name
    node-labels: {topology.kubernetes.io/zone: zone-a}
    lb-flags: ["--bpf-lb-algorithm=maglev"]
    api-socket: /run/statewright/agent.sock
    metrics-port: 0          # 0: no metrics server; else bound to metrics-address
    netlink: true
    node-addresses: {devices: [eth0], nodeport-cidrs: [10.0.0.0/8]}
    demo-netns: ""           # e.g. statewright-demo: example backends live there
    pod-cidrs: [10.200.0.0/24, "fd00:200::/112"]   # endpoints' IPAM (statewright-cni);
                             # default: the Node's spec.podCIDRs with the Kubernetes
                             # source, else DEFAULT_POD_CIDRS
    state-dir: /run/statewright/state                # endpoint and IPAM state
    k8s-kubeconfig: ""       # Kubernetes source: a kubeconfig path, or
    k8s-api-server: ""       #   an API server URL, or
    k8s-in-cluster: false    #   the pod's service account (a DaemonSet)
    k8s-qps: 20              # API requests per second, and the burst above it
    k8s-burst: 40
    auto-direct-node-routes: false   # routes to the other nodes' pod CIDRs via their
                             # InternalIPs (native routing; docs/cluster.md)
    bpf-ct-global-max: 65536 # entries of each connection-tracking map (IPv4, IPv6)
    conntrack-gc-interval: 60  # seconds between two CT garbage collections
    endpoint-datapath: true  # tc programs on the pods' veths (ingress policy, CT)
    nodeport-datapath: true  # tc programs on the external devices: NodePort,
                             # LoadBalancer, externalIPs from outside (docs/datapath.md)
    tc-attach-mode: auto     # auto (tcx, clsact without it) | tcx | clsact
    bpf-nat-global-max: 65536  # entries of each north-south NAT map (IPv4, IPv6)
    identity-allocation-mode: crd    # crd | kvstore: where identities, remote endpoints
    kvstore: ""                      #   (and nodes) live; kvstore needs kvstore: etcd and
    kvstore-opt: {etcd.config: /var/lib/etcd-config/etcd.config}   # (docs/cluster.md)
    kvstore-lease-ttl: 15    # seconds: this agent's keys outlive it by this much
    cluster-name: default    # the <cluster> of ip/v1/<cluster>/ and nodes/v1/<cluster>/
    sysctl: true             # the kernel settings pods need (forwarding, rp_filter, ...),
                             # recorded and restored at --cleanup (tables/sysctls.py);
                             # default true unless $STATEWRIGHT_SYSCTL=off
    sysctl-netns: ""         # write them in this network namespace instead (tests)
    procfs: /proc            # where /proc/sys is (a container mounts the host's
                             # /proc/sys/net read-write, e.g. at /host/proc/sys/net)

Why a frozen dataclass: the runtime and the API report it as-is (``to_json``) and
nothing may change it behind the components' backs.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import yaml

from bpf.factory import BackendConfig, BackendKind
from bpf.probe import DEFAULT_PIN_DIR
from sources.node_address_selection import NodeAddressConfig
from statedb.errors import InputError
from tables.ipam import IPAMConfig, IPAMRequestError
from tables.lb_config import default_node_name

#: The example manifests, installed with the package (examples/manifests in the repository
#: links here), so any install, editable or not, finds them.
DEFAULT_MANIFESTS = str(Path(__file__).resolve().parent / "example_manifests")
DEFAULT_SOCKET = "/run/statewright/agent.sock"
DEFAULT_STATE_DIR = "/run/statewright/state"
DEFAULT_POD_CIDRS = ("10.200.0.0/24", "fd00:200::/112")
#: Environment variable naming the API socket for the client commands.
SOCKET_ENV = "STATEWRIGHT_SOCKET"
#: The cgroup the agent creates under the cgroup2 mount when none is configured.
DEFAULT_CGROUP_NAME = "statewright"
#: The demo network namespace of ``statewright agent --demo``.
DEMO_NETNS = "statewright-demo"
BACKENDS = ("auto", "kernel", "memory")


#: Environment variable giving the default of ``sysctl`` (off, false, no or 0: false).
SYSCTL_ENV = "STATEWRIGHT_SYSCTL"


def sysctl_default(env: Mapping[str, str]) -> bool:
    """The default of ``sysctl``: true unless ``$STATEWRIGHT_SYSCTL`` says off."""
    return env.get(SYSCTL_ENV, "").strip().lower() not in ("off", "false", "no", "0")


class ConfigError(InputError):
    """The configuration is invalid; the message names the file (or override) and field."""


@dataclass(frozen=True, slots=True)
class AgentConfig:
    """Everything the agent needs to start (see the module docstring for the YAML form)."""

    pin_dir: str = DEFAULT_PIN_DIR
    backend: str = "auto"
    manifests: tuple[str, ...] = (DEFAULT_MANIFESTS,)
    manifests_interval: float = 1.0
    cgroup: str = ""
    allow_root_cgroup: bool = False
    datapath: bool = True
    #: This node's name: ``$NODE_NAME`` (a DaemonSet sets it), else the host name.
    node_name: str = field(default_factory=default_node_name)
    #: This node's labels (topology zone, node exposure), as a Node object would carry them.
    node_labels: Mapping[str, str] = field(default_factory=dict)
    lb_flags: tuple[str, ...] = ()
    api_socket: str = DEFAULT_SOCKET
    api_socket_mode: int = 0o660
    metrics_port: int = 0
    metrics_address: str = "127.0.0.1"
    netlink: bool = True
    node_addresses: NodeAddressConfig = field(default_factory=NodeAddressConfig)
    demo_netns: str = ""
    log_format: str = "text"
    #: The Kubernetes source (statewright/agent/components/kubernetes.py) runs when one of
    #: these three is set; manifests stay the default, and both may run together.
    #: This node's pod CIDRs (IPv4 and/or IPv6) for the endpoints' IPAM. Empty (not
    #: configured): the Node's spec.podCIDRs when the Kubernetes source runs, else
    #: DEFAULT_POD_CIDRS (`pod_cidrs_from_node`, `effective_pod_cidrs`).
    pod_cidrs: tuple[str, ...] = ()
    #: Where endpoint and IPAM state is kept for restarts (a tmpfs: a reboot forgets it,
    #: as it forgets the pods).
    state_dir: str = DEFAULT_STATE_DIR
    k8s_kubeconfig: str = ""
    k8s_api_server: str = ""
    k8s_in_cluster: bool = False
    k8s_qps: float = 20.0
    k8s_burst: int = 40
    #: Routes to every other node's pod CIDRs via its InternalIP, in the node's main
    #: routing table (Cilium's auto-direct-node-routes; off by default as in Cilium).
    auto_direct_node_routes: bool = False
    #: Capacity of each connection-tracking LRU map (ct4_global, ct6_global).
    bpf_ct_global_max: int = 65536
    #: Seconds between two runs of the CT garbage collection.
    conntrack_gc_interval: float = 60.0
    #: The per-endpoint tc programs (ingress policy, connection tracking; docs/datapath.md),
    #: attached with ``datapath`` on kernel maps.
    endpoint_datapath: bool = True
    #: The north-south tc programs on the external devices (NodePort, LoadBalancer and
    #: externalIPs for clients outside the node; docs/datapath.md), with ``datapath`` on
    #: kernel maps.
    nodeport_datapath: bool = True
    #: How the tc programs attach: ``auto`` (tcx links, clsact filters on kernels without
    #: tcx), ``tcx`` or ``clsact``.
    tc_attach_mode: str = "auto"
    #: Capacity of each north-south NAT LRU map (nodeport_nat4, nodeport_nat6).
    bpf_nat_global_max: int = 65536
    #: Where the cluster's identities, remote endpoints and nodes live: ``crd`` (the API
    #: server's objects) or ``kvstore`` (etcd; docs/cluster.md). Cilium's flag names.
    identity_allocation_mode: str = "crd"
    kvstore: str = ""
    kvstore_opt: Mapping[str, str] = field(default_factory=dict)
    kvstore_lease_ttl: int = 15
    cluster_name: str = "default"
    #: The agent sets the kernel settings its datapath needs (forwarding, rp_filter, the
    #: pods' interfaces; statewright/agent/components/sysctl.py). False: none. Default:
    #: true, unless $STATEWRIGHT_SYSCTL is off (the test suite sets it: no test agent in
    #: the machine's own namespace changes its settings).
    sysctl: bool = field(default_factory=lambda: sysctl_default(os.environ))
    #: Write the (per network namespace) ``net.*`` settings in this namespace, a name
    #: under /var/run/netns or a path, instead of the agent's own ("").
    sysctl_netns: str = ""
    #: The proc filesystem whose ``sys/`` the settings are written under (Cilium's
    #: ``--procfs``): a container's own /proc/sys is read-only, the host's mounted
    #: elsewhere is not (deploy/daemonset.yaml).
    procfs: str = "/proc"

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ConfigError(f"backend: {self.backend!r} is not one of {', '.join(BACKENDS)}")
        for name in ("manifests_interval", "k8s_qps"):
            if not math.isfinite(getattr(self, name)):
                raise ConfigError(f"{name.replace('_', '-')}: must be a finite number, "
                                  f"got {getattr(self, name)}")
        if not 0 <= self.api_socket_mode <= 0o777:
            raise ConfigError(f"api-socket-mode: {self.api_socket_mode:#o} is not a file mode "
                              "(0 to 0o777)")
        if not self.state_dir:
            raise ConfigError("state-dir: must not be empty")
        if not self.node_name:
            raise ConfigError("node-name: must not be empty (default: $NODE_NAME, else the "
                              "host name)")
        if not 0 <= self.metrics_port < 65536:
            raise ConfigError(f"metrics-port: {self.metrics_port} is not a TCP port (0 = off)")
        if self.manifests_interval <= 0:
            raise ConfigError(f"manifests-interval: must be > 0, got {self.manifests_interval}")
        if self.log_format not in ("text", "json"):
            raise ConfigError(f"log-format: {self.log_format!r} is not text or json")
        if not self.api_socket:
            raise ConfigError("api-socket: must not be empty")
        if not self.pin_dir:
            raise ConfigError("pin-dir: must not be empty")
        if not os.path.isabs(self.procfs):
            raise ConfigError(f"procfs: {self.procfs!r} is not an absolute path")
        if self.k8s_qps <= 0:
            raise ConfigError(f"k8s-qps: must be > 0, got {self.k8s_qps}")
        if self.k8s_burst < 1:
            raise ConfigError(f"k8s-burst: must be >= 1, got {self.k8s_burst}")
        if self.k8s_api_server and not self.k8s_api_server.startswith(("https://", "http://")):
            raise ConfigError(f"k8s-api-server: {self.k8s_api_server!r} is not an http(s) URL")
        if self.k8s_in_cluster and (self.k8s_api_server or self.k8s_kubeconfig):
            # in-cluster takes the server from KUBERNETES_SERVICE_HOST; with another source
            # one of them would be ignored without a word
            raise ConfigError(
                "k8s-in-cluster: cannot be combined with k8s-api-server or k8s-kubeconfig "
                "(choose where the API server is)"
            )
        if not 1 <= self.bpf_ct_global_max <= 1 << 24:
            raise ConfigError(f"bpf-ct-global-max: must be 1 to {1 << 24}, "
                              f"got {self.bpf_ct_global_max}")
        if not 1 <= self.bpf_nat_global_max <= 1 << 24:
            raise ConfigError(f"bpf-nat-global-max: must be 1 to {1 << 24}, "
                              f"got {self.bpf_nat_global_max}")
        if self.tc_attach_mode not in ("auto", "tcx", "clsact"):
            raise ConfigError(f"tc-attach-mode: must be auto, tcx or clsact, "
                              f"got {self.tc_attach_mode!r}")
        if not (math.isfinite(self.conntrack_gc_interval) and self.conntrack_gc_interval > 0):
            raise ConfigError(f"conntrack-gc-interval: must be a number of seconds > 0, "
                              f"got {self.conntrack_gc_interval}")
        self._check_kvstore()
        if self.pod_cidrs:
            try:
                IPAMConfig.parse(self.pod_cidrs)
            except IPAMRequestError as e:
                raise ConfigError(f"pod-cidrs: {e}") from None

    def _check_kvstore(self) -> None:
        if self.identity_allocation_mode not in ("crd", "kvstore"):
            raise ConfigError(f"identity-allocation-mode: {self.identity_allocation_mode!r} "
                              "is not crd or kvstore")
        if self.kvstore not in ("", "etcd"):
            raise ConfigError(f"kvstore: {self.kvstore!r} is not etcd (the one kvstore)")
        if not 1 <= self.kvstore_lease_ttl <= 3600:
            raise ConfigError(f"kvstore-lease-ttl: must be 1 to 3600 seconds, "
                              f"got {self.kvstore_lease_ttl}")
        if not self.cluster_name or "/" in self.cluster_name:
            raise ConfigError(f"cluster-name: {self.cluster_name!r} must be a name without /")
        if self.identity_allocation_mode != "kvstore":
            return
        if self.kvstore != "etcd":
            raise ConfigError("identity-allocation-mode kvstore needs kvstore: etcd")
        from sources.kvstore.config import KVStoreConfigError, parse_kvstore_opts

        try:
            parse_kvstore_opts(self.kvstore_opt)
        except KVStoreConfigError as e:
            raise ConfigError(f"kvstore-opt: {e}") from None

    @property
    def k8s_enabled(self) -> bool:
        """True when the Kubernetes source runs (an API server is configured)."""
        return bool(self.k8s_kubeconfig or self.k8s_api_server or self.k8s_in_cluster)

    @property
    def pod_cidrs_from_node(self) -> bool:
        """True when IPAM takes the Node's spec.podCIDRs: none configured, and the
        Kubernetes source runs."""
        return not self.pod_cidrs and self.k8s_enabled

    @property
    def effective_pod_cidrs(self) -> tuple[str, ...]:
        """The configured pod CIDRs, else DEFAULT_POD_CIDRS (empty when they come from the
        Node)."""
        if self.pod_cidrs:
            return self.pod_cidrs
        return () if self.pod_cidrs_from_node else DEFAULT_POD_CIDRS

    def map_backend(self) -> BackendConfig:
        """Where the components open their BPF maps: the backend (checked against
        `BACKENDS` when the configuration is made) and the pin directory."""
        return BackendConfig(backend=cast(BackendKind, self.backend), pin_dir=self.pin_dir)

    def to_json(self) -> dict[str, Any]:
        """The configuration as plain data (for the API and logs)."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, NodeAddressConfig):
                value = {
                    "devices": list(value.devices),
                    "exclude-prefixes": list(value.exclude_prefixes),
                    "address-cidrs": [str(c) for c in value.address_cidrs],
                    "nodeport-cidrs": [str(c) for c in value.nodeport_cidrs],
                }
            elif isinstance(value, tuple):
                value = list(value)
            elif isinstance(value, Mapping):
                value = dict(value)
            out[f.name.replace("_", "-")] = value
        out["api-socket-mode"] = oct(self.api_socket_mode)
        return out


_FIELDS = {f.name: f for f in dataclasses.fields(AgentConfig)}
_TUPLES = {"manifests", "lb_flags", "pod_cidrs"}
_BOOLS = {"allow_root_cgroup", "datapath", "netlink", "k8s_in_cluster",
          "auto_direct_node_routes", "endpoint_datapath", "sysctl",
          "nodeport_datapath"}
_INTS = {"metrics_port", "api_socket_mode", "k8s_burst", "bpf_ct_global_max",
         "kvstore_lease_ttl", "bpf_nat_global_max"}
_FLOATS = {"manifests_interval", "k8s_qps", "conntrack_gc_interval"}


def _convert(name: str, raw: Any, origin: str) -> Any:
    """One field's value from YAML (or an override) with its type checked."""
    where = f"{origin}: field {name.replace('_', '-')}"
    if name == "node_addresses":
        if raw is None:
            return NodeAddressConfig()
        try:
            return NodeAddressConfig.from_dict(raw, where)
        except ValueError as e:
            raise ConfigError(str(e)) from None
    if name in ("node_labels", "kvstore_opt"):
        return _labels(raw, where)
    if name in _TUPLES:
        if isinstance(raw, str):
            return tuple(x for x in (s.strip() for s in raw.split(",")) if x)
        if isinstance(raw, list | tuple) and all(isinstance(x, str) for x in raw):
            return tuple(raw)
        raise ConfigError(f"{where}: expected a list of strings, got {raw!r}")
    if name in _BOOLS:
        if isinstance(raw, bool):
            return raw
        raise ConfigError(f"{where}: expected true or false, got {raw!r}")
    if name in _INTS:
        if name == "api_socket_mode" and isinstance(raw, str):
            try:
                return int(raw, 8)
            except ValueError:
                raise ConfigError(f"{where}: expected an octal mode, got {raw!r}") from None
        if isinstance(raw, int) and not isinstance(raw, bool):
            return raw
        raise ConfigError(f"{where}: expected an integer, got {raw!r}")
    if name in _FLOATS:
        if isinstance(raw, int | float) and not isinstance(raw, bool):
            return float(raw)
        raise ConfigError(f"{where}: expected a number, got {raw!r}")
    if raw is None:
        raw = ""
    if not isinstance(raw, str):
        raise ConfigError(f"{where}: expected a string, got {raw!r}")
    return raw


def _labels(raw: Any, where: str) -> dict[str, str]:
    """Node labels from a YAML mapping, or ``key=value`` strings (command line)."""
    if raw is None:
        return {}
    if isinstance(raw, str):
        raw = [x for x in (p.strip() for p in raw.split(",")) if x]
    if isinstance(raw, list | tuple):
        out: dict[str, str] = {}
        for item in raw:
            key, sep, value = str(item).partition("=")
            if not sep or not key:
                raise ConfigError(f"{where}: expected key=value, got {item!r}")
            out[key] = value
        return out
    if isinstance(raw, Mapping) and all(isinstance(k, str) for k in raw):
        return {k: "" if v is None else str(v) for k, v in raw.items()}
    raise ConfigError(f"{where}: expected a mapping of label to value, got {raw!r}")


def from_mapping(data: Mapping[str, Any], origin: str = "config") -> dict[str, Any]:
    """Field values (converted and checked) from a YAML mapping; unknown keys are refused."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"{origin}: expected a mapping at the top, got {type(data).__name__}")
    out: dict[str, Any] = {}
    for key, raw in data.items():
        name = str(key).replace("-", "_")
        if name not in _FIELDS:
            known = ", ".join(sorted(n.replace("_", "-") for n in _FIELDS))
            raise ConfigError(f"{origin}: unknown field {key!r} (known: {known})")
        out[name] = _convert(name, raw, origin)
    return out


def load(path: str | None = None, overrides: Mapping[str, Any] | None = None) -> AgentConfig:
    """The configuration: defaults, then the YAML file at ``path``, then ``overrides``
    (field name -> value, None meaning "not given"). Relative manifest paths in the file
    are taken relative to the file's directory."""
    values: dict[str, Any] = {}
    if path:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as e:
            raise ConfigError(f"{path}: cannot read: {e.strerror or e}") from None
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as e:
            raise ConfigError(f"{path}: cannot parse: {e}") from None
        values = from_mapping(data or {}, path)
        if "manifests" in values:
            base = Path(path).resolve().parent
            values["manifests"] = tuple(str(base / p) for p in values["manifests"])
    for name, raw in (overrides or {}).items():
        if raw is None:
            continue
        if name not in _FIELDS:
            raise ConfigError(f"override {name!r}: no such field")
        values[name] = _convert(name, raw, "command line")
    try:
        return AgentConfig(**values)
    except ConfigError as e:
        raise ConfigError(f"{path or 'configuration'}: {e}") from None


def default_socket() -> str:
    """The API socket the client commands use: $STATEWRIGHT_SOCKET or the default path."""
    return os.environ.get(SOCKET_ENV) or DEFAULT_SOCKET
