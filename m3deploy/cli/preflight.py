"""`m3deploy preflight INVENTORY [--host H ...] [--data KEY=VALUE ...] [--json] [--nccl] [--kv-transfer]`: facts vs
plan, changing nothing; exit 1 if any check failed."""
from __future__ import annotations

import json

import click

from m3deploy.check.preflight import pyinfra_inventory, render_report, report_json, run_preflight
from m3deploy.cli import _parse_data, load
from m3deploy.cli.options import hosts_option, inventory_command, json_option
from m3deploy.core.errors import M3Error


@click.command("preflight", short_help="Check every host's facts against the plan; changes nothing.")
@inventory_command
@hosts_option()
@json_option("Print checks and facts as JSON.")
@click.option("--nccl", is_flag=True, help="Also run a short NCCL all-reduce across each GPU host's GPUs.")
@click.option("--kv-transfer", is_flag=True, help="m3_disagg: also run ucx_perftest GPU to GPU between each prefill "
              "and decode host, in the worker image, against the KV bandwidth floor (docs/DISAGG.md).")
def preflight(inventory: str, data: tuple[str, ...], hosts: tuple[str, ...], as_json: bool, nccl: bool,
              kv_transfer: bool) -> None:
    """Gather facts from every host and check them against the plan. Changes nothing."""
    try:
        _, cluster = load(inventory, data, facts=False)
        inv = pyinfra_inventory(inventory, _parse_data(data))
        report = run_preflight(inv, cluster, hosts, nccl, kv_transfer)
    except M3Error as e:
        raise click.ClickException(str(e)) from e
    if as_json:
        click.echo(json.dumps(report_json(report), indent=2, sort_keys=True))
    else:
        render_report(report)
    failed = [n for n, r in report.items() if not all(c.ok for c in r["checks"])]
    if failed:
        if not as_json:
            click.echo(f"preflight failed on: {', '.join(failed)}", err=True)
        raise SystemExit(1)
