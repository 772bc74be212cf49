"""Networking env derived from host facts (pure; used by the plan and preflight)."""
from __future__ import annotations

from typing import Any


def env_from_facts(facts: dict[str, Any]) -> dict[str, str]:
    """Networking env derived from facts: socket interfaces from the default-route interface,
    NCCL_IB_HCA / UCX_NET_DEVICES from RDMA ports that are ACTIVE. Empty values are left out."""
    env: dict[str, str] = {}
    iface = facts.get("default_interface") or ""
    if iface:
        env["NCCL_SOCKET_IFNAME"] = iface
        env["GLOO_SOCKET_IFNAME"] = iface
    active = [d for d in (facts.get("rdma") or []) if d.get("active")]
    if active:
        devs = list(dict.fromkeys(d["device"] for d in active))
        env["NCCL_IB_HCA"] = ",".join(devs)
        env["UCX_NET_DEVICES"] = ",".join(dict.fromkeys(f"{d['device']}:{d.get('port') or 1}" for d in active))
    return env
