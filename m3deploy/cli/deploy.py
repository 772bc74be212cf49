"""`m3deploy deploy INVENTORY [--data KEY=VALUE ...] [-v]`: exactly `pyinfra -y INVENTORY deploy.py [--data ...]`,
printed first, run in the project directory (pyinfra reads config.py and group_data/ from its working directory,
and deploy.py imports roles/ from there), its exit status returned. Nothing else: a re-run is the same command, a
teardown the same with `--data m3_state=absent`, a scale-in `m3deploy prune` (docs/OPERATIONS.md)."""
from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path

import click

from m3deploy.cli.options import data_option, inventory_argument, say
from m3deploy.deploy.hostfiles import REPO


def pyinfra_argv(inventory: str, data=(), verbose: int = 0, cwd: str | os.PathLike = REPO) -> list[str]:
    """The pyinfra command line, the inventory's path as seen from `cwd` (relative where it lies under it)."""
    inv = Path(inventory).resolve()
    try:
        shown = str(inv.relative_to(Path(cwd).resolve()))
    except ValueError:
        shown = str(inv)
    return (["pyinfra", "-y", shown, "deploy.py"] + [x for d in data for x in ("--data", d)]
            + (["-" + "v" * verbose] if verbose else []))


def shown(argv: list[str], cwd: Path) -> str:
    """The command as a user would type it: prefixed with `cd` where it runs in another directory than theirs."""
    line = shlex.join(argv)
    return line if Path.cwd().resolve() == cwd.resolve() else f"cd {shlex.quote(str(cwd))} && {line}"


def _pyinfra() -> str:
    """The pyinfra beside this Python (m3deploy's venv), else the first on PATH."""
    here = Path(sys.executable).parent / "pyinfra"
    return str(here) if here.is_file() else "pyinfra"


@click.command("deploy", short_help="Deploy, re-run or tear down: pyinfra -y INVENTORY deploy.py.")
@inventory_argument
@data_option
@click.option("-v", "--verbose", count=True, help="Passed to pyinfra (-v, -vv, -vvv: its meta, input, output).")
@click.option("-q", "--quiet", is_flag=True, help="Do not print the pyinfra command first.")
def deploy(inventory, data, verbose, quiet):
    """Deploy INVENTORY: run exactly `pyinfra -y INVENTORY deploy.py [--data KEY=VALUE ...]` in the project
    directory, printed first, and exit with its status.

    \b
    First deploy and every re-run (it changes only what differs):
      m3deploy deploy inventories/mylab.py
    Tear the deployment down (what each host's manifest names):
      m3deploy deploy inventories/mylab.py --data m3_state=absent
    Remove hosts you took out of the inventory (scale in):
      m3deploy prune inventories/mylab.py --yes
    """
    if not Path(inventory).is_file():
        click.echo(f"error: inventory file {inventory} does not exist (shipped inventories are in "
                   f"{REPO / 'inventories'}/)", err=True)
        sys.exit(2)
    argv = pyinfra_argv(inventory, data, verbose)
    if not quiet:
        say(shown(argv, REPO))
    sys.stdout.flush()
    os.chdir(REPO)
    os.execvp(_pyinfra(), [_pyinfra()] + argv[1:])
