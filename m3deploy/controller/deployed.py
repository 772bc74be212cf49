"""The deploy record: `~/.config/m3deploy/<cluster>/deployed.json` on the controller (`M3DEPLOY_CONFIG` moves the
root), written by the deploy's last role (roles/record.py), read by `m3deploy verify` and `m3deploy plan
--diff-deployed`.

Per host: "planned" (what the plan asked for: each service's image and full command, the model repos) and
"running" (what the host reported after the deploy, m3deploy.facts.deployed: the image id and digests each
container runs, driver, CUDA, ROCm, Dynamo version, each model repo's commit) and "connect" (how pyinfra reached
it: the non-secret ssh_* data of CONNECT_KEYS, so that `m3deploy prune` can reach a host the inventory no longer
names; never a password). Hosts write their entries
concurrently (pyinfra runs hosts in greenlets): one lock, atomic replace.
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import asdict
from pathlib import Path

from m3deploy.controller.cachelock import locked
from m3deploy.controller.secrets import secrets_path
from m3deploy.core import generation as gen
from m3deploy.core import settings
from m3deploy.core.connection import SUDO_KEYS
from m3deploy.core.errors import ValidationError
from m3deploy.core.model import ClusterPlan, HostPlan

VERSION = 1
# pyinfra's SSH connector data that say how to reach a host (pyinfra/connectors/ssh.py); secrets (ssh_password,
# ssh_key_password) are never recorded: a host reached only with one is pruned after it is put back in the inventory
CONNECT_KEYS = ("ssh_hostname", "ssh_port", "ssh_user", "ssh_key", "ssh_known_hosts_file",
                "ssh_strict_host_key_checking", "ssh_config_file", "ssh_forward_agent", "ssh_allow_agent",
                "ssh_look_for_keys", *SUDO_KEYS)  # a non-root user's hosts are pruned with its sudo


def record_path(cluster: str) -> Path:
    return secrets_path(cluster).with_name("deployed.json")  # the same checked cluster directory


def planned(plan: ClusterPlan, hp: HostPlan) -> dict:
    out = {"services": {s.name: {"image": s.image, "command": list(s.command)} for s in hp.services},
           "model_repos": [r.repo for r in plan.model_repos] if hp.weights_dir else []}
    if plan.generation and any(s.kind in ("worker", "frontend") for s in hp.services):
        out["generation"] = asdict(plan.generation)  # core/generation.py: what the host's Dynamo services run
    return out


def connection(data) -> dict:
    """The CONNECT_KEYS of a host's data (pyinfra's host.data, or a dict) that are set, as JSON values."""
    out = {}
    for k in CONNECT_KEYS:
        v = data.get(k) if hasattr(data, "get") else None
        if v is not None and isinstance(v, (str, int, bool)):
            out[k] = v
    return out


def load(cluster: str) -> dict:
    p = record_path(cluster)
    if not p.is_file():
        return {}
    return json.loads(p.read_text())


def write_host(plan: ClusterPlan, hp: HostPlan, running: dict, connect: dict | None = None) -> Path:
    p = record_path(plan.name)
    p.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    with locked(p, f"the deploy record of {plan.name}"):
        doc = load(plan.name) or {"version": VERSION, "cluster": plan.name, "hosts": {}}
        before = doc["hosts"].get(hp.name) or {}
        now = planned(plan, hp)
        old_gen = (before.get("planned") or {}).get("generation")
        # the generation a roll back returns to: the one this deploy replaced (kept across same-generation deploys)
        previous = old_gen if old_gen and old_gen != now.get("generation") else before.get("previous_generation")
        doc["hosts"][hp.name] = {"at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                                 "planned": now, "running": running, "connect": connect or {},
                                 "address": hp.address, **({"previous_generation": previous} if previous else {})}
        _replace(p, doc)
    return p


def forget(cluster: str, names) -> Path:
    """Drop hosts from the record (`m3deploy prune`, after their teardown)."""
    p = record_path(cluster)
    with locked(p, f"the deploy record of {cluster}"):
        doc = load(cluster)
        for name in names:
            (doc.get("hosts") or {}).pop(name, None)
        _replace(p, doc)
    return p


def _replace(p: Path, doc: dict) -> None:
    tmp = p.with_suffix(f".tmp.{os.getpid()}")
    tmp.write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, p)


def diff(plan: ClusterPlan, record: dict) -> list[str]:
    """What a deploy of `plan` would change against the record: one line per difference ([] = nothing)."""
    if not record:
        return [f"no deploy record ({record_path(plan.name)}): a deploy would install everything"]
    hosts = record.get("hosts") or {}
    out = generation_change(plan, record)
    for hp in plan.hosts:
        have = hosts.get(hp.name)
        if not have:
            out.append(f"{hp.name}: not deployed yet")
            continue
        want, old = planned(plan, hp), have.get("planned") or {}
        ws, os_ = want["services"], old.get("services") or {}
        for name in ws.keys() - os_.keys():
            out.append(f"{hp.name}: + {name} (new service)")
        for name in os_.keys() - ws.keys():
            out.append(f"{hp.name}: - {name} (removed)")
        for name in sorted(ws.keys() & os_.keys()):
            a, b = os_[name], ws[name]
            if a.get("image") != b.get("image"):
                out.append(f"{hp.name}: ~ {name} image {a.get('image')} -> {b.get('image')} (restart)")
            elif a.get("command") != b.get("command"):
                gone = [t for t in a.get("command", []) if t not in b["command"]]
                new = [t for t in b["command"] if t not in a.get("command", [])]
                out.append(f"{hp.name}: ~ {name} command changes (restart): - {' '.join(gone) or '(order)'} "
                           f"+ {' '.join(new) or '(order)'}")
        for repo in [r for r in want["model_repos"] if r not in (old.get("model_repos") or [])]:
            out.append(f"{hp.name}: + model repo {repo} (staged)")
    for name in hosts.keys() - {h.name for h in plan.hosts}:
        out.append(f"{name}: in the record but not in the plan (a deploy does not touch it; "
                   f"`m3deploy prune INVENTORY --host {name}` drains and tears it down)")
    return out


def _hosts_by(record: dict, key_of) -> dict:
    """key_of(planned generation or {}, host entry) -> the record's hosts with that key (None: left out)."""
    out: dict = {}
    for name, entry in sorted((record.get("hosts") or {}).items()):
        key = key_of((entry.get("planned") or {}).get("generation") or {}, entry)
        if key is not None:
            out.setdefault(key, []).append(name)
    return out


def deployed_generations(record: dict) -> dict[str, list[str]]:
    """generation id -> the hosts whose Dynamo services the record says run it (records before issue 38: the
    Dynamo version the host reported, as `dynamo <version>`)."""
    def key_of(g, entry):
        reported = (entry.get("running") or {}).get("dynamo")
        return g["id"] if g else (f"dynamo {reported}" if reported else None)
    return _hosts_by(record, key_of)


def _deployed_dynamo(record: dict) -> dict[str, list[str]]:
    """Dynamo version -> the hosts the record says run it (planned generation, else the version reported)."""
    return _hosts_by(record, lambda g, entry: str(g.get("dynamo_version") or (entry.get("running") or {}).get(
        "dynamo") or "") or None)


def _deployed_cards(record: dict) -> dict[tuple, list[str]]:
    """The recorded model cards (sorted items) -> their hosts; a record from before the card counted (no "card"):
    not known, left out."""
    return _hosts_by(record, lambda g, entry: tuple(sorted(g["card"].items())) if "card" in g else None)


def skew_problems(plan: ClusterPlan, record: dict) -> list[str]:
    """The version-skew refusals of deploying `plan` over what the record says runs (catalog.yaml `version_skew`,
    core/generation.py), and those of a model-card change that cannot change namespace (m3_planner): checked by
    `m3deploy validate` and the deploy before any host is touched."""
    if not plan.dynamo_version or plan.state == "absent":
        return []
    out = [p for old, names in _deployed_dynamo(record).items()
           for p in gen.change_problems(old, plan.dynamo_version, f"the deploy record ({', '.join(names)})")]
    if not plan.generation:
        return out
    return out + [p for card, names in _deployed_cards(record).items()
                  for p in gen.card_change_problems(dict(card), plan.generation,
                                                    f"the deploy record ({', '.join(names)})")]


def refuse_skew(plan: ClusterPlan) -> None:
    """Raise ValidationError with every skew refusal of deploying `plan` over its deploy record."""
    problems = skew_problems(plan, load(plan.name))
    if problems:
        raise ValidationError(problems)


def generation_change(plan: ClusterPlan, record: dict) -> list[str]:
    """A change of the workers' generation, as such, with the order the deploy takes it ([] when none)."""
    new = plan.generation
    old = {k: v for k, v in deployed_generations(record).items() if not new or k != new.id}
    if not new or not old:
        return []
    workers = [f"{h.name}/{s.name}" for w in plan.workers for h in plan.hosts for s in h.services
               if s.kind == "worker" and s.worker == w.index and s.rank == 0]
    frontends = [f"{h.name}/{s.name}" for h in plan.hosts for s in h.services if s.kind == "frontend"]
    was = "; ".join(f"{k} on {', '.join(v)}" for k, v in old.items())
    return [f"generation change: {was} -> {new.describe()}",
            f"  1. every host writes the new files (venv {plan.venv}); the previous generation's venv and images "
            "stay until the next deploy, its unit and env files in /var/lib/m3/rollback/",
            f"  2. the frontends restart on Dynamo {plan.dynamo_version} (before any worker rolls; behind m3_edge, "
            f"drained one at a time): {', '.join(frontends)}",
            f"  3. the workers roll one instance at a time into namespace {new.namespace}; each is drained from "
            f"the old generation only after every frontend lists its successor as routable: {', '.join(workers)}",
            "  4. the serving check; `m3deploy verify`; a roll back is the same change the other way "
            "(docs/OPERATIONS.md \"Upgrades and rollback\")"]


def rollback_data(record: dict) -> list[str]:
    """The --data that returns to the generation the last generation change replaced ([] when none is recorded):
    `m3deploy plan --diff-deployed` prints it."""
    entry = next((e for _, e in sorted((record.get("hosts") or {}).items()) if e.get("previous_generation")), None)
    if not entry:
        return []
    prev = entry["previous_generation"]
    now = (entry.get("planned") or {}).get("generation") or {}
    out = [f"m3_dynamo_version={prev['dynamo_version']}", f"m3_engine={prev['engine']}",
           f"m3_runtime={prev['runtime']}", f"m3_model_id={prev['model_id']}"]
    out += [f"m3_image={prev['image']}"] if prev["image"] != "recipe" else []
    if "card" not in prev:  # recorded before the model card counted: its values are not known
        return out
    # the model card's settings: the previous value, or the default again where only the current one sets it
    was, has = prev["card"], now.get("card") or {}
    return out + [f"{k}={was[k] if k in was else json.dumps(settings.KEYS[k].default)}"
                  for k in gen.card_keys() if k in was or k in has]


def describe_running(entry: dict) -> str:
    r = entry.get("running") or {}
    bits = [f"driver {r['driver']} (CUDA {r['cuda']})" if r.get("driver") else "",
            f"ROCm {r['rocm']}" if r.get("rocm") else "", f"dynamo {r['dynamo']}" if r.get("dynamo") else ""]
    for name, c in sorted((r.get("containers") or {}).items()):
        bits.append(f"{name} {(c.get('digests') or [c.get('id') or 'not running'])[0]}")
    for repo, commit in sorted((r.get("repos") or {}).items()):
        bits.append(f"{repo}@{commit[:12] or 'missing'}")
    return ", ".join(b for b in bits if b)
