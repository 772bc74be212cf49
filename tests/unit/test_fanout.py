"""m3deploy.core.fanout: the weights fan-out schedule (bounded degree, every host covered, rounds = ceil(log))."""
import math

import pytest

from m3deploy.core import fanout
from m3deploy.core.fanout import CONTROLLER, Transfer


def _hosts(n):
    return [f"h{i:03d}" for i in range(n)]


@pytest.mark.parametrize("n", [1, 2, 3, 7, 8, 15, 16, 63, 144, 1000])
@pytest.mark.parametrize("k", [1, 2, 3, 4, 8])
def test_tree_properties(n, k):
    rounds = fanout.schedule(CONTROLLER, _hosts(n), k)
    received = [t.receiver for r in rounds for t in r]
    assert sorted(received) == _hosts(n)  # every host exactly once
    assert len(rounds) == fanout.rounds_needed(n, k) == math.ceil(math.log(n + 1, k + 1) - 1e-9)
    have = {CONTROLLER}
    for r in rounds:
        per_sender = {}
        for t in r:
            assert t.sender in have, "a sender only sends what an earlier round gave it"
            assert t.receiver not in have
            per_sender[t.sender] = per_sender.get(t.sender, 0) + 1
        assert max(per_sender.values()) <= k  # bounded fan-out degree per round
        assert len({t.receiver for t in r}) == len(r)  # a host receives from one sender
        have |= {t.receiver for t in r}


def test_exact_schedule_7_hosts_degree_1():
    rounds = fanout.schedule(CONTROLLER, ["a", "b", "c", "d", "e", "f", "g"], 1)
    assert rounds == (
        (Transfer(CONTROLLER, "a"),),
        (Transfer(CONTROLLER, "b"), Transfer("a", "c")),
        (Transfer(CONTROLLER, "d"), Transfer("a", "e"), Transfer("b", "f"), Transfer("c", "g")))
    assert fanout.sender_of(rounds, "f") == (2, "b") and fanout.sender_of(rounds, "x") is None
    assert fanout.describe(rounds).splitlines()[1] == "round 2/3: @controller -> b; a -> c"


def test_flat_baseline_and_mirror_root():
    assert fanout.schedule(CONTROLLER, _hosts(15), 15) == (tuple(Transfer(CONTROLLER, h) for h in _hosts(15)),)
    rounds = fanout.schedule("h000", _hosts(4), 2)  # a mirror is the root, never its own receiver
    assert [[(t.sender, t.receiver) for t in r] for r in rounds] == [[("h000", "h001"), ("h000", "h002")],
                                                                     [("h000", "h003")]]
    assert fanout.schedule(CONTROLLER, [], 4) == ()


def test_144_trays():
    assert fanout.rounds_needed(144, 4) == 4 and fanout.rounds_needed(144, 1) == 8
    assert fanout.rounds_needed(144, 144) == 1


@pytest.mark.parametrize("value,want", [("hub", ("hub", "")), ("controller", ("controller", "")),
                                        ("shared", ("shared", "")), ("mirror:gpu-07", ("mirror", "gpu-07"))])
def test_parse_source(value, want):
    assert fanout.parse_source(value) == want


@pytest.mark.parametrize("value", ["mirror", "mirror:", "s3", "Hub", "controller:x"])
def test_parse_source_refuses(value):
    with pytest.raises(ValueError, match="Fix: one of hub, controller, shared, mirror:<host>"):
        fanout.parse_source(value)


def test_degree_must_be_positive():
    with pytest.raises(ValueError):
        fanout.schedule(CONTROLLER, ["a"], 0)
