"""Day-2 drills of disaggregated serving (m3_disagg, issue 23) under load, on the local testbed.

    python3 -m pytest -p no:cacheprovider -m drills tests/e2e/test_drills_disagg.py

Testbed `m3pd2`, 10.121.0.0/24 (M3_DISAGG_DRILLS_TESTBED / M3_DISAGG_DRILLS_SUBNET move it): 1 control host (etcd,
NATS, the frontend with the KV router and --migration-limit 3) and 4 mocker workers, 2 prefill + 2 decode
(`m3_disagg={"prefill":{"workers":2},"decode":{"workers":2}}`). While tests/e2e/load.py (4 concurrent clients,
streaming and non-streaming chat, no retries) counts every request and every failure:
1. SIGKILL of a prefill worker; 2. SIGKILL of a decode worker (systemd restarts each: Restart=always);
3. a rolling change of the prefill pool, then 4. of the decode pool (the pool's own env changed through m3_disagg:
   the deploy re-run rolls that pool's workers one at a time, drained).
Recovery: from the fault until the killed worker's new process is listed and has served (m3deploy.check.rollout).
The figures (with the machine's load) go to benchmarks/results/drills-disagg-<UTC start>.md; every failure's
time and message is printed, to read in the journals. M3_E2E_KEEP=1 keeps the testbed.
"""
from __future__ import annotations

import datetime
import json
import os
import re
import subprocess
import time

import pytest
import tbrun

from load import Load, Stats
from m3deploy.check import rollout
from m3deploy.check.checks import frontend_url, instance_services, metrics_url, worker_pools

pytestmark = [pytest.mark.drills, pytest.mark.e2e]

NAME = os.environ.get("M3_DISAGG_DRILLS_TESTBED", "m3pd2")
SUBNET = os.environ.get("M3_DISAGG_DRILLS_SUBNET", "10.121.0.0/24")
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ENV = {**os.environ, "M3_TESTBED": NAME, "M3_TESTBED_CONTROL": "1"}
TB = tbrun.Testbed(NAME, SUBNET, 5, ENV)
POOLS = {"prefill": {"workers": 2}, "decode": {"workers": 2}}
RECOVER_S = 15.0
STARTED = datetime.datetime.now(datetime.timezone.utc)
RESULTS: list[dict] = []


def _data(pools: dict) -> list[str]:
    return ["--data", "m3_disagg=" + json.dumps(pools, separators=(",", ":"))]


def pyinfra(pools: dict, timeout: int = 900) -> subprocess.CompletedProcess:
    return TB.deploy(*_data(pools), timeout=timeout)


on = TB.on


def _plan():
    return TB.plan(_data(POOLS))


@pytest.fixture(scope="module")
def cluster(testbed_up):
    with testbed_up(TB, deploy=_data(POOLS), timeout=900):
        try:
            plan = _plan()
            heads = {f"{h.name}/{s.name}": metrics_url(h, s) for h, s in instance_services(plan)}
            yield {"plan": plan, "health": frontend_url(plan, "/health"), "heads": heads, "pools": worker_pools(plan)}
        finally:
            _write_results()


def _write_results() -> None:
    tbrun.write_results(
        "drills-disagg", STARTED, "Disaggregated drills under load",
        "`python3 -m pytest -p no:cacheprovider -m drills tests/e2e/test_drills_disagg.py` on the local testbed "
        "(one 2-core machine shared with other work; `load`: its 1-minute load average): 1 control host (etcd, "
        "NATS, the Dynamo frontend: KV router, --migration-limit 3) and Dynamo's mocker as 2 prefill + 2 decode "
        "workers, one per host (`m3_disagg`). Load: tests/e2e/load.py, 4 concurrent clients, streaming and "
        "non-streaming chat, max_tokens 24, no retries. Recovery: from the fault until the worker's new "
        "process is listed and has served.",
        ["drill", "sent", "ok", "failed", "recovery s", "failures", "notes"],
        [[r["drill"], r["stats"].sent, r["stats"].ok, r["stats"].failed, f"{r['recovery']:.1f}",
          tbrun.failures(r["stats"]), r["note"]] for r in RESULTS])


def drill(c: dict, name: str, fault, recover, note: str = "", settle_s: float = 3.0) -> tuple[Stats, float]:
    with Load(c["plan"].endpoint, c["plan"].served_model_name, concurrency=4, duration_s=300) as load:
        time.sleep(settle_s)
        t0 = time.monotonic()
        fault()
        recovery = recover(t0)
        time.sleep(settle_s)
        stats = load.stop()
    assert stats.ok > 0, f"the load client got no answer at all: {stats.summary()}"
    rollout.wait_workers(c["health"], c["heads"], timeout_s=60, interval_s=0.2)
    tbrun.record(RESULTS, name, stats, recovery, note, key="recovery")
    return stats, recovery


def _key(c: dict, pool: str) -> str:
    return next(k for k, p in c["pools"].items() if p == pool)


def _sigkill(c: dict, pool: str) -> tuple[Stats, float]:
    key = _key(c, pool)
    host, unit = key.split("/")
    old = set(rollout.worker_counts(c["heads"][key]))

    def back(t0: float) -> float:
        rollout.wait_routable(key, c["health"], c["heads"][key], old, send=lambda: None, timeout_s=120)
        return time.monotonic() - t0
    return drill(c, f"SIGKILL a {pool} worker ({host})", lambda: on(host, f"systemctl kill -s KILL {unit}"), back,
                 note="systemd restarts it (Restart=always); frontend --migration-limit 3")


# What Dynamo 1.6.1's frontend logs when it cannot migrate a disaggregated request off a dead worker (prefill or
# decode): it tries ("Stream disconnected, recreating stream", "Creating new stream, retrying"), and its KV router
# refuses to book the retry: "Request <id> already exists (assigned to worker ...)" (benchmarks/results/
# drills-disagg-2026-12-02-1959.md quotes the journal)
CANNOT_BOOK = "failed to book scheduler state"


def _causes(journal: str) -> str:
    """What the frontend logged about the kill (its journal): migration attempts, and those its KV router refused."""
    tried = len(re.findall(r"Creating new stream, retrying|Stream disconnected, recreating stream", journal))
    return f"{tried} migration attempt(s), {journal.count(CANNOT_BOOK)} refused ({CANNOT_BOOK!r})"


def test_sigkill_prefill_worker(cluster):
    """Dynamo 1.6.1 cannot reach 0 here: a request in its prefill on the killed worker fails (503 or a stream error;
    migration is attempted and refused, CANNOT_BOOK); every other request, and every one after the kill, succeeds.
    Measured, not hidden: each failure must be that one (its cause in the frontend's journal), no more of them than
    there are clients in flight (4)."""
    ctl = cluster["plan"].group("control")[0].name
    since = on(ctl, "date -u '+%Y-%m-%d %H:%M:%S'").strip()
    stats, rec = _sigkill(cluster, "prefill")
    assert rec < RECOVER_S, f"routable again only after {rec:.1f} s"
    journal = on(ctl, f"journalctl -u m3-frontend --since '{since}' --no-pager -o cat | sed 's/\\x1b\\[[0-9;]*m//g'")
    refused = journal.count(CANNOT_BOOK)
    RESULTS[-1]["note"] += f"; {_causes(journal)}"
    assert stats.failed <= 4, stats.summary()
    assert stats.failed == 0 or (refused >= 1 and all("503" in why or "unavailable" in msg.lower()
                                                      for _, why, msg in stats.details)), (stats.details, refused)


def test_sigkill_decode_worker(cluster):
    """A decode worker's streams migrate to the other decode worker (--migration-limit 3) - unless the retry hits
    the same refusal as prefill's (CANNOT_BOOK; seen in the repeated drill): at most the 4 requests in flight."""
    ctl = cluster["plan"].group("control")[0].name
    since = on(ctl, "date -u '+%Y-%m-%d %H:%M:%S'").strip()
    stats, rec = _sigkill(cluster, "decode")
    assert rec < RECOVER_S, f"routable again only after {rec:.1f} s"
    journal = on(ctl, f"journalctl -u m3-frontend --since '{since}' --no-pager -o cat")
    RESULTS[-1]["note"] += f"; {_causes(journal)}"
    assert stats.failed <= 4, stats.summary()
    assert stats.failed == 0 or journal.count(CANNOT_BOOK) >= 1, (stats.details, _causes(journal))


@pytest.mark.parametrize("pool", ["prefill", "decode"])
def test_sigkill_repeated(cluster, pool):
    """The same kill 5 times in one load window (both workers of the pool in turn, each back before the next): how
    often a kill lands on a request in flight there, and each such failure's cause (CANNOT_BOOK)."""
    ctl = cluster["plan"].group("control")[0].name
    since = on(ctl, "date -u '+%Y-%m-%d %H:%M:%S'").strip()
    keys = [k for k, p in cluster["pools"].items() if p == pool]

    def kills():
        for i in range(5):
            key = keys[i % len(keys)]
            host, unit = key.split("/")
            old = set(rollout.worker_counts(cluster["heads"][key]))
            on(host, f"systemctl kill -s KILL {unit}")
            rollout.wait_routable(key, cluster["health"], cluster["heads"][key], old, send=lambda: None,
                                  timeout_s=120)
            time.sleep(1)
    stats, _ = drill(cluster, f"SIGKILL a {pool} worker ×5 (both in turn)", kills, lambda t0: time.monotonic() - t0,
                     note="recovery: the 5 kills and recoveries")
    journal = on(ctl, f"journalctl -u m3-frontend --since '{since}' --no-pager -o cat | sed 's/\\x1b\\[[0-9;]*m//g'")
    RESULTS[-1]["note"] += f"; {_causes(journal)}"
    # Dynamo 1.6.1 cannot reach 0 for either pool: each failure is a request in flight on the killed worker whose
    # migration its KV router refused (CANNOT_BOOK); never more than the 4 clients in flight per kill
    assert stats.failed <= 4 * 5, stats.summary()
    assert stats.failed == 0 or journal.count(CANNOT_BOOK) >= 1, (stats.details, _causes(journal))


@pytest.mark.parametrize("pool", ["prefill", "decode"])
def test_rolling_change_of_a_pool(cluster, pool):
    """The pool's own env changes (m3_disagg.<pool>.env): the deploy re-run rolls only that pool's 2 workers, one
    at a time (drained: unregister, grace period, stop), and 0 requests fail."""
    changed = {**POOLS, pool: {**POOLS[pool], "env": {"M3_DRILL_ROLL": "1"}}}
    runs = []
    stats, _ = drill(cluster, f"rolling change of the {pool} pool (its env, through m3_disagg)",
                     lambda: runs.append(pyinfra(changed)), lambda t0: time.monotonic() - t0,
                     note="the deploy's own wall time as recovery")
    run = runs[0]
    assert run.returncode == 0, run.stdout[-4000:]
    rolled = sorted(re.findall(r"rolled worker (\d+) ", run.stdout))
    want = sorted(str(w.index) for w in cluster["plan"].workers
                  if cluster["pools"][w.services[0]] == pool)
    assert rolled == want, (rolled, want, run.stdout[-3000:])
    RESULTS[-1]["note"] += f"; rolled workers {', '.join(rolled)}"
    assert stats.failed == 0, stats.summary()
    back = pyinfra(POOLS)  # and back
    assert back.returncode == 0, back.stdout[-3000:]
