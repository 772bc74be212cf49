"""What the e2e modules run against their testbed the way a user would: the CLI tools, a command on a host, the plan
of the testbed inventory under a module's environment, and the commit a results file names. Shared by the e2e
modules (imported as `from tbrun import ...`, like tbssh.py and load.py)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

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
