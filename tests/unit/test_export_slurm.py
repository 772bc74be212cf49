"""`m3deploy export slurm`: the plan as an srt-slurm (srtctl) recipe, checked offline against srtctl's own recipe
shape (NVIDIA/srt-slurm src/srtctl/core/schema.py and src/srtctl/backends/*.py at c88ef731; srtctl is not on the
package index, so it cannot be run here: m3deploy/core/export_slurm.py SCHEMA restates its dataclasses)."""
from __future__ import annotations

import copy

import pytest

from m3deploy.core import export_slurm
from tests.unit.test_export_k8s import plan_of
from tests.unit.test_plan_snapshots import ROOT, TESTBED_STATE

SCHEMA_PY = "src/srtctl/core/schema.py"


@pytest.fixture(autouse=True)
def _testbed_state(monkeypatch):
    import m3deploy.testbed

    monkeypatch.setattr(m3deploy.testbed, "load_state", lambda *a, **k: TESTBED_STATE)
    monkeypatch.setenv("M3_TESTBED", "m3tb")
    monkeypatch.chdir(ROOT)


def test_disaggregated_recipe_has_both_pools():
    doc = export_slurm.recipe(plan_of("gb200_disagg"))
    assert doc["resources"].items() >= {"prefill_nodes": 1, "decode_nodes": 1, "prefill_workers": 1,
                                        "decode_workers": 1, "gpus_per_node": 4}.items()
    cfg = doc["backend"]["vllm_config"]
    assert cfg["prefill"]["disaggregation-mode"] == "prefill" and cfg["decode"]["disaggregation-mode"] == "decode"
    assert all("$(POD_IP)" not in str(v) for pool in cfg.values() for v in pool.values())  # srtctl's addresses
    assert "ETCD_ENDPOINTS" not in doc["backend"]["prefill_environment"]  # srtctl starts etcd/NATS itself
    assert doc["dynamo"] == {"install": False, "version": "1.6.1", "request_plane": "tcp", "event_plane": "nats"}


def test_multi_node_aggregated_recipe():
    doc = export_slurm.recipe(plan_of("gb200"))  # tp8 over two 4-GPU trays
    assert doc["resources"]["agg_nodes"] == 2 and doc["resources"]["agg_workers"] == 1
    assert doc["resources"]["gpus_per_agg"] == 8
    assert "nnodes" not in doc["backend"]["vllm_config"]["aggregated"]


def _with(fn):
    doc = export_slurm.recipe(plan_of("gb200_disagg"))
    bad = copy.deepcopy(doc)
    fn(bad)
    return bad


BAD = [
    ("no-name", lambda d: d.pop("name"), "required"),
    ("model-without-container", lambda d: d["model"].pop("container"), "required"),
    ("unknown-top-level", lambda d: d.update(worker={}), "additionalProperties"),
    ("backend-type", lambda d: d["backend"].update(type="tensorrt"), "enum"),
    ("snake-case-flag", lambda d: d["backend"]["vllm_config"]["prefill"].update(tensor_parallel_size=4), "pattern"),
    ("request-plane", lambda d: d["dynamo"].update(request_plane="grpc"), "enum"),
    ("env-not-string", lambda d: d["backend"]["prefill_environment"].update(X=1), "type"),
    ("disagg-without-decode-workers", lambda d: d["resources"].update(decode_workers=0), "resources"),
    ("agg-and-disagg", lambda d: d["resources"].update(agg_nodes=1, agg_workers=1), "resources"),
    ("other-engines-config", lambda d: d["backend"].update(sglang_config={"prefill": {}}), "backend"),
]


@pytest.mark.parametrize("case,mutate,rule", BAD, ids=[b[0] for b in BAD])
def test_bad_recipe_is_refused_naming_the_rule(case, mutate, rule):
    assert export_slurm.problems(export_slurm.recipe(plan_of("gb200_disagg"))) == []
    problems = export_slurm.problems(_with(mutate))
    assert any(f"srtctl {'schema:' if rule not in ('resources', 'backend') else ''}{rule}" in p and "srt-slurm" in p
               for p in problems), problems
