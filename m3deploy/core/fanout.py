"""Weights staging: where each repo comes from (m3_weights_source) and who sends it to whom in which round.

Pure: roles/weights.py carries the schedule out, one pyinfra operation per round on every weights host (the
receivers of that round pull from their sender with rsync; pyinfra finishes an operation on every host before
the next one starts, so round r+1 only reads from hosts that round r completed). docs/WEIGHTS.md has the model.

Sources:
- `hub`: every host downloads each repo from the Hugging Face Hub by itself (no fan-out).
- `controller`: the controller holds each repo once in its own HF cache; it is the tree's root.
- `mirror:<host>`: that inventory host downloads each repo once from the hub; it is the root.
- `shared`: the hosts' HF cache is one shared filesystem: one host downloads, nobody copies.

The tree: every host that has the repo serves at most `degree` receivers per round, so the holders multiply
by (degree + 1) each round and n receivers need ceil(log_(degree+1)(n + 1)) rounds. `degree >= n` is one round
where the root serves everyone at once (what every host pulling from one server, or from the hub, looks like).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

CONTROLLER = "@controller"  # the schedule's name for the controller (never a valid inventory host name)
SOURCES = ("hub", "controller", "shared")  # and mirror:<host>


@dataclass(frozen=True)
class Transfer:
    sender: str  # CONTROLLER or an inventory host name
    receiver: str


def parse_source(value: str) -> tuple[str, str]:
    """'hub' -> ('hub', ''); 'mirror:h1' -> ('mirror', 'h1'). ValueError with the fix when malformed."""
    value = str(value)
    if value in SOURCES:
        return value, ""
    kind, sep, name = value.partition(":")
    if kind == "mirror" and sep and name:
        return "mirror", name
    raise ValueError(f"{value!r} is not a weights source. Fix: one of hub, controller, shared, mirror:<host> "
                     "(an inventory host that downloads once and serves the others)")


def rounds_needed(receivers: int, degree: int) -> int:
    """ceil(log_(degree+1)(receivers + 1)), in whole numbers (no float rounding at exact powers)."""
    if degree < 1:
        raise ValueError("degree must be >= 1")
    rounds, holders = 0, 1
    while holders < receivers + 1:
        holders *= degree + 1
        rounds += 1
    return rounds


def schedule(root: str, receivers: Sequence[str], degree: int) -> tuple[tuple[Transfer, ...], ...]:
    """Rounds of transfers from `root` to every receiver: in each round every holder (the root and the hosts
    earlier rounds filled, in that order) sends to at most `degree` hosts that do not have the repo yet.

    Receivers are served in the order given: put hosts near each other (same rack) next to each other."""
    if degree < 1:
        raise ValueError("degree must be >= 1")
    todo = [r for r in dict.fromkeys(receivers) if r != root]
    holders = [root]
    rounds: list[tuple[Transfer, ...]] = []
    while todo:
        this: list[Transfer] = []
        for sender in holders:
            take, todo = todo[:degree], todo[degree:]
            this += [Transfer(sender, r) for r in take]
            if not todo:
                break
        holders += [t.receiver for t in this]
        rounds.append(tuple(this))
    return tuple(rounds)


def sender_of(rounds, host: str) -> tuple[int, str] | None:
    """(round index, sender) in which `host` receives, or None when it never does."""
    for i, transfers in enumerate(rounds):
        for t in transfers:
            if t.receiver == host:
                return i, t.sender
    return None


def describe(rounds) -> str:
    """One line per round: 'round 1/2: @controller -> a, b; a -> c'."""
    out = []
    for i, transfers in enumerate(rounds):
        by: dict[str, list[str]] = {}
        for t in transfers:
            by.setdefault(t.sender, []).append(t.receiver)
        out.append(f"round {i + 1}/{len(rounds)}: " + "; ".join(f"{s} -> {', '.join(r)}" for s, r in by.items()))
    return "\n".join(out)
