"""SSH into a testbed's simulated hosts, as a user would: `ssh -F <state dir>/ssh_config HOST CMD` (docs/TESTBED.md).
Shared by the e2e modules (imported as `from tbssh import ...`, like load.py)."""
from __future__ import annotations

import json
import os
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


def apt_diagnostics(name: str, hosts) -> str:
    """What to look at when a deploy or apt through the testbed's proxy stalls: the proxy's log and connections;
    on each host the apt/dpkg and shell processes still running (elapsed time, kernel wait channel) and its TCP
    sockets other than SSH's."""
    with open(f"{state_dir(name)}/state.json") as f:
        st = json.load(f)
    log_dir = os.path.join(st["state_dir"], "apt-proxy", "log")
    port = st["apt_proxy"]["url"].rsplit(":", 1)[1]
    out = []
    for f in ("apt-cacher.err", "apt-cacher.log"):
        try:
            with open(os.path.join(log_dir, f)) as fh:
                out.append(f"--- {log_dir}/{f} (tail)\n" + "".join(fh.readlines()[-15:]))
        except OSError as exc:
            out.append(f"--- {log_dir}/{f}: {exc}")
    conns = subprocess.run(["ss", "-Htn", "state", "all", f"( sport = :{port} )"], capture_output=True, text=True)
    out.append(f"--- proxy connections (ss)\n{conns.stdout}")
    ssh = ssh_to(name)
    for h in hosts:
        ps = ssh(h, "ps -eo pid,etime,wchan:24,comm,args | awk '$4 ~ /^(apt|apt-get|dpkg|http|gpgv|sqv|sh|sudo)$/';"
                    " ss -tanp | grep -v ':22 '", check=False, timeout=20)
        out.append(f"--- {h}: apt/dpkg/shell processes (wchan), its TCP sockets\n{ps.stdout}{ps.stderr}")
    return "\n".join(out)
