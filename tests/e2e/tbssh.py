"""SSH into a testbed's simulated hosts, as a user would: `ssh -F <state dir>/ssh_config HOST CMD` (docs/TESTBED.md).
Shared by the e2e modules (imported as `from tbssh import ...`, like load.py)."""
from __future__ import annotations

import subprocess

from m3deploy.testbed.config import STATE_ROOT


def state_dir(name: str) -> str:
    """Where `m3deploy testbed up --name NAME` keeps its state, ssh_config among it."""
    return f"{STATE_ROOT}/{name}"


def ssh_to(name: str):
    """ssh(host, cmd, *ssh_opts, check=True, timeout=120) -> CompletedProcess on testbed `name`; with check, a
    non-zero exit fails the test with the host, the command and its output."""
    config = f"{state_dir(name)}/ssh_config"

    def ssh(host: str, cmd: str, *opts: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess:
        res = subprocess.run(["ssh", "-F", config, *opts, host, cmd], capture_output=True, text=True, timeout=timeout)
        if check and res.returncode != 0:
            raise AssertionError(f"{host}: {cmd!r} failed ({res.returncode}): {res.stdout}{res.stderr}")
        return res

    return ssh
