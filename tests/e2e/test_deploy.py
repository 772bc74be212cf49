"""End-to-end: deploy.py for real on the local testbed, as a user runs it (needs root + the testbed's tools).

One testbed per module under a test-only name and range (m3dep, 10.81.0.0/24: 1 control + 2 workers), so a
user's testbed (m3tb, 10.77.0.0/24) is never touched. Every deploy is the user's command line,
`pyinfra -y inventories/testbed.py deploy.py [--data ...]` with M3_TESTBED=m3dep, run from the repository
root; its results table and per-host log are parsed. The tests run in file order and build on each other:

1. cold deploy -> `m3deploy verify` and `pytest tests/verify` pass;
2. a second deploy changes nothing (0 changed ops) and restarts nothing (MainPID and
   ActiveEnterTimestampMonotonic of every unit equal), and no file the deploy wrote is rewritten; every file
   `m3deploy render` writes (offline) is the host's file (sha256, mode, owner);
3. one worker's host data changes (m3_rdma_env, an inventory edit) -> only that worker restarts; putting
   the inventory back restarts only that worker again;
4. invalid input (--data m3_parallel=tp2) exits non-zero naming the key, and no host changes;
5. teardown with m3_keep_caches=true (caches stay) -> verify fails -> deploy brings it back (verify passes)
   -> full teardown leaves nothing the deploy made.

Keep the testbed after the run (to look at a failure): M3_E2E_KEEP=1.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

import pytest
import tbrun

from tbssh import ssh_to, state_dir

pytestmark = pytest.mark.e2e

# another name and range for a run beside another one (tests/e2e on separate testbeds): M3_E2E_DEPLOY_TESTBED/_SUBNET
NAME = os.environ.get("M3_E2E_DEPLOY_TESTBED", "m3dep")
SUBNET = os.environ.get("M3_E2E_DEPLOY_SUBNET", "10.81.0.0/24")
CONTROL, W1, W2 = f"{NAME}-01", f"{NAME}-02", f"{NAME}-03"
HOSTS = (CONTROL, W1, W2)
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STATE_DIR = state_dir(NAME)
INVENTORY = "inventories/testbed.py"
# A cold controller for this module (issue: a warm ~/.cache/m3deploy hid a race that broke every fresh
# machine): the first deploy builds the wheelhouse and mock model from nothing, while `m3deploy artifacts`
# builds the same artifacts beside it.
COLD_CACHE = tempfile.mkdtemp(prefix="m3-e2e-cold-cache-")
ENV = {**os.environ, "M3_TESTBED": NAME, "M3_TESTBED_CONTROL": "1", "M3DEPLOY_CACHE": COLD_CACHE,
       "M3DEPLOY_CONFIG": os.path.join(COLD_CACHE, "config")}
TB = tbrun.Testbed(NAME, SUBNET, 3, ENV, cli=True, scratch=(COLD_CACHE,))
VENV = "/opt/m3/dynamo-1.6.1"
WHEELHOUSE = "/opt/m3/wheelhouse/dynamo-1.6.1"
MODEL_DIR = "/var/lib/m3/models/mock-minimax-m3"
WORKER_UNIT = "m3-worker@0.service"
# changed workers are restarted in turn by one op on the control host (m3_rollout="rolling", roles/_rollout.py)
ROLL_OP = "Roll the workers | Roll the changed workers, one engine instance at a time"
ROLLED_W2 = f"rolled worker 1 ({W2}/m3-worker@0)"
WORKER_ENV_OP = "Deploy the workers | Render /etc/m3/m3-worker@0.env"


# ------------------------------------------------------------------------------------------ pyinfra runs
ROW = re.compile(r"^\s{4}(?P<op>\S.*?)\s{2,}(?P<hosts>\d+|-)\s+(?P<success>\d+|-)\s+(?P<error>\d+|-)\s+"
                 r"(?P<nochange>\d+|-)\s*$")
START = re.compile(r"^--> Starting operation: (?P<op>.*?)\s*$")
HOST_LINE = re.compile(r"^\s{4}\[(?P<host>[^\]]+)\] (?P<status>Success|No changes|Skipped|Error)\s*$")


def _n(v: str) -> int:
    return 0 if v == "-" else int(v)


@dataclass
class Run:
    args: list[str]
    rc: int
    out: str
    secs: float
    table: dict[str, dict[str, int]] = field(default_factory=dict)   # op -> hosts/success/error/nochange
    per_host: dict[str, dict[str, list[str]]] = field(default_factory=dict)  # op -> host -> statuses

    def __post_init__(self):
        in_results, op = False, None
        for line in self.out.splitlines():
            if line.startswith("--> Results:"):
                in_results = True
                continue
            if in_results:
                m = ROW.match(line)
                if m:
                    self.table[m["op"]] = {k: _n(m[k]) for k in ("hosts", "success", "error", "nochange")}
                continue
            m = START.match(line)
            if m:
                op = m["op"]
                continue
            m = HOST_LINE.match(line)
            if m and op:
                self.per_host.setdefault(op, {}).setdefault(m["host"], []).append(m["status"])

    @property
    def total(self) -> dict[str, int]:
        assert "Grand total" in self.table, f"no `Grand total` line in pyinfra's output:\n{self.tail()}"
        return self.table["Grand total"]

    def changed_ops(self) -> dict[str, int]:
        return {op: r["success"] for op, r in self.table.items() if op != "Grand total" and r["success"]}

    def changed_on(self, op: str) -> list[str]:
        return sorted(h for h, st in self.per_host.get(op, {}).items() if "Success" in st)

    def tail(self, n: int = 60) -> str:
        return f"$ {' '.join(self.args)}  (exit {self.rc}, {self.secs:.1f} s)\n" + \
            "\n".join(self.out.splitlines()[-n:])


def pyinfra(*extra: str, inventory: str = INVENTORY, timeout: int = 300) -> Run:
    t0 = time.monotonic()
    res = TB.deploy(*extra, inventory=inventory, timeout=timeout)
    return Run(res.args, res.returncode, res.stdout, time.monotonic() - t0)


def deploy_ok(*extra: str, **kw) -> Run:
    run = pyinfra(*extra, **kw)
    assert run.rc == 0, run.tail()
    assert run.total["error"] == 0, run.tail()
    return run


def verify(inventory: str = INVENTORY, *extra: str) -> subprocess.CompletedProcess:
    return TB.verify(*extra, inventory=inventory, timeout=180)


def assert_verify_passes(inventory: str = INVENTORY):
    res = verify(inventory)
    assert res.returncode == 0, f"m3deploy verify {inventory} exited {res.returncode}:\n{res.stdout[-6000:]}" \
                                f"\n{res.stderr[-2000:]}"


# ------------------------------------------------------------------------------------------ host state
ssh = ssh_to(NAME)


def plan_units() -> dict[str, list[str]]:
    """host -> the systemd units the plan puts there (from `m3deploy plan --json`, nothing hard-coded)."""
    res = TB.m3deploy("plan", INVENTORY, "--json", timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr
    return {h: [s["unit"] for s in v["services"]] for h, v in json.loads(res.stdout)["hosts"].items()}


UNITS: dict[str, list[str]] = {}


def units() -> dict[str, list[str]]:
    if not UNITS:
        UNITS.update(plan_units())
    return UNITS


def unit_state() -> dict[str, dict[str, str]]:
    """`host/unit` -> MainPID, ActiveEnterTimestampMonotonic, ActiveState, NRestarts, LoadState."""
    props = "MainPID,ActiveEnterTimestampMonotonic,ActiveState,NRestarts,LoadState"
    out = {}
    for h, us in units().items():
        res = ssh(h, " ; ".join(f"echo @{u}; systemctl show -p {props} {u}" for u in us))
        cur = None
        for line in res.stdout.splitlines():
            if line.startswith("@"):
                cur = f"{h}/{line[1:]}"
                out[cur] = {}
            elif "=" in line and cur:
                k, v = line.split("=", 1)
                out[cur][k] = v
    return out


def pids(st: dict) -> dict[str, tuple[str, str]]:
    return {k: (v["MainPID"], v["ActiveEnterTimestampMonotonic"]) for k, v in st.items()}


def file_state() -> dict[str, str]:
    """`host:path` -> mtime (ns) + size + mode of every file the deploy writes under /etc (units, env files,
    nats.conf), the venv stamp and the wheelhouse manifest."""
    out = {}
    for h, us in units().items():
        paths = " ".join(f"/etc/systemd/system/{u}" for u in us)
        res = ssh(h, f"find /etc/m3 {paths} {VENV}/.m3-wheelhouse {WHEELHOUSE}/SHA256SUMS -maxdepth 1 "
                     "-type f -printf '%p %T@ %s %m\\n' 2>/dev/null | sort", check=False)
        for line in res.stdout.splitlines():
            p, rest = line.split(" ", 1)
            out[f"{h}:{p}"] = rest
    return out


def exists(host: str, path: str) -> bool:
    return ssh(host, f"test -e {path}", check=False).returncode == 0


def diff(before: dict, after: dict) -> dict:
    keys = sorted(set(before) | set(after))
    return {k: (before.get(k), after.get(k)) for k in keys if before.get(k) != after.get(k)}


# ------------------------------------------------------------------------------------------ the testbed
@pytest.fixture(scope="module")
def testbed(testbed_up):
    with testbed_up(TB):
        yield NAME


COLD: dict[str, Run] = {}


@pytest.fixture
def deployed(testbed):
    """The stack from the cold deploy (test 1, or here when test 1 was deselected); fails when it failed."""
    if "run" not in COLD:
        COLD["run"] = pyinfra()
    if COLD["run"].rc != 0:
        pytest.fail(f"the cold deploy did not succeed (see test_cold_deploy_then_verify_passes):\n"
                    f"{COLD['run'].tail(20)}")
    return COLD["run"]


# ------------------------------------------------------------------------------------------ 1. cold deploy
def test_cold_deploy_then_verify_passes(testbed):
    """From an empty controller cache, with `m3deploy artifacts` building the same artifacts in a second
    process at the same time (pyinfra's greenlets + another process: m3deploy.controller.cachelock)."""
    assert not [p for p in os.listdir(COLD_CACHE) if p != "config"], "the controller cache is not cold"
    side = subprocess.Popen([*tbrun.tool("m3deploy"), "artifacts", INVENTORY], cwd=REPO, env=ENV, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    run = pyinfra(timeout=900)
    side_out = side.communicate(timeout=900)[0]
    COLD["run"] = run
    assert side.returncode == 0, f"m3deploy artifacts beside the deploy exited {side.returncode}:\n{side_out}"
    assert run.rc == 0, run.tail()
    builds = (run.out + side_out).count("building the ai-dynamo==1.6.1 wheelhouse")
    assert builds == 1, f"the wheelhouse was built {builds} times (once is right):\n{side_out}\n{run.tail()}"
    print(f"cold deploy {run.secs:.0f} s; m3deploy artifacts beside it:\n{side_out}")
    assert run.total["error"] == 0 and run.total["success"] > 0, run.tail()
    # the wheelhouse went to every host in one transfer (one operation), not one operation per wheel
    ship = [op for op in run.per_host if op.startswith("Ship Dynamo artifacts | Ship ") and "mock model" not in op]
    assert [op.split(" to ")[0] for op in ship] == ["Ship Dynamo artifacts | Ship the wheelhouse"] and \
        sorted(run.changed_on(ship[0])) == sorted(HOSTS), (ship, run.tail())
    # every planned unit is active (the deploy's own readiness waits passed too: rc 0)
    st = unit_state()
    assert set(st) == {f"{h}/{u}" for h, us in units().items() for u in us}
    bad = {k: v for k, v in st.items() if v.get("ActiveState") != "active" or v.get("MainPID") in ("", "0")}
    assert not bad, bad
    assert_verify_passes()
    res = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/verify",
                          "--inventory", INVENTORY], cwd=REPO, env=ENV, capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0, f"pytest tests/verify exited {res.returncode}:\n{res.stdout[-6000:]}{res.stderr}"
    assert re.search(r"\b\d+ passed\b", res.stdout) and "failed" not in res.stdout.splitlines()[-1]


# ------------------------------------------------------------------------------------------ 2. idempotent
def test_second_deploy_changes_and_restarts_nothing(deployed):
    units_before, files_before = unit_state(), file_state()
    run = deploy_ok()
    assert run.total["success"] == 0, f"changed operations on a re-run: {run.changed_ops()}\n{run.tail()}"
    assert run.total["nochange"] == run.total["hosts"], run.tail()
    units_after, files_after = unit_state(), file_state()
    assert pids(units_after) == pids(units_before), diff(pids(units_before), pids(units_after))
    assert files_after == files_before, diff(files_before, files_after)
    assert all(v["NRestarts"] == units_before[k]["NRestarts"] for k, v in units_after.items())


# ------------------------------------------------------------------------------------------ 2b. render
def test_render_is_what_the_deploy_wrote(deployed, tmp_path):
    """`m3deploy render` (offline, m3deploy.deploy.hostfiles) shows exactly what is on the hosts: every non-secret
    file it writes has the host file's sha256, mode and owner; a secret (masked) one exists with its mode and
    owner; the nats-server mask is that link. One ssh per host."""
    out = tmp_path / "render"
    res = TB.m3deploy("render", INVENTORY, str(out), timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    for h in HOSTS:
        entries = json.loads((out / f"{h}.json").read_text())["files"]
        assert "/etc/m3/manifest.json" in {e["path"] for e in entries}
        probe = "; ".join(f"echo \"$(stat -c '%n|%a|%U:%G' {p})|$(if [ -L {p} ]; then readlink {p}; "
                          f"else sha256sum < {p} | cut -d' ' -f1; fi)\"" for p in (e["path"] for e in entries))
        got = {line.split("|")[0]: line.split("|")[1:] for line in ssh(h, probe).stdout.splitlines()}
        for e in entries:
            assert e["path"] in got, f"{h}: {e['path']} (rendered) is not on the host"
            mode, owner, digest = got[e["path"]]
            if "link" in e:
                assert digest == e["link"], (h, e, digest)
                continue
            assert (mode, owner) == (e["mode"].lstrip("0"), e["owner"]), (h, e, mode, owner)
            if not e.get("secret"):
                assert digest == e["sha256"], f"{h}: {e['path']} differs from its render"


# ------------------------------------------------------------------------------------------ 3. one worker
def _inventory_with_worker_env(tmp_path, host: str, env: dict) -> str:
    """A copy of inventories/testbed.py plus host data for ONE worker, as a user edits their inventory.
    The file keeps the name testbed.py (pyinfra's group `testbed` -> group_data/testbed.py, found from the
    cwd = the repository root)."""
    src = open(os.path.join(REPO, INVENTORY)).read()
    src += f"\n\nfor _n, _d in workers:\n    if _n == {host!r}:\n        _d['m3_rdma_env'] = {env!r}\n"
    d = tmp_path / "inventories"
    d.mkdir()
    (d / "testbed.py").write_text(src)
    return str(d / "testbed.py")


def _worker_env(host: str) -> str:
    return ssh(host, "cat /etc/m3/m3-worker@0.env").stdout


def test_one_workers_env_change_restarts_only_that_worker(deployed, tmp_path):
    inv = _inventory_with_worker_env(tmp_path, W2, {"NCCL_DEBUG": "INFO"})
    # the plan really applies it to that one host
    res = TB.m3deploy("plan", inv, "--json", timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr
    envs = {h: v["services"][0]["env"] for h, v in json.loads(res.stdout)["hosts"].items() if h in (W1, W2)}
    assert envs[W2].get("NCCL_DEBUG") == "INFO" and "NCCL_DEBUG" not in envs[W1], envs

    before = unit_state()
    try:
        run = deploy_ok(inventory=inv)
        after = unit_state()
        assert "NCCL_DEBUG=INFO" in _worker_env(W2) and "NCCL_DEBUG" not in _worker_env(W1)
        changed = diff(pids(before), pids(after))
        assert list(changed) == [f"{W2}/{WORKER_UNIT}"], f"restarted: {changed}"
        assert after[f"{W2}/{WORKER_UNIT}"]["ActiveState"] == "active"
        assert run.changed_on(ROLL_OP) == [CONTROL], run.per_host.get(ROLL_OP)
        assert ROLLED_W2 in run.out and "rolled worker 0" not in run.out, run.out[-3000:]
        # the drain took the engine's grace period: on SIGTERM the worker unregistered, then waited before shutting
        # down, as dynamo.vllm does (Dynamo 1.6.1 dynamo/common/utils/graceful_shutdown.py, 5 s by default): the
        # frontend has stopped routing to it before it stops serving
        drained = re.search(re.escape(ROLLED_W2) + r": drained in ([\d.]+) s", run.out)
        assert drained and float(drained.group(1)) >= 4.5, run.out[-3000:]
        assert run.changed_on(WORKER_ENV_OP) == [W2], run.per_host.get(WORKER_ENV_OP)
        # nothing else was rewritten or (re)started anywhere (per-host log: an op's name in the results
        # table is the first host's, e.g. a readiness URL, so the table cannot say which host changed)
        for op in run.changed_ops():
            assert not op.startswith(("Deploy etcd", "Deploy NATS", "Deploy the Dynamo frontend", "Ship Dynamo")), \
                f"{op} changed ({run.table[op]}) for a worker-only change"
        for op in run.per_host:
            if op.startswith("Deploy the workers"):
                assert set(run.changed_on(op)) <= {W2}, (op, run.per_host[op])
        assert_verify_passes(inv)
    finally:
        # the inventory back as it was: the env line goes, only that worker restarts again
        back_before = unit_state()
        back = deploy_ok()
        back_after = unit_state()
    assert "NCCL_DEBUG" not in _worker_env(W2)
    assert list(diff(pids(back_before), pids(back_after))) == [f"{W2}/{WORKER_UNIT}"]
    assert ROLLED_W2 in back.out and "rolled worker 0" not in back.out, back.out[-3000:]
    assert_verify_passes()


# ------------------------------------------------------------------------------------------ 4. bad input
def test_invalid_data_exits_naming_the_key_and_changes_nothing(deployed):
    units_before, files_before = unit_state(), file_state()
    run = pyinfra("--data", "m3_parallel=tp2")
    assert run.rc != 0, run.tail()
    assert "m3_parallel" in run.out and "tp2" in run.out, run.tail()
    assert "nothing was changed" in run.out, run.tail()
    assert "--> Beginning operation run" not in run.out, run.tail()
    assert pids(unit_state()) == pids(units_before)
    assert file_state() == files_before


def test_invalid_data_message_is_clean(deployed):
    """A validation error is what the user reads: once, without a Python traceback."""
    run = pyinfra("--data", "m3_parallel=bogus")
    assert run.rc == 2, run.tail()
    msg = "key m3_parallel: 'bogus' is not a parallel mode"
    assert msg in run.out, run.tail()
    traceback, times = "Traceback" in run.out, run.out.count(msg)
    assert not traceback and times == 1, \
        f"the validation message comes {times} times and with a traceback={traceback}:\n{run.tail(80)}"


# ------------------------------------------------------------------------------------------ 5. teardown
def _assert_stack_gone():
    for h, us in units().items():
        for u in us:
            show = ssh(h, f"systemctl show -p LoadState -p ActiveState {u}").stdout
            assert "ActiveState=active" not in show, f"{h}: {u} still active after teardown:\n{show}"
            assert not exists(h, f"/etc/systemd/system/{u}"), f"{h}: /etc/systemd/system/{u} left"
        assert not exists(h, "/etc/m3"), f"{h}: /etc/m3 left after teardown"
        left = ssh(h, "systemctl list-units --all --no-legend --plain 'm3-*' etcd.service nats.service",
                   check=False).stdout
        assert all(line.split()[1:3] == ["not-found", "inactive"] for line in left.splitlines()), \
            f"{h}: units left:\n{left}"
        listening = ssh(h, "ss -Hltn").stdout
        for port in (2379, 2380, 4222, 8222, 8000, 9090):
            assert f":{port} " not in listening, f"{h}: something still listens on {port}:\n{listening}"


def test_teardown_keep_caches_then_deploy_brings_it_back(deployed):
    deploy_ok("--data", "m3_state=absent", "--data", "m3_keep_caches=true")
    _assert_stack_gone()
    for h in HOSTS:  # every host runs a native Dynamo process (frontend or mocker): all have the caches
        assert exists(h, f"{VENV}/bin/python"), f"{h}: the venv is gone despite m3_keep_caches=true"
        assert exists(h, f"{WHEELHOUSE}/SHA256SUMS"), f"{h}: the wheelhouse is gone despite m3_keep_caches=true"
    # the mock model is a cache too (docstring of deploy.py, DEFAULTS["m3_keep_caches"]); asserted at the end
    # so that a failure here does not hide the rest of the teardown/redeploy cycle
    model_gone = [h for h in (W1, W2) if not exists(h, f"{MODEL_DIR}/config.json")]
    res = verify()
    assert res.returncode == 1, f"verify after teardown exited {res.returncode} (want 1):\n{res.stdout[-3000:]}"

    # back up from the kept caches: no wheel travels, the venv is not rebuilt
    again = deploy_ok()
    assert not [op for op in again.changed_ops() if op.startswith("Ship Dynamo artifacts | Ship the wheelhouse")
                or "Build /opt/m3" in op], again.changed_ops()
    st = unit_state()
    assert all(v["ActiveState"] == "active" for v in st.values()), st
    assert_verify_passes()
    assert not model_gone, f"m3_state=absent m3_keep_caches=true removed the mock model {MODEL_DIR} on " \
                           f"{model_gone} (it is a cache: the deploy had to ship it again)"


def test_full_teardown_leaves_nothing(deployed):
    apt_conf = "/etc/apt/apt.conf.d/80m3deploy"  # apt's retry setting, on every host the deploy touched (roles/apt.py)
    for h in HOSTS:
        assert 'Acquire::Retries::Delay "false";' in ssh(h, f"cat {apt_conf}").stdout, h
    deploy_ok("--data", "m3_state=absent")
    _assert_stack_gone()
    for h in HOSTS:
        for p in (VENV, WHEELHOUSE, "/var/lib/m3", apt_conf):
            assert not exists(h, p), f"{h}: {p} left after a full teardown"
        assert ssh(h, "getent passwd m3", check=False).returncode != 0, f"{h}: system user m3 left"
    for pkg in ("etcd-server", "nats-server"):
        st = ssh(CONTROL, f"dpkg-query -W -f='${{Status}}' {pkg} 2>/dev/null", check=False).stdout
        assert "install ok installed" not in st, f"{CONTROL}: package {pkg} still installed ({st})"
    res = verify()
    assert res.returncode == 1, f"verify after teardown exited {res.returncode} (want 1):\n{res.stdout[-3000:]}"
    # tearing down twice is fine
    deploy_ok("--data", "m3_state=absent")
    # the deploy made /opt/m3 and /opt/m3/wheelhouse: nothing of them may stay (checked last, see above)
    left = {h: ssh(h, "find /opt/m3 2>/dev/null", check=False).stdout.split() for h in HOSTS}
    assert not any(left.values()), f"left under /opt/m3 after a full teardown: {left}"


def test_deploy_after_full_teardown_brings_everything_back(deployed):
    run = deploy_ok(timeout=900)  # the venv is rebuilt on every host (minutes on a loaded 2-core machine)
    assert run.total["success"] > 0, run.tail()
    st = unit_state()
    assert all(v["ActiveState"] == "active" for v in st.values()), st
    assert_verify_passes()
