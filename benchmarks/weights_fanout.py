"""Weights fan-out on the testbed: time to stage one mock repo from the controller to every worker host, for
clusters of several sizes, tree (m3_weights_fanout = k) against flat (k = hosts: the controller serves every
host at once, what every host pulling from one server looks like), through the real deploy role
(benchmarks/weights_deploy.py -> roles/weights.py) over real SSH/rsync between the testbed's hosts.

    python3 -m m3deploy.cli testbed up 15 --name wfan --subnet 10.86.0.0/24
    python3 benchmarks/weights_fanout.py --testbed wfan --sizes 3,7,15 --mb 300 --fanout 1,flat \
        --out benchmarks/results/weights-fanout-2026-12-01.md

A cluster of N hosts is the testbed's first N hosts (1 control host, N-1 workers that receive). Before each
run every worker's copy (and marker) is removed; the controller's mock repo is built once (cached). The staging
time is from pyinfra's first round op to its results table (rsync already installed: a warm-up run installs
it); the wall time includes connecting and planning. Environment: M3DEPLOY_CACHE / M3DEPLOY_CONFIG as for any
deploy.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

INVENTORY = '''"""benchmarks/weights_fanout.py: the first {n} hosts of testbed {name}."""
from m3deploy.testbed import load_state as _load_state

_state = _load_state({name!r})
_hosts = _state["hosts"][:{n}]


def _host(h):
    return (h["name"], {{"ssh_hostname": h["address"], "ssh_user": "root", "ssh_key": _state["ssh"]["private_key"],
                         "ssh_known_hosts_file": _state["ssh"]["known_hosts"], "ssh_strict_host_key_checking": "yes",
                         "m3_address": h["address"], "m3_interface": "eth0"}})


control = [_host(h) for h in _hosts[:1]]
workers = [_host(h) for h in _hosts[1:]]
'''


def ssh(state: dict, host: str, command: str) -> str:
    return subprocess.run(["ssh", "-F", state["ssh"]["ssh_config"], host, command], check=True,
                          capture_output=True, text=True, timeout=300).stdout


def wipe(state: dict, hosts: list[str]) -> None:
    for h in hosts:
        ssh(state, h, "rm -rf /var/lib/m3/hf/hub/models--* /var/lib/m3/hf/.m3-complete-*")


def deploy(inv: Path, data: dict, log: Path) -> dict:
    args = ["pyinfra", "-y", str(inv), str(ROOT / "benchmarks" / "weights_deploy.py")]
    for k, v in data.items():
        args += ["--data", f"{k}={v}"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    t0 = time.monotonic()
    first = last = None
    rounds = 0
    with open(log, "w") as out:
        p = subprocess.Popen(args, cwd=inv.parent, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        for line in p.stdout:
            out.write(line)
            if "--> Starting operation: Model weights | Weights round" in line:
                first = first or time.monotonic()
                rounds += 1
            elif "--> Results" in line:
                last = time.monotonic()
        rc = p.wait()
    if rc:
        raise SystemExit(f"pyinfra failed (rc {rc}), see {log}")
    wall = time.monotonic() - t0
    return {"wall_s": round(wall, 1), "staging_s": round((last - first), 1) if first and last else 0.0,
            "rounds": rounds}


def identical(state: dict, hosts: list[str], repo_folder: str) -> bool:
    sums = {ssh(state, h, f"cd {repo_folder}/snapshots/*/ && sha256sum * | sha256sum") for h in hosts}
    return len(sums) == 1


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--testbed", default="wfan")
    ap.add_argument("--sizes", default="3,7,15")
    ap.add_argument("--mb", type=int, default=300)
    ap.add_argument("--fanout", default="1,flat", help="comma list of degrees; 'flat' = the number of workers")
    ap.add_argument("--out", default="")
    a = ap.parse_args(argv)

    from m3deploy.testbed import load_state

    state = load_state(a.testbed)
    sizes = [int(x) for x in a.sizes.split(",")]
    if max(sizes) > len(state["hosts"]):
        raise SystemExit(f"testbed {a.testbed} has {len(state['hosts'])} hosts; needs {max(sizes)}")
    work = Path(tempfile.mkdtemp(prefix="m3-wfan-"))
    (work / "group_data").symlink_to(ROOT / "group_data")
    base = {"m3_weights_source": "controller", "m3_mock_repo_mb": a.mb}
    results = []
    warm = work / "warm" / "testbed.py"  # named testbed.py: group_data/testbed.py applies
    warm.parent.mkdir()
    (warm.parent / "group_data").symlink_to(ROOT / "group_data")
    warm.write_text(INVENTORY.format(n=max(sizes), name=a.testbed))
    print(f"warm-up on {max(sizes)} hosts (installs rsync, builds the {a.mb} MB mock repo)", flush=True)
    deploy(warm, {**base, "m3_weights_fanout": 4}, work / "warm.log")
    for n in sizes:
        inv = work / f"n{n}" / "testbed.py"
        inv.parent.mkdir()
        (inv.parent / "group_data").symlink_to(ROOT / "group_data")
        inv.write_text(INVENTORY.format(n=n, name=a.testbed))
        workers = [h["name"] for h in state["hosts"][1:n]]
        for f in a.fanout.split(","):
            k = len(workers) if f == "flat" else int(f)
            wipe(state, workers)
            r = deploy(inv, {**base, "m3_weights_fanout": k}, work / f"n{n}-k{f}.log")
            ok = identical(state, workers, "/var/lib/m3/hf/hub/models--MiniMaxAI--MiniMax-M3")
            again = deploy(inv, {**base, "m3_weights_fanout": k}, work / f"n{n}-k{f}-rerun.log")
            row = {"hosts": n, "receivers": len(workers), "mode": "flat" if f == "flat" else f"tree k={k}",
                   "degree": k, **r, "mb": a.mb, "gb_moved": round(len(workers) * a.mb / 1024, 2),
                   "agg_mb_s": round(len(workers) * a.mb / r["staging_s"], 0) if r["staging_s"] else 0,
                   "bit_identical": ok, "rerun_rounds": again["rounds"]}
            row["load1"] = round(os.getloadavg()[0], 1)
            results.append(row)
            print(json.dumps(row), flush=True)
    wipe(state, [h["name"] for h in state["hosts"][1:max(sizes)]])
    if a.out:
        write_report(Path(a.out), results, a)
    return 0


def write_report(path: Path, results: list[dict], a) -> None:
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")),
               platform.processor())
    rows = ["| hosts | receivers | mode | rounds | staging s | wall s | GB moved | aggregate MB/s | bit-identical | "
            "re-run rounds |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        rows.append(f"| {r['hosts']} | {r['receivers']} | {r['mode']} | {r['rounds']} | {r['staging_s']} | "
                    f"{r['wall_s']} | {r['gb_moved']} | {r['agg_mb_s']:.0f} | {r['bit_identical']} | "
                    f"{r['rerun_rounds']} |")
    cmd = "python3 benchmarks/weights_fanout.py " + " ".join(shlex.quote(x) for x in sys.argv[1:])
    text = (f"# Weights fan-out on the testbed, {time.strftime('%Y-%m-%d')}\n\n"
            f"Machine: {os.cpu_count()} CPU cores ({cpu}), "
            f"{round(os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30)} GiB RAM, shared with other "
            f"sessions; testbed hosts are network namespaces on one bridge (veth, loopback speed), their disks one "
            f"overlayfs on one virtual disk. Python {platform.python_version()}, rsync "
            f"{_rsync_version()}. Load average (1 min) after the runs: "
            f"{min(r['load1'] for r in results)}-{max(r['load1'] for r in results)}.\n\n"
            f"Command: `{cmd}`\n\nOne mock repo of {a.mb} MB "
            f"(m3deploy.controller.mockrepos, {max(1, -(-a.mb // 100))} shards) from the controller's cache to every "
            "worker host, through roles/weights.py. `staging s`: first round op to pyinfra's results; `wall s`: "
            "the whole pyinfra run. `re-run rounds`: round ops of the same deploy run again (0: nothing moved).\n\n"
            + "\n".join(rows) + "\n\n" + re.sub(r"\n{3,}", "\n\n", ANALYSIS))
    path.write_text(text)


def _rsync_version() -> str:
    out = subprocess.run(["rsync", "--version"], capture_output=True, text=True).stdout.split()
    return out[2] if len(out) > 2 else "?"


ANALYSIS = """## What these figures can and cannot show

Every byte here crosses one machine: the "links" are veth pairs on one bridge, the "disks" one virtual disk,
and the ssh encryption and rsync checksums of every transfer share 2 CPU cores (with other sessions' work on
them: see the load average above). Tree and flat move the same bytes (receivers x repo) through the same
cores and disk, so the testbed cannot show the tree's network gain. What the figures do show:

- the role runs for real at 3, 7 and 15 hosts: rounds = ceil(log_(k+1)(receivers + 1)) ops (2/3/4 for k = 1,
  1/2/3 for k = 2), host-to-host pulls through `rrsync -ro` with the per-cluster key, every copy bit-identical
  to the controller's, and a re-run moves nothing (0 round ops);
- the fixed cost of a round (one pyinfra op on every host, ssh set-up, the index check on every receiver):
  about 2-5 s here, the gap between the tree and flat rows at 3 and 7 hosts;
- how one source serving many receivers at once (flat) compares with the trees at equal bytes, on this
  machine (ssh/rsync pairs contending for 2 cores and one disk). Single runs on a shared machine.

What the testbed cannot show is the tree's reason: on a real cluster every host has its own NIC and disk, so
the bytes moved in one round add up across hosts, while a single source (the controller, or the hub through the
site uplink) is limited by its own. docs/WEIGHTS.md gives that model for 144 trays x 250 GB.
"""

if __name__ == "__main__":
    sys.exit(main())
