"""Day-2 drills under load on the local testbed (issue 12): crashes, restarts, outages and a rolling change,
each while a real load client (tests/e2e/load.py: the openai client on asyncio, streaming and non-streaming
chat, no retries) counts every request and every failure.

    M3_DRILLS_TESTBED=m3drl M3_DRILLS_SUBNET=10.84.0.0/24 python3 -m pytest -p no:cacheprovider -m drills tests/e2e/test_drills.py

Opt-in (`-m drills`; the default run deselects them, see pyproject.toml): they take ~6 minutes of wall time
on top of a deploy. The module brings its testbed up (1 control host + 3 mocker workers), deploys, runs the
drills in file order, writes the figures (sent / ok / failed / recovery seconds per drill) to
benchmarks/results/drills-<date>.md, and brings the testbed down (M3_E2E_KEEP=1 keeps it).

Recovery is measured from the fault (or the end of the outage) until every planned worker is listed by the
frontend under the id of its running process and the faulted one has served a request (m3deploy.check.rollout).
Traffic goes only to the testbed's addresses; every load loop is bounded in requests and seconds.
"""
from __future__ import annotations

import datetime
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass

import pytest

from load import Load, Stats
from m3deploy.check import rollout
from m3deploy.testbed import core as testbed
from m3deploy.check.checks import frontend_url, instance_services, metrics_url

pytestmark = [pytest.mark.drills, pytest.mark.e2e]

NAME = os.environ.get("M3_DRILLS_TESTBED", "m3drl")
SUBNET = os.environ.get("M3_DRILLS_SUBNET", "10.84.0.0/24")
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
INVENTORY = "inventories/testbed.py"
ENV = {**os.environ, "M3_TESTBED": NAME, "M3_TESTBED_CONTROL": "1"}
RECOVER_S = 10.0  # a killed worker is routable again within this (issue 12)
RESULTS: list[dict] = []


@dataclass
class Cluster:
    plan: object
    health: str
    heads: dict[str, str]  # "host/service" of each planned worker's rank 0 -> its /metrics
    control: str
    workers: list[str]


def pyinfra(*extra: str, timeout: int = 400) -> subprocess.CompletedProcess:
    exe = shutil.which("pyinfra")
    args = [exe] if exe else [sys.executable, "-m", "pyinfra"]
    return subprocess.run([*args, "-y", INVENTORY, "deploy.py", *extra], cwd=REPO, env=ENV, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout)


def on(host: str, cmd: str, timeout: float = 60) -> str:
    res = testbed.run_on(NAME, host, cmd, timeout=timeout)
    assert res.returncode == 0, f"{host}: {cmd!r} failed ({res.returncode}): {res.stdout}{res.stderr}"
    return res.stdout


def _plan():
    from m3deploy.cli import load_plan

    old = {k: os.environ.get(k) for k in ("M3_TESTBED", "M3_TESTBED_CONTROL")}
    os.environ.update(M3_TESTBED=NAME, M3_TESTBED_CONTROL="1")
    try:
        return load_plan(os.path.join(REPO, INVENTORY), facts=False)
    finally:
        for k, v in old.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)


@pytest.fixture(scope="module")
def cluster():
    testbed.up(4, name=NAME, subnet=SUBNET, log=lambda *a, **k: None)
    res = pyinfra()
    assert res.returncode == 0, res.stdout[-4000:]
    plan = _plan()
    heads = {f"{h.name}/{s.name}": metrics_url(h, s) for h, s in instance_services(plan)}
    c = Cluster(plan, frontend_url(plan, "/health"), heads, plan.group("control")[0].name,
                [k.split("/")[0] for k in heads])
    yield c
    _write_results()
    if not os.environ.get("M3_E2E_KEEP"):
        testbed.down(name=NAME, log=lambda *a, **k: None)


def _write_results() -> None:
    if not RESULTS:
        return
    day = datetime.date.today().isoformat()
    path = os.path.join(REPO, "benchmarks", "results", f"drills-{day}.md")
    lines = [f"# Drills under load ({day})", "",
             "`python3 -m pytest -p no:cacheprovider -m drills tests/e2e/test_drills.py` on the local testbed: "
             "1 control host (etcd, NATS, frontend with --migration-limit 3) and 3 mocker workers; load: "
             "tests/e2e/load.py, 4 concurrent clients, streaming and non-streaming chat, max_tokens 24, no "
             "retries. Recovery: from the fault (or the end of the outage) until every planned worker is "
             "listed under its running process's id and has served (m3deploy.check.rollout).", "",
             "| drill | sent | ok | failed | recovery s | failures | notes |", "|---|---|---|---|---|---|---|"]
    rows = {}  # drill -> table row; rows of drills not run this time (-k) stay from the same day's file
    if os.path.exists(path):
        for line in open(path).read().splitlines()[len(lines):]:
            if line.startswith("| "):
                rows[line.split(" | ")[0][2:]] = line
    for r in RESULTS:
        s: Stats = r["stats"]
        errs = ", ".join(f"{n}× {e}" for e, n in s.errors.most_common()) or "-"
        rows[r["drill"]] = (f"| {r['drill']} | {s.sent} | {s.ok} | {s.failed} | {r['recovery']:.1f} | {errs} | "
                            f"{r.get('note', '')} |")
    lines += rows.values()
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


def _ids(c: Cluster, key: str, timeout_s: float = 30) -> set[str]:
    """The instance id(s) of the process running `key` now (waits while it is restarting)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            ids = set(rollout.worker_counts(c.heads[key]))
            if ids:
                return ids
        except OSError:
            if time.monotonic() > deadline:
                raise
        time.sleep(0.2)


def all_registered(c: Cluster, timeout_s: float = 120) -> float:
    return rollout.wait_workers(c.health, c.heads, timeout_s=timeout_s, interval_s=0.2)


def back(c: Cluster, key: str, old: set[str], timeout_s: float = 120) -> float:
    """Until `key` runs a new process that the frontend lists and routes to (the load's requests reach it)."""
    return rollout.wait_routable(key, c.health, c.heads[key], old, send=lambda: None, timeout_s=timeout_s)


def drill(c: Cluster, name: str, fault, recover, note: str = "", settle_s: float = 3.0,
          all_back: bool = True) -> tuple[Stats, float]:
    """Steady load for settle_s, the fault, the recovery wait, settle_s more load; record the figures.
    all_back: every planned worker is registered again afterwards."""
    with Load(c.plan.endpoint, c.plan.served_model_name, concurrency=4, duration_s=240) as load:
        time.sleep(settle_s)
        t0 = time.monotonic()
        fault()
        recovery = recover(t0)
        time.sleep(settle_s)
        stats = load.stop()
    assert stats.ok > 0, f"the load client got no answer at all: {stats.summary()}"
    if all_back:
        all_registered(c, 60)
    RESULTS.append({"drill": name, "stats": stats, "recovery": recovery, "note": note})
    print(f"{name}: {stats.summary()}; recovery {recovery:.1f} s")
    return stats, recovery


def since(t0: float, wait) -> float:
    wait()
    return time.monotonic() - t0


# ------------------------------------------------------------------------------------------------ drills
def _worker_drill(c: Cluster, index: int, name: str, command: str, note: str) -> tuple[Stats, float]:
    """`systemctl <command> UNIT` on worker `index` under load; recovery: its new process routable again."""
    key = list(c.heads)[index]
    host, unit = key.split("/")
    old = _ids(c, key)
    return drill(c, name, lambda: on(host, f"systemctl {command} {unit}"),
                 lambda t0: since(t0, lambda: back(c, key, old)), note=note)


def test_sigkill_worker(cluster):
    stats, rec = _worker_drill(cluster, 0, "SIGKILL one worker", "kill -s KILL",
                               "systemd restarts it (Restart=always, RestartSec=1); in-flight requests migrate")
    assert stats.failed == 0, stats.summary()
    assert rec < RECOVER_S, f"routable again only after {rec:.1f} s"


def test_restart_worker(cluster):
    stats, _ = _worker_drill(cluster, 1, "`systemctl restart` one worker", "restart",
                             "SIGTERM: it unregisters, drains, restarts")
    assert stats.failed == 0, stats.summary()


def test_crash_loop_is_never_given_up(cluster):
    key = list(cluster.heads)[2]
    host, unit = key.split("/")
    before = int(on(host, f"systemctl show -p NRestarts --value {unit}").strip() or 0)
    last: set[str] = set()

    def kills():
        for i in range(5):
            if i:
                time.sleep(2.5)
            last.clear()
            last.update(_ids(cluster, key) if i else set())
            on(host, f"systemctl kill -s KILL {unit}")
    stats, rec = drill(cluster, "crash loop: kill -9 ×5, 2.5 s apart", kills,
                       lambda t0: _back_after(cluster, key, last),
                       note="StartLimitIntervalSec=0: never given up; recovery after the last kill")
    restarts = int(on(host, f"systemctl show -p NRestarts --value {unit}").strip() or 0)
    assert restarts >= before + 5, (before, restarts)
    assert on(host, f"systemctl is-active {unit}").strip() == "active"
    assert stats.failed == 0, stats.summary()
    assert rec < RECOVER_S, rec


def _back_after(c: Cluster, key: str, old: set[str]) -> float:
    t0 = time.monotonic()
    back(c, key, old, timeout_s=60)
    return time.monotonic() - t0


def test_rolling_change_of_every_worker(cluster):
    """A worker-only change (the mocker's speed) rolls the 3 workers one at a time: 0 failed requests."""
    runs = []

    def change():
        runs.append(pyinfra("--data", "m3_mocker_speedup_ratio=8"))
    stats, rec = drill(cluster, "rolling change of every worker (m3_mocker_speedup_ratio 10 → 8)", change,
                       lambda t0: time.monotonic() - t0, note="the deploy's own wall time as recovery")
    run = runs[0]
    assert run.returncode == 0, run.stdout[-4000:]
    rolled = re.findall(r"rolled worker (\d+) ", run.stdout)
    assert sorted(rolled) == ["0", "1", "2"], run.stdout[-4000:]
    assert "Restart m3-frontend.service" not in _changed_ops(run.stdout)
    assert stats.failed == 0, stats.summary()
    # and back, the same way
    runs.clear()
    stats, _ = drill(cluster, "rolling change back (8 → 10)", lambda: runs.append(pyinfra()),
                     lambda t0: time.monotonic() - t0, note="the deploy's own wall time as recovery")
    assert runs[0].returncode == 0, runs[0].stdout[-4000:]
    assert stats.failed == 0, stats.summary()


def test_failed_rollout_stops_and_the_rest_keep_serving(cluster):
    """A change whose new version does not start: the rollout stops at the first instance with its journal tail,
    the others keep serving the previous version; re-running with the previous data rolls it back."""
    pids = {h: on(h, "systemctl show -p MainPID --value m3-worker@0") for h in cluster.workers}
    runs = []
    bad = ("--data", 'm3_extra_args=["--no-such-flag"]', "--data", "m3_readiness_timeout_s=15")
    stats, _ = drill(cluster, "bad change (unknown engine flag): rollout stops at worker 0",
                     lambda: runs.append(pyinfra(*bad)), lambda t0: time.monotonic() - t0, all_back=False,
                     note="the deploy's wall time; workers 1-2 never stopped")
    run = runs[0]
    assert run.returncode != 0, run.stdout[-3000:]
    assert "rolling restart stopped at worker 0" in run.stdout, run.stdout[-3000:]
    assert "not rolled, still serving the previous version: [1, 2]" in run.stdout, run.stdout[-3000:]
    assert "no-such-flag" in run.stdout  # the journal tail names the cause
    # and the whole deploy stops there (roles/_failfast.py): no later operation ran on any host
    assert "failed at 'Roll the workers | Roll the changed workers" in run.stdout, run.stdout[-3000:]
    assert "Starting operation: Every host has reached: workers started" not in run.stdout
    for h in cluster.workers[1:]:
        assert on(h, "systemctl show -p MainPID --value m3-worker@0") == pids[h], h
    assert stats.failed == 0, stats.summary()
    runs.clear()
    stats, _ = drill(cluster, "roll back: re-run with the previous data", lambda: runs.append(pyinfra()),
                     lambda t0: time.monotonic() - t0, note="the deploy's wall time")
    assert runs[0].returncode == 0, runs[0].stdout[-3000:]
    assert re.findall(r"rolled worker (\d+) |started (\d+) worker", runs[0].stdout), runs[0].stdout[-3000:]
    assert stats.failed == 0, stats.summary()


def _changed_ops(out: str) -> list[str]:
    """Results-table rows with a Success count (the op changed something on some host)."""
    rows = re.findall(r"^\s{4}(\S.*?)\s{2,}(\d+|-)\s+(\d+|-)\s+(\d+|-)\s+(\d+|-)\s*$", out, re.M)
    return [r[0] for r in rows if r[2] not in ("-", "0")]


def test_restart_nats(cluster):
    stats, rec = drill(cluster, "restart NATS", lambda: on(cluster.control, "systemctl restart nats"),
                       lambda t0: since(t0, lambda: all_registered(cluster)))
    assert stats.failed == 0, stats.summary()


def test_restart_etcd(cluster):
    stats, rec = drill(cluster, "restart etcd", lambda: on(cluster.control, "systemctl restart etcd"),
                       lambda t0: since(t0, lambda: all_registered(cluster)))
    assert stats.failed == 0, stats.summary()


def test_etcd_down_30s_recovers_without_a_manual_step(cluster):
    """Longer than the leases: Dynamo's processes exit 0; Restart=always brings them back once etcd is."""
    ends = []

    def outage():
        on(cluster.control, "systemctl stop etcd")
        time.sleep(30)
        on(cluster.control, "systemctl start etcd")
        ends.append(time.monotonic())

    def recover(t0):
        all_registered(cluster, timeout_s=180)
        _serves(cluster)
        return time.monotonic() - ends[0]
    stats, rec = drill(cluster, "etcd down 30 s", outage, recover,
                       note="recovery counted from etcd's start; no manual step")
    assert rec < 150, rec


def _serves(c: Cluster, timeout_s: float = 60) -> None:
    import openai

    client = openai.OpenAI(base_url=c.plan.endpoint, api_key="none", max_retries=0, timeout=10)
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            client.chat.completions.create(model=c.plan.served_model_name, max_tokens=4,
                                           messages=[{"role": "user", "content": "up?"}])
            return
        except openai.APIError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def test_restart_frontend(cluster):
    stats, rec = drill(cluster, "restart the frontend", lambda: on(cluster.control, "systemctl restart m3-frontend"),
                       lambda t0: since(t0, lambda: (all_registered(cluster), _serves(cluster))),
                       note="one frontend: requests in flight and those sent in the gap fail")
    assert rec < RECOVER_S, rec


def test_hung_frontend_is_restarted_by_the_watchdog(cluster):
    """A frontend that stops answering but does not exit (seen after a 30 s etcd outage: `Runtime shutdown
    initiated`, HTTP port closed, process alive), simulated with SIGSTOP: m3-frontend-watchdog restarts it."""
    def hang():
        on(cluster.control, "kill -STOP $(systemctl show -p MainPID --value m3-frontend)")
    stats, rec = drill(cluster, "frontend hung (SIGSTOP), restarted by the watchdog", hang,
                       lambda t0: since(t0, lambda: (_serves(cluster, timeout_s=90), all_registered(cluster))),
                       note="watchdog grace 15 s + restart; requests in the gap fail")
    log = on(cluster.control, "journalctl -u m3-frontend-watchdog --no-pager -o cat -n 20")
    assert "has not answered for 15 s while the unit is active: restarting it" in log, log
    assert rec < 45, rec


def test_unreachable_host_changes_nothing(cluster):
    """A worker host that SSH cannot reach at the start: the deploy stops naming it, before any change."""
    st = testbed.load_state(NAME)
    lost = next(h for h in st["hosts"] if h["name"] == cluster.workers[-1])
    others = [h for h in cluster.workers if h != lost["name"]]
    envs = {h: on(h, "sha256sum /etc/m3/m3-worker@0.env") for h in others}
    pids = {h: on(h, "systemctl show -p MainPID --value m3-worker@0") for h in others}
    subprocess.run(["ip", "-n", lost["netns"], "link", "set", "eth0", "down"], check=True)
    try:
        run = pyinfra("--data", "m3_mocker_speedup_ratio=7", timeout=200)
    finally:
        subprocess.run(["ip", "-n", lost["netns"], "link", "set", "eth0", "up"], check=True)
    assert run.returncode != 0, run.stdout[-3000:]
    assert f"cannot reach {lost['name']}, nothing was changed" in run.stdout, run.stdout[-3000:]
    for h in others:
        assert on(h, "sha256sum /etc/m3/m3-worker@0.env") == envs[h], h
        assert on(h, "systemctl show -p MainPID --value m3-worker@0") == pids[h], h
    t0 = time.monotonic()
    all_registered(cluster, timeout_s=120)  # its worker, if its lease ran out, came back on its own
    RESULTS.append({"drill": f"worker host {lost['name']} unreachable at deploy start", "stats": Stats(),
                    "recovery": time.monotonic() - t0,
                    "note": "deploy exit %d before any change, naming the host; no load" % run.returncode})
