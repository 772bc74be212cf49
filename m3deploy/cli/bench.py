"""`m3deploy bench INVENTORY [--profile seed|sweep|custom] [--out DIR] [--compare OLD] [--dry-run]`: the seed's
benchmark on a deployed cluster, once every planned worker is routable (m3deploy.check.bench, docs/BENCH.md)."""
from __future__ import annotations

import os
import sys
from datetime import datetime, timezone
from pathlib import Path

import click

from m3deploy.check import bench as bench_suite
from m3deploy.cli import fail, load
from m3deploy.cli.options import inventory_command
from m3deploy.core.errors import M3Error


@click.command("bench", short_help="Benchmark a deployed cluster and write a report.")
@inventory_command
@click.option("--profile", type=click.Choice(["seed", "sweep", "custom"]), default="seed", show_default=True,
              help="seed: the seed's workload exactly; sweep: concurrency 1, 2, 4, ... up to --concurrency "
                   f"(default {bench_suite.SWEEP_CAP}); custom: the seed's workload with your flags.")
@click.option("--input-len", type=int, help="Random input tokens per prompt (seed: 2048).")
@click.option("--output-len", type=int, help="Output tokens per request (seed: 1024).")
@click.option("--num-prompts", type=int, help="Requests per run (seed: 100; sweep: 10 x concurrency).")
@click.option("--concurrency", type=int, help="Max concurrency (seed: 10); a sweep's cap.")
@click.option("--endpoint", type=click.Choice(list(bench_suite.ENDPOINTS)), help="completions (seed) or chat.")
@click.option("--client", type=click.Choice(["auto", "vllm", "aiperf"]), default="auto", show_default=True,
              help="vllm: `vllm bench serve` in the worker's engine image on a worker host; aiperf: NVIDIA AIPerf "
                   "on the controller; auto: vllm when workers run in containers, else aiperf.")
@click.option("--image", help="Run `vllm bench serve` in this image instead of the worker's.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), help="Report directory "
              "(default bench/<cluster>-<UTC timestamp>/).")
@click.option("--compare", "compare_dir", type=click.Path(file_okay=False), help="An earlier run's directory: "
              "print and plot the deltas (with --dry-run or alone: compare --out against it without running).")
@click.option("--timeout", "timeout_s", type=float, help="Seconds to wait for every worker to be routable "
              "(default: the frontend's readiness timeout from the plan).")
@click.option("--dry-run", is_flag=True, help="Print the commands it would run; send nothing.")
def bench(inventory, data, profile, input_len, output_len, num_prompts, concurrency, endpoint, client, image, out_dir,
          compare_dir, timeout_s, dry_run):
    """Benchmark a deployed cluster (the seed's `vllm bench serve` workload by default) and write a report:
    report.json, report.md, latency.png, workers.png (and sweep.png, compare.png).

    Waits first until every planned worker is routable: a run with 5 of 8 workers up reports 40 % less
    throughput. Exit status: 0 done with no failed request, 1 some requests failed, 2 it could not run."""
    from rich.console import Console

    console = Console(stderr=True)
    try:
        inv, plan = load(inventory, data, facts=False)
        w = bench_suite.workload(profile, input_len, output_len, num_prompts, concurrency, endpoint)
        who = bench_suite.default_client(plan) if client == "auto" else client
        stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
        out = Path(out_dir or os.path.join("bench", f"{plan.name}-{stamp}"))
        if dry_run:
            click.echo(bench_suite.dry_run_text(plan, profile, w, who, image, out))
            return
        if (out / "report.json").is_file():
            if compare_dir:  # two finished runs: compare only
                bench_suite.need_client("none")  # the plots' matplotlib
                bench_suite.compare_dirs(Path(compare_dir), out, console)
                return
            raise M3Error(f"{out}/report.json exists: a new run would overwrite it. Fix: another --out DIR "
                          f"(or --compare OLD --out {out} to compare that run with OLD without running)")
        bench_suite.need_client(who)
        report = bench_suite.run(plan, inv, profile, w, out, who, console, image, timeout_s)
        click.echo(Path(out / "report.md").read_text())
        click.echo(f"report: {out}/ (report.json, report.md, " + ", ".join(
            sorted(p.name for p in out.glob("*.png"))) + ")")
        if compare_dir:
            bench_suite.compare_dirs(Path(compare_dir), out, console)
    except (M3Error, FileNotFoundError, ValueError) as e:
        fail(e if isinstance(e, M3Error) else M3Error(str(e)))
        return
    sys.exit(1 if report["failed"] else 0)
