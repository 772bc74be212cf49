"""`m3deploy testbed up N | status | down | ssh` (a click group; the main CLI adds it with add_command)."""

from __future__ import annotations

import json
import os
import sys

import click

from m3deploy.core.errors import M3Error, plural

from . import config, core

NAME_OPT = click.option("--name", default=config.DEFAULT_NAME, show_default=True, metavar="NAME",
                        help="Testbed name (1-8 lower-case letters/digits); prefix of its hosts.")


def _echo(msg: str) -> None:
    click.echo(msg)


def _fail(exc: M3Error) -> None:
    click.echo(f"error: {exc}", err=True)
    sys.exit(1)


@click.group(name="testbed", short_help="A local testbed of systemd hosts over SSH (needs root).")
def testbed():
    """Local testbed of systemd hosts over SSH (like `kind`, for bare metal). Needs root."""


@testbed.command()
@click.argument("n", type=click.IntRange(1, config.MAX_HOSTS))
@NAME_OPT
@click.option("--subnet", default=None, metavar="CIDR",
              help=f"Private /24 for the bridge (default {config.DEFAULT_SUBNET}; fixed once the testbed exists).")
@click.option("--install-deps", is_flag=True,
              help=f"apt-get install {' '.join(config.HOST_DEPS)} first when missing.")
@click.option("--timeout", default=90.0, show_default=True, help="Seconds to wait for hosts to answer SSH.")
@click.option("--docker", is_flag=True, help="Hosts that can run dockerd (m3_runtime=docker; fixed once the "
              "testbed exists; docs/TESTBED.md).")
@click.option("--net-admin", is_flag=True, help="Hosts with CAP_NET_ADMIN in their network namespace (an address "
              "added by keepalived or `ip addr add`; fixed once the testbed exists; docs/TESTBED.md).")
@click.option("--sudo-user", is_flag=True, help=f"Hosts that also have user {config.SUDO_USER} (the testbed's SSH "
              "key, passwordless sudo), to deploy as a non-root user: --data ssh_user=... --data _sudo=True "
              "(fixed once the testbed exists; docs/INVENTORY.md).")
def up(n, name, subnet, install_deps, timeout, docker, net_admin, sudo_user):
    """Bring up (at least) N hosts. Idempotent: again = no change; a larger N adds hosts."""
    options = (("docker",) if docker else ()) + (("net-admin",) if net_admin else ()) + (
        ("sudo-user",) if sudo_user else ())
    try:
        core.up(n, name=name, subnet=subnet, install_deps=install_deps, timeout=timeout, options=options, log=_echo)
    except M3Error as exc:
        _fail(exc)


@testbed.command(short_help="Remove every trace of the testbed.")
@NAME_OPT
@click.option("--purge-cache", is_flag=True, help="Also delete the cached host image and apt cache.")
def down(name, purge_cache):
    """Remove every trace of the testbed (hosts, network, mounts, cgroups, sysctls, proxy, files)."""
    try:
        core.down(name=name, purge_cache=purge_cache, log=_echo)
    except M3Error as exc:
        _fail(exc)


@testbed.command()
@NAME_OPT
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def status(name, as_json):
    """Hosts, addresses, systemd state and whether sshd answers."""
    try:
        st = core.status(name)
    except M3Error as exc:
        _fail(exc)
    if as_json:
        click.echo(json.dumps(st, indent=2))
        return
    from rich.console import Console
    from rich.table import Table

    con = Console()
    proxy = st["apt_proxy"]
    con.print(f"testbed [bold]{st['name']}[/] {st['subnet']} bridge {st['bridge']['name']} "
              f"{st['bridge']['address']} ({'present' if st['bridge_present'] else 'MISSING'}); "
              f"apt proxy {proxy['url']} ({'answers' if proxy['answers'] else 'DOWN'})")
    table = Table("host", "address", "netns", "process", "systemd", "sshd")
    for h in st["hosts"]:
        sysd = h["systemd"]
        color = "green" if sysd == "running" else "yellow" if sysd in ("degraded", "starting") else "red"
        table.add_row(h["name"], h["address"], h["netns"], "up" if h["process"] else "[red]down[/]",
                      f"[{color}]{sysd}[/]", "[green]yes[/]" if h["sshd"] else "[red]no[/]")
    con.print(table)
    con.print(f"ssh -F {st['ssh_config']} {st['hosts'][0]['name']}" if st["hosts"] else "")
    bad = [h for h in st["hosts"] if not (h["process"] and h["sshd"])]
    if bad:
        con.print(f"[red]{plural(len(bad), 'host')} down[/]: run `m3deploy testbed up {len(st['hosts'])} "
                  f"--name {name}` to restart them")
        sys.exit(1)


@testbed.command(context_settings={"ignore_unknown_options": True},
                 short_help="SSH into a testbed host, or run COMMAND there.")
@NAME_OPT
@click.argument("host")
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def ssh(name, host, command):
    """SSH into a testbed host (strict host keys), optionally running COMMAND."""
    try:
        argv = core.ssh_argv(name, host, *command)
    except M3Error as exc:
        _fail(exc)
    os.execvp(argv[0], argv)


if __name__ == "__main__":
    testbed()
