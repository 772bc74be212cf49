"""`m3deploy artifacts INVENTORY [--check] [--from DIR] [--images]`: build (once) or check every controller artifact
a deploy needs (m3deploy.controller.prepare)."""
from __future__ import annotations

import sys
import time

import click

from m3deploy.cli import fail, load
from m3deploy.cli.options import inventory_command, say
from m3deploy.controller import prepare
from m3deploy.core.errors import M3Error, plural


@click.command("artifacts", short_help="Build or check the controller artifacts a deploy needs.")
@inventory_command
@click.option("--check", "check_only", is_flag=True, help="Only verify what is there; build nothing (exit 1 if "
              "anything is missing or does not verify).")
@click.option("--from", "source", type=click.Path(exists=True, file_okay=False), metavar="DIR",
              help="Air-gapped controller: build the wheelhouses from this directory of wheels (no index).")
@click.option("--images", "save_images", is_flag=True, help="Also `docker save` the plan's images into "
              "m3_image_archive_dir (otherwise a missing archive is an error naming m3deploy save-images).")
def artifacts(inventory, data, check_only, source, save_images):
    """Build (once) and verify every controller artifact a deploy of INVENTORY needs: the ai-dynamo wheelhouse
    for each Python and CPU the hosts and engine containers need, the mock model, image archives. Safe to run
    beside a deploy: each artifact is built under a lock and published atomically. A deploy builds the same
    list itself before its first operation; this command does it ahead of time (or checks it)."""
    try:
        p = load(inventory, data, facts=False)[1]
        todo = prepare.needs(p)
    except M3Error as e:
        fail(e)
    if not todo:
        say(f"{inventory}: the deploy needs no controller artifact")
        return
    bad = 0
    for need in todo:
        more = " ..." if len(need.hosts) > 4 else ""
        hosts_txt = f"{plural(len(need.hosts), 'host')}: {', '.join(need.hosts[:4])}{more}"
        if check_only:
            where, problems = prepare.check(need)
            bad += bool(problems)
            status = "ok" if not problems else "PROBLEM: " + "; ".join(problems[:3])
            click.echo(f"{'ok ' if not problems else 'BAD'} {need.label}\n    {where or '-'}\n    {status}; "
                       f"for {hosts_txt}")
            continue
        t0 = time.monotonic()
        try:
            where = prepare.ensure(need, log=lambda m: say(f"    {m}", err=True), source=source,
                                   save_images=save_images)
        except M3Error as e:
            fail(e)
        click.echo(f"ok  {need.label}\n    {where}  ({time.monotonic() - t0:.1f} s; for {hosts_txt})")
    if bad:
        click.echo(f"{bad} of {plural(len(todo), 'artifact')} missing or not verified. Fix: m3deploy artifacts "
                   f"{inventory}", err=True)
        sys.exit(1)

