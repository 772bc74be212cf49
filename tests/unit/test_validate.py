"""Every validation rule: the error names the host or key, says what is wrong and the fix, and all problems
are reported at once."""
from __future__ import annotations

from pathlib import Path

import pytest

from m3deploy.core import build as planmod
from m3deploy.core import inventory
from m3deploy.core.errors import ValidationError

ROOT = Path(__file__).resolve().parents[2]


def build(workers=1, control=0, **data):
    base = {"m3_platform": "h200", "m3_variant": "bf16", "m3_parallel": "tp8", "m3_engine": "vllm",
            "m3_serving": "standalone"}
    base.update(data)
    groups = {"workers": [(f"w{i}", {"m3_address": f"10.0.0.{11 + i}"}) for i in range(workers)]}
    if control:
        groups["control"] = [(f"c{i}", {"m3_address": f"10.0.0.{2 + i}"}) for i in range(control)]
    return planmod.build(inventory.hosts_from_dict(groups, all_data=base), name="t")


def problems(**kw) -> list[str]:
    with pytest.raises(ValidationError) as e:
        build(**kw)
    return e.value.problems


def one(**kw) -> str:
    p = problems(**kw)
    assert len(p) == 1, p
    return p[0]


def test_valid_baseline_builds():
    assert build().hosts[0].services[0].name == "m3-worker@0"


@pytest.mark.parametrize("key,value,valid", [
    ("m3_variant", "fp16", "bf16, mxfp8, nvfp4, mxfp4"),
    ("m3_engine", "tgi", "vllm, sglang, trtllm, mocker"),
    ("m3_serving", "k8s", "standalone, dynamo"),
])
def test_unknown_choice_lists_valid_ones(key, value, valid):
    msg = one(**{key: value})
    assert key in msg and repr(value) in msg and valid in msg


def test_image_pull_is_missing_or_always():
    msg = one(m3_image_pull="sometimes")
    assert "m3_image_pull" in msg and "'sometimes'" in msg and "'always'" in msg


def test_unknown_platform_names_the_host():
    msg = one(m3_platform="h100")
    assert msg.startswith("host w0:") and "'h100'" in msg and "gb200" in msg and "mi355x" in msg


def test_unknown_feature():
    msg = one(m3_features=["eagle4"])
    assert "'eagle4'" in msg and "eagle3-gqa" in msg


def test_features_must_be_a_list():
    assert "must be a list" in problems(m3_features="text-only")[0]


def test_bad_parallel_mode():
    msg = one(m3_parallel="pp2")
    assert "m3_parallel" in msg and "tp<N>" in msg


def test_block_size_other_than_128():
    msg = one(m3_extra_args=["--block-size", "16"])
    assert "host w0 m3-worker@0" in msg and "--block-size 16" in msg and "128" in msg


def test_parser_other_than_minimax_m3():
    msg = one(m3_extra_args={"--tool-call-parser": "minimax_m2"})
    assert "'minimax_m3'" in msg and "minimax_m2" in msg


def test_sglang_parsers_are_its_own():
    assert build(m3_platform="b200", m3_engine="sglang", m3_parallel="tp8-ep")
    msg = one(m3_platform="b200", m3_engine="sglang", m3_parallel="tp8-ep",
              m3_extra_args={"--reasoning-parser": "minimax_m3"})
    assert "'minimax-m3'" in msg


def test_nvfp4_off_blackwell():
    msg = one(m3_variant="nvfp4", m3_platform="h200")
    assert "nvfp4 needs blackwell" in msg and "b200" in msg


def test_mxfp4_off_mi355x():
    msg = one(m3_variant="mxfp4", m3_platform="mi300x")
    assert "mxfp4 runs only on mi355x" in msg


def test_text_only_with_encoder_parallel():
    msg = one(m3_features=["text-only", "encoder-parallel"])
    assert "mutually exclusive" in msg


def test_two_eagle_heads():
    assert "pick one EAGLE3" in one(m3_platform="b200", m3_features=["eagle3", "eagle3-gqa"])


def test_tp_does_not_divide_host_gpus():
    msg = one(m3_platform="b200", m3_variant="nvfp4", m3_parallel="tp3")
    assert "does not divide" in msg and "8 GPUs" in msg


def test_tp_not_multiple_of_gpus_per_host():
    msg = one(m3_platform="gb200", m3_variant="nvfp4", m3_parallel="tp6", workers=2)
    assert "not a multiple of 4 GPUs" in msg


def test_group_does_not_divide_into_whole_workers():
    msg = one(m3_platform="gb200", m3_variant="nvfp4", m3_parallel="tp8", workers=3)
    assert msg.startswith("group workers: 3 hosts") and "multiple of 2 hosts" in msg


def test_mixed_platforms_inside_one_worker():
    groups = {"workers": [("t1", {"m3_platform": "gb200", "m3_address": "10.0.0.1"}),
                          ("t2", {"m3_platform": "b200", "m3_address": "10.0.0.2", "m3_gpus_per_host": 4})]}
    with pytest.raises(ValidationError) as e:
        planmod.build(inventory.hosts_from_dict(groups, all_data={"m3_variant": "nvfp4", "m3_parallel": "tp8"}))
    assert any("mixes platforms" in p and "t1, t2" in p for p in e.value.problems)


def test_weights_do_not_fit():
    msg = one(m3_parallel="tp4")
    assert "1025 GB" in msg and "4 x 141 GB = 564 GB" in msg and "mxfp8" in msg


def test_weights_fit_rule_per_variant():
    assert build(m3_variant="mxfp8", m3_parallel="tp4")  # 4 x 141 = 564 >= 513
    assert "768 GB" in one(m3_platform="h20")  # 8 x 96 GB < 1025 GB BF16


def test_dynamo_without_control_host():
    msg = one(m3_serving="dynamo")
    assert msg.startswith("group control") and "etcd, NATS and the frontend" in msg


def test_duplicate_addresses():
    groups = {"workers": [("a", {"m3_address": "10.0.0.5"}), ("b", {"m3_address": "10.0.0.5"})]}
    with pytest.raises(ValidationError) as e:
        planmod.build(inventory.hosts_from_dict(groups, all_data={"m3_platform": "h200"}))
    assert any(p.startswith("host a") and "same cluster address 10.0.0.5 as host b" in p for p in e.value.problems)


def test_conflicting_ports_on_one_host():
    # a host that is both control and worker: frontend and a standalone-style port collide
    groups = {"control": [("n1", {"m3_address": "10.0.0.5"})], "workers": [("n1", {})]}
    data = {"m3_platform": "h200", "m3_serving": "dynamo", "m3_system_port": 8000}
    with pytest.raises(ValidationError) as e:
        planmod.build(inventory.hosts_from_dict(groups, all_data=data))
    assert any(p.startswith("host n1: port 8000 is used by") and "m3-frontend" in p and "m3-worker@0" in p
               for p in e.value.problems)


def test_cluster_keys_must_agree_across_workers():
    groups = {"workers": [("a", {"m3_address": "1.1.1.1", "m3_variant": "bf16"}),
                          ("b", {"m3_address": "1.1.1.2", "m3_variant": "mxfp8"})]}
    with pytest.raises(ValidationError) as e:
        planmod.build(inventory.hosts_from_dict(groups, all_data={"m3_platform": "h200"}))
    assert any("m3_variant differs between workers" in p for p in e.value.problems)


def test_engine_rules():
    assert "text-only" in one(m3_platform="b200", m3_engine="trtllm")
    assert "m3_serving = 'dynamo'" in one(m3_engine="mocker", m3_platform="sim", m3_parallel="tp1")
    assert "only the mocker engine, or the CPU build of vllm" in one(m3_engine="sglang", m3_platform="sim",
                                                                      m3_parallel="tp1")
    # vLLM on the sim platform is its CPU build (engines.yaml vllm: cpu:): the module entry point, the tiny model
    cpu = build(m3_platform="sim", m3_parallel="tp1")
    argv = next(s for h in cpu.hosts for s in h.services if s.kind == "worker").argv
    assert argv[1:5] == ("-m", "vllm.entrypoints.openai.api_server", "--model", cpu.model_dir)
    assert cpu.model_dir.endswith("/models/tiny-minimax-m3") and not cpu.model_repos and cpu.venv


def test_feature_scope():
    assert "GB200 trays only" in one(m3_features=["kv-offload"])
    assert "MI355X with mxfp4" in one(m3_platform="mi355x", m3_variant="mxfp8", m3_features=["agentx"])


def test_mi300x_mxfp8_needs_max_model_len():
    assert "m3_max_model_len" in one(m3_platform="mi300x", m3_variant="mxfp8")


def test_max_model_len_bounds():
    assert "above MiniMax-M3's 1M" in one(m3_max_model_len=2_000_000)
    # vLLM's CPU build on the testbed serves the tiny model, whose window is 4096: a larger cap crash-loops the
    # engine at every start (seen in the rolling-change drill), so the plan refuses it; its own window is fine
    msg = one(m3_platform="sim", m3_parallel="tp1", m3_max_model_len=8192)
    assert "m3_max_model_len: 8192 is above the 4096-token window of tiny-minimax-m3" in msg and "<= 4096" in msg
    argv = next(s for h in build(m3_platform="sim", m3_parallel="tp1", m3_max_model_len=4096).hosts
                for s in h.services if s.kind == "worker").argv
    assert argv[argv.index("--max-model-len") + 1] == "4096"
    assert build(m3_platform="h200", m3_max_model_len=8192).hosts  # on a GPU the bound is M3's own window


def test_all_problems_reported_at_once():
    p = problems(m3_variant="nvfp4", m3_platform="h200", m3_parallel="tp16", workers=3, m3_serving="dynamo")
    text = "\n".join(p)
    assert "nvfp4 needs blackwell" in text and "3 hosts do not divide" in text and "group control" in text


def test_no_workers_group():
    with pytest.raises(ValidationError) as e:
        planmod.build(inventory.hosts_from_dict({"control": [("c", {})]}))
    assert "no `workers` group" in e.value.problems[0]


def test_dp8_ep_on_gb200_dynamo_is_data_parallel_only():
    """dp8-ep runs data-parallel ranks: the GB200 Dynamo lane used to add --tensor-parallel-size 8 next to
    --data-parallel-size 8 (and validation passed it)."""
    hosts = inventory.load_inventory(ROOT / "inventories" / "gb200.py", override_data={"m3_parallel": "dp8-ep"})
    p = planmod.build(hosts, name="gb200")
    workers = [s for h in p.hosts for s in h.services if s.kind == "worker"]
    assert workers
    for s in workers:
        assert s.argv[s.argv.index("--data-parallel-size") + 1] == "8"
        assert "--tensor-parallel-size" not in s.argv, s.argv
    with pytest.raises(ValidationError) as e:
        planmod.build(inventory.load_inventory(ROOT / "inventories" / "gb200.py", override_data={
            "m3_parallel": "dp8-ep", "m3_extra_args": ["--tensor-parallel-size", "8"]}), name="gb200")
    # refused by the input contract already: the plan owns --tensor-parallel-size (engines.yaml `parallel`)
    assert any("'--tensor-parallel-size' is set by the plan" in x and "set m3_parallel instead" in x
               for x in e.value.problems), e.value.problems


def test_trtllm_recipe_limits():
    """Dynamo's MiniMax-M3 recipe: TensorRT-LLM from BF16, text only; over two trays one MPI world, which m3deploy
    launches under Dynamo (engines.yaml mpi_world) and not for a standalone trtllm-serve."""
    assert "BF16 checkpoint only" in one(m3_platform="b200", m3_engine="trtllm", m3_variant="mxfp8",
                                         m3_features=["text-only"])
    p = one(m3_platform="gb200", m3_engine="trtllm", m3_parallel="tp8", m3_features=["text-only"], workers=2)
    assert "trtllm worker over several hosts" in p and "no mpi_world for standalone" in p
    assert "Fix: a tp8 that fits one host, or m3_serving = 'dynamo' (one MPI world)" in p
    plan = build(m3_platform="gb200", m3_engine="trtllm", m3_parallel="tp8-ep", m3_features=["text-only"],
                 m3_serving="dynamo", workers=2, control=1)
    assert [s.argv[0] for h in plan.hosts for s in h.services if s.kind == "worker"] == \
        ["/opt/hpcx/ompi/bin/mpirun", "/usr/sbin/sshd"]


@pytest.mark.parametrize("image", ["lmsysorg/sglang:latest", "vllm/vllm-openai-rocm:nightly", "vllm/vllm-openai"])
def test_floating_image_refused(image):
    p = one(m3_image=image)
    assert p.startswith(f"host w0 m3-worker@0: image {image} is a floating tag") and "Fix: set m3_image" in p


def test_pinned_user_image_accepted():
    assert build(m3_image="registry.example/vllm:v0.31.0-m3").hosts[0].services[0].image == \
        "registry.example/vllm:v0.31.0-m3"


def test_engine_version_outside_dynamo_range(tmp_path, monkeypatch):
    """dynamo.vllm 1.6.1 needs 0.27 <= vLLM < 0.32; the reason names the import that fails."""
    newer = one(m3_platform="mi355x", m3_variant="mxfp8", m3_serving="dynamo", control=1)
    assert "vllm/vllm-openai-rocm:v0.33.0 carries vllm 0.33.0, newer than Dynamo 1.6.1" in newer
    assert "get_engine_zmq_addresses" in newer
    (tmp_path / "engines.yaml").write_text(
        "vllm:\n  images:\n    vllm/vllm-openai:v0.26.0: {version: 0.26.0, source: test}\n")
    monkeypatch.setenv("M3DEPLOY_RECIPES", str(tmp_path))
    older = one(m3_image="vllm/vllm-openai:v0.26.0", m3_serving="dynamo", control=1)
    assert "carries vllm 0.26.0, older than Dynamo 1.6.1 works with (>= 0.27.0)" in older and "VLLMClientError" in older
