"""`m3deploy verify INVENTORY [--host H] [--skip-smoke] [--report FILE] [--json]`: the deployed cluster vs its plan."""
from __future__ import annotations

import json
import time

import click

from m3deploy.check import verify as verify_suite
from m3deploy.cli import fail, load
from m3deploy.cli.options import inventory_command, json_option
from m3deploy.core.errors import M3Error


@click.command(short_help="Check a deployed cluster against its plan; exit 1 on a failure.")
@inventory_command
@click.option("--host", "only_host", help="Only this host's units, ports, files and health (smoke still runs).")
@click.option("--skip-smoke", is_flag=True, help="No requests through the frontend.")
@click.option("--report", "report", type=click.Path(dir_okay=False), help="Also write the report to FILE "
              "(JSON with --json, else text).")
@json_option("Print machine-readable results (JSON) instead of the table.")
def verify(inventory, data, only_host, skip_smoke, report, as_json):
    """Check a deployed cluster against its plan: units, ports, file modes, health, smoke requests.

    Exit status: 0 when every check passed, 1 when any failed or nothing was deployed (no deploy record of the
    cluster's hosts: one line naming the record, no checks run), 2 when the plan cannot be built."""
    from rich.console import Console

    try:
        inv, plan = load(inventory, data, facts=False)
        checks = verify_suite.all_checks(plan, inv, only_host, smoke=not skip_smoke)
        ctx = verify_suite.Context(plan, inv)  # reads m3_api_key_file: a missing or readable-by-others file stops here
    except M3Error as e:
        fail(e)
        return
    missing = verify_suite.nothing_deployed(plan, only_host, inventory)
    if missing:  # no record of a deploy: say so at once instead of failing every check after its timeouts
        ctx.close()
        click.echo(json.dumps({"cluster": plan.name, "ok": False, "error": missing}) if as_json else missing,
                   err=not as_json)
        raise SystemExit(1)
    t0 = time.monotonic()
    try:
        results = verify_suite.run_checks(checks, ctx)
    finally:
        ctx.close()
    took = time.monotonic() - t0
    notes = verify_suite.plan_notes(plan, not skip_smoke, only_host)
    doc = verify_suite.to_json(plan, results, took, notes)
    if as_json:
        click.echo(json.dumps(doc, indent=2))
    else:
        con = Console()
        if not con.is_terminal:
            con = Console(width=160)
        verify_suite.print_report(results, con, title=f"m3deploy verify {plan.name} ({plan.endpoint})", seconds=took,
                     notes=notes)
    if report:
        with open(report, "w") as f:
            if as_json:
                json.dump(doc, f, indent=2)
                f.write("\n")
            else:
                f.write(verify_suite.render_text(results, title=f"m3deploy verify {plan.name} ({plan.endpoint})",
                                                 seconds=took, notes=notes))
    raise SystemExit(0 if doc["ok"] else 1)
