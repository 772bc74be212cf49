"""`m3deploy certs INVENTORY [--json] [--data K=V]`: every certificate of the cluster the controller can see (name,
hosts, not-after, days left, issuer, what is due), from m3deploy.controller.certs; it makes none. Exit 1 when one
is inside the renewal window, expired or not strict X.509 (the next deploy renews ours; the user's own edge
certificate is replaced by its file)."""
from __future__ import annotations

import json

import click

from m3deploy.cli import fail, load_plan
from m3deploy.cli.options import inventory_command, json_option
from m3deploy.core.errors import M3Error


@click.command("certs", short_help="List the certificates, their days left; exit 1 if one is due.")
@inventory_command
@json_option("Print the certificates as JSON.")
def certs(inventory, data, as_json):
    """List the cluster's certificates with their days left; exit 1 when one is due."""
    from rich.console import Console
    from rich.table import Table

    from m3deploy.controller import certs as lifecycle
    from m3deploy.controller import secrets as store
    from m3deploy.controller import tls

    try:
        plan = load_plan(inventory, data, facts=False)
        stored = store.load_secrets(plan.name)
        found = lifecycle.inventory(plan, stored)
    except M3Error as e:
        fail(e)
        return
    rows = [{**c.to_dict(), "due": lifecycle.due(plan, c, stored)} for c in found]
    if as_json:
        click.echo(json.dumps(rows, indent=2))
    elif not rows:
        click.echo(f"no certificates for cluster {plan.name} (the deploy makes them with m3_edge or "
                   f"m3_internal_tls; store: {store.secrets_path(plan.name)})")
    else:
        t = Table(title=f"certificates of {plan.name} (renewal window {tls.days(plan, 'm3_cert_renew_days')} days)")
        for col in ("name", "hosts", "not after", "days left", "issuer", "due"):
            t.add_column(col)
        for r in rows:
            t.add_row(r["name"], ", ".join(r["hosts"]), r["not_after"], str(r["days_left"]), r["issuer"],
                      r["due"] or "-")
        Console(width=200).print(t)
    raise SystemExit(1 if any(r["due"] for r in rows) else 0)

