"""Every port of a built plan distinct on its host, and none on the host's sshd (issue 35): each refusal names the
key behind each port (`Port.key`, set by the builder that made it: m3_edge_port, m3_prometheus_port,
m3_node_exporter_port, m3_planner.port, m3_disagg.bootstrap_port, ...), the host, the file the user set it in, and
the key to change. Pure, no I/O (m3deploy.core.validate.check_plan calls it).

A port on two services of one host fails the second one's bind long after drivers and weights are in place; a
port on the host's ssh_port (sshd's) is refused too: whichever starts second cannot bind it (if the service wins,
as after a reboot, the host has no sshd for the deploy to reach).
"""
from __future__ import annotations

from collections import defaultdict

from m3deploy.core.connection import hosts_phrase

ANY = ("", "0.0.0.0", "::")
FIXED = "a fixed port of etcd, NATS or an engine"


def data_key(key: str) -> str:
    """The data key a port's key is set in (`m3_disagg.bootstrap_port` is set in m3_disagg)."""
    return key.split(".", 1)[0]


def _what(svc: str, p) -> str:
    span = f", ports {p.port}-{p.port + p.span - 1}" if p.span > 1 else ""
    return f"{svc} ({p.name}{span}, {p.key or FIXED})"


def _fix(keys: list[str], h) -> str:
    """Change a key the user set (else the first with a key): 'Fix: ...'."""
    data = getattr(h, "data", {}) or {}
    chosen = [k for k in keys if data.get(data_key(k)) is not None] or keys[:1]
    return (f"Fix: set {' or '.join(chosen)} to a port no other service of the host uses" if chosen
            else "Fix: change the service's port")


def _where(hp_name: str, h, keys: list[str]) -> str:
    src = (getattr(h, "sources", {}) or {}) if h is not None else {}
    files = sorted({src[data_key(k)] for k in keys if src.get(data_key(k))})
    return hosts_phrase([hp_name]) + (f" ({', '.join(files)})" if files else "")


def problems(plan, hosts) -> list[str]:
    """Ports used twice on a host (on one address, or one of them on every address), and ports on its ssh_port."""
    data = {h.name: h for h in hosts}
    out = []
    for hp in plan.hosts:
        h = data.get(hp.name)
        bound = defaultdict(list)
        for svc in hp.services:
            for p in svc.ports:
                for port in range(p.port, p.port + p.span):  # a range: each of its ports
                    bound[port].append((svc.name, p))
        ssh_port = int(((getattr(h, "data", {}) or {}).get("ssh_port")) or 22)
        clashes: dict[tuple, list[int]] = defaultdict(list)
        for port, users in bound.items():
            keys = list(dict.fromkeys(p.key for _, p in users if p.key))
            if port == ssh_port:
                svc, p = users[0]
                out.append(f"{_where(hp.name, h, keys + ['ssh_port'])}: "
                           + (f"key {p.key}: " if p.key else "")
                           + f"port {port} of {_what(svc, p)} is the host's ssh_port (sshd listens there). "
                           + (f"Fix: set {p.key} to another port, or move sshd (ssh_port)" if p.key
                              else "Fix: change ssh_port (sshd's port on the host)"))
            addrs = [p.address for _, p in users]  # one port on two specific addresses (the edge's own and m3_vip's)
            if len(users) > 1 and (len(set(addrs)) < len(addrs) or set(addrs) & set(ANY)):
                clashes[(hp.name, tuple(users))].append(port)  # a range over others: one line for all its ports
        for (name, users), taken in clashes.items():
            keys = list(dict.fromkeys(p.key for _, p in users if p.key))
            out.append(f"{_where(name, h, keys)}: port{'s' if len(taken) > 1 else ''} "
                       f"{', '.join(map(str, taken))} {'are' if len(taken) > 1 else 'is'} used by "
                       + " and ".join(_what(s, p) for s, p in users) + f". {_fix(keys, h)}")
    return out
