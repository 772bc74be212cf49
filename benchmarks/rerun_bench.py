"""Benchmark: a cold deploy's operations per host, and a no-change re-run against the one-command floor.

On its own 3-host testbed (1 control + 2 mocker workers; name `m3spb`, 10.170.0.0/24 unless --name/--subnet):
1. a cold deploy from empty controller caches (a fresh M3DEPLOY_CACHE/M3DEPLOY_CONFIG; the testbed image cache is
   the machine's, or --testbed-cache): wall time, and for every host the operations that ran on it and how many
   of them changed something;
2. N paired runs, in one run, each pair back to back: `pyinfra -y inventories/testbed.py deploy.py` (must change
   nothing) and `pyinfra -y inventories/testbed.py exec -- true` (the floor: one SSH session and one command per
   host). The ratio reported is the median of the per-pair ratios;
   Then `m3deploy verify` (the demo's steps: up, deploy, verify);
3. one re-run with `--debug`, whose timestamps say where a re-run's time goes (printed, summarised).

    python benchmarks/rerun_bench.py [--pairs 5] [--out benchmarks/results/rerun-DATE.md] [--keep]
"""
from __future__ import annotations

import argparse
import datetime
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
INV = "inventories/testbed.py"
ANSI = re.compile(r"\x1b\[[0-9;]*m")
START = re.compile(r"^--> Starting operation: (?P<op>.*?)\s*$")
HOST_LINE = re.compile(r"^\s+\[(?P<host>[^\]]+)\] (?P<status>Success|No changes|Skipped|Error)\s*$")


def run(argv, env, check=True, timeout=1800):
    t = time.perf_counter()
    r = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout, check=False)
    took = time.perf_counter() - t
    out = ANSI.sub("", r.stdout + r.stderr)
    if check and r.returncode != 0:
        sys.stderr.write(out[-6000:])
        raise SystemExit(f"failed ({r.returncode}): {' '.join(argv)}")
    return took, out


def per_host(out: str) -> dict[str, dict[str, int]]:
    """host -> {"ops": operations executed on it (pyinfra says Success, No changes or Error; not Skipped: an op
    of other hosts, or one whose condition was false), "changed": of them, those that changed something}."""
    res: dict[str, dict[str, int]] = {}
    op = None
    for line in out.splitlines():
        m = START.match(line)
        if m:
            op = m["op"]
            continue
        m = HOST_LINE.match(line)
        if m and op:
            d = res.setdefault(m["host"], {"ops": 0, "changed": 0})
            d["ops"] += m["status"] != "Skipped"
            d["changed"] += m["status"] == "Success"
    return res


def grand_total(out: str) -> tuple[int, int]:
    m = re.search(r"Grand total\s+(\d+)\s+(\S+)", out)
    return (int(m.group(1)), 0 if m.group(2) == "-" else int(m.group(2))) if m else (0, -1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--name", default="m3spb")
    ap.add_argument("--subnet", default="10.170.0.0/24")  # not test_edge.py's 10.105
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("--testbed-cache", default=os.environ.get("M3_TESTBED_CACHE", ""))
    ap.add_argument("--label", default="")
    ap.add_argument("--out", default=f"benchmarks/results/rerun-{datetime.date.today()}.md")
    ap.add_argument("--keep", action="store_true", help="leave the testbed up")
    args = ap.parse_args()
    cold = tempfile.mkdtemp(prefix="m3-rerun-bench-cold-")
    env = {**os.environ, "M3_TESTBED": args.name, "M3DEPLOY_CACHE": cold,
           "M3DEPLOY_CONFIG": os.path.join(cold, "config")}
    if args.testbed_cache:
        env["M3_TESTBED_CACHE"] = args.testbed_cache
    tb = [sys.executable, "-m", "m3deploy.testbed.cli"]
    pyinfra = [sys.executable, "-m", "pyinfra", "-y", INV]
    load0 = os.getloadavg()
    run([*tb, "down", "--name", args.name], env, check=False)
    try:
        up, _ = run([*tb, "up", "3", "--name", args.name, "--subnet", args.subnet], env)
        cold_s, out = run([*pyinfra, "deploy.py"], env)
        ops_total, changed_total = grand_total(out)
        hosts = per_host(out)
        verify_s, _ = run([sys.executable, "-m", "m3deploy.cli", "verify", INV], env)
        print(f"cold deploy {cold_s:.1f} s, {ops_total} ops; per host {hosts}", flush=True)
        pairs = []
        for i in range(args.pairs):
            t_re, o_re = run([*pyinfra, "deploy.py"], env)
            t_fl, _ = run([*pyinfra, "exec", "--", "true"], env)
            pairs.append((t_re, t_fl, grand_total(o_re)[1]))
            print(f"pair {i + 1}: re-run {t_re:.2f} s (changed {pairs[-1][2]}), floor {t_fl:.2f} s", flush=True)
        t_dbg, o_dbg = run([*pyinfra, "deploy.py", "--debug"], env)
        Path(cold, "rerun-debug.log").write_text(o_dbg)
    finally:
        if not args.keep:
            run([*tb, "down", "--name", args.name], env, check=False)
    ratios = [a / b for a, b, _ in pairs]
    med = statistics.median(ratios)
    load1 = os.getloadavg()
    lines = [
        (f"## {args.label or 'rerun'}: `python benchmarks/rerun_bench.py --pairs {args.pairs}` "
         f"({datetime.datetime.now():%Y-%m-%d %H:%M})"),
        "",
        (f"Machine: {os.cpu_count()} cores shared with other engineers' jobs (load average {load0[0]:.1f} at the "
         f"start, {load1[0]:.1f} at the end), {platform.platform()}, Python {platform.python_version()}. Testbed: 3 "
         f"hosts (1 control + 2 mocker workers), up in {up:.1f} s. Controller caches empty at the start."),
        "",
        (f"Cold deploy: {cold_s:.1f} s, {ops_total} operations in pyinfra's table, {changed_total} with changes; "
         f"then `m3deploy verify` {verify_s:.1f} s. The demo's steps (testbed up + cold deploy + verify): "
         f"**{up + cold_s + verify_s:.1f} s**."),
        "",
        "| host | operations executed on it (cold; not Skipped) | of them changed something |",
        "|---|---|---|",
        *[f"| {h} | {d['ops']} | {d['changed']} |" for h, d in sorted(hosts.items())],
        "",
        "| pair | no-change re-run | `pyinfra -y INV exec -- true` | ratio | changed on the re-run |",
        "|---|---|---|---|---|",
        *[f"| {i + 1} | {a:.2f} s | {b:.2f} s | {a / b:.2f}x | {c} |" for i, (a, b, c) in enumerate(pairs)],
        "",
        (f"Median ratio of the paired runs: **{med:.2f}x** (re-run median {statistics.median(p[0] for p in pairs):.2f} s, "
         f"floor median {statistics.median(p[1] for p in pairs):.2f} s). A `--debug` re-run took {t_dbg:.2f} s."),
        "",
    ]
    text = "\n".join(lines)
    print(text)
    outp = ROOT / args.out
    outp.parent.mkdir(parents=True, exist_ok=True)
    with open(outp, "a") as f:
        f.write(text + "\n")
    print(f"debug log of the re-run: {cold}/rerun-debug.log")


if __name__ == "__main__":
    main()
