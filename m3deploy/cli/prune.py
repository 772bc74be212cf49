"""`m3deploy prune INVENTORY [--host H ...] [--data KEY=VALUE ...] [--yes | --json]`: drain and tear down the
deployed hosts that the inventory no longer names (scale in). Without --yes it only lists them. The decisions and
guards: m3deploy.controller.prune."""
from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import tempfile
import urllib.request

import click

from m3deploy.cli import fail, load
from m3deploy.cli.options import hosts_option, inventory_command, json_option
from m3deploy.core.errors import M3Error
from m3deploy.deploy.hostfiles import REPO


def _listed_at(health_url: str, addresses: set[str]) -> list[str]:
    """The frontend's `generate` instances whose address is one of `addresses`."""
    from m3deploy.check.checks import generate_instances, instance_address

    with urllib.request.urlopen(health_url, timeout=5) as r:
        doc = json.loads(r.read().decode())
    return [a for a in map(instance_address, generate_instances(doc)) if a in addresses]


def _still_serving(plan, targets) -> str:
    """After the teardown: every planned worker listed by the frontend, none at a pruned host's address."""
    from m3deploy.check import rollout
    from m3deploy.check.checks import frontend_url, instance_services, metrics_url

    health = frontend_url(plan, "/health")
    if not health:
        return "no frontend in the plan: not checked"
    rollout.wait_workers(health, {f"{h.name}/{s.name}": metrics_url(h, s) for h, s in instance_services(plan)},
                         timeout_s=120)
    left = _listed_at(health, {t.address for t in targets})
    if left:
        raise M3Error(f"the frontend still lists instances at {', '.join(sorted(set(left)))} after the teardown")
    return f"the frontend lists every planned worker ({len(plan.workers)}) and none of the pruned hosts"


@click.command(short_help="Drain and tear down hosts taken out of the inventory.")
@inventory_command
@hosts_option("Only this host (repeatable); default: every host in the deploy record that the inventory does not "
              "name.")
@click.option("--yes", is_flag=True, help="Do it: drain, tear down by each host's manifest, drop it from the record.")
@json_option("Print the candidates as JSON (without --yes).")
def prune(inventory, data, hosts, yes, as_json):
    """Drain and tear down hosts that are in the deploy record but no longer in the inventory.

    A plain deploy never removes a host (it warns and names this command), so an inventory with a host left out by
    mistake tears nothing down. Exit status: 0 (listed, or done), 1 (the teardown or the check after it failed),
    2 (refused: nothing was changed)."""
    from m3deploy.controller import deployed
    from m3deploy.controller import prune as pr

    try:
        if as_json and yes:
            raise M3Error("--json lists the candidates and changes nothing. Fix: --json without --yes, or --yes "
                          "without --json")
        inv, plan = load(inventory, data, facts=False)
        targets = pr.plan(plan, deployed.load(plan.name), inv, hosts)
    except M3Error as e:
        fail(e)
        return
    if as_json:
        click.echo(json.dumps({"cluster": plan.name, "changed": False, "candidates": [
            {"host": t.name, "address": t.connect["ssh_hostname"], "recorded": t.at, "services": list(t.services)}
            for t in targets]}, indent=2))
        return
    if not targets:
        click.echo(f"{plan.name}: every host in the deploy record is in the inventory, nothing to prune")
        return
    for t in targets:
        click.echo(f"- {t.name} ({t.connect['ssh_hostname']}, recorded {t.at}): drain {', '.join(t.services) or '-'}, "
                   "then remove what its /etc/m3/manifest.json names (units, files, directories, venvs, caches, "
                   "packages, users), then drop it from the deploy record")
    if not yes:
        click.echo(f"nothing was changed; to do it: m3deploy prune {shlex.quote(inventory)} "
                   + "".join(f"--data {shlex.quote(d)} " for d in data)
                   + " ".join(f"--host {t.name}" for t in targets) + " --yes")
        return
    with tempfile.TemporaryDirectory(prefix="m3deploy-prune-") as tmp:
        path = os.path.join(tmp, f"prune_{plan.name}.py")
        with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as f:
            f.write(pr.inventory_text(targets))
        rc = subprocess.call([sys.executable, "-m", "pyinfra", "-y", path, str(REPO / "prune.py")], cwd=REPO)
    if rc != 0:
        click.echo(f"error: the teardown stopped (pyinfra exit {rc}, its output is above); the deploy record still "
                   "lists the host(s). Fix the cause and run this again", err=True)
        sys.exit(1)
    path = deployed.forget(plan.name, [t.name for t in targets])
    click.echo(f"removed {', '.join(t.name for t in targets)} from {path}")
    try:
        click.echo(_still_serving(plan, targets))
    except (M3Error, OSError, ValueError) as e:
        click.echo(f"error: after the prune: {e}", err=True)
        sys.exit(1)
