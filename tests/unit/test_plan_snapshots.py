"""The rendered plan (`m3deploy plan --json --no-facts`) of every shipped inventory, and of a few `--data`
variants of each, committed under tests/fixtures/plans/. A YAML or code change that moves a flag, an env var,
an image or a port shows up here as a reviewable diff (as Dynamo commits its rendered manifests).

A variant the rules reject is committed as its list of problems, so a validation change shows up too.
Regenerate after an intended change: `M3_UPDATE_PLAN_SNAPSHOTS=1 python3 -m pytest tests/unit/test_plan_snapshots.py`
and review `git diff tests/fixtures/plans`.
"""
from __future__ import annotations

import difflib
import json
import os
from pathlib import Path

import pytest

from m3deploy.cli import load_plan
from m3deploy.core.errors import ValidationError

ROOT = Path(__file__).resolve().parents[2]
SNAPSHOTS = ROOT / "tests" / "fixtures" / "plans"
SHIPPED = sorted(p.stem for p in (ROOT / "inventories").glob("*.py"))

# A testbed's state.json (inventories/testbed.py reads it), fixed so the snapshot does not depend on a live one.
TESTBED_STATE = {
    "hosts": [{"name": f"m3tb-{i}", "address": f"10.77.0.{10 + i}"} for i in range(1, 4)],
    "ssh": {"private_key": "/var/lib/m3deploy/testbed/m3tb/ssh/id_ed25519",
            "known_hosts": "/var/lib/m3deploy/testbed/m3tb/ssh/known_hosts"},
}

# Variants of every inventory: each engine, each serving mode, data-parallel expert parallelism and the
# cluster overrides.
VARIANTS = {
    "": {},
    "standalone": {"m3_serving": "standalone"},
    "dynamo": {"m3_serving": "dynamo"},
    "sglang": {"m3_engine": "sglang", "m3_features": []},
    "sglang-dynamo": {"m3_engine": "sglang", "m3_serving": "dynamo", "m3_features": []},
    "trtllm": {"m3_engine": "trtllm", "m3_features": ["text-only"]},
    # Dynamo's MiniMax-M3 TensorRT-LLM recipe: BF16, TP8/EP8 (on GB200: two 4-GPU trays, one MPI world)
    "trtllm-dynamo": {"m3_engine": "trtllm", "m3_serving": "dynamo", "m3_features": ["text-only"],
                      "m3_variant": "bf16", "m3_parallel": "tp8-ep"},
    "max-len": {"m3_max_model_len": 65536, "m3_extra_args": ["--foo", "1"], "m3_extra_env": {"X_EXTRA": "1"}},
    "dp8-ep": {"m3_parallel": "dp8-ep"},
    "dp8-ep-dynamo": {"m3_parallel": "dp8-ep", "m3_serving": "dynamo"},
}


def render(inventory: str, data: dict) -> str:
    try:
        plan = load_plan(str(ROOT / "inventories" / f"{inventory}.py"),
                         [f"{k}={json.dumps(v)}" for k, v in data.items()], facts=False)
        out = plan.to_dict()
    except ValidationError as e:
        out = {"invalid": list(e.problems)}
    return json.dumps(out, indent=2, sort_keys=True) + "\n"


CASES = [(inv, v) for inv in SHIPPED for v in VARIANTS if not (inv == "testbed" and v)]


@pytest.fixture(autouse=True)
def _testbed_state(monkeypatch):
    import m3deploy.testbed

    monkeypatch.setattr(m3deploy.testbed, "load_state", lambda *a, **k: TESTBED_STATE)
    monkeypatch.setenv("M3_TESTBED", "m3tb")  # the testbed's name is its cluster's (inventories/testbed.py)
    monkeypatch.chdir(ROOT)


@pytest.mark.parametrize("inventory,variant", CASES, ids=[f"{i}{'--' + v if v else ''}" for i, v in CASES])
def test_plan_snapshot(inventory, variant):
    path = SNAPSHOTS / (f"{inventory}--{variant}.json" if variant else f"{inventory}.json")
    got = render(inventory, VARIANTS[variant])
    if os.environ.get("M3_UPDATE_PLAN_SNAPSHOTS"):
        path.write_text(got)
    want = path.read_text() if path.exists() else ""
    assert got == want, "plan changed; review and regenerate (see module docstring):\n" + "".join(
        difflib.unified_diff(want.splitlines(True), got.splitlines(True), str(path), "rendered", n=2))[:6000]


def test_no_stale_snapshots():
    expected = {f"{i}--{v}.json" if v else f"{i}.json" for i, v in CASES}
    assert {p.name for p in SNAPSHOTS.glob("*.json")} == expected
