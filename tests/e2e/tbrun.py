"""What the e2e modules run against their testbed the way a user would: the CLI tools, a command on a host, the plan
of the testbed inventory under a module's environment, and the commit a results file names; `Testbed`, a module's
own testbed (its name, subnet, host count and environment: what conftest.py's `testbed_up` brings up and down) with
its `pyinfra -y ... deploy.py` and `m3deploy ...` runs. Shared by the e2e modules (imported as `from tbrun import
...`, like tbssh.py and load.py)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field

from m3deploy.testbed import core as testbed

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
INVENTORY = "inventories/testbed.py"
# what inventories/testbed.py and the controller read from the environment (a module's ENV sets them for pyinfra)
PLAN_ENV = ("M3_TESTBED", "M3_TESTBED_CONTROL", "M3_TESTBED_STANDBY", "M3_TESTBED_HOSTS", "M3DEPLOY_CONFIG")


def tool(name: str) -> list[str]:
    """argv of `pyinfra` or `m3deploy`: the one on PATH (the venv's), else this interpreter's module."""
    exe = shutil.which(name)
    return [exe] if exe else [sys.executable, "-m", {"pyinfra": "pyinfra", "m3deploy": "m3deploy.cli"}[name]]


def on(name: str, host: str, cmd: str, timeout: float = 60) -> str:
    """`cmd` on testbed `name`'s `host`; a non-zero exit fails the test with the host, the command and its output."""
    res = testbed.run_on(name, host, cmd, timeout=timeout)
    assert res.returncode == 0, f"{host}: {cmd!r} failed ({res.returncode}): {res.stdout}{res.stderr}"
    return res.stdout


def plan(env: dict, data=()):
    """The plan pyinfra builds from the testbed inventory with `env` and `data` (KEY=VALUE, with or without
    pyinfra's `--data` before each), without asking any host: PLAN_ENV's keys are as `env` has them (one it lacks is
    unset) while the plan is built, then as they were."""
    from m3deploy.cli import load_plan

    old = {k: os.environ.get(k) for k in PLAN_ENV}
    for k in PLAN_ENV:
        os.environ.pop(k, None)
        if k in env:
            os.environ[k] = env[k]
    try:
        return load_plan(os.path.join(REPO, INVENTORY), data=[x for x in data if x != "--data"], facts=False)
    finally:
        for k, v in old.items():
            os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)


def commit() -> str:
    """The checkout's commit, `-dirty` when it has changes (what a results file says it measured)."""
    return subprocess.run(["git", "-C", REPO, "describe", "--always", "--dirty"], capture_output=True, text=True,
                          check=False).stdout.strip() or "unknown"


def keep() -> bool:
    """M3_E2E_KEEP=1: a module leaves its testbed (and its controller-side scratch) as it is after its tests."""
    return bool(os.environ.get("M3_E2E_KEEP"))


def testbed_cli(*args: str, check: bool = True, timeout: float = 900) -> subprocess.CompletedProcess:
    """`m3deploy testbed ARGS` (the testbed's CLI, from the repository root); with check, a non-zero exit fails the
    test with the arguments and the output."""
    res = subprocess.run([sys.executable, "-m", "m3deploy.testbed.cli", *args], capture_output=True, text=True,
                         cwd=REPO, timeout=timeout)
    if check and res.returncode != 0:
        raise AssertionError(f"testbed {args} failed ({res.returncode}):\n{res.stdout}\n{res.stderr}")
    return res


def pyinfra_argv(*data: str, inventory: str = INVENTORY, script: str = "deploy.py") -> list[str]:
    """`pyinfra -y INVENTORY SCRIPT DATA...`, the deploy's command line as a user types it."""
    return [*tool("pyinfra"), "-y", inventory, script, *data]


@dataclass(eq=False)
class Testbed:
    """An e2e module's own testbed (each module's docstring names it) and what runs against it.

    `m3deploy testbed up HOSTS --name NAME --subnet SUBNET` with the hosts' `options` ("docker", "net-admin");
    `env`: the environment pyinfra and m3deploy run under (default: os.environ with M3_TESTBED=NAME,
    M3_TESTBED_CONTROL=1). `cli`: brought up and down through the testbed's CLI in a subprocess, after a `down` of
    what an interrupted run left (else by m3deploy.testbed.core in the test process, which finds a testbed kept by
    M3_E2E_KEEP=1 as it was). `tools`: what else the module needs on PATH, each with its fix. `scratch`: the
    module's controller-side directories (a cache, a config), removed with the testbed."""
    name: str
    subnet: str
    hosts: int
    env: dict | None = None
    options: tuple[str, ...] = ()
    cli: bool = False
    tools: dict[str, str] = field(default_factory=dict)
    scratch: tuple[str, ...] = ()

    def __post_init__(self):
        if self.env is None:
            self.env = {**os.environ, "M3_TESTBED": self.name, "M3_TESTBED_CONTROL": "1"}

    def deploy(self, *data: str, inventory: str = INVENTORY, script: str = "deploy.py", timeout: float = 900,
               env: dict | None = None) -> subprocess.CompletedProcess:
        """`pyinfra -y INVENTORY SCRIPT DATA...` from the repository root under `env` (default: the testbed's);
        its stdout and stderr together in .stdout, whatever its exit."""
        return subprocess.run(pyinfra_argv(*data, inventory=inventory, script=script), cwd=REPO,
                              env=self.env if env is None else env, text=True, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, timeout=timeout, check=False)

    def deploy_ok(self, *data: str, **kw) -> subprocess.CompletedProcess:
        """deploy(), which must exit 0 (else the test fails with the end of its output)."""
        res = self.deploy(*data, **kw)
        assert res.returncode == 0, f"the deploy exited {res.returncode}:\n{res.stdout[-6000:]}"
        return res

    def m3deploy(self, *args: str, timeout: float = 600, merge: bool = False,
                 env: dict | None = None) -> subprocess.CompletedProcess:
        """`m3deploy ARGS` from the repository root under `env` (default: the testbed's), whatever its exit;
        merge: its stderr in .stdout too."""
        return subprocess.run([*tool("m3deploy"), *args], cwd=REPO, env=self.env if env is None else env, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT if merge else subprocess.PIPE,
                              timeout=timeout, check=False)

    def verify(self, *args: str, inventory: str = INVENTORY, **kw) -> subprocess.CompletedProcess:
        """`m3deploy verify INVENTORY ARGS` (m3deploy()'s keywords), whatever its exit."""
        return self.m3deploy("verify", inventory, *args, **kw)

    def on(self, host: str, cmd: str, timeout: float = 60) -> str:
        """on() this testbed's `host`."""
        return on(self.name, host, cmd, timeout)

    def plan(self, data=()):
        """plan() under this testbed's environment."""
        return plan(self.env, data)


# ------------------------------------------------------------------------------------------- results files

def failures(stats, times: str = "×") -> str:
    """A drill's failures as the results tables write them ("3× HTTP 503, 1× timeout"), or "-"."""
    return ", ".join(f"{n}{times} {e}" for e, n in stats.errors.most_common()) or "-"


def write_results(name: str, started, title: str, intro: str, columns: list[str], rows: list[list]) -> None:
    """benchmarks/results/<name>-<UTC start>.md: one file per run, with the commit it ran, `rows` under `columns`
    (nothing when no drill ran)."""
    if not rows:
        return
    path = os.path.join(REPO, "benchmarks", "results", f"{name}-{started:%Y-%m-%d-%H%M}.md")
    lines = [f"# {title} ({started:%Y-%m-%d %H:%M} UTC, commit {commit()})", "", intro, "",
             "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


def record(results: list, name: str, stats, seconds: float, note: str = "", key: str = "took", **extra) -> None:
    """One drill's row (`key`: what `seconds` measured, "took" or "recovery"; the machine is shared, 2 cores: its
    1-minute load average goes into the notes), and its failures printed with their UTC times (to read the hosts'
    journals at that moment)."""
    results.append({"drill": name, "stats": stats, key: seconds, **extra,
                    "note": f"{note}{'; ' if note else ''}load {os.getloadavg()[0]:.1f}"})
    print(f"{name}: {stats.summary()} ({key} {seconds:.1f} s)" + (f" {extra}" if extra else ""))
    for when, why, msg in stats.details[:10]:
        print(f"  failed at {when} UTC: {why}: {msg}")
    if len(stats.details) > 10:
        print(f"  ... {len(stats.details) - 10} more failures, the last at {stats.details[-1][0]} UTC")


def https_status(url: str, ca: str | None, key: str | None = None, scheme: str = "Bearer") -> int:
    """The HTTP status of a GET over TLS with the CA (and a key, sent as `SCHEME KEY`), an error status included."""
    import ssl
    import urllib.error
    import urllib.request

    ctx = ssl.create_default_context(cafile=ca) if ca else ssl.create_default_context()
    req = urllib.request.Request(url, headers={"Authorization": f"{scheme} {key}"} if key else {})
    try:
        with urllib.request.urlopen(req, timeout=10, context=ctx) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def prom(plan, path: str, **query):
    """The `data` of a GET of the plan's Prometheus API at `path` (query parameters from keywords); asserts success."""
    import json
    import urllib.parse
    import urllib.request

    from m3deploy.core import monitor

    url = monitor.prometheus_url(plan, path) + ("?" + urllib.parse.urlencode(query) if query else "")
    with urllib.request.urlopen(url, timeout=10) as r:
        doc = json.loads(r.read())
    assert doc["status"] == "success", doc
    return doc["data"]
