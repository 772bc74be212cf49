"""`m3deploy status INVENTORY [--watch] [--source auto|prometheus|direct] [--json]` and
`m3deploy dashboards INVENTORY OUTDIR`: the cluster now (m3deploy.check.status) and its Grafana dashboards
(m3deploy.core.monitor)."""
from __future__ import annotations

import json
import time

import click

from m3deploy.cli import fail, load_plan, output_dir
from m3deploy.cli.options import inventory_command, json_option, say
from m3deploy.core.errors import M3Error

PIPE_WIDTH = 1000  # the tables' own width is their content's (expand=False); this only keeps rich from folding them


@click.command(short_help="The cluster now: workers, control services, hosts down.")
@inventory_command
@click.option("--watch", is_flag=True, help="Refresh until interrupted.")
@click.option("--interval", default=2.0, show_default=True, help="Seconds between refreshes (--watch).")
@click.option("--source", type=click.Choice(["auto", "prometheus", "direct"]), default="auto", show_default=True,
              help="auto: Prometheus when the plan has it and it answers, else each service's /metrics.")
@json_option("Print the snapshot as JSON.")
def status(inventory, data, watch, interval, source, as_json):
    """Per worker: up, routable, in flight, req/s, TTFT p50/p99, KV usage, restarts; per control service: up,
    leader, members; the hosts that do not answer. Exit 1 when anything planned is down or not routable."""
    from rich.console import Console
    from rich.live import Live

    from m3deploy.check import status as cluster_status

    try:
        plan = load_plan(inventory, data, facts=False)
    except M3Error as e:
        fail(e)
        return
    snap = cluster_status.snapshot(plan, source)
    if as_json:
        click.echo(json.dumps(snap.to_dict(), indent=2))
        raise SystemExit(0 if snap.ok else 1)
    con = Console()
    if not con.is_terminal:  # a pipe or a file: every column (rich would fit them into 80), no colours
        con = Console(width=PIPE_WIDTH)
    if not watch:
        con.print(cluster_status.render(snap))
        raise SystemExit(0 if snap.ok else 1)
    try:
        if not con.is_terminal:  # no live redraw in a pipe: each snapshot in turn, flushed
            while True:
                con.print(cluster_status.render(snap))
                con.file.flush()
                time.sleep(interval)
                snap = cluster_status.snapshot(plan, source)
        with Live(cluster_status.render(snap), console=con, refresh_per_second=4) as live:
            while True:
                time.sleep(interval)
                live.update(cluster_status.render(cluster_status.snapshot(plan, source)))
    except KeyboardInterrupt:
        pass


@click.command(short_help="Write Grafana dashboards and the Prometheus config.")
@inventory_command
@click.argument("outdir", type=click.Path(file_okay=False))
def dashboards(inventory, data, outdir):
    """Write the cluster's Grafana dashboards (JSON, one file each) and its Prometheus config and rules into
    OUTDIR, for a Grafana or Prometheus of your own."""
    from m3deploy.core import monitor

    try:
        plan = load_plan(inventory, data, facts=False)
        out = output_dir(outdir)
    except M3Error as e:
        fail(e)
        return
    for name, doc in monitor.dashboards(plan).items():
        (out / name).write_text(monitor.dashboard_json(doc))
        say(f"wrote {out / name}")
    for name, text in (("prometheus.yml", monitor.to_yaml(monitor.prometheus_config(plan))),
                       ("prometheus-rules.yml", monitor.to_yaml(monitor.rules(plan)))):
        (out / name).write_text(text)
        say(f"wrote {out / name}")
