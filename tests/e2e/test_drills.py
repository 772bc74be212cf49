"""Day-2 drills under load on the local testbed (issue 12): crashes, restarts, outages and a rolling change,
each while a real load client (tests/e2e/load.py: the openai client on asyncio, streaming and non-streaming
chat, no retries) counts every request and every failure.

    M3_DRILLS_TESTBED=m3drl M3_DRILLS_SUBNET=10.84.0.0/24 python3 -m pytest -p no:cacheprovider -m drills tests/e2e/test_drills.py

Opt-in (`-m drills`; the default run deselects them, see pyproject.toml): ~15 minutes on a 2-core machine, both
testbeds' deploys included. The module brings its testbed up (1 control host + 3 mocker workers), deploys, runs the
drills in file order, writes the figures (sent / ok / failed / recovery seconds per drill) to
benchmarks/results/drills-<UTC start>.md, and brings the testbed down (M3_E2E_KEEP=1 keeps it).

Recovery is measured from the fault (or the end of the outage) until every planned worker is listed by the
frontend under the id of its running process and the faulted one has served a request (m3deploy.check.rollout).
Traffic goes only to the testbed's addresses; every load loop is bounded in requests and seconds.
"""
from __future__ import annotations

import collections
import datetime
import json
import os
import re
import signal
import subprocess
import time
from dataclasses import dataclass

import pytest
import tbrun

from load import Load, Stats
from m3deploy.check import rollout
from m3deploy.check.checks import frontend_url, instance_services, metrics_url
from m3deploy.testbed import core as testbed

pytestmark = [pytest.mark.drills, pytest.mark.e2e]

NAME = os.environ.get("M3_DRILLS_TESTBED", "m3drl")
SUBNET = os.environ.get("M3_DRILLS_SUBNET", "10.84.0.0/24")
# the HA drills' testbed: 3 control hosts + 3 workers (its own name and subnet, 10.90: tests' range 10.90-10.99)
HA_NAME = os.environ.get("M3_DRILLS_HA_TESTBED", "m3ha")
HA_SUBNET = os.environ.get("M3_DRILLS_HA_SUBNET", "10.90.0.0/24")
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
INVENTORY = "inventories/testbed.py"
ENV = {**os.environ, "M3_TESTBED": NAME, "M3_TESTBED_CONTROL": "1"}
HA_ENV = {**os.environ, "M3_TESTBED": HA_NAME, "M3_TESTBED_CONTROL": "3"}
TB = tbrun.Testbed(NAME, SUBNET, 4, ENV)
HA_TB = tbrun.Testbed(HA_NAME, HA_SUBNET, 6, HA_ENV)
RECOVER_S = 10.0  # a killed worker is routable again within this (issue 12)
LOAD_TIMEOUT_S = 30.0  # the load client's per-request timeout (tests/e2e/load.py --timeout-s default)
RESULTS: list[dict] = []


@dataclass
class Cluster:
    plan: object
    health: str
    heads: dict[str, str]  # "host/service" of each planned worker's rank 0 -> its /metrics
    control: str
    workers: list[str]
    env: dict = None  # pyinfra's environment for this testbed


def pyinfra(*extra: str, timeout: int = 400, env: dict = ENV) -> subprocess.CompletedProcess:
    return TB.deploy(*extra, timeout=timeout, env=env)


def on(host: str, cmd: str, timeout: float = 60, name: str = NAME) -> str:
    return tbrun.on(name, host, cmd, timeout)


def _plan(env: dict = ENV):
    return tbrun.plan(env)


def _cluster(tb: tbrun.Testbed, testbed_up):
    with testbed_up(tb, deploy=(), timeout=900):
        plan = _plan(tb.env)
        heads = {f"{h.name}/{s.name}": metrics_url(h, s) for h, s in instance_services(plan)}
        c = Cluster(plan, frontend_url(plan, "/health"), heads, plan.group("control")[0].name,
                    [k.split("/")[0] for k in heads], tb.env)
        yield c
        _write_results()


@pytest.fixture(scope="module")
def cluster(testbed_up):
    yield from _cluster(TB, testbed_up)


STARTED = datetime.datetime.now(datetime.timezone.utc)


def _write_results() -> None:
    """One file per run (benchmarks/results/drills-<UTC start>.md), with the commit it ran: rows of one run only."""
    tbrun.write_results(
        "drills", STARTED, "Drills under load",
        "`python3 -m pytest -p no:cacheprovider -m drills tests/e2e/test_drills.py` on the local testbed "
        "(one 2-core machine; `load` in the notes: its 1-minute load average): "
        "1 control host (etcd, NATS, frontend with --migration-limit 3) and 3 mocker workers, and for the "
        "`3 control hosts` drills 3 control hosts (3-member etcd, 3-node NATS, a frontend on each) and 3 "
        "mocker workers; load: "
        "tests/e2e/load.py, 4 concurrent clients, streaming and non-streaming chat, max_tokens 24, no "
        "retries. Recovery: from the fault (or the end of the outage) until every planned worker is "
        "listed under its running process's id and has served (m3deploy.check.rollout). A drill that "
        "failed, or was not selected (-k), has no row.",
        ["drill", "sent", "ok", "failed", "recovery s", "failures", "notes"],
        [[r["drill"], r["stats"].sent, r["stats"].ok, r["stats"].failed, f"{r['recovery']:.1f}",
          tbrun.failures(r["stats"]), r.get("note", "")] for r in RESULTS])


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
          all_back: bool = True, endpoint: str = "") -> tuple[Stats, float]:
    """Steady load for settle_s, the fault, the recovery wait, settle_s more load; record the figures.
    all_back: every planned worker is registered again afterwards. endpoint: the frontend the load goes to
    (default: the plan's)."""
    with Load(endpoint or c.plan.endpoint, c.plan.served_model_name, concurrency=4, duration_s=240) as load:
        time.sleep(settle_s)
        t0 = time.monotonic()
        fault()
        recovery = recover(t0)
        time.sleep(settle_s)
        stats = load.stop()
    assert stats.ok > 0, f"the load client got no answer at all: {stats.summary()}"
    if all_back:
        all_registered(c, 60)
    tbrun.record(RESULTS, name, stats, recovery, note, key="recovery")
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


DEAD_LISTED_S = 5.0  # a killed worker's entry leaves the frontend's /health within this (its lease's TTL is 30 s)


def _gone_from_health(c: Cluster, ids: set[str], t0: float, timeout_s: float = 40) -> float:
    """Seconds from t0 until none of `ids` is listed on the frontend's /health."""
    while rollout.listed_ids(c.health) & ids:
        assert time.monotonic() - t0 < timeout_s, f"{ids} still listed after {timeout_s} s"
        time.sleep(0.1)
    return time.monotonic() - t0


def test_sigkill_worker(cluster):
    """systemd restarts a SIGKILLed worker, and its unit's ExecStopPost (files/m3-unregister-dead.py) revokes the
    records the dead process left, so the frontend stops routing to it at once instead of for up to 30 s."""
    key = list(cluster.heads)[0]
    host, unit = key.split("/")
    old = _ids(cluster, key)
    gone = []

    def kill():
        t0 = time.monotonic()
        on(host, f"systemctl kill -s KILL {unit}")
        gone.append(_gone_from_health(cluster, old, t0))
    stats, rec = drill(cluster, "SIGKILL one worker", kill, lambda t0: since(t0, lambda: back(cluster, key, old)),
                       note="systemd restarts it (Restart=always, RestartSec=1); in-flight requests migrate")
    RESULTS[-1]["note"] += f"; its dead entry left /health after {gone[0]:.1f} s"
    assert stats.failed == 0, stats.summary()
    assert rec < RECOVER_S, f"routable again only after {rec:.1f} s"
    assert gone[0] < DEAD_LISTED_S, f"the killed process stayed listed for {gone[0]:.1f} s"


def test_restart_worker(cluster):
    stats, _ = _worker_drill(cluster, 1, "`systemctl restart` one worker", "restart",
                             "SIGTERM: it unregisters, drains, restarts")
    assert stats.failed == 0, stats.summary()


def test_crash_loop_is_never_given_up(cluster):
    key = list(cluster.heads)[2]
    host, unit = key.split("/")
    before = int(on(host, f"systemctl show -p NRestarts --value {unit}").strip() or 0)
    last: set[str] = set()
    killed: set[str] = set()  # every killed process's id

    def kills():
        for i in range(5):
            if i:
                time.sleep(2.5)
            last.clear()
            last.update(_ids(cluster, key) if i else set())
            killed.update(_ids(cluster, key))
            on(host, f"systemctl kill -s KILL {unit}")
    stats, rec = drill(cluster, "crash loop: kill -9 ×5, 2.5 s apart", kills,
                       lambda t0: _back_after(cluster, key, last),
                       note="StartLimitIntervalSec=0: never given up; recovery after the last kill")
    restarts = int(on(host, f"systemctl show -p NRestarts --value {unit}").strip() or 0)
    assert restarts >= before + 5, (before, restarts)
    assert on(host, f"systemctl is-active {unit}").strip() == "active"
    assert stats.failed == 0, stats.summary()
    assert rec < RECOVER_S, rec
    # no dead process is still listed (their leases' TTL is 30 s): the frontend would route requests to them, and
    # one that met 4 in a row was answered 503 (files/m3-unregister-dead.py, docs/CONTRACTS.md)
    assert len(killed) == 5, killed
    assert not rollout.listed_ids(cluster.health) & killed, "the frontend still lists killed processes"


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
    # each stop took the engine's grace period at least: it unregistered, then waited before shutting down, as
    # dynamo.vllm does (dynamo/common/utils/graceful_shutdown.py, DYN_GRACEFUL_SHUTDOWN_GRACE_PERIOD_SECS=5)
    drained = [float(x) for x in re.findall(r"rolled worker \d+ .*?drained in ([\d.]+) s", run.stdout)]
    assert len(drained) == 3 and min(drained) >= 4.5, run.stdout[-4000:]
    RESULTS[-1]["note"] += "; drained in " + ", ".join(f"{d:.1f}" for d in drained) + " s"
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


def test_worker_host_cut_off_for_30s_comes_back_on_its_own(cluster):
    """A worker host's link goes down for 30 s under load (not powered off: its processes live on). Its worker
    loses its etcd lease and exits 0 (issue 12's journals: `Unable to maintain lease ... Runtime shutdown
    initiated`); Restart=always brings it back once the link is up, with no manual step. The requests routed to it
    before the frontend dropped it fail (they hang until the client's 30 s timeout); once it is dropped, the other
    workers answer everything."""
    key = list(cluster.heads)[-1]
    host = key.split("/")[0]
    netns = next(h["netns"] for h in testbed.load_state(NAME)["hosts"] if h["name"] == host)
    restarts = int(on(host, "systemctl show -p NRestarts --value m3-worker@0"))
    marks = {}

    def cut():
        subprocess.run(["ip", "-n", netns, "link", "set", "eth0", "down"], check=True)
        time.sleep(30)
        subprocess.run(["ip", "-n", netns, "link", "set", "eth0", "up"], check=True)
        marks["up"] = time.monotonic()
    stats, rec = drill(cluster, f"worker host {host} cut off for 30 s (link down), then back", cut,
                       lambda t0: since(marks["up"], lambda: all_registered(cluster, 120)),
                       note="recovery counted from the link's return: every worker listed under its running "
                            "process; failures: requests routed to it before the frontend dropped it")
    again = int(on(host, "systemctl show -p NRestarts --value m3-worker@0"))
    assert again > restarts, f"{host}'s worker was not restarted by systemd ({restarts} -> {again} restarts)"
    assert rec < 60, rec
    # after the link's return nothing new fails: a failure after it is a request sent before it that timed out
    def sent_before(t: float, why: str) -> bool:  # a timeout: it was sent LOAD_TIMEOUT_S before it failed
        return why in ("TimeoutError", "APITimeoutError") and t - LOAD_TIMEOUT_S < marks["up"]
    late = [(round(t - marks["up"], 1), why) for t, why in stats.failures
            if t >= marks["up"] and not sent_before(t, why)]
    assert not late, f"failed after the link came back (s after, reason): {late}; {stats.summary()}"


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


# ------------------------------------------------------------------------------ 3 control hosts (HA)
CONTROLLER_SIDE = ("Roll the workers", "Check the cluster is serving", "Record the deployment")


@pytest.fixture(scope="module")
def ha(testbed_up):
    """3 control hosts (3-member etcd, 3-node NATS, a frontend on each) and 3 mocker workers."""
    yield from _cluster(HA_TB, testbed_up)


def _tb_host(host: str) -> dict:
    return next(h for h in testbed.load_state(HA_NAME)["hosts"] if h["name"] == host)


def _power_off(host: str, cut_first: bool = True) -> None:
    """The host dies at once, as at a power cut: SIGKILL to its systemd (PID 1 of its PID namespace, so the
    kernel kills every process in it; SIGKILL to nspawn itself would leave the host running). cut_first: its
    link goes down first, so its peers see silence, not resets, and this waits until its nspawn is gone; else
    its link stays up (open connections to it are reset) and its nspawn cleans up in its own time (_power_on
    waits for that). A clean poweroff (SIGTERM to nspawn) is not a power cut: it stops every unit in turn,
    each within its TimeoutStopSec, and took over 180 s on the loaded 2-core machine (lead's run, 2026-12-01)."""
    h = _tb_host(host)
    if cut_first:
        subprocess.run(["ip", "-n", h["netns"], "link", "set", "eth0", "down"], check=True)
    kids = open(f"/proc/{h['pid']}/task/{h['pid']}/children").read().split()
    os.kill(int(kids[0]), signal.SIGKILL)
    if cut_first:
        _wait_gone(host, h["pid"])


def _wait_gone(host: str, pid: int) -> None:
    deadline = time.monotonic() + 180
    while _running(pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _running(pid), f"{host} did not stop"


def _running(pid: int) -> bool:
    """Alive and not a zombie (a host booted by this process's testbed.up is its child: reaped here)."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass
    try:
        return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _power_on(host: str) -> None:
    """Boot it again with its disk as it was (the testbed's `up` relaunches a stopped host)."""
    h = _tb_host(host)
    _wait_gone(host, h["pid"])
    subprocess.run(["ip", "-n", h["netns"], "link", "set", "eth0", "up"], check=True)
    testbed.up(6, name=HA_NAME, log=lambda *a, **k: None)


def _get(url: str):
    import urllib.request

    with urllib.request.urlopen(url, timeout=5) as r:
        return json.loads(r.read())


def _control_healthy(c: Cluster, hosts, timeout_s: float = 120) -> None:
    """etcd /health true on each of `hosts` (a leader and a quorum) and each NATS node routed to the others."""
    want = len(c.plan.group("control")) - 1
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            bad = [h.name for h in hosts if _get(f"http://{h.address}:2379/health").get("health") != "true"
                   or _get(f"http://{h.address}:8222/routez")["num_routes"] < want]
        except OSError as e:
            bad = [str(e)]
        if not bad:
            return
        assert time.monotonic() < deadline, f"control plane not healthy on {bad}"
        time.sleep(0.5)


def changes_by_host(out: str) -> dict[str, list[str]]:
    """host -> the ops that changed something on it (pyinfra's `[host] Success` after `Starting operation`)."""
    per, op = collections.defaultdict(list), ""
    for line in out.splitlines():
        m = re.match(r"--> Starting operation: (.*?)\s*$", line)
        if m:
            op = m.group(1)
        m = re.match(r"\s+\[([^\]]+)\] Success", line)
        if m:
            per[m.group(1)].append(op)
    return per


def host_changes(out: str) -> dict[str, list[str]]:
    """changes_by_host without the ops that act from the controller (rollout, serving check, record)."""
    return {h: [o for o in ops if not o.startswith(CONTROLLER_SIDE)] for h, ops in changes_by_host(out).items()}


def _rejoin(c: Cluster, host: str, ok_changes=()) -> dict[str, list[str]]:
    """Boot `host`, re-run the deploy: every control member healthy again, nothing changed on the others."""
    _power_on(host)
    run = pyinfra(env=c.env, timeout=900)
    assert run.returncode == 0, run.stdout[-4000:]
    _control_healthy(c, c.plan.group("control"))
    changed = host_changes(run.stdout)
    others = {h: ops for h, ops in changed.items() if h != host and ops}
    assert not others, f"the re-run changed hosts that were right: {others}"
    all_registered(c, 120)
    return changed


def test_ha_stop_a_control_host_that_is_not_the_endpoint(ha):
    """With 3 control hosts, one of them (etcd member, NATS node, its own frontend; not the endpoint's frontend)
    stops under load: 0 failed requests; it rejoins (its etcd member with its data dir) on a re-run."""
    ctl = ha.plan.group("control")
    lost = ctl[2]
    streams = _get(f"http://{ctl[0].address}:8222/jsz")["streams"]
    stats, rec = drill(ha, f"3 control hosts: {lost.name} stopped (etcd member, NATS node, a frontend)",
                       lambda: _power_off(lost.name),
                       lambda t0: since(t0, lambda: (_control_healthy(ha, ctl[:2]), all_registered(ha))),
                       note=f"link cut, then killed (a power cut); recovery: etcd/NATS healthy on the other two and every "
                            f"worker listed; JetStream streams Dynamo made: {streams}")
    assert stats.failed == 0, stats.summary()
    t0 = time.monotonic()
    changed = _rejoin(ha, lost.name)
    RESULTS.append({"drill": f"3 control hosts: {lost.name} boots again + deploy re-run", "stats": Stats(),
                    "recovery": time.monotonic() - t0,
                    "note": f"etcd member rejoined with its data dir, NATS routes back; ops changed on it: "
                            f"{len(changed.get(lost.name, []))}, on the others: 0; no load; "
                            f"load {os.getloadavg()[0]:.1f}"})


def test_ha_the_endpoints_control_host_dies(ha):
    """The first control host (the plan's endpoint, the workers' NATS seed, an etcd member) dies: its clients
    lose their frontend; a client of another control host's frontend sees 0 failures."""
    ctl = ha.plan.group("control")
    other = next(s for s in ctl[1].services if s.kind == "frontend")
    endpoint = f"http://{ctl[1].address}:{other.ports[0].port}/v1"
    c1 = Cluster(ha.plan, f"http://{ctl[1].address}:{other.ports[0].port}/health", ha.heads, ctl[1].name,
                 ha.workers, ha.env)
    stats, rec = drill(c1, f"3 control hosts: {ctl[0].name} (endpoint's frontend, workers' NATS seed) stopped; "
                           f"load on {ctl[1].name}'s frontend", lambda: _power_off(ctl[0].name),
                       lambda t0: since(t0, lambda: (_control_healthy(c1, ctl[1:]), all_registered(c1))),
                       endpoint=endpoint, note="clients of the stopped host's frontend fail until it is back")
    assert stats.failed == 0, stats.summary()
    _rejoin(ha, ctl[0].name)


def test_host_lost_mid_deploy_converges_on_a_rerun(ha):
    """A worker host dies (SIGKILL of the whole host) while a deploy that changes every worker writes their
    files: the deploy stops; the others keep serving; after the host is back a re-run converges: every worker
    runs its current files and the hosts that were right see 0 changes."""
    lost = ha.workers[-1]
    proc = subprocess.Popen(tbrun.pyinfra_argv("--data", "m3_mocker_speedup_ratio=8"), cwd=REPO, env=ha.env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out, cut = [], []

    def deploy_and_lose():
        for line in proc.stdout:
            out.append(line)
            if not cut and "Starting operation: Deploy the workers" in line:
                cut.append(time.monotonic())
                _power_off(lost, cut_first=False)
        proc.wait(timeout=900)
    stats, _ = drill(ha, f"host {lost} lost mid-deploy (m3_mocker_speedup_ratio 10 → 8)", deploy_and_lose,
                     lambda t0: time.monotonic() - t0, all_back=False,
                     note="SIGKILL of the host as its worker files are written; the deploy's wall time")
    text = "".join(out)
    print("the deploy that lost a host, its end:\n" + text[-2500:])
    if os.path.exists(os.path.join(REPO, "pyinfra-debug.log")):  # pyinfra's traceback of the lost connection
        os.remove(os.path.join(REPO, "pyinfra-debug.log"))
    assert cut and proc.returncode != 0, text[-4000:]
    assert lost in text[text.index("Deploy the workers"):], text[-4000:]
    first = host_changes(text)
    t0 = time.monotonic()
    _power_on(lost)
    run = pyinfra("--data", "m3_mocker_speedup_ratio=8", env=ha.env, timeout=900)
    assert run.returncode == 0, run.stdout[-4000:]
    changed = host_changes(run.stdout)
    workers = set(ha.workers)
    right = [h.name for h in ha.plan.hosts if h.name not in workers]  # control hosts: nothing to change there
    assert all(not changed.get(h) for h in right), {h: changed.get(h) for h in right}
    for h in ha.workers:  # every worker's running process has the new ratio
        argv = on(h, "tr '\\0' ' ' < /proc/$(systemctl show -p MainPID --value m3-worker@0)/cmdline", name=HA_NAME)
        assert "--speedup-ratio 8 " in argv, (h, argv)
    all_registered(ha, 120)
    again = pyinfra("--data", "m3_mocker_speedup_ratio=8", env=ha.env, timeout=900)
    assert again.returncode == 0 and not any(host_changes(again.stdout).values()), again.stdout[-3000:]
    RESULTS.append({"drill": f"host {lost} back + deploy re-run", "stats": Stats(), "recovery": time.monotonic() - t0,
                    "note": "ops changed per host: " + ", ".join(f"{h.name} {len(changed.get(h.name, []))}"
                                                                 for h in ha.plan.hosts)
                            + f" (first run, before it stopped: {sum(map(len, first.values()))} in all); "
                              f"a second re-run: 0 everywhere; load {os.getloadavg()[0]:.1f}"})
    # and back to the inventory's own ratio, rolled
    assert pyinfra(env=ha.env, timeout=900).returncode == 0
