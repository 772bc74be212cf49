"""Benchmark: prepare time of an `@fake` deploy of N GB200 trays (NVL72 racks of 18) plus one control host.

Runs deploy.py the way `pyinfra -y INVENTORY deploy.py` loads it (tests/deploy/conftest.py run_deploy_file:
pyinfra's load_deploy_file, every host's copy in pyinfra's greenlet pool) on `@fake/<name>` hosts with the
deploy tests' fact values (provisioned trays), and times pyinfra's load of deploy.py on every host (the plan,
every role's operations: the prepare proper) and the whole run (connect + prepare + reading every operation's
commands, which the test harness does). Nothing runs on a host. The plan must be built once per deploy, so the
time should grow linearly with the number of hosts.

    python benchmarks/prepare_bench.py [--trays 72 144 288] [--runs 3] [--out benchmarks/results/prepare-DATE.md]
"""
from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

CLUSTER = {"m3_platform": "gb200", "m3_variant": "nvfp4", "m3_parallel": "tp8", "m3_engine": "vllm",
           "m3_serving": "dynamo", "m3_features": ["eagle3-gqa", "text-only"]}


def cluster_hosts(trays: int):
    """{"control": [...], "workers": [...]} for `trays` GB200 trays, 18 per rack, TP8 over pairs of trays."""
    workers = [(f"r{1 + i // 18:02d}-t{1 + i % 18:02d}",
                {"ssh_hostname": f"10.100.{1 + i // 18}.{11 + i % 18}", "m3_address": f"10.100.{1 + i // 18}.{11 + i % 18}",
                 "m3_interface": "enP5p9s0", "m3_rack": 1 + i // 18, "m3_tray": 1 + i % 18, **CLUSTER})
               for i in range(trays)]
    control = [("ctl-01", {"ssh_hostname": "10.100.0.10", "m3_address": "10.100.0.10", **CLUSTER})]
    return {"control": control, "workers": workers}


def setup_controller(tmp: Path):
    """The controller's caches under tmp, with a complete (tiny) wheelhouse: as tests/deploy does."""
    os.environ["M3DEPLOY_CONFIG"] = str(tmp / "config")
    os.environ["M3DEPLOY_CACHE"] = str(tmp / "cache")
    from tests.deploy.test_deploy_py import HF_TOKEN, controller  # noqa: F401 (same fixture data)
    os.environ["HF_TOKEN"] = HF_TOKEN
    import pytest
    mp = pytest.MonkeyPatch()
    gen = controller.__wrapped__(tmp, mp, None) if hasattr(controller, "__wrapped__") else None
    if gen is None:  # pytest keeps the fixture function under _get_wrapped_function / __pytest_wrapped__
        fn = getattr(controller, "__pytest_wrapped__", None)
        gen = (fn.obj if fn else controller)(tmp, mp, None)
    next(gen)
    return mp


def prepare(trays: int) -> tuple[float, float, int, float, int]:
    from pyinfra.facts.server import Os, Which

    from m3deploy.core.build import build
    from m3deploy.core.inventory import hosts_from_dict
    from tests.deploy import test_deploy_py as deploy_tests
    from tests.deploy.conftest import run_deploy_file

    groups_in = cluster_hosts(trays)
    hosts = hosts_from_dict(groups_in)
    plan = build(hosts, name="bench")
    groups = {"control": [n for n, _ in groups_in["control"]], "workers": [n for n, _ in groups_in["workers"]],
              "bench": [h.name for h in hosts]}
    spec = {}
    for h in hosts:
        hp = plan.host(h.name)
        fn = {"nvidia": deploy_tests.nvidia_facts, "amd": deploy_tests.amd_facts}.get(hp.gpu_vendor, deploy_tests.control_facts)
        spec[h.name] = {"data": dict(h.data),
                        "facts": {Os: "Linux", Which: lambda command: f"/usr/sbin/{command}", **fn(hp, plan)}}
    import pyinfra_cli.util

    load, spent = pyinfra_cli.util.load_deploy_file, []

    def timed(*a, **kw):  # pyinfra's prepare proper: every host's deploy.py (plan, roles, operations)
        t0 = time.perf_counter()
        try:
            return load(*a, **kw)
        finally:
            spent.append(time.perf_counter() - t0)

    try:  # the plan builder, wherever this checkout keeps it (m3deploy.plan before the layered layout)
        from m3deploy.core import build as planmod
    except ImportError:
        from m3deploy import plan as planmod
    build_fn, builds = planmod.build, []

    def timed_build(*a, **kw):
        t0 = time.perf_counter()
        try:
            return build_fn(*a, **kw)
        finally:
            builds.append(time.perf_counter() - t0)

    pyinfra_cli.util.load_deploy_file, planmod.build = timed, timed_build
    try:
        t = time.perf_counter()
        run = run_deploy_file(spec, groups)
        took = time.perf_counter() - t
    finally:
        pyinfra_cli.util.load_deploy_file, planmod.build = load, build_fn
    assert run.error is None, run.error
    return took, sum(spent), len(builds), sum(builds), sum(len(ops) for ops in run.ops_by_host.values())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trays", type=int, nargs="+", default=[72, 144, 288])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--label", default="")
    ap.add_argument("--out", default=f"benchmarks/results/prepare-{datetime.date.today()}.md")
    args = ap.parse_args()
    os.chdir(ROOT)
    with tempfile.TemporaryDirectory() as tmp:
        setup_controller(Path(tmp))
        rows = []
        prepare(4)  # warm up: imports, the controller's caches (built and verified once per process)
        for n in args.trays:
            times, loads, plans, ops = [], [], [], 0
            for _ in range(args.runs):
                took, load, n_builds, in_build, ops = prepare(n)
                times.append(took)
                loads.append(load)
                plans.append((n_builds, in_build))
            rows.append((n, statistics.median(loads), statistics.median(times), ops, plans[-1]))
            print(rows[-1], flush=True)
    lines = [f"## {args.label or 'prepare'}: `python benchmarks/prepare_bench.py --trays "
             f"{' '.join(map(str, args.trays))} --runs {args.runs}` ({datetime.date.today()})", "",
             f"Machine: {os.cpu_count()} cores, {platform.platform()}, Python {platform.python_version()}.", "",
             "| GB200 trays (+1 control) | deploy.py prepare (median) | per tray | plan builds (time in them) "
             "| whole @fake run (median) | ops (all hosts) |", "|---|---|---|---|---|---|"]
    lines += [f"| {n} | {p:.2f} s | {1000 * p / n:.1f} ms | {nb} ({tb:.2f} s) | {m:.2f} s | {ops} |"
              for n, p, m, ops, (nb, tb) in rows]
    text = "\n".join(lines) + "\n"
    out = ROOT / args.out
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "a") as f:
        f.write(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
