"""The testbed's GPU-free engines in the plan (m3deploy.core.simengine) and the scripted engine's reply format."""
import importlib.util
import json
import re

from m3deploy.check.verify import contract, registered_services, smoke
from m3deploy.controller import mockmodel
from m3deploy.core import build as planmod
from m3deploy.core import inventory, simengine

REPO = __import__("pathlib").Path(__file__).resolve().parents[2]


def _plan(**extra):
    hosts = inventory.hosts_from_dict(
        {"control": [("c", {"m3_address": "10.0.0.1"})],
         "workers": [("w1", {"m3_address": "10.0.0.2"}), ("w2", {"m3_address": "10.0.0.3"})]},
        all_data={"m3_platform": "sim", "m3_engine": "mocker", "m3_serving": "dynamo", "m3_parallel": "tp1", **extra})
    return planmod.build(hosts, name="t")


def _engine():
    spec = importlib.util.spec_from_file_location("m3_sim_engine", REPO / "files/m3-sim-engine.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_mocker_workers_carry_m3_parsers_and_think_token_ids():
    p = _plan()
    w = p.host("w1").service("m3-worker@0")
    assert w.argv[1:3] == (simengine.SIM_ENGINE, "mocker")
    a = list(w.argv)
    assert a[a.index("--dyn-reasoning-parser") + 1] == "minimax_m3"
    assert a[a.index("--dyn-tool-call-parser") + 1] == "minimax_m3"
    reasoning = json.loads(a[a.index("--reasoning") + 1])
    ids = {t["content"]: t["id"] for t in json.loads(mockmodel.build_tokenizer_json())["added_tokens"]}
    # the recipe's ids are the mock tokenizer's think delimiters, which are the ones the checks look for
    assert (reasoning["start_thinking_token_id"], reasoning["end_thinking_token_id"]) == tuple(
        ids[d] for d in contract.THINK_DELIMITERS)
    assert 0 < reasoning["thinking_ratio"] < 1


def test_one_scripted_engine_beside_the_first_worker():
    p = _plan()
    s = simengine.scripted(p)
    assert s is not None and s.host == "w1" and s.kind == "scripted" and s.name == simengine.SCRIPTED
    assert [x.kind for x in p.host("w2").services] == ["worker"]
    assert s.ports[0].port == 9091 and s.readiness.url == "http://10.0.0.2:9091/health"
    env = dict(s.env)
    assert env["DYN_SYSTEM_PORT"] == "9091" and env["HOME"].endswith("/m3-scripted")
    assert s.env_file == "/etc/m3/m3-scripted.env" and s.after == ("c/m3-frontend",)
    a = list(s.argv)
    assert a[a.index("--dyn-tool-call-parser") + 1] == "minimax_m3"
    assert simengine.tool_call_model(p) == p.served_model_name + "-scripted"
    assert len(registered_services(p)) == 3


def test_parsers_follow_the_features():
    p = _plan(m3_features=["no-reasoning", "no-tool-calling"])
    w = p.host("w1").service("m3-worker@0")
    assert not set(simengine.PARSER_FLAGS + ("--reasoning",)) & set(w.argv)
    assert not set(simengine.PARSER_FLAGS) & set(simengine.scripted(p).argv)
    ids = {c.id for c in contract.contract_checks(p)}
    assert "smoke/reasoning-split" not in ids and "smoke/tool-call" not in ids


def test_contract_checks_in_the_smoke_list():
    ids = [c.id for c in (smoke.smoke_checks(_plan()) + contract.contract_checks(_plan()))]
    for want in ("smoke/reasoning-split", "smoke/reasoning-split-stream", "smoke/tool-call", "smoke/tool-call-stream",
                 "smoke/model-ready", "smoke/routable", "smoke/session-affinity",
                 "smoke/session-affinity-x-session-id"):
        assert want in ids
    tool = next(c for c in (smoke.smoke_checks(_plan()) + contract.contract_checks(_plan())) if c.id == "smoke/tool-call")
    assert "-scripted" in tool.reproduce and '"top_k":40' in tool.reproduce and smoke.SYSTEM_PROMPT in tool.reproduce


def test_scripted_reply_is_m3_tool_call_markup():
    eng = _engine()
    prompt = ('<|im_start|>system\n# Tools\n<tools>\n' + json.dumps(smoke.TOOLS[0]["function"]) +
              '\n</tools>\nTo call a tool...<|im_end|>\n<|im_start|>user\nweather?<|im_end|>\n')
    text = eng.tool_call_text(prompt)
    ns = re.escape(eng.NS)
    assert re.fullmatch(f'{ns}<tool_call>{ns}<invoke name="get_weather">{ns}<city>Paris{ns}</city>'
                        f'{ns}</invoke>{ns}</tool_call>', text)
    assert eng.tool_call_text("<|im_start|>user\nhi<|im_end|>\n") is None


def test_image_policy_follows_the_plan():
    assert contract.image_policy(_plan()) == "accepted"
    vllm = planmod.build(inventory.hosts_from_dict(
        {"control": [("c", {"m3_address": "10.0.0.1"})], "workers": [("w1", {"m3_address": "10.0.0.2"})]},
        all_data={"m3_platform": "h200", "m3_engine": "vllm", "m3_serving": "dynamo", "m3_parallel": "tp8",
                  "m3_features": ["text-only"]}), name="t")
    assert contract.image_policy(vllm) == "refused"
    check = next(c for c in contract.contract_checks(vllm) if c.id == "smoke/image-input")
    assert check.title.endswith("refused") and "image_url" in check.reproduce


# The docker testbed's wrapper resolves the staged repos offline (HF_HUB_OFFLINE=1, huggingface_hub
# snapshot_download(local_files_only=True)), in its own process: huggingface_hub reads HF_HOME at import.
_RESOLVE = ("import importlib.util, json, sys\n"
            "spec = importlib.util.spec_from_file_location('m3_sim_engine', sys.argv[1])\n"
            "mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod)\n"
            "print(json.dumps(mod.resolve(sys.argv[2:])))\n")
TARGET = "MiniMaxAI/MiniMax-M3"


def _resolve(hf_home, *argv):
    import os
    import subprocess
    import sys

    env = {**os.environ, "HF_HOME": str(hf_home), "HF_HUB_OFFLINE": "1"}
    env.pop("HF_HUB_CACHE", None)
    return subprocess.run([sys.executable, "-c", _RESOLVE, str(REPO / "files/m3-sim-engine.py"), *argv],
                          env=env, capture_output=True, text=True, timeout=60)


def _argv():
    plan = _plan(m3_runtime="docker", m3_weights_source="controller", m3_mock_repo_mb=1, m3_model_id=TARGET)
    w = next(s for h in plan.hosts for s in h.services if s.kind == "worker")
    return list(w.argv[w.argv.index("--model-path"):])  # what the wrapper's mocker mode gets


def test_wrapper_resolves_the_staged_target_and_draft_offline_and_hands_the_mocker_the_snapshot(tmp_path):
    from m3deploy.controller import mockrepos

    target = mockrepos.make_repo(tmp_path / "hub", TARGET, size_mb=1, shards=1)
    draft = mockrepos.make_repo(tmp_path / "hub", simengine.SIM_DRAFT, size_mb=1, shards=1, tokenizer=False)
    res = _resolve(tmp_path, *_argv())
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert out[:2] == ["--model-path", str(target.snapshot)] and "--speculative-config" not in out
    assert (target.snapshot / "tokenizer.json").is_file()  # what the mocker reads, as in the mock model dir
    assert f"loaded target {TARGET}@main: snapshot {target.commit}" in res.stderr
    assert f"loaded draft {simengine.SIM_DRAFT}@main: snapshot {draft.commit}" in res.stderr


def test_wrapper_refuses_a_missing_draft_naming_the_repo_and_the_fix(tmp_path):
    from m3deploy.controller import mockrepos

    mockrepos.make_repo(tmp_path / "hub", TARGET, size_mb=1, shards=1)
    res = _resolve(tmp_path, *_argv())
    assert res.returncode != 0 and res.stdout == ""
    assert f"the draft repo {simengine.SIM_DRAFT}@main is not in the HF cache {tmp_path}/hub" in res.stderr
    assert "Fix: stage it on the host (m3_weights_source=controller" in res.stderr


def test_wrapper_refuses_an_incomplete_target_naming_the_missing_shard(tmp_path):
    from m3deploy.controller import mockrepos

    target = mockrepos.make_repo(tmp_path / "hub", TARGET, size_mb=1, shards=2)
    mockrepos.make_repo(tmp_path / "hub", simengine.SIM_DRAFT, size_mb=1, shards=1, tokenizer=False)
    (target.snapshot / "model-00002-of-00002.safetensors").unlink()
    res = _resolve(tmp_path, *_argv())
    assert res.returncode != 0
    assert f"the target repo {TARGET}@main is incomplete" in res.stderr
    assert "lacks model-00002-of-00002.safetensors" in res.stderr
