#!/usr/bin/env python3
"""`m3deploy render` of every shipped inventory with every plan-snapshot variant and every feature variant (edge,
VIP, internal TLS, monitor, disaggregation, planner, an MPI world), each into OUTDIR/<inventory>--<variant>/, with
`m3deploy plan --explain` beside it (<name>.explain.txt) and, for a variant the rules refuse, its problems
(<name>.invalid.txt). A refactor that must change no behaviour renders the same tree before and after:

    python3 scripts/render-matrix.py /tmp/before      # on the old commit
    python3 scripts/render-matrix.py /tmp/after       # on the new one
    diff -r -x '*.explain.txt' /tmp/before /tmp/after  # exit 0: every host file byte-identical

The testbed inventory reads a fixed testbed state (as tests/unit/test_plan_snapshots.py), so no testbed need be up.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TESTBED_STATE = {
    "hosts": [{"name": f"m3tb-{i}", "address": f"10.77.0.{10 + i}"} for i in range(1, 6)],
    "ssh": {"private_key": "/var/lib/m3deploy/testbed/m3tb/ssh/id_ed25519",
            "known_hosts": "/var/lib/m3deploy/testbed/m3tb/ssh/known_hosts"},
}
# the plan snapshots' variants (tests/unit/test_plan_snapshots.py VARIANTS), then the features'
FEATURES = {
    "edge": {"m3_serving": "dynamo", "m3_edge": True},
    "edge-3fe": {"m3_serving": "dynamo", "m3_edge": True, "m3_edge_frontends": 3},
    "internal-tls": {"m3_serving": "dynamo", "m3_internal_tls": True},
    "edge-tls-monitor": {"m3_serving": "dynamo", "m3_edge": True, "m3_internal_tls": True, "m3_monitor": True},
    "monitor": {"m3_monitor": True},
    "monitor-dynamo": {"m3_serving": "dynamo", "m3_monitor": True},
    "trtllm-dynamo-tls": {"m3_engine": "trtllm", "m3_serving": "dynamo", "m3_features": ["text-only"],
                          "m3_variant": "bf16", "m3_parallel": "tp8-ep", "m3_internal_tls": True},
    "disagg": {"m3_serving": "dynamo", "m3_disagg": {"prefill": {"workers": 1}, "decode": {"workers": 1}}},
    "disagg-tls": {"m3_serving": "dynamo", "m3_internal_tls": True,
                   "m3_disagg": {"prefill": {"workers": 1}, "decode": {"workers": 1}}},
}
THREE = {"M3_TESTBED_HOSTS": "m3tb-1,m3tb-2,m3tb-3"}  # 1 control + 2 workers: the pools take exactly those
DOCKER = {"m3_runtime": "docker", "m3_weights_source": "controller", "m3_mock_repo_mb": 8}
# the testbed's own variants: (environment, data)
TESTBED = {
    "": ({}, {}),
    "edge": ({}, {"m3_edge": True}),
    "vip": ({"M3_TESTBED_CONTROL": "3"}, {"m3_edge": True, "m3_vip": "10.77.0.200/24"}),
    "vip-tls-monitor": ({"M3_TESTBED_CONTROL": "3"}, {"m3_edge": True, "m3_vip": "10.77.0.200/24",
                                                       "m3_internal_tls": True, "m3_monitor": True}),
    "internal-tls": ({}, {"m3_internal_tls": True}),
    "monitor": ({}, {"m3_monitor": True}),
    "disagg": (THREE, {"m3_disagg": {"prefill": {"workers": 1}, "decode": {"workers": 1}}}),
    "disagg-tls-monitor": (THREE, {"m3_disagg": {"prefill": {"workers": 1}, "decode": {"workers": 1}},
                                "m3_internal_tls": True, "m3_monitor": True}),
    "planner": ({"M3_TESTBED_STANDBY": "1"}, {"m3_planner": {"min": 3, "max": 4}}),
    "planner-local-tls-monitor": ({"M3_TESTBED_STANDBY": "2"}, {
        "m3_planner": {"planner": "local", "min": 2, "max": 4}, "m3_internal_tls": True, "m3_monitor": True}),
    "docker": ({}, DOCKER),
    "docker-tls": ({}, {**DOCKER, "m3_internal_tls": True}),
    "docker-edge-monitor": ({}, {**DOCKER, "m3_edge": True, "m3_monitor": True}),
}


def cases():
    sys.path.insert(0, str(ROOT / "tests" / "unit"))
    from test_plan_snapshots import VARIANTS  # the snapshots' own list: one owner

    for inv in sorted(p.stem for p in (ROOT / "inventories").glob("*.py")):
        if inv == "testbed":
            for name, (env, data) in TESTBED.items():
                yield inv, name, env, data
            continue
        for name, data in {**VARIANTS, **FEATURES}.items():
            yield inv, name, {}, data


def _with_env(env: dict):
    """The environment of one case (the testbed inventory reads M3_TESTBED_*), restored after."""
    import contextlib

    @contextlib.contextmanager
    def scope():
        saved = {k: os.environ.get(k) for k in (*env, "M3_TESTBED")}
        os.environ.update({"M3_TESTBED": "m3tb", **env})
        try:
            yield
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
    return scope()


def _load(inv: str, env: dict, data: dict):
    import m3deploy.testbed
    from m3deploy.cli import load_plan

    m3deploy.testbed.load_state = lambda *a, **k: TESTBED_STATE
    with _with_env(env):
        return load_plan(str(ROOT / "inventories" / f"{inv}.py"), [f"{k}={json.dumps(v)}" for k, v in data.items()],
                         facts=False)


def valid(inv: str, name: str, env: dict, data: dict) -> bool:
    """Does the case plan (the rules accept it)?"""
    from m3deploy.core.errors import M3Error

    try:
        _load(inv, env, data)
        return True
    except M3Error:
        return False


def main(outdir: str) -> int:
    from m3deploy.cli import render_text
    from m3deploy.cli.render import render_hosts, write_render
    from m3deploy.core.errors import M3Error, ValidationError

    os.chdir(ROOT)
    out = Path(outdir)
    out.mkdir(parents=True, exist_ok=True)
    n = 0
    for inv, name, env, data in cases():
        label = f"{inv}--{name}" if name else inv
        try:
            plan = _load(inv, env, data)
            (out / f"{label}.explain.txt").write_text(render_text(plan, explain=True) + "\n")
            write_render(out / label, plan.name, render_hosts(plan))
            n += 1
        except ValidationError as e:
            (out / f"{label}.invalid.txt").write_text("\n".join(e.problems) + "\n")
        except M3Error as e:
            (out / f"{label}.invalid.txt").write_text(f"{e}\n")
    print(f"{outdir}: {n} rendered plans")
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(f"usage: {sys.argv[0]} OUTDIR")
    sys.exit(main(sys.argv[1]))
