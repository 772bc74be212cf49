"""The connection data of an inventory host (issue 36): pyinfra's own ssh_* keys, and the files it connects with.

`ssh_key_problem` is part of the input contract (m3deploy.core.inputs.check_hosts, so `plan` refuses a typo too);
`connection_file_problems` reads the controller's files, so only the commands that connect call it (`m3deploy
validate`, the deploy's preload before pyinfra connects).
"""
from __future__ import annotations

import difflib
import os
from collections import defaultdict
from typing import Iterable


def hosts_phrase(names) -> str:
    """"host a" / "hosts a, b, ..." (8 named, then a count)."""
    names = list(dict.fromkeys(names))
    more = f" (+{len(names) - 8} more)" if len(names) > 8 else ""
    return ("host " if len(names) == 1 else "hosts ") + ", ".join(names[:8]) + more


# pyinfra 3.10's SSH connector data (pyinfra/connectors/ssh.py ConnectorData; tests/unit/test_connection_keys.py
# compares): any other ssh_* key is ignored by pyinfra without a word (`ssh_usr`: the deploy connects as root)
SSH_KEYS = frozenset({
    "ssh_allow_agent", "ssh_config_file", "ssh_connect_retries", "ssh_connect_retry_max_delay",
    "ssh_connect_retry_min_delay", "ssh_file_transfer_protocol", "ssh_forward_agent", "ssh_hostname", "ssh_key",
    "ssh_key_password", "ssh_known_hosts_file", "ssh_look_for_keys", "ssh_paramiko_connect_kwargs", "ssh_password",
    "ssh_port", "ssh_strict_host_key_checking", "ssh_user"})


def ssh_key_problem(k: str) -> str:
    """An ssh_* key pyinfra does not know ('' when it does)."""
    if k in SSH_KEYS:
        return ""
    near = difflib.get_close_matches(k, SSH_KEYS, n=1, cutoff=0.7)
    return (f"key {k} is not a pyinfra SSH connection key{f' (did you mean {near[0]}?)' if near else ''}; pyinfra "
            f"would ignore it without a word. Fix: {f'rename it to {near[0]}' if near else 'remove it'} "
            "(keys: docs/INVENTORY.md \"Connecting\")")


# pyinfra's privilege arguments as host data (pyinfra/api/arguments.py: a global argument's default is the host's
# data of that name): `_sudo = True` (with `ssh_user` a non-root user) runs every operation under sudo. m3deploy's
# own commands over a host's connection outside an operation (roles/hostops.run_on, the deploy record's probe), the
# controller's weights push and verify's SSH checks pass the same (docs/INVENTORY.md "Connecting as a non-root user
# with sudo"). `_sudo_password` is a secret: never recorded, never on a command line of ours.
SUDO_KEYS = ("_sudo", "_sudo_user", "_use_sudo_login", "_preserve_sudo_env")


# pyinfra 3.10's global arguments (pyinfra/api/arguments.py all_argument_meta; tests/unit/test_sudo_user.py compares):
# as host data they are every operation's default. A near miss (`_sduo`) would be ignored without a word.
GLOBAL_ARGS = frozenset({
    "_chdir", "_continue_on_error", "_doas", "_doas_user", "_dzdo", "_dzdo_user", "_env", "_get_pty", "_if",
    "_ignore_errors", "_parallel", "_preserve_su_env", "_preserve_sudo_env", "_retries", "_retry_delay",
    "_retry_until", "_run_once", "_serial", "_shell_executable", "_stdin", "_su_password", "_su_shell", "_su_user",
    "_success_exit_codes", "_sudo", "_sudo_password", "_sudo_user", "_temp_dir", "_timeout", "_use_su_login",
    "_use_sudo_login"})


def global_arg_problem(k: str) -> str:
    """A `_`-key that is a near miss of a pyinfra global argument ('' for one, and for any other private name)."""
    if k in GLOBAL_ARGS or k.startswith("__"):
        return ""
    near = difflib.get_close_matches(k, GLOBAL_ARGS, n=1, cutoff=0.8)
    return (f"key {k} is not a pyinfra global argument (did you mean {near[0]}?); pyinfra would ignore it without "
            f"a word. Fix: rename it to {near[0]} (docs/INVENTORY.md \"Connecting as a non-root user with sudo\")"
            if near else "")


def sudo_args(data) -> dict:
    """The SUDO_KEYS of a host's data (pyinfra's host.data, or a dict) that are set: pyinfra's connector arguments."""
    return {k: v for k in SUDO_KEYS if (v := data.get(k)) not in (None, False, "")}


CONNECTION_FILES = ("ssh_key", "ssh_config_file", "ssh_known_hosts_file")


def connection_file_problems(hosts: Iterable) -> list[str]:
    """The connection files of these InvHosts that are no usable file on this controller, identical ones merged
    across hosts. Checked by the commands that connect (`m3deploy validate`, the deploy before pyinfra connects),
    not by `plan`/`render`, which may run where the keys are not."""
    found: dict[tuple[str, str], list[str]] = defaultdict(list)
    for h in hosts:
        for k in CONNECTION_FILES:
            why = connection_file_problem(k, h.data.get(k))
            if why:
                src = (getattr(h, "sources", {}) or {}).get(k, "")
                found[(f" ({src})" if src else "", why)].append(h.name)
    return [f"{hosts_phrase(names)}{where}: {msg}" for (where, msg), names in found.items()]


def connection_file_problem(k: str, v) -> str:
    """ssh_key / ssh_config_file / ssh_known_hosts_file `v` as a file on the controller ('' when fine). A private key
    must be private: OpenSSH refuses one others can read."""
    if v is None:
        return ""
    if not isinstance(v, str) or not v:
        return f"key {k}: {v!r} is not a file path. Fix: {k} = \"~/.ssh/id_ed25519\""
    path = os.path.expanduser(v)
    if os.path.isdir(path):
        return f"key {k}: {v} is a directory, not a file. Fix: name the file in it (e.g. {v.rstrip('/')}/id_ed25519)"
    if not os.path.isfile(path):
        return (f"key {k}: {v} does not exist on this controller. Fix: the path of the file (~ is your home), "
                + ("or make one: ssh-keygen -t ed25519 -f " + v if k == "ssh_key" else "or remove the key"))
    if k == "ssh_key" and os.stat(path).st_mode & 0o077:
        return (f"key ssh_key: {v} can be read by others (mode {os.stat(path).st_mode & 0o777:o}); a private key "
                f"must be yours alone (OpenSSH refuses it). Fix: chmod 600 {v}")
    if not os.access(path, os.R_OK):
        return f"key {k}: {v} cannot be read by this user. Fix: run as its owner, or chmod u+r {v}"
    return ""
