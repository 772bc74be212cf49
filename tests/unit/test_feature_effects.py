"""A feature the user asks for must do something on the chosen engine (issue 22): whether it does is read from
the recipe layers (core/data/layers/*.yaml `when:`), not from a list written beside them. A feature with no layer
for that engine is refused with the reason and the fix, instead of planning a cluster without its flags."""
from __future__ import annotations

import pytest

from m3deploy.core import build as planmod
from m3deploy.core import inventory, recipes
from m3deploy.core.errors import ValidationError

BASE = {"m3_platform": "h200", "m3_variant": "bf16", "m3_parallel": "tp8", "m3_serving": "standalone"}


def plan(**data):
    hosts = inventory.hosts_from_dict({"workers": [("w1", {"m3_address": "10.0.0.1"})]}, all_data={**BASE, **data})
    return planmod.build(hosts, name="t")


def problems(**data) -> list[str]:
    with pytest.raises(ValidationError) as e:
        plan(**data)
    return list(e.value.problems)


def test_the_issues_case_sglang_with_vllm_only_features():
    """`--data m3_engine=sglang --data 'm3_features=["fp8-kv","thinking-always-on"]'` planned neither a KV-dtype
    nor a chat-template flag."""
    p = problems(m3_engine="sglang", m3_features=["fp8-kv", "thinking-always-on"])
    for f in ("fp8-kv", "thinking-always-on"):
        msg = next(x for x in p if f"{f!r} has no effect with m3_engine = 'sglang'" in x)
        assert "50-features.yaml" in msg and "apply to vllm only" in msg
        assert f"Fix: drop {f!r} from m3_features, or use m3_engine = 'vllm'" in msg


def layers_of(feature: str) -> list:
    return [layer for layer in recipes.layers() if feature in layer.when.get("features", ())]


# every shipped feature on every engine: refused exactly when no layer implements it for that engine
CASES = [(f, e) for f in ("fp8-kv", "thinking-always-on", "eagle3", "encoder-parallel", "text-only")
         for e in ("vllm", "sglang", "trtllm")]


@pytest.mark.parametrize("feature,engine", CASES)
def test_refused_exactly_when_no_layer_serves_the_engine(feature, engine):
    served = {layer.when.get("engine") for layer in layers_of(feature)}
    features = [feature] + (["text-only"] if engine == "trtllm" and feature != "text-only" else [])
    try:
        p = plan(m3_engine=engine, m3_features=features).hosts
        refused = []
    except ValidationError as e:
        p, refused = None, [x for x in e.problems if f"{feature!r} has no effect" in x]
    assert bool(refused) == (engine not in served), (feature, engine, served, refused)
    if p is not None and engine == "vllm":  # and where it is kept, the flags of its layers are in the plan
        argv = p[0].services[0].argv
        layer = next(x for x in layers_of(feature) if recipes.matches(
            {k: v for k, v in x.when.items() if k not in ("features",)},
            {"engine": "vllm", "vendor": "nvidia", "platform": "h200", "serving": "standalone"}))
        assert all(flag in argv for flag in layer.args), (feature, layer.args)
