"""Which planned worker the Dynamo frontend can route to, and the rolling order (pure Python, no pyinfra).

A planned worker (rank 0 of an engine instance) is *registered* when the instance id its own process reports
(label `worker_id` on its system-port /metrics, the id of the frontend's /health in hex) is among the
frontend's `generate` instances. Counting the frontend's entries is not enough: a restarted worker is listed
twice (old and new entry) until the old lease expires, and a dead one stays listed that long (issue 12).
It is *routable* once the frontend has sent it a request that it served (its generate counter grew).

roles/rolling.py drives the restarts over pyinfra's connections; m3deploy.check.readiness polls single services.
"""
from __future__ import annotations

import time
import urllib.request
from typing import Callable, Iterable, Sequence

from m3deploy.check.checks import parse_prometheus, worker_id_hex
from m3deploy.check.readiness import NotReady, generate_instances


def batches(items: Sequence, size: int) -> list[list]:
    """The rolling order: `size` (m3_rollout_max_unavailable) instances at a time, in plan order."""
    size = max(1, int(size))
    return [list(items[i:i + size]) for i in range(0, len(items), size)]


def _get(url: str, timeout: float = 5.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return resp.read().decode("utf-8", "replace")


def worker_counts(metrics_url: str) -> dict[str, float]:
    """{instance id (hex): generate requests served} of the worker process answering `metrics_url`.
    Ids come from any sample labelled worker_id (the counter appears once the endpoint is served)."""
    out: dict[str, float] = {}
    for name, labels, value in parse_prometheus(_get(metrics_url)):
        wid = labels.get("worker_id")
        if not wid:
            continue
        out.setdefault(wid, 0.0)
        if name == "dynamo_component_requests_total" and labels.get("dynamo_endpoint") == "generate":
            out[wid] += value
    return out


def listed_ids(health_url: str) -> set[str]:
    """Instance ids (hex) of the frontend's `generate` entries."""
    return {worker_id_hex(i["instance_id"]) for i in generate_instances(health_url) if "instance_id" in i}


def _poll(what: str, probe: Callable[[], tuple[bool, str]], timeout_s: float, interval_s: float,
          clock=time.monotonic, sleep=time.sleep) -> float:
    start = clock()
    detail = "not checked"
    while True:
        try:
            ok, detail = probe()
        except (OSError, ValueError, KeyError) as e:
            ok, detail = False, f"{type(e).__name__}: {e}"
        if ok:
            return clock() - start
        if clock() - start >= timeout_s:
            raise NotReady(f"{what} after {timeout_s:.0f} s (last: {detail})")
        sleep(interval_s)


def registered(health_url: str, metrics_url: str) -> tuple[bool, str]:
    ids = set(worker_counts(metrics_url))
    if not ids:
        return False, f"{metrics_url} reports no worker_id yet"
    listed = listed_ids(health_url)
    return bool(ids & listed), f"worker ids {sorted(ids)}, frontend lists {sorted(listed)}"


def wait_workers(health_url: str, heads: dict[str, str], timeout_s: float = 120, interval_s: float = 0.5,
                 clock=time.monotonic, sleep=time.sleep) -> float:
    """Every planned worker (`{"host/service": metrics_url}`) is listed by the frontend under the id of the
    process running now; stale entries of dead or replaced processes do not count."""
    def probe():
        missing = {k: d for k, (ok, d) in ((k, _safe(registered, health_url, u)) for k, u in heads.items()) if not ok}
        return not missing, "; ".join(f"{k}: {d}" for k, d in missing.items())
    try:
        return _poll(f"the frontend at {health_url} does not list every planned worker", probe, timeout_s,
                     interval_s, clock, sleep)
    except NotReady as e:
        raise NotReady(f"{e}\n  fix: journalctl -u 'm3-worker@*' on the named hosts; check ETCD_ENDPOINTS/"
                       "NATS_SERVER and the DYN_*_HOST addresses in /etc/m3/*.env") from None


def _safe(fn, *args) -> tuple[bool, str]:
    try:
        return fn(*args)
    except (OSError, ValueError, KeyError) as e:
        return False, f"{type(e).__name__}: {e}"


def wait_routable(key: str, health_url: str, metrics_url: str, old_ids: Iterable[str],
                  send: Callable[[], object], timeout_s: float, interval_s: float = 0.25,
                  clock=time.monotonic, sleep=time.sleep, also: Iterable[str] = ()) -> float:
    """After a restart of `key`: its new process (an id not in `old_ids`) is listed by the frontend, and a
    request sent through the frontend was served by it. `send()` sends one small request (its failure is
    tolerated while waiting: other traffic may be what reaches the new worker first). `also`: the other
    frontends' /health URLs, each of which must list the new process too (a new generation is routable from
    every frontend before the next old instance drains)."""
    old = set(old_ids)

    def probe():
        counts = worker_counts(metrics_url)
        new = set(counts) - old
        if not new:
            return False, f"{metrics_url} still reports the old id(s) {sorted(old)}" if counts else "no worker_id yet"
        for url in (health_url, *also):
            if not new & listed_ids(url):
                return False, f"new id(s) {sorted(new)} not listed by {url} yet"
        if sum(counts[i] for i in new) >= 1:
            return True, "served"
        try:
            send()
        except Exception as e:  # noqa: BLE001 - shown only if the wait times out
            return False, f"listed; a request through the frontend failed: {type(e).__name__}: {e}"
        return False, f"listed as {sorted(new)}; no request served on it yet"
    return _poll(f"{key} is not routable (new instance listed and a request served on it)", probe,
                 timeout_s, interval_s, clock, sleep)

