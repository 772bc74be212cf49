"""m3deploy.deploy.factbatch against a real host: pyinfra's @local connector runs every fact in a real shell here.

A run asks, in one command, the facts its previous run asked; it answers them from that round until it changes the
host, and asks live after that, so what an operation sees is what it would have seen asking one fact at a time.
"""
import pytest
from pyinfra.api import Config, Inventory, State
from pyinfra.api.connect import connect_all
from pyinfra.facts.server import Command

from m3deploy.deploy import factbatch
from roles.hostops import PathState

RECORD = "cl/fact-rounds-present"


def _local_run():
    inv = Inventory((["@local"], {}))
    state = State(inv, Config())
    connect_all(state)
    return state, inv.get_host("@local")


def _counting(state, host) -> list[str]:
    """The commands that reach the host's shell (a fact round counts once)."""
    hf = state._m3_fact_rounds[host.name]
    sent, run = [], hf.run

    def counted(cmd, *a, **kw):
        sent.append(str(cmd))
        return run(cmd, *a, **kw)
    hf.run = counted
    return sent


def _end(state):
    """The end of a run: pyinfra disconnects every host (the record is written then)."""
    for h in state.inventory:
        h.disconnect()


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("M3DEPLOY_CACHE", str(tmp_path / "cache"))
    return tmp_path


def test_second_run_asks_every_fact_in_one_round(cache):
    a, b = cache / "a.txt", cache / "b"
    a.write_text("hello\n")
    b.mkdir()
    asks = [(PathState, {"path": str(a)}), (PathState, {"path": str(b)}), (PathState, {"path": str(cache / "no")}),
            (Command, {"command": "echo one; echo two"})]

    state, host = _local_run()
    factbatch.install(state, RECORD)
    sent = _counting(state, host)
    first = [host.get_fact(cls, **kw) for cls, kw in asks]
    assert len(sent) == len(asks)  # no record yet: one command per fact, as pyinfra does
    _end(state)
    assert oct(factbatch.record_path(RECORD).stat().st_mode & 0o777) == "0o600"

    state, host = _local_run()
    factbatch.install(state, RECORD)
    sent = _counting(state, host)
    second = [host.get_fact(cls, **kw) for cls, kw in asks]
    assert second == first and first[2] == "-" and first[3] == "one\ntwo"
    assert len(sent) == 1, sent  # the whole record in one round


def test_a_change_on_the_host_ends_the_round_and_facts_are_asked_live(cache):
    f = cache / "f.txt"
    asks = [(PathState, {"path": str(f)})] * 2
    state, host = _local_run()
    factbatch.install(state, RECORD)
    for cls, kw in asks:
        host.get_fact(cls, **kw)
    _end(state)

    state, host = _local_run()
    factbatch.install(state, RECORD)
    assert host.get_fact(PathState, path=str(f)) == "-"  # from the round
    host.run_shell_command(f"echo x > {f}")  # an operation's change
    assert host.get_fact(PathState, path=str(f)).startswith("644:"), "a fact after a change must be asked live"


def test_a_fact_whose_command_fails_is_asked_live(cache):
    state, host = _local_run()
    factbatch.install(state, RECORD)
    host.get_fact(Command, command="false", _ignore_errors=True)
    host.get_fact(Command, command="echo ok")
    _end(state)
    state, host = _local_run()
    factbatch.install(state, RECORD)
    sent = _counting(state, host)
    assert host.get_fact(Command, command="echo ok") == "ok"
    assert len(sent) == 1
