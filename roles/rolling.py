"""Rolling restart of changed worker units (m3_rollout = "rolling", the default), from the controller.

pyinfra runs each operation on every host at once, so an order across hosts cannot be a chain of per-host
ops. Instead the worker role only ships the units and env files (no restart) and records, per worker rank,
whether its files changed; then ONE python.call on the endpoint-owning host (after a barrier: every host's
files are written) restarts the changed engine instances in turn over pyinfra's own connections:

  for each batch of m3_rollout_max_unavailable instances (plan order; a multi-host instance is one, all ranks):
    1. drain: `systemctl stop` every rank (SIGTERM: Dynamo unregisters at once, then finishes in-flight
       requests within TimeoutStopSec, the drain bound); the other instances keep serving;
    2. start every rank, rank 0 first (in an MPI world its followers' sshd first, rank 0's mpirun reaches them);
    3. wait until each rank is ready and the frontend lists the NEW process of rank 0 and has routed a
       request that it served (m3deploy.check.rollout.wait_routable), then the next batch.

Instances that were not running at all (first deploy, after a teardown) have nothing to drain and start
together. The call runs only when some worker file changed: a re-run with no change has 0 changed ops.
A readiness failure stops the rollout with the unit's journal tail; instances not yet rolled keep serving.
"""
from __future__ import annotations

import shlex
import time

import gevent
from pyinfra import host, state
from pyinfra.api import deploy
from pyinfra.operations import python

from m3deploy.check import readiness as _readiness
from m3deploy.check import rollout
from m3deploy.check.checks import frontend_url, frontend_urls, metrics_url
from m3deploy.controller.secrets import api_key
from m3deploy.core.errors import M3Error, plural
from roles import lifecycle
from roles.hostops import run_on

REQUEST = {"messages": [{"role": "user", "content": "rollout check"}], "max_tokens": 4}


def _registry() -> dict:
    if not hasattr(state, "_m3_worker_changes"):
        state._m3_worker_changes = {}
    return state._m3_worker_changes


def register(s, changed) -> None:
    """Record (at prepare time) the callable saying whether this rank's unit/env file changed this run."""
    _registry()[f"{s.host}/{s.name}"] = changed


def _changed() -> set[str]:
    return {k for k, fn in _registry().items() if fn()}


def _systemctl(verb: str, keys: list[str]) -> None:
    """`systemctl VERB unit` on each rank's host, all at once (gevent: pyinfra's connections are greenlets)."""
    jobs = [(k, gevent.spawn(run_on, k.split("/", 1)[0], f"systemctl {verb} {shlex.quote(k.split('/', 1)[1])}"))
            for k in keys]
    gevent.joinall([j for _, j in jobs])
    bad = [(k, j.value[1]) for k, j in jobs if not j.value[0]]
    if bad:
        raise M3Error("; ".join(f"systemctl {verb} {k}: {out[-300:]}" for k, out in bad))


def _service(cp, key: str):
    hname, sname = key.split("/", 1)
    hp = cp.host(hname)
    return hp, hp.service(sname)


def _tail(key: str) -> str:
    hname, unit = key.split("/", 1)
    return run_on(hname, f"journalctl --no-pager -o short-iso -n 30 -u {shlex.quote(unit)} 2>&1 || true")[1]


def _send(cp):
    import json
    import urllib.request

    body = json.dumps({"model": cp.served_model_name, **REQUEST}).encode()
    req = urllib.request.Request(f"{cp.endpoint}/chat/completions", data=body,
                                 headers={"Content-Type": "application/json", **_readiness.auth(api_key(cp))})
    return lambda: urllib.request.urlopen(req, timeout=30).read()


def _waves(cp, instances) -> list[list[str]]:
    """The ranks in start order: first those naming no other rank of their instance in `after` (rank 0; in an MPI
    world the followers' sshd, which rank 0's mpirun reaches: m3deploy.core.mpi), then the rest."""
    first = [k for w in instances for k in w.services if not set(_service(cp, k)[1].after) & set(w.services)]
    return [first, [k for w in instances for k in w.services if k not in first]]


def _bring_up(cp, instances, old_ids: dict) -> None:
    """Start every rank in `_waves` order, then wait: each rank ready, rank 0's new process routable. A wave whose
    readiness is a port (an MPI world's sshd, up in seconds) is waited for before the next starts; an engine's
    (http) is not: its ranks load together."""
    for wave in filter(None, _waves(cp, instances)):
        _systemctl("start", wave)
        for key in wave:
            s = _service(cp, key)[1]
            if s.readiness and s.readiness.kind == "tcp":
                _readiness.wait_ready(s.readiness, what=key, logs=lambda k=key: _tail(k))
    health = frontend_url(cp, "/health") if cp.serving == "dynamo" else ""
    others = frontend_urls(cp, "/health")[1:] if health else []  # every frontend lists each new instance
    for w in instances:
        for key in w.services:
            hp, s = _service(cp, key)
            if s.readiness and s.readiness.kind in _readiness.CHECKS:
                _readiness.wait_ready(s.readiness, what=key, logs=lambda k=key: _tail(k))
        hp, s = _service(cp, w.services[0])
        murl = metrics_url(hp, s)
        if health and murl:
            took = rollout.wait_routable(w.services[0], health, murl, old_ids.get(w.index, ()), _send(cp),
                                         timeout_s=s.readiness.timeout_s if s.readiness else 120, also=others)
            host.log(f"worker {w.index} ({w.services[0]}): routed to and served ({took:.1f} s)")


def _is_active(key: str) -> bool:
    hname, unit = key.split("/", 1)
    return run_on(hname, f"systemctl is-active {shlex.quote(unit)}")[1].strip() == "active"


def _ids(cp, key: str) -> set[str]:
    hp, s = _service(cp, key)
    murl = metrics_url(hp, s)
    try:
        return set(rollout.worker_counts(murl)) if murl else set()
    except (OSError, ValueError):
        return set()


def _roll(cp) -> None:
    changed = _changed()
    todo = [w for w in cp.workers if changed & set(w.services)]
    max_unavailable = cp.rollout.max_unavailable
    idle = [w for w in todo if not _is_active(w.services[0])]
    live = [w for w in todo if w not in idle]
    done: list[int] = []
    if idle:
        _bring_up(cp, idle, {})
        idle_names = ", ".join(str(w.index) for w in idle)
        host.log(f"started {plural(len(idle), 'worker')} that were not running: {idle_names}")
    for batch in rollout.batches(live, max_unavailable):
        names = ", ".join(f"worker {w.index} ({' + '.join(w.services)})" for w in batch)
        try:
            old = {w.index: _ids(cp, w.services[0]) for w in batch}
            t0 = time.monotonic()
            _systemctl("stop", [k for w in batch for k in w.services])  # SIGTERM: unregister, drain
            drained = time.monotonic() - t0
            _bring_up(cp, batch, old)
        except M3Error as e:
            rest = [w.index for w in live if w.index not in done and w not in batch]
            raise M3Error(
                f"rolling restart stopped at {names}: {e}\n"
                f"  rolled already: {done or 'none'}; not rolled, still serving the previous version: "
                f"{rest or 'none'} (their new unit files are written; a re-run rolls them: a unit running older "
                "files than it has counts as changed).\n"
                "  fix or roll back: correct the inventory/group_data (or check out the previous version of it) and "
                "run the deploy again: it re-renders the units and rolls the changed workers the same way; the "
                f"files they replaced are in {lifecycle.ROLLBACK_DIR} (docs/OPERATIONS.md)") from None
        done += [w.index for w in batch]
        host.log(f"rolled {names}: drained in {drained:.1f} s, serving again")


@deploy("Roll the workers")
def roll_workers() -> None:
    """On the endpoint-owning host only: one python.call that rolls the changed workers (see module doc)."""
    from roles.serving import endpoint_owner

    cp, hp = lifecycle.plans()
    if cp.rollout.mode != "rolling" or hp.name != endpoint_owner(cp):
        return
    lifecycle.track(python.call(name="Roll the changed workers, one engine instance at a time", function=_roll, cp=cp,
                        _if=lambda: bool(_changed())))
