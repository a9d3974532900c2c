"""statewright-cni: a CNI 1.0 plugin that connects a container to the node through the agent.

A container runtime runs it with the network configuration on stdin and ``CNI_COMMAND``,
``CNI_CONTAINERID``, ``CNI_NETNS``, ``CNI_IFNAME``, ``CNI_ARGS`` and ``CNI_PATH`` in the
environment; it prints a result (ADD), nothing (DEL, CHECK) or the version document
(VERSION) on stdout, or an error document (``code``, ``msg``, ``details``) with exit
status 1. Error codes are the specification's: 1 incompatible version, 2 unsupported
field, 3 unknown container, 4 invalid environment variables, 5 I/O failure, 6 failed to
decode content, 7 invalid network configuration, 11 try again later (agent not reachable).

ADD, as Cilium's plugin does it:

1. ``POST /ipam?owner=<container id>`` on the agent's unix socket: one address per
   family of the node's pod CIDRs and the gateway (the router address);
2. a veth pair in the current (node) network namespace: ``lxc<hash>`` stays, the peer is
   moved into ``CNI_NETNS`` and renamed ``CNI_IFNAME``; MTU on both;
3. inside the container: the address as /32 (/128); for IPv4 a permanent neighbour entry
   gateway (the router address) -> the host side's MAC, a link route to the gateway and
   the default route through it (the node need not own or answer ARP for the router
   address); for IPv6 the default route through the host side's link-local address;
4. on the node: a route to each pod address through the host-side veth;
5. ``PUT /endpoint/cni-attachment-id:<container id>:<ifname>``: the endpoint change
   request (interfaces, MACs, addressing, pod name/namespace from ``CNI_ARGS``,
   netns path, and the pod's labels from the configuration's ``args.cni.labels``).

A failure undoes what was done (veth deleted, addresses released). DEL deletes the
endpoint (which releases its addresses) and the veth, and succeeds when they are already
gone. While the agent is down DEL still succeeds: it deletes the veth (the node's routes to
the pod go with it) and the agent's next start removes the endpoint, whose interface is
gone, and releases its addresses. CHECK verifies that the endpoint, both interfaces and the
addresses are there.

Network configuration keys: ``cniVersion``, ``name``, ``type`` (required), ``mtu``
(default 1500), ``agent-socket`` (default ``$STATEWRIGHT_SOCKET`` or
``/run/statewright/agent.sock``), ``ipam`` (optional: ``{"type": "host-local", ...}``
delegates addressing to that IPAM plugin, found in ``CNI_PATH`` and run with the same
environment and configuration; the endpoint is then registered with
``datapath-configuration.external-ipam`` and DEL/CHECK are delegated too), ``args``
(the CNI conventions' runtime arguments; ``args.cni.labels``, a list of
``{"key": .., "value": ..}``, are the pod's labels: they go into the endpoint request as
``k8s:<key>=<value>``, and the agent adds the pod's namespace, and the Pod object's labels
when it reads an API server, to the identity labels; ``args.cni.ports``, the pod's
container ports as a Pod lists them, ``[{"name": .., "containerPort": .., "protocol":
..}]``, go into the request's ``named-ports``: what NetworkPolicies' named ports resolve
to when the agent has no Pod object).
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import os
import socket
import sys
import time
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TextIO

from statedb.errors import StatewrightError
from statewright.broken_pipe import EXIT_BROKEN_PIPE, discard_stdout
from statewright.rtnl import RT_SCOPE_LINK, Rtnl

CNI_VERSION = "1.0.0"
SUPPORTED_VERSIONS = ["0.3.0", "0.3.1", "0.4.0", "1.0.0"]
DEFAULT_SOCKET = "/run/statewright/agent.sock"
DEFAULT_MTU = 1500

ERR_INCOMPATIBLE_VERSION = 1
ERR_UNSUPPORTED_FIELD = 2
ERR_UNKNOWN_CONTAINER = 3
ERR_INVALID_ENV = 4
ERR_IO = 5
ERR_DECODE = 6
ERR_INVALID_CONFIG = 7
ERR_TRY_AGAIN = 11


class CNIError(StatewrightError):
    """A failure reported to the runtime as a CNI error document."""

    def __init__(self, code: int, msg: str, details: str = "") -> None:
        super().__init__(msg)
        self.code = code
        self.msg = msg
        self.details = details

    def document(self, version: str) -> dict[str, Any]:
        """The specification's error result."""
        doc: dict[str, Any] = {"cniVersion": version, "code": self.code, "msg": self.msg}
        if self.details:
            doc["details"] = self.details
        return doc


# ----- the agent's API -----------------------------------------------------------------------
def _http(socket_path: str, method: str, path: str, body: bytes | None, timeout: float
          ) -> tuple[int, bytes]:
    """One HTTP/1.1 request on a unix socket (``Connection: close``); (status, body).
    OSError when the socket does not answer, ValueError for a malformed answer. (Not
    http.client: its import, with the email package, costs more than the request.)"""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    chunks = []
    try:
        sock.connect(socket_path)
        head = f"{method} {path} HTTP/1.1\r\nHost: statewright-agent\r\nConnection: close\r\n"
        if body is not None:
            head += f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        sock.sendall(head.encode() + b"\r\n" + (body or b""))
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    finally:
        sock.close()
    head_raw, sep, payload = b"".join(chunks).partition(b"\r\n\r\n")
    lines = head_raw.split(b"\r\n")
    parts = lines[0].split()
    if not sep or len(parts) < 2 or not parts[0].startswith(b"HTTP/"):
        raise ValueError(f"not an HTTP answer: {head_raw[:80]!r}")
    headers = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(b":") for ln in lines[1:])}
    if headers.get(b"transfer-encoding", b"").lower() == b"chunked":
        payload = _dechunk(payload)
    elif b"content-length" in headers:
        payload = payload[: int(headers[b"content-length"])]
    return int(parts[1]), payload


def _dechunk(data: bytes) -> bytes:
    """The body of a chunked transfer encoding."""
    out: list[bytes] = []
    while True:
        size_line, _, data = data.partition(b"\r\n")
        size = int(size_line.split(b";")[0], 16)
        if size == 0:
            return b"".join(out)
        out.append(data[:size])
        data = data[size + 2 :]


class AgentAPI:
    """JSON requests to the agent's unix socket; errors become `CNIError`s (11 when the
    agent does not answer, 5 for an error answer, ``not_found`` lets 404 through)."""

    def __init__(self, socket_path: str, timeout: float = 30.0) -> None:
        self.socket_path = socket_path
        self.timeout = timeout

    def request(self, method: str, path: str, body: Any = None, not_found_ok: bool = False) -> Any:
        """The decoded answer, or None for an allowed 404."""
        data = None if body is None else json.dumps(body).encode()
        try:
            status, raw = _http(self.socket_path, method, path, data, self.timeout)
        except OSError as e:
            raise CNIError(
                ERR_TRY_AGAIN,
                f"statewright agent not reachable on {self.socket_path}",
                f"{method} {path}: {e}",
            ) from None
        except ValueError as e:
            raise CNIError(ERR_IO, f"agent: {method} {path}: {e}") from None
        if status == 404 and not_found_ok:
            return None
        try:
            doc = json.loads(raw or b"null")
        except ValueError:
            doc = {"error": raw.decode(errors="replace")}
        if status >= 300:
            msg = doc.get("error", doc) if isinstance(doc, dict) else doc
            raise CNIError(ERR_IO, f"agent: {method} {path}: {status}: {msg}")
        return doc


# ----- configuration and environment ----------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Invocation:
    """One call of the plugin: command, environment and network configuration."""

    command: str
    container_id: str
    netns: str
    ifname: str
    args: Mapping[str, str]
    config: Mapping[str, Any]
    env: Mapping[str, str] = field(default_factory=dict)

    @property
    def version(self) -> str:
        """The configuration's cniVersion (what results are written as)."""
        return str(self.config.get("cniVersion", CNI_VERSION))

    @property
    def socket(self) -> str:
        """The agent's socket."""
        return str(
            self.config.get("agent-socket")
            or os.environ.get("STATEWRIGHT_SOCKET")
            or DEFAULT_SOCKET
        )

    @property
    def mtu(self) -> int:
        """The interfaces' MTU."""
        return int(self.config.get("mtu", DEFAULT_MTU))

    @property
    def delegated_ipam(self) -> str | None:
        """The IPAM plugin type when the configuration delegates IPAM (``ipam.type``)."""
        ipam = self.config.get("ipam")
        return str(ipam["type"]) if isinstance(ipam, Mapping) else None

    @property
    def labels(self) -> list[str]:
        """The pod's labels from ``args.cni.labels`` (CNI conventions) as
        ``k8s:<key>=<value>``; CNIError 7 when that is not a list of string key/values."""
        args = self.config.get("args")
        cni = args.get("cni") if isinstance(args, Mapping) else None
        raw = cni.get("labels") if isinstance(cni, Mapping) else None
        if raw is None:
            return []
        bad = CNIError(
            ERR_INVALID_CONFIG,
            'network configuration: args.cni.labels must be a list of {"key": .., "value": ..}',
        )
        if not isinstance(raw, list):
            raise bad
        out = []
        for item in raw:
            if not isinstance(item, Mapping):
                raise bad
            key, value = item.get("key"), item.get("value", "")
            if not isinstance(key, str) or not key or not isinstance(value, str):
                raise bad
            out.append(f"k8s:{key}={value}")
        return out

    @property
    def named_ports(self) -> list[dict[str, Any]]:
        """The pod's named container ports from ``args.cni.ports`` as the endpoint
        request's ``named-ports`` (the agent validates names and numbers); CNIError 7 when
        that is not a list of objects."""
        args = self.config.get("args")
        cni = args.get("cni") if isinstance(args, Mapping) else None
        raw = cni.get("ports") if isinstance(cni, Mapping) else None
        if raw is None:
            return []
        if not isinstance(raw, list) or not all(isinstance(p, Mapping) for p in raw):
            raise CNIError(
                ERR_INVALID_CONFIG,
                'network configuration: args.cni.ports must be a list of {"name": .., '
                '"containerPort": .., "protocol": ..}',
            )
        return [
            {"name": p["name"], "port": p.get("containerPort", p.get("port")),
             "protocol": p.get("protocol") or "TCP"}
            for p in raw if p.get("name")
        ]

    @property
    def attachment(self) -> str:
        """The endpoint reference of this attachment."""
        return f"cni-attachment-id:{self.container_id}:{self.ifname}"


def parse_cni_args(text: str) -> dict[str, str]:
    """``CNI_ARGS`` (``K=V;K2=V2``); CNIError 4 when malformed."""
    out: dict[str, str] = {}
    for part in filter(None, text.split(";")):
        key, sep, value = part.partition("=")
        if not sep or not key:
            raise CNIError(ERR_INVALID_ENV, f"CNI_ARGS: {part!r} is not KEY=VALUE")
        out[key] = value
    return out


def parse_config(raw: str) -> dict[str, Any]:
    """The network configuration; CNIError 6 (not JSON) or 7 (invalid), 1 (version)."""
    try:
        conf = json.loads(raw or "{}")
    except ValueError as e:
        raise CNIError(ERR_DECODE, "network configuration is not JSON", str(e)) from None
    if not isinstance(conf, dict):
        raise CNIError(ERR_DECODE, "network configuration is not a JSON object")
    for key in ("cniVersion", "name", "type"):
        if not isinstance(conf.get(key), str) or not conf[key]:
            raise CNIError(ERR_INVALID_CONFIG, f"network configuration: {key!r} is required")
    if conf["cniVersion"] not in SUPPORTED_VERSIONS:
        raise CNIError(
            ERR_INCOMPATIBLE_VERSION,
            f"cniVersion {conf['cniVersion']} is not supported",
            f"supported: {', '.join(SUPPORTED_VERSIONS)}",
        )
    ipam = conf.get("ipam")
    if ipam is not None and (
        not isinstance(ipam, dict)
        or not isinstance(ipam.get("type"), str)
        or not ipam["type"]
        or "/" in ipam["type"]
    ):
        raise CNIError(ERR_INVALID_CONFIG, "network configuration: 'ipam' needs a plugin 'type'")
    mtu = conf.get("mtu", DEFAULT_MTU)
    if not isinstance(mtu, int) or isinstance(mtu, bool) or not 576 <= mtu <= 65535:
        raise CNIError(ERR_INVALID_CONFIG, f"network configuration: mtu {mtu!r} is invalid")
    return conf


def invocation(env: Mapping[str, str], stdin: str) -> Invocation:
    """Read the environment and the configuration; CNIError for what is missing or bad."""
    command = env.get("CNI_COMMAND", "")
    if command not in ("ADD", "DEL", "CHECK", "VERSION"):
        raise CNIError(ERR_INVALID_ENV, f"CNI_COMMAND {command!r}: want ADD, DEL, CHECK or VERSION")
    if command == "VERSION":
        return Invocation(command, "", "", "", {}, {})
    config = parse_config(stdin)
    need = ("CNI_CONTAINERID", "CNI_IFNAME") + (("CNI_NETNS",) if command != "DEL" else ())
    missing = [k for k in need if not env.get(k)]
    if missing:
        raise CNIError(ERR_INVALID_ENV, f"missing environment variable(s): {', '.join(missing)}")
    ifname = env["CNI_IFNAME"]
    if len(ifname) > 15 or any(c in ifname for c in "/: \t\n") or ifname in (".", ".."):
        raise CNIError(ERR_INVALID_ENV, f"CNI_IFNAME {ifname!r} is not an interface name")
    return Invocation(
        command,
        env["CNI_CONTAINERID"],
        env.get("CNI_NETNS", ""),
        env["CNI_IFNAME"],
        parse_cni_args(env.get("CNI_ARGS", "")),
        config,
        dict(env),
    )


def host_ifname(container_id: str, ifname: str) -> str:
    """The host-side veth name: ``lxc`` + 11 hex digits of a hash (15 characters max)."""
    return "lxc" + hashlib.sha256(f"{container_id}:{ifname}".encode()).hexdigest()[:11]


# ----- netlink ----------------------------------------------------------------------------------
def _no_dad(ifname: str) -> None:
    """No duplicate address detection on the host-side veth (a setting of this interface
    only): its link-local address is the pods' IPv6 gateway and must answer at once.
    Written here, before the interface comes up (DAD starts then, before the agent hears
    of the interface); the agent's ``sysctls`` table holds the same setting for the
    endpoint's interface (tables/sysctls.py) and shows it."""
    path = f"/proc/sys/net/ipv6/conf/{ifname}/accept_dad"
    if os.path.exists(path):
        with open(path, "w") as f:
            f.write("0")


def _host_link_local(nl: Rtnl, index: int) -> str | None:
    # The kernel adds the link-local address once both ends are up. It may still be
    # tentative (DAD): a route through it is valid already, traffic flows after DAD.
    for _ in range(500):
        for addr in nl.addresses(index, socket.AF_INET6):
            if addr.startswith("fe80:"):
                return addr
        time.sleep(0.01)
    return None


def create_veth(inv: Invocation, ips: list[tuple[str, str]]) -> dict[str, Any]:
    """Steps 2-4 of ADD; returns the names, indexes and MACs. ``ips``: (address, gateway)."""
    host = host_ifname(inv.container_id, inv.ifname)
    tmp = "tmp" + host[3:]
    if not os.path.exists(inv.netns):
        raise CNIError(ERR_UNKNOWN_CONTAINER, f"network namespace {inv.netns} does not exist")
    v6 = any(ipaddress.ip_address(a).version == 6 for a, _ in ips)
    with Rtnl() as nl:
        if nl.link(host) is not None:
            raise CNIError(ERR_IO, f"interface {host} already exists (container attached twice?)")
        nl.add_veth(host, tmp)
        try:
            host_link, peer = nl.link(host), nl.link(tmp)
            assert host_link is not None and peer is not None
            fd = os.open(inv.netns, os.O_RDONLY)
            try:
                nl.set_link(peer.index, netns_fd=fd)
            finally:
                os.close(fd)
            if v6:
                _no_dad(host)
            nl.set_link(host_link.index, mtu=inv.mtu, up=True)
            with Rtnl(inv.netns) as cnl:
                cpeer = cnl.link(tmp)
                assert cpeer is not None
                cidx = cpeer.index
                cnl.set_link(cidx, name=inv.ifname, mtu=inv.mtu)
                cnl.set_link(cidx, up=True)
                lo = cnl.link("lo")
                if lo is not None:
                    cnl.set_link(lo.index, up=True)
                for addr, gw in ips:
                    ip = ipaddress.ip_address(addr)
                    cnl.add_address(cidx, addr, 32 if ip.version == 4 else 128, nodad=True)
                    if ip.version == 4:
                        # the gateway (the router address) resolves to the host side's MAC
                        # for good: nothing on the node has to answer ARP for it
                        cnl.add_neighbour(cidx, gw, host_link.mac)
                        cnl.add_route(gw, 32, cidx, scope=RT_SCOPE_LINK)
                        cnl.add_route("0.0.0.0", 0, cidx, gateway=gw)
                host_ll = None
                if v6:
                    # both ends are up now: the host side gets its link-local address
                    host_ll = _host_link_local(nl, host_link.index)
                    if host_ll is None:
                        raise CNIError(ERR_IO, f"{host}: no IPv6 link-local address appeared")
                    cnl.add_route("::", 0, cidx, gateway=host_ll)
            for addr, _ in ips:
                ip = ipaddress.ip_address(addr)
                nl.add_route(addr, 32 if ip.version == 4 else 128, host_link.index)
        except BaseException:
            try:
                gone = nl.link(host)
                if gone is not None:
                    nl.delete_link(gone.index)
            except Exception:
                pass
            raise
    return {
        "host": host,
        "host_index": host_link.index,
        "host_mac": host_link.mac,
        "mac": cpeer.mac,
        # the gateway of the IPv6 default route: the host side's link-local address
        "ipv6_gateway": host_ll,
    }


def delete_veth(inv: Invocation) -> bool:
    """Delete the host-side veth (its peer goes with it); False when it is not there."""
    host = host_ifname(inv.container_id, inv.ifname)
    with Rtnl() as nl:
        link = nl.link(host)
        if link is None:
            return False
        nl.delete_link(link.index)
    return True


# ----- delegated IPAM ---------------------------------------------------------------------------
def delegate_ipam(inv: Invocation, command: str) -> Any:
    """Run the configured IPAM plugin (found in ``CNI_PATH``) for ``command`` with this
    invocation's environment and configuration, as the specification's delegation does;
    its result (ADD), or None. Its error document becomes our CNIError."""
    plugin = inv.delegated_ipam
    assert plugin is not None
    dirs = [d for d in inv.env.get("CNI_PATH", "").split(os.pathsep) if d]
    path = next(
        (os.path.join(d, plugin) for d in dirs if os.access(os.path.join(d, plugin), os.X_OK)),
        None,
    )
    if path is None:
        raise CNIError(
            ERR_INVALID_CONFIG,
            f"IPAM plugin {plugin!r} not found in CNI_PATH",
            inv.env.get("CNI_PATH", "(unset)"),
        )
    import subprocess  # only delegated IPAM runs a program

    env = {**inv.env, "CNI_COMMAND": command}
    proc = subprocess.run(
        [path],
        input=json.dumps(inv.config),
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    try:
        doc = json.loads(proc.stdout) if proc.stdout.strip() else None
    except ValueError:
        raise CNIError(
            ERR_DECODE, f"IPAM plugin {plugin}: output is not JSON", proc.stdout[:200]
        ) from None
    if proc.returncode != 0:
        err = doc if isinstance(doc, dict) else {}
        raise CNIError(
            int(err.get("code", ERR_IO)),
            f"IPAM plugin {plugin}: {err.get('msg', proc.stderr.strip() or 'failed')}",
            str(err.get("details", "")),
        )
    return doc


def _delegated_ips(result: Any) -> list[tuple[str, str]]:
    """(address, gateway) pairs of an IPAM plugin's result; the gateway defaults to the
    first address of the address's subnet (only the pod's neighbour entry uses it)."""
    out = []
    for entry in (result or {}).get("ips", []):
        iface = ipaddress.ip_interface(entry["address"])
        gw = entry.get("gateway") or str(iface.network.network_address + 1)
        out.append((str(iface.ip), gw))
    if not out:
        raise CNIError(ERR_IO, "IPAM plugin returned no address")
    return out


# ----- commands ---------------------------------------------------------------------------------
def cmd_add(inv: Invocation) -> dict[str, Any]:
    """ADD (module doc); returns the CNI result."""
    api = AgentAPI(inv.socket)
    labels = inv.labels  # a bad configuration fails before anything is allocated
    named_ports = inv.named_ports
    if inv.delegated_ipam:
        ips = _delegated_ips(delegate_ipam(inv, "ADD"))
    else:
        owner = urllib.parse.quote(inv.container_id, safe="")
        alloc = api.request("POST", f"/ipam?owner={owner}")
        ips = [
            (alloc[f"ipv{f}"]["ip"], alloc[f"ipv{f}"]["gateway"])
            for f in (4, 6)
            if f"ipv{f}" in alloc
        ]
    created: dict[str, Any] | None = None
    try:
        created = create_veth(inv, ips)
        body = {
            "container-id": inv.container_id,
            "interface-name": created["host"],
            "interface-index": created["host_index"],
            "container-interface-name": inv.ifname,
            "mac": created["mac"],
            "host-mac": created["host_mac"],
            "addressing": {f"ipv{ipaddress.ip_address(a).version}": a for a, _ in ips},
            "k8s-pod-name": inv.args.get("K8S_POD_NAME", ""),
            "k8s-namespace": inv.args.get("K8S_POD_NAMESPACE", ""),
            "labels": labels,
            "named-ports": named_ports,
            "netns-path": inv.netns,
            "datapath-configuration": {"external-ipam": bool(inv.delegated_ipam)},
        }
        ref = urllib.parse.quote(inv.attachment, safe=":")
        api.request("PUT", f"/endpoint/{ref}", body)
    except BaseException:
        if created is not None:
            delete_veth(inv)
        try:
            if inv.delegated_ipam:
                delegate_ipam(inv, "DEL")
            else:
                for a, _ in ips:
                    api.request("DELETE", f"/ipam/{a}", not_found_ok=True)
        except CNIError:
            pass  # the original failure is what the runtime needs to see
        raise
    result: dict[str, Any] = {
        "cniVersion": inv.version,
        "interfaces": [
            {"name": created["host"], "mac": created["host_mac"]},
            {"name": inv.ifname, "mac": created["mac"], "sandbox": inv.netns},
        ],
        "ips": [],
        "routes": [],
        "dns": {},
    }
    for a, gw in ips:
        ip = ipaddress.ip_address(a)
        if ip.version == 6 and created.get("ipv6_gateway"):
            gw = created["ipv6_gateway"]  # what the route really uses, not the router address
        entry: dict[str, Any] = {
            "address": f"{a}/{32 if ip.version == 4 else 128}",
            "gateway": gw,
            "interface": 1,
        }
        if inv.version != CNI_VERSION:  # 0.3.x and 0.4.0 results name the family
            entry["version"] = str(ip.version)
        result["ips"].append(entry)
        result["routes"].append({"dst": "0.0.0.0/0" if ip.version == 4 else "::/0"})
    return result


def cmd_del(inv: Invocation) -> None:
    """DEL: delete the endpoint (the agent releases its addresses) and the veth, and
    release any address still allocated to this container (an ADD that died between
    ``POST /ipam`` and ``PUT /endpoint``); what is already gone is fine."""
    api = AgentAPI(inv.socket)
    ref = urllib.parse.quote(inv.attachment, safe=":")
    try:
        api.request("DELETE", f"/endpoint/{ref}", not_found_ok=True)
    except CNIError as e:
        if e.code != ERR_TRY_AGAIN:
            raise
        # The agent is down, and the runtime does not retry a DEL for ever: remove what
        # the plugin created (the veth; the node's routes to the pod go with it). The
        # agent's next start removes the endpoint, whose interface is gone, and releases
        # its addresses (EndpointManager.restore).
        delete_veth(inv)
        if inv.delegated_ipam:
            delegate_ipam(inv, "DEL")
        print(f"statewright-cni: DEL {inv.attachment}: {e.msg}: removed the interface; the "
              "agent removes the endpoint when it starts", file=sys.stderr)
        return
    delete_veth(inv)
    if inv.delegated_ipam:
        delegate_ipam(inv, "DEL")
        return
    status = api.request("GET", "/ipam")
    for alloc in status.get("allocations", []):
        if alloc.get("owner") == inv.container_id:
            owner = urllib.parse.quote(inv.container_id, safe="")
            api.request("DELETE", f"/ipam/{alloc['ip']}?owner={owner}", not_found_ok=True)


def cmd_check(inv: Invocation) -> None:
    """CHECK: the endpoint exists, its host veth has the recorded ifindex, the container
    interface carries the endpoint's addresses, and the ``prevResult`` of the
    configuration (when given) names those addresses."""
    api = AgentAPI(inv.socket)
    ref = urllib.parse.quote(inv.attachment, safe=":")
    ep = api.request("GET", f"/endpoint/{ref}", not_found_ok=True)
    if ep is None:
        raise CNIError(ERR_UNKNOWN_CONTAINER, f"no endpoint for {inv.attachment}")
    host = host_ifname(inv.container_id, inv.ifname)
    with Rtnl() as nl:
        link = nl.link(host)
        if link is None or link.index != ep["interface-index"]:
            raise CNIError(ERR_IO, f"host interface {host} is missing or has another ifindex")
    if not os.path.exists(inv.netns):
        raise CNIError(ERR_UNKNOWN_CONTAINER, f"network namespace {inv.netns} does not exist")
    with Rtnl(inv.netns) as cnl:
        clink = cnl.link(inv.ifname)
        if clink is None:
            raise CNIError(ERR_IO, f"interface {inv.ifname} is missing in {inv.netns}")
        have = set(cnl.addresses(clink.index))
    want = {a for a in ep["addressing"].values() if a}
    prev = inv.config.get("prevResult")
    if isinstance(prev, Mapping):
        try:
            prev_ips = {str(ipaddress.ip_interface(i["address"]).ip) for i in prev.get("ips", [])}
        except (KeyError, TypeError, ValueError):
            raise CNIError(ERR_DECODE, "prevResult: malformed 'ips'") from None
        if prev_ips != want:
            raise CNIError(
                ERR_IO,
                f"prevResult addresses {sorted(prev_ips)} differ from the endpoint's "
                f"{sorted(want)}",
            )
    if not want <= have:
        raise CNIError(ERR_IO, f"{inv.ifname} lacks {', '.join(sorted(want - have))}")
    if inv.delegated_ipam:
        delegate_ipam(inv, "CHECK")


def run(env: Mapping[str, str], stdin: str, stdout: TextIO) -> int:
    """Run one invocation; returns the exit status (0 or 1)."""
    version = CNI_VERSION
    try:
        inv = invocation(env, stdin)
        version = inv.version if inv.config else CNI_VERSION
        if inv.command == "VERSION":
            json.dump({"cniVersion": CNI_VERSION, "supportedVersions": SUPPORTED_VERSIONS}, stdout)
        elif inv.command == "ADD":
            json.dump(cmd_add(inv), stdout)
        elif inv.command == "DEL":
            cmd_del(inv)
        else:
            cmd_check(inv)
        return 0
    except CNIError as e:
        json.dump(e.document(version), stdout)
        return 1
    except OSError as e:
        json.dump(CNIError(ERR_IO, str(e)).document(version), stdout)
        return 1
    except Exception as e:  # never a traceback on stdout: the runtime parses it
        json.dump(CNIError(ERR_IO, f"{type(e).__name__}: {e}").document(version), stdout)
        return 1


def main() -> None:
    """The ``statewright-cni`` console script. A runtime that stopped reading its output
    gets the SIGPIPE exit status, not a traceback on standard error."""
    try:
        code = run(os.environ, sys.stdin.read(), sys.stdout)
        sys.stdout.flush()
    except BrokenPipeError:
        discard_stdout()
        code = EXIT_BROKEN_PIPE
    sys.exit(code)


if __name__ == "__main__":
    main()
