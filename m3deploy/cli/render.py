"""`m3deploy render INVENTORY OUTDIR [--host H ...] [--data KEY=VALUE ...] [--json]`: every file the deploy would
write on each host, written under OUTDIR/<host>/<absolute path>, with OUTDIR/<host>.json indexing them (path, mode,
owner, sha256; no digest of a secret file). Offline: no host is contacted, no secret is read or made (secret values
are masked `KEY=<secret: NAME>`). The text comes from m3deploy.deploy.hostfiles, which the roles ship."""
from __future__ import annotations

import json
import os
import posixpath
import shutil
from pathlib import Path

import click

from m3deploy.cli import fail, load_plan, output_dir
from m3deploy.cli.options import hosts_option, inventory_command, json_option, say, unknown_hosts
from m3deploy.core.errors import M3Error, plural


def _safe_name(name: str) -> bool:
    return bool(name) and "/" not in name and name not in (".", "..")


def render_hosts(plan, only=()) -> dict[str, list]:
    """{host: [HostFile]} for the chosen hosts, secrets masked; raises M3Error before anything is written."""
    from m3deploy.deploy.hostfiles import host_files

    names = [h.name for h in plan.hosts]
    bad = unknown_hosts(only, names)
    if bad:
        raise M3Error(bad)
    out = {}
    for hp in plan.hosts:
        if only and hp.name not in only:
            continue
        if not _safe_name(hp.name):
            raise M3Error(f"host {hp.name!r}: its name cannot be a directory name. Fix: rename it in the inventory")
        files = host_files(plan, hp, secrets=None)
        for f in files:
            if not f.path.startswith("/") or posixpath.normpath(f.path) != f.path:
                raise M3Error(f"host {hp.name}: {f.path!r} is not a normalized absolute path")
        out[hp.name] = files
    return out


def write_render(outdir: Path, cluster: str, rendered: dict[str, list]) -> int:
    """Write the files and each host's index; a host's earlier render (its directory and index) is replaced."""
    for name in rendered:
        tree, index = outdir / name, outdir / f"{name}.json"
        if tree.exists() and not index.is_file():
            raise M3Error(f"{tree} exists and is not an earlier render (no {index.name} beside it). "
                          "Fix: choose an empty OUTDIR")
    n = 0
    for name, files in rendered.items():
        tree, index = outdir / name, outdir / f"{name}.json"
        if tree.exists():
            shutil.rmtree(tree)
        for f in files:
            dest = tree / f.path.lstrip("/")
            dest.parent.mkdir(parents=True, exist_ok=True)
            if f.link:
                os.symlink(f.link, dest)
            else:
                dest.write_text(f.text)
            n += 1
        index.write_text(json.dumps({"cluster": cluster, "host": name, "files": [f.index() for f in files]},
                                    indent=2) + "\n")
    return n


@click.command("render", short_help="Write every file the deploy would write; contacts no host.")
@inventory_command
@click.argument("outdir", type=click.Path(file_okay=False))
@hosts_option()
@json_option("Print what was written as JSON ({host: [{path, mode, owner, group, sha256...}]}).")
@click.option("--no-facts", is_flag=True, help="Ignore the facts `m3deploy preflight` saved for this cluster.")
def render(inventory, data, outdir, hosts, as_json, no_facts):
    """Write every file the deploy would write on each host into OUTDIR/<host>/, secrets masked. Contacts no host.

    Review it, or `diff -r` two renders (before and after an inventory change)."""
    try:
        plan = load_plan(inventory, data, facts=not no_facts)
        rendered = render_hosts(plan, hosts)
        n = write_render(output_dir(outdir), plan.name, rendered)
    except M3Error as e:
        fail(e)
    if as_json:
        index = {h: [f.index() for f in files] for h, files in rendered.items()}
        click.echo(json.dumps({"outdir": outdir, "hosts": index}, indent=2))
        return
    say(f"{inventory}: {plural(n, 'file')} of {plural(len(rendered), 'host')} written under {outdir}/<host>/ "
        f"(index {outdir}/<host>.json; secret values masked)")
