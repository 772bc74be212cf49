"""Control-plane outages ridden out (issues 27, 36), under load on the local testbed, with the default lease TTL.

    M3_ELASTIC_TESTBED=m3el M3_ELASTIC_SUBNET=10.130.0.0/24 python3 -m pytest -p no:cacheprovider -m drills \
        tests/e2e/test_drills_elastic.py

Opt-in (`-m drills`). Brings its testbed up (1 control host + 2 mocker workers), deploys with the defaults
(m3_etcd_lease_ttl 120 since issue 36: Dynamo 1.6.1's ETCD_LEASE_TTL, lib/runtime/src/transports/etcd.rs in
dynamo/_core.abi3.so, whose own default is 30 s), runs the drills under tests/e2e/load.py (4 clients, no retries) with the helpers of
tests/e2e/test_drills.py, writes benchmarks/results/elastic-<UTC start>.md and brings the testbed down
(M3_E2E_KEEP=1 keeps it).
"""
from __future__ import annotations

import datetime
import os
import time

import pytest
import tbrun
import test_drills as d

from m3deploy.check import rollout
from m3deploy.check.checks import frontend_url, instance_services, metrics_url
from m3deploy.testbed import core as testbed

pytestmark = [pytest.mark.drills, pytest.mark.e2e]

NAME = os.environ.get("M3_ELASTIC_TESTBED", "m3el")
SUBNET = os.environ.get("M3_ELASTIC_SUBNET", "10.130.0.0/24")
ENV = {**os.environ, "M3_TESTBED": NAME, "M3_TESTBED_CONTROL": "1"}
TB = tbrun.Testbed(NAME, SUBNET, 3, ENV)
TTL = 120
ROUTING_S = 10.0  # full routing within this after etcd returns
DEAD_GONE_S = 2.0  # a SIGKILLed worker leaves the frontend's /health within this
STARTED = datetime.datetime.now(datetime.timezone.utc)


@pytest.fixture(scope="module")
def cluster(testbed_up):
    with testbed_up(TB, deploy=(), timeout=900):  # the defaults: since issue 36 the TTL is 120 unless set
        plan = d._plan(ENV)
        assert dict(plan.settings).get("m3_etcd_lease_ttl") == TTL
        heads = {f"{h.name}/{s.name}": metrics_url(h, s) for h, s in instance_services(plan)}
        c = d.Cluster(plan, frontend_url(plan, "/health"), heads, plan.group("control")[0].name,
                      [k.split("/")[0] for k in heads], ENV)
        for h in [c.control, *c.workers]:  # the deploy wrote it into every Dynamo process's env file
            out = testbed.run_on(NAME, h, "grep -h ^ETCD_LEASE_TTL= /etc/m3/m3-*.env").stdout
            assert f"ETCD_LEASE_TTL={TTL}" in out, (h, out)
        n = len(d.RESULTS)
        yield c
        _write(d.RESULTS[n:])


def _write(rows) -> None:
    if not rows:
        return
    commit = tbrun.commit()
    path = os.path.join(d.REPO, "benchmarks", "results", f"elastic-{STARTED:%Y-%m-%d-%H%M}.md")
    lines = [f"# Control-plane outages with the default m3_etcd_lease_ttl = {TTL} ({STARTED:%Y-%m-%d %H:%M} UTC, commit {commit})",
             "", "`python3 -m pytest -p no:cacheprovider -m drills tests/e2e/test_drills_elastic.py`: one 2-core "
             "machine shared with other helpers (`load`: its 1-minute load average), 1 control host + 2 mocker "
             "workers, tests/e2e/load.py 4 clients, no retries.", "",
             "| drill | sent | ok | failed | recovery s | failures | notes |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        s = r["stats"]
        errs = ", ".join(f"{n}× {e}" for e, n in s.errors.most_common()) or "-"
        lines.append(f"| {r['drill']} | {s.sent} | {s.ok} | {s.failed} | {r['recovery']:.1f} | {errs} | {r['note']} |")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


def _outage(c, unit: str, seconds: float, ends: list):
    def go():
        d.on(c.control, f"systemctl stop {unit}", name=NAME)
        time.sleep(seconds)
        d.on(c.control, f"systemctl start {unit}", name=NAME)
        ends.append(time.monotonic())
    return go


def _routed(c, ends):
    def wait(t0):
        rollout.wait_workers(c.health, c.heads, timeout_s=120, interval_s=0.2)
        d._serves(c)
        return time.monotonic() - ends[0]
    return wait


def test_etcd_away_60s_fails_nothing(cluster):
    """The leases (TTL 120) outlive the outage: no process exits, the frontend keeps routing on what it knows,
    and its watches resync when etcd is back."""
    ends = []
    stats, rec = d.drill(cluster, "etcd away 60 s (lease TTL 120)", _outage(cluster, "etcd", 60, ends),
                         _routed(cluster, ends), note="recovery from etcd's start: every worker listed, a request served")
    assert stats.failed == 0, stats.summary()
    assert rec < ROUTING_S, rec


def test_sigkilled_worker_leaves_health_within_2s(cluster):
    """With leases of 120 s the dead records would stay 120 s: the unit's ExecStopPost (files/m3-unregister-dead.py)
    revokes them."""
    key = list(cluster.heads)[0]
    host, unit = key.split("/")
    old = d._ids(cluster, key)
    gone = []

    def kill():
        t0 = time.monotonic()
        d.on(host, f"systemctl kill -s KILL {unit}", name=NAME)
        gone.append(d._gone_from_health(cluster, old, t0))
    stats, rec = d.drill(cluster, "SIGKILL one worker (lease TTL 120)", kill,
                         lambda t0: d.since(t0, lambda: d.back(cluster, key, old)))
    d.RESULTS[-1]["note"] += f"; its dead entry left /health after {gone[0]:.1f} s"
    assert stats.failed == 0, stats.summary()
    assert gone[0] < DEAD_GONE_S, f"the killed process stayed listed for {gone[0]:.1f} s"


def test_nats_away_60s(cluster):
    """NATS carries the KV-event plane here (DYN_EVENT_PLANE=nats); the request plane is TCP."""
    ends = []
    stats, rec = d.drill(cluster, "NATS away 60 s (lease TTL 120)", _outage(cluster, "nats", 60, ends),
                         _routed(cluster, ends), note="recovery from NATS's start")
    assert stats.failed == 0, stats.summary()
    assert rec < ROUTING_S, rec
