"""The planner's decisions carried out (m3_planner, issue 27; docs/PLANNER.md), under load on the local testbed.

    M3_PLANNER_TESTBED=m3pl M3_PLANNER_SUBNET=10.160.0.0/24 python3 -m pytest -p no:cacheprovider -m drills \
        tests/e2e/test_drills_planner.py

Opt-in (`-m drills`). Brings its testbed up (1 control host, 1 mocker worker, 1 standby worker host:
M3_TESTBED_STANDBY=1), deploys with m3_planner (cool-down COOLDOWN_S, `planner: external`), then:
- a load step of 3x (tests/e2e/load.py: BASE -> 3 x BASE clients) and a scale-out decision: the actuator starts the
  standby host's worker, the frontend routes to it, TTFT p99 (the frontend's histogram) is under the target;
- a decision above max: clamped, nothing started; the actuator restarted: the decision it handled is not redone;
- the load back to BASE and a scale-in decision (inside the cool-down: carried out when it ends): the standby worker
  is drained and stopped with 0 failed requests;
writes benchmarks/results/planner-<UTC start>.md (figures, the actuator's and the agent's journal lines) and
brings the testbed down (M3_E2E_KEEP=1 keeps it).

Who decides: with M3_PLANNER_POLICY=dynamo, Dynamo 1.6.1's own planner (the m3-planner unit; `planner: local`,
AISimulate's dev build from PyPI, optimization_target `load`: docs/PLANNER.md), and the drill waits for its
decisions; else tests/e2e/planner_publish.py publishes them through the runtime's own VirtualConnectorCoordinator
(what the planner's VirtualConnector calls), which also drives what a policy cannot be made to do on cue: a decision
above max, the actuator's restart. Everything downstream of the decision is the product, for real.

    M3_PLANNER_POLICY=dynamo python3 -m pytest -p no:cacheprovider -m drills tests/e2e/test_drills_planner.py
"""
from __future__ import annotations

import datetime
import json
import os
import re
import subprocess
import time
import urllib.request

import pytest
import tbrun
import test_drills as d

from load import Load
from m3deploy.check import rollout
from m3deploy.check.checks import frontend_url, metrics_url
from m3deploy.core import planner

pytestmark = [pytest.mark.drills, pytest.mark.e2e]

NAME = os.environ.get("M3_PLANNER_TESTBED", "m3pl")
SUBNET = os.environ.get("M3_PLANNER_SUBNET", "10.160.0.0/24")
CONFIG = f"/tmp/m3-e2e-{NAME}-config"
ENV = {**os.environ, "M3_TESTBED": NAME, "M3_TESTBED_CONTROL": "1", "M3_TESTBED_STANDBY": "1",
       "M3DEPLOY_CONFIG": CONFIG}
TB = tbrun.Testbed(NAME, SUBNET, 3, ENV)
COOLDOWN_S = 60  # longer than the step's phases: the scale-in decision comes inside it and waits
TTFT_TARGET_MS = 500  # m3_planner's ttft_ms default: the planner's target
# M3_PLANNER_POLICY=dynamo: Dynamo's own 1.6.1 planner decides (planner 'local', AISimulate's dev build from PyPI,
# optimization_target 'load'); else the decisions are this drill's, published by tests/e2e/planner_publish.py
DYNAMO = os.environ.get("M3_PLANNER_POLICY", "") == "dynamo"
AISIMULATE = "aisimulate==0.13.0.dev202610270000000085"  # PyPI's build (the 0.13.0 pin is on NVIDIA's index)
# KV use the mocker reports for tests/e2e/load.py with MAX_TOKENS, seen on the testbed (262144 tokens of cache):
# ~0.17% per client -> 1 client on 1 worker 0.17%, the 3x step 0.5%; on 2 workers 0.26% and 0.09%
LOAD_TARGET = {"optimization_target": "load", "scale_up_kv_pct": 0.35, "scale_down_kv_pct": 0.12, "interval_s": 5}
SETTING = ({"cooldown_s": COOLDOWN_S, "planner": "local", "ttft_ms": TTFT_TARGET_MS, "aisimulate": AISIMULATE,
            **LOAD_TARGET} if DYNAMO else {"cooldown_s": COOLDOWN_S, "planner": "external", "ttft_ms": TTFT_TARGET_MS})
DATA = f"m3_planner={json.dumps(SETTING)}"
BASE = 1 if DYNAMO else 2  # clients before and after the step; the step is 3x
MAX_TOKENS = 400 if DYNAMO else 24  # long answers: the KV use the planner reads is steadier
STARTED = datetime.datetime.now(datetime.timezone.utc)
ROWS: list[dict] = []


def _plan():
    return TB.plan((DATA,))


class Publisher:
    """tests/e2e/planner_publish.py on the control host, kept up (its etcd lease holds the decision)."""

    def __init__(self, plan, control: str):
        ssh = ["ssh", "-F", f"/var/lib/m3deploy/testbed/{NAME}/ssh_config", control]
        src = os.path.join(d.REPO, "tests", "e2e", "planner_publish.py")
        with open(src) as f:
            subprocess.run([*ssh, "cat > /root/planner_publish.py"], stdin=f, check=True, timeout=30)
        act = plan.host(control).service(planner.ACTUATOR_UNIT)
        self.proc = subprocess.Popen([*ssh, f"{plan.venv}/bin/python /root/planner_publish.py {act.env_file} "
                                            f"{planner.NAMESPACE} 2>/dev/null"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert json.loads(self.proc.stdout.readline()) == {"ready": True}

    def decide(self, n: int) -> int:
        self.proc.stdin.write(f"{n}\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())["decision_id"]

    def close(self):
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


@pytest.fixture(scope="module")
def cluster(testbed_up):
    with testbed_up(TB, deploy=("--data", DATA), timeout=1500):
        plan = _plan()
        control = plan.group("control")[0].name
        pub = None if DYNAMO else Publisher(plan, control)
        yield plan, control, pub
        if pub:
            pub.close()
        _write(plan, control)


def _journal(host: str, unit: str, since: str) -> list[str]:
    out = d.on(host, f"journalctl -u {unit} --no-pager -o short-iso --since '{since}' | grep -E ' (decision|action): '"
                     " || true", name=NAME)
    return [re.sub(r"^(\S+) \S+ \S+ ", r"\1 ", x) for x in out.splitlines() if x.strip()]


def _ttft_buckets(plan) -> dict[float, float]:
    with urllib.request.urlopen(frontend_url(plan, "/metrics"), timeout=10) as r:
        text = r.read().decode()
    out: dict[float, float] = {}
    for m in re.finditer(r'^dynamo_frontend_time_to_first_token_seconds_bucket\{[^}]*le="([^"]+)"[^}]*\} (\S+)$',
                         text, re.M):
        le = float("inf") if m.group(1) == "+Inf" else float(m.group(1))
        out[le] = out.get(le, 0.0) + float(m.group(2))
    return out


def _p99_ms(before: dict, after: dict) -> float:
    """TTFT p99 (ms) of the requests between two scrapes: the first bucket bound holding 99% of them."""
    diff = sorted((le, after.get(le, 0) - before.get(le, 0)) for le in after)
    total = diff[-1][1] if diff else 0
    if not total:
        return float("nan")
    return next(le for le, n in diff if n >= 0.99 * total) * 1000


def _listed(plan, n: int, timeout_s: float = 120) -> float:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        with urllib.request.urlopen(frontend_url(plan, "/health"), timeout=10) as r:
            doc = json.loads(r.read())
        ids = {i.get("instance_id") for i in doc.get("instances", []) if i.get("endpoint") == "generate"
               and i.get("component") == "backend"}
        if len(ids) == n:
            return time.monotonic() - t0
        time.sleep(0.5)
    raise AssertionError(f"the frontend did not list {n} backend worker(s) in {timeout_s} s: {doc}")


def _row(name, stats, p99, note):
    ROWS.append({"drill": name, "stats": stats, "p99": p99, "note": f"{note}; load {os.getloadavg()[0]:.1f}"})
    print(f"{name}: {stats.summary()}; TTFT p99 {p99:.0f} ms; {note}")


def _wait_journal(host, unit, since, pattern, timeout_s=180) -> str:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        hit = [x for x in _journal(host, unit, since) if re.search(pattern, x)]
        if hit:
            return hit[-1]
        time.sleep(1)
    raise AssertionError(f"{unit} on {host}: no {pattern!r} in {timeout_s} s: {_journal(host, unit, since)[-10:]}")


def test_scale_out_under_a_3x_step_and_in_with_zero_failed(cluster):
    plan, control, pub = cluster
    standby = plan.group(planner.STANDBY_GROUP)[0].name
    unit = next(s.unit for s in plan.host(standby).services if s.kind == "worker")
    assert d.on(standby, f"systemctl is-active {unit} || true", name=NAME).strip() == "inactive"  # staged only
    assert d.on(standby, f"systemctl is-enabled {unit} || true", name=NAME).strip() == "disabled"
    _listed(plan, 1)
    model = plan.served_model_name
    since = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S")

    with Load(plan.endpoint, model, concurrency=BASE, duration_s=600, max_tokens=MAX_TOKENS) as load:  # baseline
        b0 = _ttft_buckets(plan)
        time.sleep(20)
        stats = load.stop()
    _row(f"baseline, {BASE} clients, 1 worker", stats, _p99_ms(b0, _ttft_buckets(plan)), "before the step")

    with Load(plan.endpoint, model, concurrency=3 * BASE, duration_s=600, max_tokens=MAX_TOKENS) as load:  # the 3x step
        time.sleep(10)
        b1 = _ttft_buckets(plan)
        time.sleep(10)
        p99_before = _p99_ms(b1, _ttft_buckets(plan))
        t0 = time.monotonic()
        did = _planner_decides(control, since, 2) if DYNAMO else pub.decide(2)
        started = _wait_journal(control, planner.ACTUATOR_UNIT, since, rf"action: start {standby} done")
        took = time.monotonic() - t0
        _listed(plan, 2)
        b2 = _ttft_buckets(plan)
        time.sleep(20)
        p99_after = _p99_ms(b2, _ttft_buckets(plan))
        stats = load.stop()
    _row(f"3x step ({3 * BASE} clients), decision {did}: 2 workers", stats, p99_after,
         f"TTFT p99 {p99_before:.0f} ms at 1 worker under the step; standby serving {took:.1f} s after the drill "
         f"{'saw the planner publish it' if DYNAMO else 'published it'} "
         f"({started.split(': ', 1)[1]})")
    assert d.on(standby, f"systemctl is-active {unit}", name=NAME).strip() == "active"
    assert p99_after < TTFT_TARGET_MS, f"TTFT p99 {p99_after:.0f} ms after the scale-out >= {TTFT_TARGET_MS} ms"

    if DYNAMO:  # the planner's own scale-in, when the load drops (its decision may wait out the cool-down)
        _dynamo_scale_in(plan, control, standby, unit, model, since, started)
        return
    # above max: clamped to max (2 = what serves), acknowledged, nothing started
    did_max = pub.decide(5)
    _wait_journal(control, planner.ACTUATOR_UNIT, since, rf"id {did_max}: acknowledged")
    assert [x for x in _journal(control, planner.ACTUATOR_UNIT, since) if f"id {did_max}: ack:" in x]

    # the actuator restarted: the decision it handled is not redone
    d.on(control, f"systemctl restart {planner.ACTUATOR_UNIT}", name=NAME)
    up = _wait_journal(control, planner.ACTUATOR_UNIT, since, r"actuator up: state \{")
    time.sleep(6)
    after_restart = _journal(control, planner.ACTUATOR_UNIT, since)
    after_restart = after_restart[after_restart.index(up):]
    assert f"'acted_id': {did_max}" in up, up
    assert not [x for x in after_restart if " action: " in x], after_restart

    # the load drops back; scale in (the cool-down from the start above may still hold it): 0 failed
    with Load(plan.endpoint, model, concurrency=BASE, duration_s=600, max_tokens=MAX_TOKENS) as load:
        time.sleep(5)
        b3 = _ttft_buckets(plan)
        t0 = time.monotonic()
        did_in = pub.decide(1)
        stopped = _wait_journal(control, planner.ACTUATOR_UNIT, since, rf"action: stop {standby} done")
        took = time.monotonic() - t0
        held = [x for x in _journal(control, planner.ACTUATOR_UNIT, since) if f"id {did_in}: wait:" in x]
        _listed(plan, 1)
        time.sleep(10)
        stats = load.stop()
    _row(f"load back to {BASE} clients, decision {did_in}: 1 worker", stats, _p99_ms(b3, _ttft_buckets(plan)),
         f"{'held by the cool-down' if held else 'NOT held'}, then drained and stopped {took:.1f} s after the decision "
         f"({stopped.split(': ', 1)[1]})")
    assert stats.failed == 0, f"scale-in failed requests: {stats.summary()}"
    assert held, "the scale-in decision came inside the cool-down but was not held"
    t_start = datetime.datetime.fromisoformat(started.split(" ", 1)[0])
    t_stop = datetime.datetime.fromisoformat(stopped.split(" ", 1)[0])
    assert (t_stop - t_start).total_seconds() >= COOLDOWN_S - 1, (started, stopped)  # not before the cool-down
    assert d.on(standby, f"systemctl is-active {unit} || true", name=NAME).strip() == "inactive"
    rollout.wait_workers(frontend_url(plan, "/health"), {
        f"{h.name}/{s.name}": metrics_url(h, s) for h in plan.hosts for s in h.services
        if s.kind == "worker" and not s.standby}, timeout_s=30)
    os.environ["M3_PLANNER_SINCE"] = since


def _planner_decides(control: str, since: str, n: int, timeout_s: float = 180) -> int:
    """Dynamo's planner publishes a decision for n workers by itself: its id, from the actuator's journal."""
    hit = _wait_journal(control, planner.ACTUATOR_UNIT, since, rf"decision: id \d+: (scale|wait): planner wants {n},",
                        timeout_s)
    return int(re.search(r"decision: id (\d+)", hit).group(1))


def _dynamo_scale_in(plan, control, standby, unit, model, since, started) -> None:
    with Load(plan.endpoint, model, concurrency=BASE, duration_s=600, max_tokens=MAX_TOKENS) as load:
        b3 = _ttft_buckets(plan)
        t0 = time.monotonic()
        stopped = _wait_journal(control, planner.ACTUATOR_UNIT, since, rf"action: stop {standby} done", 240)
        took = time.monotonic() - t0
        did_in = _planner_decides(control, since, 1, 5)
        _listed(plan, 1)
        time.sleep(10)
        stats = load.stop()
    _row(f"load back to {BASE} client(s), the planner's decision {did_in}: 1 worker", stats,
         _p99_ms(b3, _ttft_buckets(plan)), f"drained and stopped {took:.1f} s after the load dropped "
         f"({stopped.split(': ', 1)[1]})")
    assert stats.failed == 0, f"scale-in failed requests: {stats.summary()}"
    t_start = datetime.datetime.fromisoformat(started.split(" ", 1)[0])
    t_stop = datetime.datetime.fromisoformat(stopped.split(" ", 1)[0])
    assert (t_stop - t_start).total_seconds() >= COOLDOWN_S - 1, (started, stopped)  # not before the cool-down
    assert d.on(standby, f"systemctl is-active {unit} || true", name=NAME).strip() == "inactive"
    os.environ["M3_PLANNER_SINCE"] = since


def _write(plan, control) -> None:
    if not ROWS:
        return
    since = os.environ.get("M3_PLANNER_SINCE", STARTED.strftime("%Y-%m-%d %H:%M:%S"))
    standby = plan.group(planner.STANDBY_GROUP)[0].name
    commit = tbrun.commit()
    path = os.path.join(d.REPO, "benchmarks", "results",
                        f"planner-{'dynamo-' if DYNAMO else ''}{STARTED:%Y-%m-%d-%H%M}.md")
    lines = [f"# The planner's decisions carried out ({STARTED:%Y-%m-%d %H:%M} UTC, commit {commit})", "",
             f"`{'M3_PLANNER_POLICY=dynamo ' if DYNAMO else ''}python3 -m pytest -p no:cacheprovider -m drills "
             "tests/e2e/test_drills_planner.py`: one 2-core machine "
             "shared with other helpers (`load`: its 1-minute load average), 1 control host + 1 mocker worker + 1 "
             f"standby host, m3_planner = `{json.dumps(SETTING)}`, tests/e2e/load.py (max_tokens {MAX_TOKENS}), no "
             "retries. " + ("Decisions: Dynamo 1.6.1's own planner (`python -m dynamo.planner`, the m3-planner "
                            "unit, M3_PLANNER_POLICY=dynamo)" if DYNAMO else "Decisions published through Dynamo's "
                            "VirtualConnectorCoordinator by tests/e2e/planner_publish.py (the drill's, not a policy's)")
             + "; TTFT p99 from the frontend's histogram (bucket bound).", "",
             "| phase | sent | ok | failed | TTFT p99 ms | notes |", "|---|---|---|---|---|---|"]
    for r in ROWS:
        s = r["stats"]
        lines.append(f"| {r['drill']} | {s.sent} | {s.ok} | {s.failed} | {r['p99']:.0f} | {r['note']} |")
    if DYNAMO:
        said = d.on(control, f"journalctl -u {planner.PLANNER_UNIT} --no-pager -o cat --since '{since}' | "
                    "sed 's/\x1b\\[[0-9;]*m//g' | grep -E 'SCALE_(UP|DOWN)|threshold' || true", name=NAME)
        lines += ["", f"## Dynamo's planner: its scaling decisions (journalctl -u {planner.PLANNER_UNIT} on {control})",
                  "", "```", *[x for x in said.splitlines() if x.strip()], "```"]
    lines += ["", f"## The actuator's decisions and actions (journalctl -u {planner.ACTUATOR_UNIT} on {control})", "",
              "```", *_journal(control, planner.ACTUATOR_UNIT, since), "```", "",
              f"## The standby agent's actions (journalctl -u {planner.AGENT_UNIT} on {standby})", "",
              "```", *_journal(standby, planner.AGENT_UNIT, since), "```", ""]
    with open(path, "w") as f:
        f.write("\n".join(lines))
