"""Facts the controller last saw per host (written by `m3deploy preflight`), so `m3deploy plan --explain`
can show env derived from facts (NCCL/GLOO socket interface, NCCL_IB_HCA, UCX_NET_DEVICES) without SSH.

`~/.cache/m3deploy/<cluster>/facts.json` ($M3DEPLOY_CACHE moves the root). No secrets in facts.
A deploy does not read this file: it gathers the facts live on each host.
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any


def path(cluster: str) -> Path:
    root = os.environ.get("M3DEPLOY_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "m3deploy")
    return Path(root) / cluster / "facts.json"


def save(cluster: str, facts_by_host: dict[str, dict[str, Any]]) -> Path:
    p = path(cluster)
    p.parent.mkdir(parents=True, exist_ok=True)
    old = load(cluster)
    for h, f in facts_by_host.items():
        old[h] = {"saved_at": int(time.time()), "facts": f}
    tmp = p.with_suffix(".tmp")
    tmp.write_text(json.dumps(old, indent=1, sort_keys=True, default=str))
    os.replace(tmp, p)
    return p


def load(cluster: str) -> dict[str, Any]:
    p = path(cluster)
    try:
        return json.loads(p.read_text())
    except (OSError, ValueError):
        return {}


def network_facts(cluster: str) -> dict[str, dict[str, Any]]:
    """{host: {"env": {...}}} for plan.build(facts=...), from the cached facts."""
    from m3deploy.core.netenv import env_from_facts

    return {h: {"env": env_from_facts(v.get("facts") or {})} for h, v in load(cluster).items()}
