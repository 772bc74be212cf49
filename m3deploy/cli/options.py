"""The options every command that takes an inventory shares, defined once (issue 36: one vocabulary):

- `INVENTORY` (the pyinfra inventory file), `--data KEY=VALUE` (repeatable, parsed as pyinfra parses it);
- `--json` (machine-readable output on stdout instead of text);
- `--host HOST` (repeatable and cumulative: `--host a --host b` is both);
- `-v` (also say which files the inventory's data came from, and the cluster's name; on stderr) and `-q` (no
  progress or summary lines: only errors and what the command is for).
`inventory_command` puts INVENTORY, --data, -v and -q on a command; the others are added where they mean something
(docs/CLI.md lists which command has which).
"""
from __future__ import annotations

import click

_KEY = "m3deploy.verbosity"


def _set_verbosity(ctx: click.Context, param: click.Parameter, value) -> None:
    if param.name == "quiet":
        if value:
            ctx.meta[_KEY] = -1
    elif value and ctx.meta.get(_KEY, 0) >= 0:
        ctx.meta[_KEY] = value


def verbosity() -> int:
    """-1 with -q, the count of -v, else 0 (also outside a command)."""
    ctx = click.get_current_context(silent=True)
    return ctx.meta.get(_KEY, 0) if ctx else 0


def say(message: str, err: bool = False) -> None:
    """A progress or summary line: printed unless -q."""
    if verbosity() >= 0:
        click.echo(message, err=err)


def detail(message: str) -> None:
    """A -v line, on stderr (stdout stays the command's output, e.g. its JSON)."""
    if verbosity() > 0:
        click.echo(message, err=True)


def inventory_argument(f):
    return click.argument("inventory", type=click.Path(dir_okay=False))(f)


def data_option(f):
    return click.option("--data", multiple=True, metavar="KEY=VALUE",
                        help="Override inventory data, as pyinfra --data does (repeatable).")(f)


def verbosity_options(f):
    f = click.option("-q", "--quiet", is_flag=True, expose_value=False, is_eager=True, callback=_set_verbosity,
                     help="Only errors and the command's own output: no progress or summary lines.")(f)
    return click.option("-v", "--verbose", count=True, expose_value=False, is_eager=True, callback=_set_verbosity,
                        help="Also say which files the inventory's data came from (on stderr).")(f)


def inventory_command(f):
    """INVENTORY, --data, -v, -q."""
    return inventory_argument(data_option(verbosity_options(f)))


def json_option(help_text: str = "Print JSON instead of text."):
    return click.option("--json", "as_json", is_flag=True, help=help_text)


def hosts_option(help_text: str = "Only this host (repeatable: --host a --host b is both)."):
    return click.option("--host", "hosts", multiple=True, metavar="HOST", help=help_text)


def unknown_hosts(hosts, names) -> str:
    """'' when every --host is one of `names`, else the error's text naming them and the hosts there are."""
    bad = [h for h in hosts if h not in names]
    if not bad:
        return ""
    return (f"--host {', '.join(bad)}: not in the inventory; its hosts: {', '.join(names)}. Fix: --host one of "
            "those")
