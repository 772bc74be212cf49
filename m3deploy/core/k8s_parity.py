"""Parity between a DynamoGraphDeployment export and the bare-metal units it came from: every Dynamo client's argv
and env in its component's `main` container equal the unit's token for token, except the differences
m3deploy.core.export_k8s.DIFFERENCES lists. Independent of how the export was made: it reads the exported
container back and explains each differing token by one named difference, or reports it. Pure.
"""
from __future__ import annotations

import difflib
from typing import Any

from m3deploy.core import export_k8s as ek
from m3deploy.core.model import ClusterPlan, HostPlan, Service

NAMES = {d.name for d in ek.DIFFERENCES}


def _container(dgd: dict[str, Any], component: str) -> dict[str, Any] | None:
    for c in dgd["spec"]["components"]:
        if c.get("name") == component:
            return next((x for x in c["podTemplate"]["spec"]["containers"] if x.get("name") == ek.MAIN), None)
    return None


def _explain_tokens(plan: ClusterPlan, hp: HostPlan, svc: Service, want: list[str], got: list[str]
                    ) -> tuple[set[str], list[str]]:
    """Each differing run of tokens, explained by a difference name, or an unexplained-difference message."""
    used, bad = set(), []
    slot = ek.slot_of(svc) if svc.kind == "worker" else 0
    flags = ek.multi_host_flags(plan)
    mpi_head = len(svc.argv) - len(ek.unwrap_mpi(plan, svc.argv)) if svc.mpi == "launcher" else 0
    for op, i1, i2, j1, j2 in difflib.SequenceMatcher(a=want, b=got, autojunk=False).get_opcodes():
        if op == "equal":
            continue
        a, b = want[i1:i2], got[j1:j2]
        if op == "delete" and i2 <= mpi_head:
            used.add("multi-node")
        elif op == "delete" and _only_flags(want, i1, i2, flags):
            used.add("multi-node")
        elif op == "replace" and i1 == 0 and i2 == 1 and b == ["python3"] and a[0].startswith(f"{plan.venv}/"):
            used.add("interpreter")
        elif op == "replace" and len(a) == len(b):
            for x, y in zip(a, b):
                name = _explain_value(hp, svc, slot, x, y)
                if name:
                    used.add(name)
                else:
                    bad.append(f"argv token {x!r} is {y!r}")
        else:
            bad.append(f"argv {op} {a!r} -> {b!r}")
    return used, bad


def _only_flags(argv: list[str], i1: int, i2: int, flags: dict[str, bool]) -> bool:
    """Is argv[i1:i2] made of whole multi-host flags (each with its value)?"""
    i = i1
    while i < i2:
        if argv[i] not in flags:
            return False
        i += 2 if flags[argv[i]] else 1
    return i == i2


def _explain_value(hp: HostPlan, svc: Service, slot: int, want: str, got: str) -> str:
    back = got.replace(f"$({ek.POD_IP})", hp.address)
    if back == want:
        return "address"
    if slot:
        for p in svc.ports:
            if back.replace(str(p.port - slot), str(p.port)) == want:
                return "slot-ports"
    if svc.devices and back == ",".join(map(str, range(len(svc.devices)))) and want == ",".join(map(str, svc.devices)):
        return "devices"
    return ""


def _explain_env(plan: ClusterPlan, hp: HostPlan, svc: Service, container: dict) -> tuple[set[str], list[str]]:
    used, bad = set(), []
    slot = ek.slot_of(svc) if svc.kind == "worker" else 0
    got = {e["name"]: e for e in container.get("env") or []}
    for k, v in svc.env:
        e = got.pop(k, None)
        if e is None:
            if k in ek.CONTROL_ENV:
                used.add("control-plane")
            else:
                bad.append(f"env {k} is missing")
        elif "value" not in e:
            bad.append(f"env {k} is not a value")
        elif e["value"] != v:
            name = "home" if k == "HOME" and not svc.image and e["value"] == "/root" else \
                _explain_value(hp, svc, slot, v, e["value"])
            if name:
                used.add(name)
            else:
                bad.append(f"env {k}={v!r} is {e['value']!r}")
    for k, ref in svc.secret_env:
        e = got.pop(k, None)
        if e is None and k in ek.CONTROL_SECRETS:
            used.add("control-plane")
        elif e is None or "secretKeyRef" not in (e.get("valueFrom") or {}):
            bad.append(f"secret env {k} (secret {ref}) is not a Secret reference")
    for k, e in got.items():
        if k == ek.POD_IP and (e.get("valueFrom") or {}).get("fieldRef", {}).get("fieldPath") == "status.podIP":
            used.add("address")
        elif k == "HF_TOKEN" and "secretKeyRef" in (e.get("valueFrom") or {}):
            used.add("hf-token")
        else:
            bad.append(f"env {k} is not in the unit")
    return used, bad


def parity(plan: ClusterPlan, dgd: dict[str, Any]) -> tuple[dict[str, set[str]], list[str]]:
    """({"host/unit": difference names used}, unexplained differences) for every Dynamo client rank."""
    component_of = {f"{h.name}/{s.name}": name for name, _, members in ek.groups(plan) for h, s in members}
    for w in plan.workers:  # ranks > 0 run in their rank 0's component
        for unit in w.services[1:]:
            component_of[unit] = component_of[w.services[0]]
    explained: dict[str, set[str]] = {}
    problems: list[str] = []
    for hp, svc in ek.dynamo_clients(plan):
        unit = f"{hp.name}/{svc.name}"
        container = _container(dgd, component_of.get(unit, ""))
        if container is None:
            problems.append(f"{unit}: no component's {ek.MAIN!r} container runs it")
            continue
        if svc.mpi == "follower":  # its argv is the MPI world's sshd: the operator's launch (multi-node)
            explained[unit] = {"multi-node"}
            continue
        used, bad = _explain_tokens(plan, hp, svc, list(svc.argv),
                                    list(container.get("command") or []) + list(container.get("args") or []))
        used_env, bad_env = _explain_env(plan, hp, svc, container)
        explained[unit] = used | used_env
        problems += [f"{unit}: {b}" for b in bad + bad_env]
    return explained, problems
