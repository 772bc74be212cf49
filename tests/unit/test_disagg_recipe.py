"""inventories/gb200_disagg.py against Dynamo's MiniMax-M3 vLLM MXFP8 GB200 disaggregated recipe, flag by flag.

The recipe: ai-dynamo/dynamo recipes/minimax-m3/vllm/disagg/MXFP8/deploy.yaml at commit 25e7a52 (its launch lines
verbatim in tests/fixtures/recipes/dynamo-minimax-m3-vllm-disagg-mxfp8.yaml). Every flag of its prefill and decode
lines must be in the plan's worker of that pool with the same value; every flag the plan adds, and every value that
differs, is listed below with the reason.
"""
from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
import yaml

from m3deploy.cli import load_plan
from m3deploy.core import disagg

ROOT = Path(__file__).resolve().parents[2]
RECIPE = ROOT / "tests" / "fixtures" / "recipes" / "dynamo-minimax-m3-vllm-disagg-mxfp8.yaml"
INVENTORY = ROOT / "inventories" / "gb200_disagg.py"

# recipe flags whose value is the site's, not the recipe's (why)
SITE_VALUES = {
    "--model": "the recipe's site path of the checkpoint; the plan names the variant's HF repo (staged offline)",
    "--served-model-name": "the recipe's preview name; the plan serves m3_served_model_name, else the model id",
    # the recipe binds every interface on 5557; the plan binds the host's cluster address on m3_kv_events_port
    # (60-dynamo.yaml dynamo:vllm), same publisher and enable flag
    "--kv-events-config": "same JSON keys enable_kv_cache_events=true; endpoint on the cluster address",
}
# flags the plan adds over the recipe (why)
PLAN_EXTRAS = {
    "--request-plane": "Dynamo's request plane named explicitly (tcp, its default; docs/DYNAMO.md)",
    "--reasoning-parser": "vLLM's own reasoning parser (feature reasoning; Dynamo's agentic GB200 recipe sets it too)",
    "--device-ids": "the worker's GPUs (all four of the tray), from the plan's layout",
    "--pipeline-parallel-size": "1, vLLM's default (GB200 AgentX lane)",
}


def _flags(tokens: list[str]) -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        if tok.startswith("--"):
            value = tokens[i + 1] if i + 1 < len(tokens) and not tokens[i + 1].startswith("--") else None
            out[tok] = value
            i += 2 if value is not None else 1
        else:
            i += 1
    return out


def _recipe() -> dict:
    return yaml.safe_load(RECIPE.read_text())


def _recipe_flags(pool: str) -> dict[str, str | None]:
    tokens = shlex.split(_recipe()[pool])
    assert tokens[:4] == ["exec", "python3", "-m", "dynamo.vllm"], tokens[:4]
    return _flags(tokens[4:])


@pytest.fixture(scope="module")
def plan():
    return load_plan(str(INVENTORY), [], facts=False)


def _worker(plan, pool: str):
    found = [s for h in plan.hosts for s in h.services if s.kind == "worker" and disagg.pool_of(s) == pool]
    assert len(found) == _recipe()["topology"][pool]["replicas"], found
    return found[0]


def test_the_fixture_names_its_source():
    r = _recipe()
    assert r["repo"] == "ai-dynamo/dynamo" and r["path"] == "recipes/minimax-m3/vllm/disagg/MXFP8/deploy.yaml"
    assert len(r["commit"]) == 40 and r["commit"] in r["source"]


@pytest.mark.parametrize("pool", disagg.POOLS)
def test_every_recipe_flag_is_in_the_plan(plan, pool):
    """Dynamo's recipe file recipes/minimax-m3/vllm/disagg/MXFP8/deploy.yaml, each flag of the pool's line."""
    want, svc = _recipe_flags(pool), _worker(plan, pool)
    assert svc.argv[:3] == ("python3", "-m", "dynamo.vllm")
    have = _flags(list(svc.argv[3:]))
    wrong = {f: (v, have.get(f, "<absent>")) for f, v in want.items() if f not in SITE_VALUES and have.get(f, "!") != v}
    assert not wrong, f"recipe flag -> (recipe value, plan value): {wrong}"
    assert all(f in have for f in SITE_VALUES)
    events = json.loads(have["--kv-events-config"])
    assert events["enable_kv_cache_events"] is True and events["endpoint"].startswith("tcp://10.20.1.")


@pytest.mark.parametrize("pool", disagg.POOLS)
def test_every_flag_the_plan_adds_is_explained(plan, pool):
    want, svc = _recipe_flags(pool), _worker(plan, pool)
    extra = set(_flags(list(svc.argv[3:]))) - set(want)
    assert extra == set(PLAN_EXTRAS), f"unexplained: {extra - set(PLAN_EXTRAS)}; gone: {set(PLAN_EXTRAS) - extra}"


@pytest.mark.parametrize("pool", disagg.POOLS)
def test_the_recipe_env_and_the_nixl_env(plan, pool):
    svc, env = _worker(plan, pool), None
    env = dict(svc.env)
    for k, v in _recipe()["env"].items():
        assert env[k] == v, k
    address = plan.host(svc.host).address
    # dynamo/vllm/args.py get_host_ip: set explicitly, the side channel is the host's cluster address
    assert env["VLLM_NIXL_SIDE_CHANNEL_HOST"] == address and env["VLLM_NIXL_SIDE_CHANNEL_PORT"] == "5600"
    assert env["UCX_MEMTYPE_CACHE"] == "n" and "tcp" not in env["UCX_TLS"].split(",")
    assert svc.port("nixl").port == 5600 and svc.port("nixl").address == address


def test_the_pools_sit_on_their_trays_and_the_frontend_routes_by_kv(plan):
    assert _worker(plan, "prefill").host == "gb200-r01-t01" and _worker(plan, "decode").host == "gb200-r01-t02"
    fe = plan.first("frontend")[1]
    recipe_fe = _flags(_recipe()["frontend"]["args"])
    have = _flags(list(fe.argv[3:]))
    assert have["--router-mode"] == recipe_fe["--router-mode"] == "kv"
    assert "--enforce-disagg" not in have  # deprecated and ignored in 1.6.1 (router_args.py)


def test_explain_names_the_recipe_layer(plan):
    svc = _worker(plan, "prefill")
    layer = {p.key: p.layer for p in svc.provenance}
    assert layer["--attention-backend"] == "recipe:dynamo-m3-vllm-disagg-mxfp8-gb200"
    assert layer["--gpu-memory-utilization"] == "recipe:dynamo-m3-vllm-disagg-mxfp8-gb200"
    assert layer["--disaggregation-mode"] == "disagg:vllm" and layer["--kv-transfer-config"] == "disagg:vllm"
    assert layer["env:UCX_TLS"] == "disagg:vllm:nvidia"
