"""Benchmark: `m3deploy plan` on 144 GB200 trays (8 NVL72 racks x 18) + a control host. Target: < 1 s.

Measures the whole CLI as a user runs it (new process: Python start, imports, inventory load, build,
validation, JSON out) and the in-process build alone; best and median of N runs. Writes a markdown report.

    python benchmarks/plan_bench.py [--runs 7] [--out benchmarks/results/plan-YYYY-MM-DD.md]
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
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
INV = "benchmarks/inventories/gb200_nvl72x8.py"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--out", default=f"benchmarks/results/plan-{datetime.date.today()}.md")
    args = ap.parse_args()
    os.chdir(ROOT)

    cli = []
    for _ in range(args.runs):
        t = time.perf_counter()
        out = subprocess.run([sys.executable, "-m", "m3deploy.cli", "plan", INV, "--json"], capture_output=True,
                             check=True).stdout
        cli.append(time.perf_counter() - t)
    text = []
    for _ in range(args.runs):
        t = time.perf_counter()
        subprocess.run([sys.executable, "-m", "m3deploy.cli", "plan", INV], capture_output=True, check=True)
        text.append(time.perf_counter() - t)
    imp = []
    for _ in range(args.runs):
        t = time.perf_counter()
        subprocess.run([sys.executable, "-c", "import m3deploy.cli"], check=True)
        imp.append(time.perf_counter() - t)

    from m3deploy.core import build as planmod
    from m3deploy.core import inventory

    hosts = inventory.load_inventory(INV)
    build = []
    for _ in range(args.runs):
        t = time.perf_counter()
        p = planmod.build(hosts, name="gb200-nvl72x8")
        build.append(time.perf_counter() - t)
    n_services = sum(len(h.services) for h in p.hosts)

    def row(name, xs):
        return f"| {name} | {min(xs):.3f} | {statistics.median(xs):.3f} | {max(xs):.3f} |"

    report = "\n".join([
        f"# `m3deploy plan` on 144 GB200 trays + 1 control host ({datetime.date.today()})",
        "",
        f"Machine: {os.cpu_count()} cores, {platform.platform()}, Python {platform.python_version()}. "
        f"{args.runs} runs each; seconds. Target: the CLI under 1 s.",
        f"Plan: {len(p.hosts)} hosts, {len(p.workers)} workers (TP8 over 2 trays), {n_services} services; "
        f"JSON output {len(out) / 1e6:.1f} MB.",
        "",
        "| what | best | median | worst |",
        "|---|---|---|---|",
        row("`m3deploy plan INV --json` (whole process)", cli),
        row("`m3deploy plan INV` text (whole process)", text),
        row("`python -c 'import m3deploy.cli'` (start-up share)", imp),
        row("`plan.build()` in process (validate + build)", build),
        "",
    ])
    Path(args.out).write_text(report)
    print(report)


if __name__ == "__main__":
    main()
