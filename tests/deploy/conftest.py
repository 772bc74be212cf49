"""Harness: run a @deploy function (a role, or deploy.py's main) through pyinfra with the `@fake`
connector, with fact values given per fact class, and return what pyinfra would run.

    run = run_fake(deploy_drivers, facts={NvidiaDriver: {...}, NvidiaPackages: {...}},
                   host_data={"m3_allow_reboot": True}, host_plan=hp, cluster_plan=cp)
    run.commands          # every shell command of every op, in op order (uploads as "UPLOAD <dest>")
    run.ops               # [FakeOp(name, commands, conditional)], conditional: the op has an `_if`
    run.names             # op names

How fact values are provided: pyinfra 3.10's `@fake` connector (pyinfra/connectors/fake.py) answers every
command with canned `fake_responses` host data (empty success by default), and pyinfra 3 does not cache
facts, so facts are injected by patching `Host.get_fact`: a class in `facts` returns its value (a
callable value is called with the fact kwargs, e.g. `{DockerImage: lambda image: {...}}`); any other fact
(pyinfra's own, used inside operations) goes to the fake connector and so gets its default. Nothing runs:
ops are only prepared, and their command generators are read (their `_if` conditions are not evaluated
outside execution, hence `conditional`).

`host_plan` / `cluster_plan` replace m3deploy.deploy.context's functions for the run; pass a ClusterPlan only
to let `host_plan()` come from it (`cluster_plan.host(name)`). To run several hosts, pass
`hosts={name: {"facts": ..., "host_data": ...}}` and read `run.for_host(name)`.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


@dataclass
class FakeOp:
    name: str
    commands: list[str]
    conditional: bool
    uploads: dict = field(default_factory=dict)  # dest -> text, for uploads from an in-memory source (StringIO)
    names: list = field(default_factory=list)  # every name of the op: one op shared by several hosts (same
    #                                            call site) has each host's name, e.g. "Stop: @fake/<host> ..."


@dataclass
class FakeRun:
    ops_by_host: dict[str, list[FakeOp]] = field(default_factory=dict)
    state: Any = None
    error: BaseException | None = None  # run_deploy_file(..., raises=...): what the deploy file raised

    def for_host(self, name: str) -> list[FakeOp]:
        return self.ops_by_host[name]

    @property
    def ops(self) -> list[FakeOp]:
        return next(iter(self.ops_by_host.values())) if self.ops_by_host else []

    @property
    def commands(self) -> list[str]:
        return [c for op in self.ops for c in op.commands]

    @property
    def names(self) -> list[str]:
        return [op.name for op in self.ops]

    def op(self, prefix: str) -> FakeOp:
        for o in self.ops:
            if o.name.startswith(prefix):
                return o
        raise AssertionError(f"no op named {prefix!r}*; ops: {self.names}")


def _command_text(cmd) -> str:
    from pyinfra.api.command import FileDownloadCommand, FileUploadCommand, FunctionCommand, StringCommand

    if isinstance(cmd, StringCommand):
        return cmd.get_raw_value()
    if isinstance(cmd, FileUploadCommand):
        return f"UPLOAD {cmd.dest}"
    if isinstance(cmd, FileDownloadCommand):
        return f"DOWNLOAD {cmd.src}"
    if isinstance(cmd, FunctionCommand):
        return f"PYTHON {getattr(cmd.function, '__name__', cmd.function)}"
    return repr(cmd)


def _upload_text(cmd) -> tuple[str, str] | None:
    """(dest, text) of an upload whose source is in memory (files.put(src=StringIO(...)))."""
    from pyinfra.api.command import FileUploadCommand

    if isinstance(cmd, FileUploadCommand) and hasattr(cmd.src, "getvalue"):
        value = cmd.src.getvalue()
        return cmd.dest, value.decode() if isinstance(value, bytes) else value
    return None


def _collect(state, inventory, by_fake: dict[str, str]) -> FakeRun:
    """Every host's ops in pyinfra's cluster-wide op order, with their commands read."""
    from pyinfra.context import ctx_host, ctx_state

    run = FakeRun(state=state)
    for h in inventory:
        ops = []
        for op_hash in state.get_op_order():
            op_data = state.ops[h].get(op_hash)
            if op_data is None:
                continue
            meta = state.get_op_meta(op_hash)
            with ctx_state.use(state), ctx_host.use(h):
                raw = list(op_data.command_generator())
            uploads = dict(u for u in map(_upload_text, raw) if u)
            ops.append(FakeOp(name=", ".join(sorted(meta.names)), commands=[_command_text(c) for c in raw],
                              conditional=bool(op_data.global_arguments.get("_if")), uploads=uploads,
                              names=sorted(meta.names)))
        run.ops_by_host[by_fake[h.name]] = ops
    return run


def _preparing_state(inventory):
    """A pyinfra State on `inventory`, its @fake hosts connected, ready to add operations."""
    from pyinfra.api import Config, State
    from pyinfra.api.connect import connect_all
    from pyinfra.api.state import StateStage

    state = State(inventory, Config())
    state.set_stage(StateStage.Connect)
    connect_all(state)
    state.set_stage(StateStage.Prepare)
    return state


def _serve_facts(mp: pytest.MonkeyPatch, hosts: dict[str, dict], by_fake: dict[str, str]) -> None:
    """Host.get_fact answers from hosts[name]["facts"] ({FactClass: value, or a callable of the fact's
    arguments}); any other fact goes to the @fake connector (its default). The plan knows `@fake/<name>`
    as `<name>` (m3deploy.deploy.context.plan_name)."""
    from pyinfra.api.host import Host

    from m3deploy.deploy import context

    mp.setattr(context, "plan_name", lambda h: by_fake.get(h.name, h.name))

    original = Host.get_fact

    def get_fact(self, cls, *a, **kw):
        table = hosts[by_fake[self.name]].get("facts") or {}
        if cls in table:
            value = table[cls]
            return value(*a, **kw) if callable(value) else value
        return original(self, cls, *a, **kw)

    mp.setattr(Host, "get_fact", get_fact)


def run_fake(deploy_fn: Callable, facts: dict | None = None, host_data: dict | None = None,
             host_plan=None, cluster_plan=None, hosts: dict[str, dict] | None = None,
             monkeypatch: pytest.MonkeyPatch | None = None, args: tuple = (), kwargs: dict | None = None) -> FakeRun:
    from pyinfra.api import Inventory
    from pyinfra.api.deploy import add_deploy

    from m3deploy.deploy import context

    if hosts is None:
        name = host_plan.name if host_plan is not None else "gpu-01"
        hosts = {name: {"facts": facts or {}, "host_data": host_data or {}}}
    names = list(hosts)
    inventory = Inventory(([(f"@fake/{n}", {"fake_delay": 0, "fake_delay_jitter": 0,
                                            **(hosts[n].get("host_data") or {})}) for n in names], {}))
    by_fake = {f"@fake/{n}": n for n in names}
    state = _preparing_state(inventory)

    mp = monkeypatch or pytest.MonkeyPatch()
    _serve_facts(mp, hosts, by_fake)
    def _host_plan():
        from pyinfra import host as current

        n = by_fake[current.name]
        if hosts[n].get("host_plan") is not None:
            return hosts[n]["host_plan"]
        if host_plan is not None and len(names) == 1:
            return host_plan
        return cluster_plan.host(n)

    mp.setattr(context, "host_plan", _host_plan)
    if cluster_plan is not None:
        mp.setattr(context, "cluster_plan", lambda: cluster_plan)
    try:
        add_deploy(state, deploy_fn, *args, **(kwargs or {}))
        return _collect(state, inventory, by_fake)
    finally:
        if monkeypatch is None:
            mp.undo()


DEPLOY_PY = ROOT / "deploy.py"


def run_deploy_file(hosts: dict[str, dict], groups: dict[str, list[str]], path: Path = DEPLOY_PY,
                    override_data: dict | None = None, raises: tuple = (),
                    monkeypatch: pytest.MonkeyPatch | None = None) -> FakeRun:
    """Load a deploy FILE the way `pyinfra INVENTORY deploy.py` does (pyinfra_cli.util.load_deploy_file,
    every host's copy of the file run in pyinfra's greenlet pool), on `@fake/<name>` hosts.

    hosts: {name: {"data": host data (already merged with group data), "facts": {FactClass: value}}};
    groups: {group name: [names]}; override_data: what `--data k=v` would give. Nothing in
    m3deploy.deploy.context is replaced: the plan is built from this inventory like in a real run.
    An exception of a type in `raises` (SystemExit included) is caught and kept in `run.error`, with
    the ops added up to then; any other propagates.
    """
    import pyinfra
    from pyinfra.api import Inventory
    from pyinfra.context import ctx_state
    from pyinfra_cli.util import load_deploy_file

    names = list(hosts)
    by_fake = {f"@fake/{n}": n for n in names}
    inventory = Inventory(
        ([(f"@fake/{n}", {**(hosts[n].get("data") or {}), "fake_delay": 0, "fake_delay_jitter": 0})
          for n in names], {}),
        override_data=override_data,
        **{g: ([f"@fake/{n}" for n in members], {}) for g, members in groups.items()})
    state = _preparing_state(inventory)
    state.current_op_file_number = 0

    mp = monkeypatch or pytest.MonkeyPatch()
    _serve_facts(mp, hosts, by_fake)
    # pyinfra_cli/main.py sets this: op order (and identity across hosts) then comes from the call
    # stack's line numbers in the deploy file, not from a per-host counter (API mode)
    mp.setattr(pyinfra, "is_cli", True)
    error = None
    try:
        with ctx_state.use(state):
            try:
                load_deploy_file(state, str(path))
            except raises as e:  # noqa: B030 (a tuple of exception types)
                error = e
        run = _collect(state, inventory, by_fake)
        run.error = error
        return run
    finally:
        if monkeypatch is None:
            mp.undo()


@pytest.fixture
def fake(monkeypatch):
    """`fake(deploy_fn, facts=..., host_data=..., host_plan=..., cluster_plan=..., hosts=...)` -> FakeRun."""
    def _run(deploy_fn, **kw):
        return run_fake(deploy_fn, monkeypatch=monkeypatch, **kw)
    return _run


@pytest.fixture
def deploy_file(monkeypatch):
    """`deploy_file(hosts, groups, override_data=..., raises=...)` -> FakeRun: run_deploy_file, undone after the test."""
    def _run(hosts, groups, **kw):
        return run_deploy_file(hosts, groups, monkeypatch=monkeypatch, **kw)
    return _run
