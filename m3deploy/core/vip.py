"""One address for the cluster: keepalived's VRRP address (m3_vip) across the control hosts, in front of the edge.

Pure plan data, no I/O. With m3_edge and m3_vip = "ADDRESS/PREFIX" (an address of the control hosts' subnet that
no host has) the plan gives each control host one `m3-vip` service: Debian's keepalived, VRRP only (`--vrrp`),
with /etc/m3/keepalived.conf (m3deploy.deploy.vipfiles): every control host BACKUP with `nopreempt`, priorities
from the control group's order (the first highest), unicast advertisements to the other control hosts (no
multicast needed; `check_unicast_src`: only theirs are taken), and a track script that puts the instance in FAULT
(the address released) while the host's edge does not accept connections or has no frontend UP. The edge also
listens on the address (`transparent`: on every control host, held or not), and the plan's endpoint becomes
`https://<m3_vip>:<m3_edge_port>/v1`: verify, bench, the smoke checks and the deploy's last request use it.

No VRRP authentication: VRRPv2's `auth_type PASS` sends its 8 characters in clear in every advertisement (it
stops no one who can send to the segment), and keepalived's AH type is deprecated upstream; the peers are the
control hosts' addresses instead (docs/OPERATIONS.md "One address for the cluster").
"""
from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from typing import Any

from m3deploy.core.errors import plural
from m3deploy.core.model import Service
from m3deploy.core.provenance import launch_provenance, provenance

VIP_UNIT = "m3-vip"
VIP_CONF = "/etc/m3/keepalived.conf"
VIP_CHECK = "/etc/m3/vip-check"  # the track script: the edge accepts connections and has a frontend UP
VIP_RUN = "/run/m3-vip"
INSTANCE = "m3"  # the vrrp_instance's name
TOP_PRIORITY, STEP = 150, 10
SOURCE = "m3deploy/core/vip.py"  # the first control host's priority; each next one STEP lower


def enabled(s: Mapping[str, Any]) -> bool:
    return bool(s.get("m3_vip"))


def interface(s: Mapping[str, Any]) -> ipaddress.IPv4Interface:
    """m3_vip as address + its network (checked by problems())."""
    return ipaddress.IPv4Interface(str(s["m3_vip"]).strip())


def address(s: Mapping[str, Any]) -> str:
    """The cluster's address without its prefix, "" without m3_vip."""
    return str(interface(s).ip) if enabled(s) else ""


def router_id(s: Mapping[str, Any]) -> int:
    """m3_vip_router_id, else the address's last octet (0 -> 255): clusters sharing a segment differ by address."""
    if s.get("m3_vip_router_id"):
        return int(s["m3_vip_router_id"])
    return int(interface(s).ip.packed[-1]) or 255


def priority(index: int) -> int:
    return TOP_PRIORITY - STEP * index


def vip_service(host: str) -> Service:
    argv = ("/usr/sbin/keepalived", "--dont-fork", "--vrrp", "--log-console", "--no-syslog", "--use-file", VIP_CONF,
            "--pid", f"{VIP_RUN}/keepalived.pid", "--vrrp_pid", f"{VIP_RUN}/vrrp.pid")
    return Service(name=VIP_UNIT, kind="vip", host=host, argv=argv, after=(f"{host}/m3-edge",),
                   provenance=launch_provenance(argv[:1], "feature:m3_vip", SOURCE)
                   + provenance(argv, (), "feature:m3_vip", SOURCE))


def add_services(services: dict[str, list[Service]], control: list[str], s: Mapping[str, Any]) -> str:
    """Add keepalived to each control host's services (in place); return the address ("" without m3_vip)."""
    vip = address(s)
    for c in control if vip else ():
        services[c].append(vip_service(c))
    return vip


def problems(s: Mapping[str, Any], control: Mapping[str, str], hosts: Mapping[str, str]) -> list[str]:
    """m3_vip's rules (validate.edge_settings). `control`/`hosts`: {name: cluster address}."""
    raw = s.get("m3_vip")
    if not raw:
        return ["key m3_vip_router_id: only with m3_vip. Fix: remove it, or set m3_vip"] \
            if s.get("m3_vip_router_id") else []
    out = []
    if not (s.get("m3_edge") and s.get("m3_serving") == "dynamo"):
        out.append("key m3_vip: the address is the edge's (HAProxy on the control hosts). Fix: m3_edge = true with "
                   "m3_serving = 'dynamo', or remove m3_vip")
    if len(control) < 2:
        out.append(f"key m3_vip: {plural(len(control), 'control host')}: nothing to move the address to (one "
                   "host's own address is the endpoint already). Fix: 3 hosts in `control` (docs/OPERATIONS.md "
                   "\"HA control plane\"), or remove m3_vip")
    try:
        iface = ipaddress.IPv4Interface(str(raw).strip())
    except ValueError:
        return out + [f"key m3_vip: {raw!r} is not an IPv4 address with its prefix. Fix: m3_vip = "
                      "'10.0.0.200/24': a free address of the control hosts' subnet and that subnet's prefix length"]
    if "/" not in str(raw):
        out.append(f"key m3_vip: {raw!r} has no prefix length (keepalived adds the address with it). Fix: m3_vip = "
                   f"'{raw}/24' (the prefix of the control hosts' subnet)")
        return out
    net = iface.network
    if net.prefixlen < 31 and iface.ip in (net.network_address, net.broadcast_address):
        out.append(f"key m3_vip: {iface.ip} is the {'network' if iface.ip == net.network_address else 'broadcast'} "
                   f"address of {net}. Fix: a free host address of {net}")
    for name, a in hosts.items():
        if a == str(iface.ip):
            out.append(f"key m3_vip: {iface.ip} is host {name}'s own address (the address moves between hosts: no "
                       "host may have it). Fix: a free address of the subnet")
    for name, a in control.items():
        try:
            inside = ipaddress.ip_address(a) in net
        except ValueError:
            out.append(f"host {name}: address {a!r} is not an IP address; m3_vip needs the control hosts' addresses "
                       "(keepalived's unicast peers). Fix: m3_address = <its IP> on that host")
            continue
        if not inside:
            out.append(f"key m3_vip: {iface} is not in control host {name}'s subnet ({a} is outside {net}): VRRP "
                       "moves an address within one L2 segment. Fix: an address of the control hosts' subnet, or "
                       "the DNS alternative (docs/OPERATIONS.md)")
    return out
