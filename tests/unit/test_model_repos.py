"""`model_repos`: every Hugging Face repo any worker loads is in the plan, so the weights role stages it and the
cache check finds it before workers start with HF_HUB_OFFLINE=1 (which makes a repo missing from the cache a
load failure: huggingface_hub raises instead of downloading)."""
from __future__ import annotations

import json

import pytest

from m3deploy.cli import load_plan
from m3deploy.core import repos
from m3deploy.core.errors import ValidationError
from tests.unit.test_image_contracts import VALID, _plan
from tests.unit.test_plan_snapshots import ROOT, _testbed_state  # noqa: F401 (fixture)


def _workers(plan):
    return [s for h in plan.hosts for s in h.services if s.kind == "worker"]


@pytest.mark.parametrize("inventory,variant", VALID, ids=[f"{i}{'--' + v if v else ''}" for i, v in VALID])
def test_model_repos_cover_every_repo_in_argv(inventory, variant):
    plan = _plan(inventory, variant)
    staged = {r.repo for r in plan.model_repos}
    assert plan.model_repos[0].repo == plan.model_id and plan.model_repos[0].role == "target"
    for s in _workers(plan):
        for flag, repo in repos.references(s.argv):
            assert repo in staged or flag == "--served-model-name", (s.host, s.name, flag, repo)
    assert plan.to_dict()["model_repos"][0]["repo"] == plan.model_id


@pytest.mark.parametrize("inventory,draft", [("b200", "Inferact/MiniMax-M3-EAGLE3"),
                                             ("gb200", "Inferact/MiniMax-M3-EAGLE3-GQA")])
def test_speculative_draft_heads_are_staged(inventory, draft):
    plan = _plan(inventory, "")
    assert [(r.repo, r.role, r.flag) for r in plan.model_repos][1:] == [(draft, "draft", "--speculative-config")]
    spec = next(s.argv[s.argv.index("--speculative-config") + 1] for s in _workers(plan))
    assert json.loads(spec)["model"] == draft


def _load(data):
    return load_plan(str(ROOT / "inventories" / "h200.py"), [f"{k}={json.dumps(v)}" for k, v in data.items()],
                     facts=False)


def test_a_separate_tokenizer_is_staged():
    plan = _load({"m3_extra_args": ["--tokenizer", "Org/M3-Tokenizer"]})
    assert ("Org/M3-Tokenizer", "tokenizer", "--tokenizer") in [(r.repo, r.role, r.flag) for r in plan.model_repos]


def test_a_repo_no_known_flag_names_is_refused():
    with pytest.raises(ValidationError) as e:
        _load({"m3_extra_args": ["--hf-config-path", "Org/Other-Config"]})
    msg = "\n".join(e.value.problems)
    assert "--hf-config-path names the Hugging Face repo Org/Other-Config" in msg and "model_repos" in msg
    assert "repo_args" in msg and "h200-" in msg  # names the host, the flag, and the fix


def test_a_served_name_that_looks_like_a_repo_is_not_a_repo():
    plan = _load({"m3_served_model_name": "acme/m3-prod"})
    assert [r.repo for r in plan.model_repos] == [plan.model_id]


def test_repo_ids_and_references():
    assert repos.is_repo_id("Inferact/MiniMax-M3-EAGLE3") and not repos.is_repo_id("/var/lib/m3/hf")
    assert not repos.is_repo_id("a--b/c") and not repos.is_repo_id("tcp") and not repos.is_repo_id("x/y/z")
    argv = ["vllm", "serve", "O/T", "--speculative-config", '{"model": "O/D", "n": [{"x": "O/N"}]}', "--p", "8"]
    assert sorted(repos.references(argv)) == [("(positional)", "O/T"), ("--speculative-config", "O/D"),
                                              ("--speculative-config", "O/N")]
