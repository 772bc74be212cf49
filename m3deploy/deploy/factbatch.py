"""Every state check of a host in ONE SSH round: the facts a run will ask, fetched together, served from there.

pyinfra 3.10 runs one SSH command per fact and keeps no cache (pyinfra/api/facts.py `_get_fact`), and it runs
operations one at a time across the cluster, gathering each operation's facts when it executes. A no-change
re-run of the 3-host testbed asked 86 facts (35 on the control host), one round trip each, one after another:
most of its time (benchmarks/results/rerun-2026-12-02.md).

Here a run asks the facts its previous run on that host asked (`<cache>/<cluster>/fact-rounds-<state>.json`,
written as pyinfra disconnects each host at the end of a run; a teardown has its own record), all in one command,
on the host's first fact. Each answer is served whenever the run asks for that same fact (same class, same
command); anything else, and everything after the first command this run sends to the host that is not a fact (an
operation's change), goes to pyinfra as before. So a fact is never older than the last change the run made on that
host: what an operation sees is what it would have seen live, unless something outside the run changed the host
between that round and the operation (the window pyinfra's own prepare-time facts have too). A fact whose command
failed or needs a missing binary is asked live, so pyinfra's own handling (errors, failing the host) stays as it
is; one that printed nothing gets the fact's default, as pyinfra gives it.

`install(state, record)` wraps each host's `get_fact`, `run_shell_command` and `put_file` (instance attributes: the
class, and tests that patch it, stay as they are). The record holds fact class names and arguments (paths, unit
names, the shell commands of `server.Command` facts); it is written 0600.
"""
from __future__ import annotations

import contextlib
import importlib
import json
import os
import threading
from pathlib import Path
from typing import Any

from pyinfra.api import FactBase
from pyinfra.api.facts import ShortFactBase, _handle_fact_kwargs, _make_command
from pyinfra.api.state import BaseStateCallback

MARK = "@@m3-fact-round"
VERSION = 1


def record_path(record: str) -> Path:
    root = os.environ.get("M3DEPLOY_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "m3deploy")
    return Path(root) / f"{record}.json"


def _load(path: Path) -> dict[str, list]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data.get("hosts", {}) if data.get("version") == VERSION else {}


def _class(path: str):
    mod, _, name = path.partition(":")
    try:
        cls = getattr(importlib.import_module(mod), name)
    except (ImportError, AttributeError):
        return None
    return cls if isinstance(cls, type) and issubclass(cls, FactBase) else None


def _kwargs_json(kwargs: dict) -> Any:
    try:
        return json.loads(json.dumps(kwargs))
    except (TypeError, ValueError):
        return None


def round_command(cmds: list[tuple[str, str]]) -> str:
    """One shell command that runs every (fact command, required binary) at once, each in the background into its
    own file of a private temp dir, and prints them in order, each between its marks with its exit status. At once:
    the checks only read, and most of their time is systemctl's (a process and a D-Bus round trip each, ~6 ms on
    the testbed): the control host's round took ~145 ms one after another, ~100 ms at once. No temp dir (a full
    /tmp): the command fails and every fact is asked live."""
    parts = ['d=$(mktemp -d) || exit 1', "trap 'rm -rf \"$d\"' EXIT"]
    for i, (command, requires) in enumerate(cmds):
        body = f"( {command} ) </dev/null 2>/dev/null"
        if requires:
            body = f"if command -v {requires} >/dev/null 2>&1; then {body}; else false; fi"
        parts.append(f'{{ echo {MARK}:{i}; {body}; echo {MARK}:{i}:rc=$?; }} >"$d/{i}" &')
    parts.append("wait")
    parts.append("cat " + " ".join(f'"$d/{i}"' for i in range(len(cmds))))
    return "\n".join(parts)


class _HostFacts:
    """One host's round: asked facts (for the record), answers of the round, and whether they still hold."""

    def __init__(self, host, wanted: list):
        self.host, self.wanted = host, wanted
        self.asked: list = []  # [class path, kwargs] in the order this run asked them
        self.answers: dict[tuple[str, str], list[str]] | None = None
        self.valid = True
        self.in_fact: set[int] = set()  # greenlets (threads) inside a fact: their commands change nothing
        self.lock = threading.Lock()  # one round per host, though several greenlets ask at once (gevent-patched)
        self.get_fact, self.run, self.put = host.get_fact, host.run_shell_command, host.put_file

    # ------------------------------------------------------------------ the round
    def _round(self) -> dict[tuple[str, str], list[str]]:
        cmds: list[tuple[tuple[str, str], str, str]] = []
        seen = set()
        for path, kwargs in self.wanted:
            cls = _class(path)
            if cls is None or issubclass(cls, ShortFactBase) or not isinstance(kwargs, dict):
                continue
            try:
                command = str(_make_command(cls().command, dict(kwargs)))
                requires = _make_command(cls().requires_command, dict(kwargs))
                requires = str(requires) if requires else ""
            except Exception:  # noqa: BLE001 - a fact whose arguments changed shape: asked live instead
                command = None
            key = (path, command)
            if command is not None and key not in seen:
                seen.add(key)
                cmds.append((key, command, requires))
        if not cmds:
            return {}
        try:
            with self._asking():
                ok, out = self.run(round_command([(c, r) for _, c, r in cmds]), print_output=False,
                                   print_input=False)
        except Exception:  # noqa: BLE001 - the round is an optimisation: pyinfra asks each fact itself
            return {}
        if not ok:
            return {}
        answers: dict[tuple[str, str], list[str]] = {}
        cur, lines = None, []
        for line in out.stdout_lines:
            if line.startswith(f"{MARK}:"):
                tag = line[len(MARK) + 1:]
                if ":rc=" in tag:
                    i, rc = tag.split(":rc=", 1)
                    if cur is not None and i == str(cur) and rc == "0":
                        answers[cmds[cur][0]] = lines
                    cur, lines = None, []
                elif tag.isdigit():
                    cur, lines = int(tag), []
            elif cur is not None:
                lines.append(line)
        return answers

    # ------------------------------------------------------------------ the wrappers
    def _batchable(self, cls, args, kwargs) -> bool:
        if args or any(k.startswith("_") for k in kwargs) or issubclass(cls, ShortFactBase):
            return False
        current = getattr(self.host, "current_op_global_arguments", None) or {}
        # the round runs as the connection's user in `sh`: an operation with sudo/su/doas, env or chdir asks live
        return not any(current.get(k) for k in _EXEC_ARGS) and current.get("_shell_executable") in (None, "sh")

    def fact(self, cls, *args, **kwargs):
        path = f"{cls.__module__}:{cls.__qualname__}"
        kw = _kwargs_json(kwargs) if self._batchable(cls, args, kwargs) else None
        if kw is not None and [path, kw] not in self.asked:
            self.asked.append([path, kw])
        if self.valid and kw is not None:
            with self.lock:
                if self.answers is None:
                    self.answers = self._round()
            try:
                fact_kwargs, _ = _handle_fact_kwargs(self.host.state, self.host, cls, (), kwargs)
                command = str(_make_command(cls().command, fact_kwargs))
            except Exception:  # noqa: BLE001 - asked live below, where pyinfra reports the problem
                command = None
            lines = self.answers.get((path, command)) if command is not None else None
            if lines is not None:
                fact = cls()
                return fact.process(lines) if lines else fact.default()  # as pyinfra: no output -> default
        with self._asking():
            return self.get_fact(cls, *args, **kwargs)

    @contextlib.contextmanager
    def _asking(self):
        me = threading.get_ident()
        self.in_fact.add(me)
        try:
            yield
        finally:
            self.in_fact.discard(me)

    def run_shell_command(self, *args, **kwargs):
        if threading.get_ident() not in self.in_fact:
            self.valid = False  # the run changes this host from here on: its facts are asked live
        return self.run(*args, **kwargs)

    def put_file(self, *args, **kwargs):
        self.valid = False
        return self.put(*args, **kwargs)


_EXEC_ARGS = ("_sudo", "_sudo_user", "_su_user", "_doas", "_doas_user", "_dzdo", "_dzdo_user", "_chdir", "_env")


class _SaveOnDisconnect(BaseStateCallback):
    """pyinfra disconnects every host at the end of a run (api/host.py `disconnect` -> `host_disconnect`)."""

    def __init__(self, path: Path, hosts: dict[str, _HostFacts]):
        self.path, self.hosts = path, hosts

    def host_disconnect(self, state, host):
        hf = self.hosts.get(host.name)
        if hf is not None and hf.asked:
            _save(self.path, {host.name: hf.asked})


def install(state, record: str) -> None:
    """Batch every host's facts for this run (once per run), and record what was asked for the next one (when pyinfra
    disconnects each host). `record`: the record's name under the cache (`<cluster>/fact-rounds-<state>`: a deploy
    and a teardown ask different facts); its path is fixed here, at the start of the run."""
    if getattr(state, "_m3_fact_rounds", None) is not None:
        return
    path = record_path(record)
    wanted = _load(path)
    hosts = {}
    for h in state.inventory:
        hf = _HostFacts(h, wanted.get(h.name, []))
        h.get_fact, h.run_shell_command, h.put_file = hf.fact, hf.run_shell_command, hf.put_file
        hosts[h.name] = hf
    state._m3_fact_rounds = hosts
    state.add_callback_handler(_SaveOnDisconnect(path, hosts))


def _save(path: Path, asked: dict[str, list]) -> None:
    data = {"version": VERSION, "hosts": {**_load(path), **asked}}  # --limit: the other hosts' entries stay
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=0)
        os.replace(tmp, path)
    except OSError:
        pass  # the next run asks its facts one by one
