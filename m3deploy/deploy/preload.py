"""Before pyinfra reads the inventory: read it with m3deploy's loader, so a broken file stops the run with one
line (file:line and the fix) instead of pyinfra's "An internal exception occurred" and a debug log, and a host
listed twice in a group is refused instead of merged (pyinfra merges it silently).

It also records which file that is (m3deploy.deploy.context.inventory_file): the plan names the cluster after it
unless m3_cluster is
set (m3deploy.core.inventory.cluster_name), and pyinfra keeps no note of it. The note is kept on pyinfra's State,
which the CLI makes before it runs config.py and keeps for the whole run.

pyinfra 3.10 executes `config.py` from the working directory before it loads the inventory
(pyinfra_cli/cli.py `_setup_state`, `_set_config`, then `make_inventory`); the repository's config.py calls
`check()`.
"""
from __future__ import annotations

from pathlib import Path

import click

from m3deploy.core import connection, inventory
from m3deploy.core.errors import M3Error


def check() -> None:
    """Load the inventory named on pyinfra's command line (a .py file; anything else is pyinfra's) the way
    `m3deploy validate` does; raise InvalidPlan (exit 2, one message) when it cannot be loaded."""
    from m3deploy.deploy.context import InvalidPlan, record_inventory_file

    ctx = click.get_current_context(silent=True)
    params = ctx.params if ctx else {}
    path = Path(str(params.get("inventory") or ""))
    if path.suffix != ".py" or not path.is_file():
        return
    record_inventory_file(str(path))
    try:
        hosts = inventory.load(path, cwd=str(Path.cwd()), group_data_directories=list(params.get("group_data") or ()))
    except M3Error as e:
        raise InvalidPlan(f"the inventory cannot be loaded, nothing was changed:\n{e}") from None
    # the key files pyinfra is about to connect with (its own error would come per host, mid-connect)
    problems = connection.connection_file_problems(inventory.InvHost(name=n, groups=g, data=d) for n, g, d in hosts)
    if problems:
        raise InvalidPlan("the inventory's connection files are not usable, nothing was changed:\n"
                          + "\n".join(f"- {p}" for p in problems))
