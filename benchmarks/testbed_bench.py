#!/usr/bin/env python3
"""Benchmark the local testbed: `up` of 8 and 16 hosts (cached image), then `down`.

Runs the real CLI (`python -m m3deploy.testbed.cli`) as a user would, under its own name and range
(m3bench, 10.76.0.0/24), and writes a Markdown table. Needs root. Targets: 16 up < 10 s, down < 10 s.

    python3 benchmarks/testbed_bench.py --sizes 8 16 --repeat 3 \
        --out benchmarks/results/testbed-$(date +%F).md
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

NAME = "m3bench"
SUBNET = "10.76.0.0/24"
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLI = [sys.executable, "-m", "m3deploy.testbed.cli"]
SSH_CONFIG = f"/var/lib/m3deploy/testbed/{NAME}/ssh_config"


def timed(*args) -> float:
    t0 = time.monotonic()
    res = subprocess.run([*CLI, *args], capture_output=True, text=True, cwd=REPO)
    dt = time.monotonic() - t0
    if res.returncode != 0:
        sys.exit(f"{args} failed:\n{res.stdout}\n{res.stderr}")
    return dt


def testbed_pss_mb() -> float:
    """Proportional set size of every process in the testbed's cgroups (hosts' systemd, sshd, ...)."""
    from m3deploy.testbed import core
    total = 0
    for pid in core._cgroup_pids(NAME):
        try:
            with open(f"/proc/{pid}/smaps_rollup") as f:
                total += sum(int(line.split()[1]) for line in f if line.startswith("Pss:"))
        except OSError:
            pass
    return total / 1024


def all_running(n: int) -> list[str]:
    def one(i):
        host = f"{NAME}-{i:02d}"
        return subprocess.run(["ssh", "-F", SSH_CONFIG, host, "systemctl is-system-running --wait"],
                              capture_output=True, text=True, timeout=120).stdout.strip()
    with ThreadPoolExecutor(max_workers=n) as ex:
        return list(ex.map(one, range(1, n + 1)))


def machine() -> str:
    cores = os.cpu_count()
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    try:
        osname = [line.split("=", 1)[1].strip().strip('"') for line in open("/etc/os-release")
                  if line.startswith("PRETTY_NAME=")][0]
    except (OSError, IndexError):
        osname = platform.platform()
    return f"{cores} cores, {mem:.0f} GiB, {osname}, kernel {platform.release()}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[8, 16])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--out", default=os.path.join(REPO, "benchmarks/results",
                                                  f"testbed-{datetime.date.today()}.md"))
    a = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("needs root")
    subprocess.run([*CLI, "down", "--name", NAME], capture_output=True, cwd=REPO)
    # make sure the image is cached, so `up` below measures a cached image
    timed("up", "1", "--name", NAME, "--subnet", SUBNET)
    timed("down", "--name", NAME)

    rows = []
    for n in a.sizes:
        ups, reruns, runnings, downs, mems, states = [], [], [], [], [], set()
        for _ in range(a.repeat):
            t0 = time.monotonic()
            ups.append(timed("up", str(n), "--name", NAME, "--subnet", SUBNET))
            st = all_running(n)
            runnings.append(time.monotonic() - t0)
            states.update(st)
            mems.append(testbed_pss_mb())
            reruns.append(timed("up", str(n), "--name", NAME))
            downs.append(timed("down", "--name", NAME))
        rows.append((n, ups, runnings, reruns, downs, mems, states))
        print(f"{n} hosts: up {statistics.median(ups):.2f} s, all running {statistics.median(runnings):.2f} s, "
              f"re-run {statistics.median(reruns):.2f} s, down {statistics.median(downs):.2f} s, "
              f"states {sorted(states)}", flush=True)

    def fmt(xs):
        return f"{statistics.median(xs):.2f} s (min {min(xs):.2f}, max {max(xs):.2f})"

    lines = [
        f"# Testbed benchmark, {datetime.date.today()}",
        "",
        f"Machine: {machine()}; cgroups hybrid v1/v2; PID 1 of the machine is not systemd.",
        f"Command: `python3 benchmarks/testbed_bench.py --sizes {' '.join(map(str, a.sizes))} "
        f"--repeat {a.repeat}` (testbed `{NAME}`, {SUBNET}). Image cached (built beforehand).",
        "Each figure: median of the repeats, wall clock of the CLI process (Python start included).",
        "`up` returns when every host's sshd answers with the host key written to known_hosts;",
        "'all running' = from the start of `up` until `systemctl is-system-running --wait` returned on every host (over SSH).",
        "",
        "| hosts | up (cached image) | all hosts `running` | `up` again (no change) | down | memory (PSS of the hosts) | systemd state |",
        "|---|---|---|---|---|---|---|",
    ]
    for n, ups, runnings, reruns, downs, mems, states in rows:
        lines.append(f"| {n} | {fmt(ups)} | {fmt(runnings)} | {fmt(reruns)} | {fmt(downs)} | "
                     f"~{statistics.median(mems):.0f} MB | {', '.join(sorted(states))} |")
    lines += ["", "Targets: 16 hosts up < 10 s with a cached image; down < 10 s.", ""]
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    with open(a.out, "w") as f:
        f.write("\n".join(lines))
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
