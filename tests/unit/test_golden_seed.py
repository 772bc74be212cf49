"""Golden tests: every launch command of the serving recipe (tests/fixtures/seeds/000-serving-recipe.txt) and the vendor blog (tests/fixtures/seeds/002-vendor-blog.txt),
copied verbatim below, is reproduced by the plan from data — same program, model, flags with values, and env.

Flag order is not compared (vLLM's argparse is order-independent and the seed itself orders the same flags
differently between commands); the plan's own additions (--host/--port, HF_HUB_OFFLINE, Dynamo addresses)
are listed explicitly where they are expected.
"""
from __future__ import annotations

import shlex

import pytest

from m3deploy.core import build as planmod
from m3deploy.core import inventory

PLAN_ARGS = {"--host", "--port"}
PLAN_ENV = {"HF_HUB_OFFLINE", "HIP_VISIBLE_DEVICES"}


def parse_seed(text: str):
    """A seed snippet -> (program tokens, {flag: value|None}, {env: value})."""
    env: dict[str, str] = {}
    body = []
    for line in text.strip().splitlines():
        line = line.split("  #", 1)[0].strip()
        if line.startswith("export "):
            for kv in shlex.split(line[len("export "):]):
                k, v = kv.split("=", 1)
                env[k] = v
        elif line:
            body.append(line.rstrip("\\").strip())
    toks = shlex.split(" ".join(body))
    while toks and "=" in toks[0] and not toks[0].startswith("-"):
        k, v = toks.pop(0).split("=", 1)
        env[k] = v
    i = next(i for i, t in enumerate(toks) if t.startswith("--"))
    return toks[:i], _flags(toks[i:]), env


def _flags(toks):
    out, i = {}, 0
    while i < len(toks):
        t = toks[i]
        assert t.startswith("-"), toks
        if i + 1 < len(toks) and not toks[i + 1].startswith("--"):
            out[t] = toks[i + 1]
            i += 2
        else:
            out[t] = None
            i += 1
    return out


def worker(platform, variant="bf16", parallel="tp8", engine="vllm", serving="standalone", features=(), hosts=1,
           rank=0, **data):
    d = {"m3_platform": platform, "m3_variant": variant, "m3_parallel": parallel, "m3_engine": engine,
         "m3_serving": serving, "m3_features": list(features), **data}
    groups = {"workers": [(f"w{i}", {"m3_address": f"10.0.0.{11 + i}"}) for i in range(hosts)]}
    if serving == "dynamo":
        groups["control"] = [("ctl", {"m3_address": "10.0.0.2"})]
    p = planmod.build(inventory.hosts_from_dict(groups, all_data=d), name="golden")
    svc = p.host(f"w{rank}").services[0]
    return p, svc


def split(svc):
    """The service's program tokens, flags, env — minus the plan's own additions."""
    argv = list(svc.argv)
    i = next(i for i, t in enumerate(argv) if t.startswith("--") and i > 1)
    flags = {k: v for k, v in _flags(argv[i:]).items() if k not in PLAN_ARGS}
    env = {k: v for k, v in svc.env if k not in PLAN_ENV}
    return argv[:i], flags, env


def check(svc, seed_text, extra_env=None, prog=None):
    sprog, sflags, senv = parse_seed(seed_text)
    pprog, pflags, penv = split(svc)
    assert pflags == sflags
    assert penv == {**senv, **(extra_env or {})}
    assert pprog == (prog or sprog)


# ------------------------------------------------------------------------------------------ NVIDIA
def test_nvidia_tp8():
    _, svc = worker("h200")
    check(svc, """vllm serve MiniMaxAI/MiniMax-M3 \\
  --tensor-parallel-size 8 \\
  --block-size 128 \\
  --tool-call-parser minimax_m3 \\
  --reasoning-parser minimax_m3 \\
  --enable-auto-tool-choice""")
    # the seed's :minimax-m3 tag names no version; the plan pins the release its flags were checked against
    # (m3deploy/core/data/engines.yaml images:, tests/unit/test_engine_flags.py)
    assert svc.image == "vllm/vllm-openai:v0.31.0"
    assert svc.docker_args[:3] == ("--network", "host", "--ipc=host")
    assert "--gpus" in svc.docker_args and "all" in svc.docker_args


def test_nvidia_tp8_expert_parallel():
    # the seed's "8x H200 / H20" BF16 fit holds for the 141 GB H20; the 96 GB one is rejected (test_validate)
    _, svc = worker("h20", parallel="tp8-ep", m3_gpu_memory_gb=141)
    check(svc, """vllm serve MiniMaxAI/MiniMax-M3 \\
  --tensor-parallel-size 8 \\
  --enable-expert-parallel \\
  --block-size 128 \\
  --tool-call-parser minimax_m3 \\
  --reasoning-parser minimax_m3 \\
  --enable-auto-tool-choice""")


def test_nvidia_dp8_expert_parallel():
    _, svc = worker("h200", parallel="dp8-ep")
    check(svc, """vllm serve MiniMaxAI/MiniMax-M3 \\
  --data-parallel-size 8 \\
  --enable-expert-parallel \\
  --block-size 128 \\
  --tool-call-parser minimax_m3 \\
  --reasoning-parser minimax_m3 \\
  --enable-auto-tool-choice""")


def test_fp8_kv_cache_adds_one_flag():
    _, base = worker("h200")
    _, svc = worker("h200", features=["fp8-kv"])
    assert split(svc)[1] == {**split(base)[1], "--kv-cache-dtype": "fp8"}


def test_context_cap():
    _, svc = worker("h200", features=["no-tool-calling", "no-reasoning"], m3_max_model_len=131072)
    check(svc, """vllm serve MiniMaxAI/MiniMax-M3 \\
  --tensor-parallel-size 8 \\
  --block-size 128 \\
  --max-model-len 131072        # 128K instead of the full 1M""")


def test_mxfp8_generic():
    _, svc = worker("h200", variant="mxfp8")
    check(svc, """vllm serve MiniMaxAI/MiniMax-M3-MXFP8 \\
  --tensor-parallel-size 8 \\
  --block-size 128 \\
  --tool-call-parser minimax_m3 \\
  --reasoning-parser minimax_m3 \\
  --enable-auto-tool-choice""")


def test_b200_nvfp4_baseline():
    _, svc = worker("b200", variant="nvfp4")
    check(svc, """VLLM_FLOAT32_MATMUL_PRECISION=high \\
  vllm serve nvidia/MiniMax-M3-NVFP4 \\
  --tensor-parallel-size 8 \\
  --trust-remote-code \\
  --block-size 128 \\
  --tool-call-parser minimax_m3 \\
  --reasoning-parser minimax_m3 \\
  --enable-auto-tool-choice""")


@pytest.mark.parametrize("platform", ["b200", "b300"])
def test_nvfp4_eagle3_mha(platform):
    _, svc = worker(platform, variant="nvfp4", features=["eagle3", "text-only", "no-tool-calling", "no-reasoning"])
    check(svc, """VLLM_FLOAT32_MATMUL_PRECISION=high \\
  vllm serve nvidia/MiniMax-M3-NVFP4 \\
  --tensor-parallel-size 8 \\
  --trust-remote-code \\
  --block-size 128 \\
  --language-model-only \\
  --speculative-config '{"method": "eagle3", "model": "Inferact/MiniMax-M3-EAGLE3", "num_speculative_tokens": 3, "attention_backend": "FLASH_ATTN"}'""")


def test_nvfp4_eagle3_gqa():
    _, svc = worker("b200", variant="nvfp4", features=["eagle3-gqa", "text-only", "no-tool-calling", "no-reasoning"])
    check(svc, """VLLM_FLOAT32_MATMUL_PRECISION=high \\
  vllm serve nvidia/MiniMax-M3-NVFP4 \\
  --tensor-parallel-size 8 \\
  --trust-remote-code \\
  --block-size 128 \\
  --language-model-only \\
  --speculative-config '{"method": "eagle3", "model": "Inferact/MiniMax-M3-EAGLE3-GQA", "num_speculative_tokens": 3, "attention_backend": "FLASH_ATTN"}'""")


def test_encoder_parallel_nvidia_and_blog_vllm_line():
    """tests/fixtures/seeds/002-vendor-blog.txt's vLLM line: TP8+EP with the NVIDIA vision-encoder flags; it omits --mm-encoder-tp-mode,
    which the recipe's Encoder Parallel adds, so the user drops it with m3_unset_args."""
    _, svc = worker("b200", parallel="tp8-ep", features=["encoder-parallel"], m3_extra_args=["--trust-remote-code"],
                    m3_unset_args=["--mm-encoder-tp-mode"])
    check(svc, """vllm serve MiniMaxAI/MiniMax-M3
--tensor-parallel-size 8
--enable-expert-parallel
--block-size 128
--mm-encoder-attn-backend FLASHINFER
--mm-processor-cache-type shm
--tool-call-parser minimax_m3
--enable-auto-tool-choice
--reasoning-parser minimax_m3
--trust-remote-code""")
    _, full = worker("b200", parallel="tp8-ep", features=["encoder-parallel"])
    assert split(full)[1]["--mm-encoder-tp-mode"] == "data"


# ------------------------------------------------------------------------------------------ AMD
AMD_ENV = "export VLLM_USE_BREAKABLE_CUDAGRAPH=0\n"


@pytest.mark.parametrize("platform", ["mi300x", "mi325x", "mi350x", "mi355x"])
def test_amd_tp8_text_or_vision(platform):
    _, svc = worker(platform, features=["encoder-parallel"])
    check(svc, AMD_ENV + """vllm serve MiniMaxAI/MiniMax-M3 \\
  --tensor-parallel-size 8 \\
  --block-size 128 \\
  --attention-backend TRITON_ATTN \\
  --mm-encoder-tp-mode data \\
  --mm-encoder-attn-backend ROCM_AITER_FA \\
  --tool-call-parser minimax_m3 \\
  --reasoning-parser minimax_m3 \\
  --enable-auto-tool-choice""")
    assert svc.image == "vllm/vllm-openai-rocm:v0.33.0"  # the seed's :nightly, pinned
    # docker run flags of the seed's AMD container line
    assert svc.docker_args[2:] == ("--device", "/dev/kfd", "--device", "/dev/dri", "--group-add", "video",
                                   "--cap-add", "SYS_PTRACE", "--security-opt", "seccomp=unconfined", "--ipc=host",
                                   "--shm-size=16g", "-v", "/var/lib/m3/hf:/root/.cache/huggingface")


def test_amd_tp8_fp8_per_channel():
    _, svc = worker("mi300x", features=["fp8-per-channel"])
    check(svc, """export VLLM_USE_BREAKABLE_CUDAGRAPH=0
export VLLM_ROCM_USE_AITER=1
export VLLM_ROCM_USE_AITER_MOE=0

vllm serve MiniMaxAI/MiniMax-M3 \\
  --tensor-parallel-size 8 \\
  --block-size 128 \\
  --attention-backend TRITON_ATTN \\
  --quantization fp8_per_channel \\
  --tool-call-parser minimax_m3 \\
  --reasoning-parser minimax_m3 \\
  --enable-auto-tool-choice""")


def test_amd_tp8_expert_parallel():
    _, svc = worker("mi325x", parallel="tp8-ep", features=["encoder-parallel"])
    check(svc, AMD_ENV + """vllm serve MiniMaxAI/MiniMax-M3 \\
  --tensor-parallel-size 8 \\
  --enable-expert-parallel \\
  --block-size 128 \\
  --attention-backend TRITON_ATTN \\
  --mm-encoder-tp-mode data \\
  --mm-encoder-attn-backend ROCM_AITER_FA \\
  --tool-call-parser minimax_m3 \\
  --reasoning-parser minimax_m3 \\
  --enable-auto-tool-choice""")


def test_amd_dp8_expert_parallel():
    _, svc = worker("mi355x", parallel="dp8-ep", features=["encoder-parallel"])
    check(svc, AMD_ENV + """vllm serve MiniMaxAI/MiniMax-M3 \\
  --data-parallel-size 8 \\
  --enable-expert-parallel \\
  --block-size 128 \\
  --attention-backend TRITON_ATTN \\
  --mm-encoder-tp-mode data \\
  --mm-encoder-attn-backend ROCM_AITER_FA \\
  --tool-call-parser minimax_m3 \\
  --reasoning-parser minimax_m3 \\
  --enable-auto-tool-choice""")


def test_amd_1m_context_yarn():
    _, svc = worker("mi355x", features=["long-context-1m", "fp8-kv", "encoder-parallel"])
    check(svc, AMD_ENV + """VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 \\
  vllm serve MiniMaxAI/MiniMax-M3 \\
  --block-size 128 \\
  --kv-cache-dtype fp8 \\
  --tensor-parallel-size 8 \\
  --max-model-len 1048576 \\
  --attention-backend TRITON_ATTN \\
  --mm-encoder-tp-mode data \\
  --mm-encoder-attn-backend ROCM_AITER_FA \\
  --tool-call-parser minimax_m3 \\
  --enable-auto-tool-choice \\
  --reasoning-parser minimax_m3 \\
  --hf-overrides '{"text_config":{"rope_scaling":{"rope_type":"yarn","factor":2.0,"original_max_position_embeddings":524288}}}'""")


def test_mi300x_mxfp8_tuned():
    _, svc = worker("mi300x", variant="mxfp8", m3_max_model_len=131072)
    check(svc, """export VLLM_ENGINE_READY_TIMEOUT_S=3600
export VLLM_USE_BREAKABLE_CUDAGRAPH=0
export VLLM_ROCM_USE_AITER=1
export VLLM_ROCM_USE_AITER_MHA=0
export TORCH_BLAS_PREFER_HIPBLASLT=1
export NCCL_MIN_NCHANNELS="112"
export GPU_MAX_HW_QUEUES="2"

vllm serve MiniMaxAI/MiniMax-M3-MXFP8 \\
  --tensor-parallel-size 8 \\
  --block-size 128 \\
  --language-model-only \\
  --max-model-len 131072 \\
  --attention-backend TRITON_ATTN \\
  --async-scheduling \\
  --max-num-batched-tokens 16384 \\
  --tool-call-parser minimax_m3 \\
  --reasoning-parser minimax_m3 \\
  --enable-auto-tool-choice""")
    assert svc.readiness.timeout_s >= 3600


def test_mi355x_mxfp8_default():
    _, svc = worker("mi355x", variant="mxfp8")
    check(svc, """export VLLM_USE_BREAKABLE_CUDAGRAPH=0
export VLLM_ROCM_USE_AITER=1
export VLLM_ROCM_USE_AITER_FUSION_SHARED_EXPERTS=1
export VLLM_ROCM_QUICK_REDUCE_QUANTIZATION=INT4

vllm serve MiniMaxAI/MiniMax-M3-MXFP8 \\
  --tensor-parallel-size 8 \\
  --block-size 128 \\
  --attention-backend TRITON_ATTN \\
  --tool-call-parser minimax_m3 \\
  --reasoning-parser minimax_m3 \\
  --enable-auto-tool-choice""")
    assert svc.image == "vllm/vllm-openai-rocm:v0.33.0"  # the seed's :nightly, pinned


def test_mi355x_mxfp8_high_concurrency_tp4():
    p, svc = worker("mi355x", variant="mxfp8", parallel="tp4", features=["high-concurrency"])
    check(svc, """export VLLM_USE_BREAKABLE_CUDAGRAPH=0
export VLLM_ROCM_USE_AITER=1
export VLLM_ROCM_USE_AITER_FUSION_SHARED_EXPERTS=1
export VLLM_ROCM_SHUFFLE_KV_CACHE_LAYOUT=1
export VLLM_ROCM_QUICK_REDUCE_QUANTIZATION=INT4
export VLLM_ROCM_QUICK_REDUCE_CAST_BF16_TO_FP16=0
export VLLM_ROCM_QUICK_REDUCE_QUANTIZATION_MIN_SIZE_KB=256

vllm serve MiniMaxAI/MiniMax-M3-MXFP8 \\
  --tensor-parallel-size 4 \\
  --block-size 128 \\
  --language-model-only \\
  --moe-backend aiter \\
  --kv-cache-dtype fp8 \\
  --max-num-batched-tokens 32768 \\
  --attention-backend TRITON_ATTN \\
  --linear-backend emulation \\
  --tool-call-parser minimax_m3 \\
  --reasoning-parser minimax_m3 \\
  --enable-auto-tool-choice""")
    # TP4 on an 8-GPU node: two engines, GPUs 0-3 and 4-7, distinct ports
    h = p.host("w0")
    assert [s.name for s in h.services] == ["m3-worker@0", "m3-worker@1"]
    assert [dict(s.env)["HIP_VISIBLE_DEVICES"] for s in h.services] == ["0,1,2,3", "4,5,6,7"]
    assert [s.ports[0].port for s in h.services] == [8000, 8001]


def test_mi355x_mxfp4_baseline():
    _, svc = worker("mi355x", variant="mxfp4")
    check(svc, AMD_ENV + """vllm serve amd/MiniMax-M3-MXFP4 \\
  --tensor-parallel-size 8 \\
  --trust-remote-code \\
  --block-size 128 \\
  --attention-backend TRITON_ATTN \\
  --mm-encoder-tp-mode data \\
  --mm-encoder-attn-backend ROCM_AITER_FA \\
  --tool-call-parser minimax_m3 \\
  --enable-auto-tool-choice \\
  --reasoning-parser minimax_m3""")


def test_mi355x_mxfp4_agentx_preset():
    _, svc = worker("mi355x", variant="mxfp4", parallel="tp4", features=["agentx"])
    _, flags, env = split(svc)
    assert flags["--tensor-parallel-size"] == "4" and "--language-model-only" in flags
    assert "Inferact/MiniMax-M3-EAGLE3-GQA" in flags["--speculative-config"]
    assert '"TRITON_ATTN"' in flags["--speculative-config"]
    assert flags["--moe-backend"] == "aiter" and env["VLLM_ROCM_USE_AITER_MOE"] == "1"
    assert "--mm-encoder-tp-mode" not in flags and "--kv-transfer-config" not in flags


# ------------------------------------------------------------------------------------------ GB200 Dynamo lane
GB200_ENV = """
export ETCD_ENDPOINTS=http://10.0.0.2:2379 NATS_SERVER=nats://10.0.0.2:4222
export VLLM_FLOAT32_MATMUL_PRECISION=high VLLM_FLASHINFER_ALLREDUCE_BACKEND={allreduce}
export NCCL_CUMEM_ENABLE=1 NCCL_MNNVL_ENABLE=1 NCCL_NVLS_ENABLE=1
export UCX_MEMTYPE_CACHE=n UCX_TLS=cuda_copy,cuda_ipc,rc
"""
GB200_WORKER = """python3 -m dynamo.vllm --model nvidia/MiniMax-M3-NVFP4 --served-model-name nvidia/MiniMax-M3-NVFP4 \\
  --request-plane tcp --device-ids 0,1,2,3 \\
  --tensor-parallel-size {tp} --pipeline-parallel-size 1 --trust-remote-code \\
  --attention-config '{{"backend":"FLASHINFER","use_trtllm_attention":true,"indexer_kv_dtype":"fp8","minimax_m3_msa_decode_backend":"cutlass"}}' \\
  --kv-cache-dtype fp8 --block-size 128 --enable-prefix-caching \\
  --speculative-config '{{"method":"eagle3","model":"Inferact/MiniMax-M3-EAGLE3-GQA","num_speculative_tokens":3,"attention_backend":"FLASHINFER","use_local_argmax_reduction":true}}' \\
  --max-model-len 1048576 --max-num-batched-tokens 16384 --max-num-seqs 64 \\
  --compilation-config '{{"cudagraph_mode":"FULL_AND_PIECEWISE","cudagraph_capture_sizes":[1,2,4,8,16,32,64,256,512,1024,2048]}}' \\
  --gpu-memory-utilization 0.9 --no-enable-flashinfer-autotune --stream-interval 20 --language-model-only \\
  --kv-events-config '{{"publisher":"zmq","topic":"kv-events","enable_kv_cache_events":true,"endpoint":"tcp://{addr}:5200"}}' \\
  --reasoning-parser minimax_m3 --dyn-reasoning-parser minimax_m3 --dyn-tool-call-parser minimax_m3"""
GB200_DATA = dict(variant="nvfp4", serving="dynamo", features=["eagle3-gqa", "text-only"], m3_max_num_seqs=64,
                  m3_cudagraph_capture_sizes=[1, 2, 4, 8, 16, 32, 64])
# what the plan adds on top of the seed's env: the timeouts the seed says to raise, the IMEX channel,
# Dynamo's advertised addresses, NATS event plane, etcd/NATS auth user and health server
# (docs/DYNAMO.md), the etcd token type marker (m3deploy.core.build.etcd_jwt_option), offline weights, the etcd
# lease TTL that rides out a 60 s etcd outage (m3_etcd_lease_ttl, docs/OPERATIONS.md).
GB200_PLAN_ENV = {"M3_ETCD_AUTH_TOKEN": "jwt", "ETCD_LEASE_TTL": "120", "VLLM_ENGINE_READY_TIMEOUT_S": "3600",
                  "VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS": "3600",
                  "NVIDIA_IMEX_CHANNELS": "0", "DYN_REQUEST_PLANE": "tcp", "HOME": "/root",
                  "DYN_EVENT_PLANE": "nats", "ETCD_AUTH_USERNAME": "m3", "NATS_AUTH_USERNAME": "m3",
                  "DYN_SYSTEM_USE_ENDPOINT_HEALTH_STATUS": '["generate"]', "DYN_SYSTEM_PORT": "9090"}


def _addr_env(a):
    return {k: a for k in ("DYN_TCP_RPC_HOST", "DYN_TCP_RESPONSE_STREAM_HOST", "DYN_EVENT_PLANE_HOST",
                           "DYN_SYSTEM_HOST")}


def _generation_env(p):
    """The worker's generation namespace suffix (m3deploy/core/generation.py, issue 38)."""
    return {"DYN_NAMESPACE_WORKER_SUFFIX": p.generation.id}


def test_gb200_tp4_one_tray():
    """The seed's `tcp://*:5200` KV-events endpoint binds every interface; the plan binds the tray's address."""
    p, svc = worker("gb200", parallel="tp4", **GB200_DATA)
    check(svc, GB200_ENV.format(allreduce="trtllm") + GB200_WORKER.format(tp=4, addr="10.0.0.11"),
          extra_env={**GB200_PLAN_ENV, **_addr_env("10.0.0.11"), **_generation_env(p)})
    assert svc.base_image.startswith("vllm/vllm-openai:nightly-5555a2d8")
    assert svc.base_image.endswith("@sha256:8896fd7b29fc4ee7ce839f146cb4757984c476ec79d0234ffa8c995dee6e339a")
    assert svc.image.startswith("m3deploy/dynamo-vllm:1.6.1-")


def test_gb200_tp8_two_trays():
    p, svc0 = worker("gb200", parallel="tp8", hosts=2, m3_interface="enP5p9s0", **GB200_DATA)
    svc1 = p.host("w1").services[0]
    env_extra = {"NCCL_SOCKET_IFNAME": "enP5p9s0", "GLOO_SOCKET_IFNAME": "enP5p9s0"}
    for rank, svc, addr in ((0, svc0, "10.0.0.11"), (1, svc1, "10.0.0.12")):
        seed = GB200_ENV.format(allreduce="mnnvl") + GB200_WORKER.format(tp=8, addr=addr)
        seed += f" --nnodes 2 --node-rank {rank} --master-addr 10.0.0.11" + (" --headless" if rank else "")
        extra = {**GB200_PLAN_ENV, **_addr_env(addr), **env_extra, **_generation_env(p)}
        check(svc, seed, extra_env=extra)
    assert p.workers[0].hosts == ("w0", "w1")
    assert svc1.after == ("w0/m3-worker@0",)
    assert svc1.readiness.kind == "process" and svc0.readiness.url == "http://10.0.0.11:9090/health"
    assert p.host("w0").needs_rdma and p.host("w1").needs_rdma


def test_gb200_kv_offload():
    _, svc = worker("gb200", parallel="tp4", **{**GB200_DATA, "features": ["eagle3-gqa", "text-only", "kv-offload"]})
    _, flags, env = split(svc)
    assert env["VLLM_USE_SIMPLE_KV_OFFLOAD"] == "1"
    assert flags["--kv-transfer-config"] == ('{"kv_connector":"SimpleCPUOffloadConnector","kv_role":"kv_both",'
                                             '"kv_connector_extra_config":{"cpu_bytes_to_use":777389080576,'
                                             '"cpu_bytes_to_use_per_rank":194347270144,"lazy_offload":true}}')


def test_gb200_frontend():
    p, _ = worker("gb200", parallel="tp4", **GB200_DATA)
    fe = p.host("ctl").service("m3-frontend")
    seed = """export ETCD_ENDPOINTS=http://10.0.0.2:2379 NATS_SERVER=nats://10.0.0.2:4222 DYN_REQUEST_PLANE=tcp
export DYN_TOKENIZER=fastokens DYN_TOKENIZER_CACHE_BYTES=8589934592 DYN_TCP_REQUEST_TIMEOUT=60
python3 -m dynamo.frontend --trust-remote-code \\
  --router-mode kv --router-kv-events --router-temperature 0 \\
  --router-session-affinity-ttl-secs 14400 --kv-cache-block-size 128"""
    _, sflags, senv = parse_seed(seed)
    argv = list(fe.argv)
    assert argv[1:3] == ["-m", "dynamo.frontend"]
    flags = _flags(argv[3:])
    # the plan adds the bind address/port and a migration limit (notes: 0 failed 3/91 requests on a worker kill);
    # it drops --router-temperature 0: deprecated in 1.6.1 ("removed in v1.7") and the default
    del sflags["--router-temperature"]
    assert flags == {**sflags, "--http-host": "10.0.0.2", "--http-port": "8000", "--migration-limit": "3"}
    env = dict(fe.env)
    assert {k: env[k] for k in senv} == senv
    assert env["HOME"] and env["DYN_TCP_RPC_HOST"] == "10.0.0.2"
    assert "0.0.0.0" not in " ".join(fe.argv)


# ------------------------------------------------------------------------------------------ SGLang / TRT-LLM
def test_sglang_blog_line():
    _, svc = worker("b200", engine="sglang", parallel="tp8-ep")
    check(svc, """python -m sglang.launch_server
--model-path MiniMaxAI/MiniMax-M3
--dtype bfloat16
--tp-size 8
--ep-size 8
--trust-remote-code
--mem-fraction-static 0.8
--enable-multimodal
--quantization mxfp8
--attention-backend flashinfer
--mm-attention-backend flashinfer_cudnn
--moe-runner-backend deep_gemm
--chunked-prefill-size 8192
--reasoning-parser minimax-m3
--tool-call-parser minimax-m3""", prog=["python3", "-m", "sglang.launch_server"])
    # the blog spells the tool parser minimax-m3-nom, which SGLang refuses: sglang 0.5.21
    # srt/function_call/parser_names.py lists minimax-m3 (docs/RECIPES.md "Parser names")
    assert svc.image == "lmsysorg/sglang:v0.5.21"


def test_trtllm_text_only_line():
    _, svc = worker("b200", engine="trtllm", features=["text-only"])
    prog, flags, _ = split(svc)
    assert prog == ["trtllm-serve", "serve", "MiniMaxAI/MiniMax-M3"]
    assert flags["--tp_size"] == "8" and flags["--backend"] == "pytorch"
    assert flags["--tool_parser"] == "minimax_m3" and flags["--reasoning_parser"] == "minimax_m3"
    assert svc.image == "nvcr.io/nvidia/tensorrt-llm/release:1.3.0rc29"


# ------------------------------------------------------------------------------------------ provenance
def test_every_flag_and_env_names_its_layer():
    _, svc = worker("mi355x", variant="mxfp8", parallel="tp4", features=["high-concurrency"],
                    m3_extra_env={"NCCL_DEBUG": "INFO"})
    prov = {p.key: p for p in svc.provenance}
    _, flags, env = split(svc)
    for flag in flags:
        assert flag in prov, flag
    for k in env:
        assert f"env:{k}" in prov, k
    assert prov["--linear-backend"].layer == "feature:high-concurrency"
    assert prov["--linear-backend"].source == "m3deploy/core/data/layers/50-features.yaml"
    assert prov["env:NCCL_DEBUG"].layer == "cluster:m3_extra_env"
    assert prov["--block-size"].layer == "base"
    assert prov["image"].layer == "vendor:amd"  # one pinned ROCm image for every AMD layer (engines.yaml images:)
