"""Each model constant is written once, in catalog.yaml `model:` (issue 22): the recipe layers name it as a
placeholder, so the block size, the context window and each engine's parser names cannot drift apart; a setting
that becomes a flag (m3_mocker_speedup_ratio) is placed by the engine data, not overwritten after it."""
from __future__ import annotations

from pathlib import Path

import pytest

from m3deploy.core import build as planmod
from m3deploy.core import catalog, inventory, recipes

ROOT = Path(__file__).resolve().parents[2]
FLAGS = {"--block-size": "block_size", "--kv-cache-block-size": "block_size", "--max-model-len": "max_context",
         "--reasoning-parser": "reasoning_parser", "--reasoning_parser": "reasoning_parser",
         "--dyn-reasoning-parser": "reasoning_parser", "--tool-call-parser": "tool_call_parser",
         "--dyn-tool-call-parser": "tool_call_parser"}


def test_no_layer_writes_a_model_constant_literally():
    literal = [(layer.source, layer.name, flag, value) for layer in recipes.layers()
               for flag, value in layer.args.items() if flag in FLAGS and "{" not in str(value)]
    assert literal == []


@pytest.mark.parametrize("engine,platform,serving", [("vllm", "h200", "standalone"), ("vllm", "h200", "dynamo"),
                                                     ("sglang", "h200", "standalone"), ("trtllm", "b200", "standalone"),
                                                     ("mocker", "sim", "dynamo")])
def test_the_plan_carries_the_catalogs_values(engine, platform, serving):
    data = {"m3_platform": platform, "m3_engine": engine, "m3_serving": serving,
            "m3_parallel": "tp1" if platform == "sim" else "tp8",
            "m3_features": ["text-only"] if engine == "trtllm" else []}
    groups = {"workers": [("w1", {"m3_address": "10.0.0.1"})]}
    if serving == "dynamo":
        groups["control"] = [("c1", {"m3_address": "10.0.0.9"})]
    plan = planmod.build(inventory.hosts_from_dict(groups, all_data=data), name="t")
    want = catalog.model_constants(engine)
    seen = 0
    for svc in (s for h in plan.hosts for s in h.services if s.kind in ("worker", "frontend")):
        argv = list(svc.argv)
        for flag, key in FLAGS.items():
            if flag in argv and key != "max_context":
                assert argv[argv.index(flag) + 1] == str(want[key]), (svc.name, flag)
                seen += 1
    assert seen >= 1


def test_speedup_ratio_is_the_settings():
    def argv(**data):
        hosts = inventory.hosts_from_dict(
            {"control": [("c1", {"m3_address": "10.0.0.9"})], "workers": [("w1", {"m3_address": "10.0.0.1"})]},
            all_data={"m3_platform": "sim", "m3_engine": "mocker", "m3_serving": "dynamo", "m3_parallel": "tp1",
                      **data})
        return list(planmod.build(hosts, name="t").host("w1").service("m3-worker@0").argv)

    for data, want in (({}, "10"), ({"m3_mocker_speedup_ratio": 25}, "25")):
        a = argv(**data)
        assert a.count("--speedup-ratio") == 1 and a[a.index("--speedup-ratio") + 1] == want
