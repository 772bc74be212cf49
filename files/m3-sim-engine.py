"""GPU-free engines for the testbed, run with the Dynamo venv's Python (shipped by roles/workers.py).

    m3-sim-engine.py mocker [--dyn-reasoning-parser P] [--dyn-tool-call-parser P] MOCKER-ARGS...
        Dynamo's own mocker (`python -m dynamo.mocker MOCKER-ARGS`), whose model card also names the
        frontend's reasoning and tool-call parsers, as `dynamo.vllm --dyn-reasoning-parser ...` does on GPU
        hosts (the 1.6.1 mocker has no such flags: its runtime config leaves both unset).

    m3-sim-engine.py scripted --model-path DIR --model-name NAME [--endpoint dyn://ns.component.endpoint]
                              [--dyn-reasoning-parser P] [--dyn-tool-call-parser P]
        A deterministic Dynamo worker, registered like the mocker (token input, chat + completions). It
        decodes the rendered prompt; when the prompt carries tools it answers with one MiniMax-M3 tool call
        of the first tool (`]<]minimax[>[<tool_call>...`, the format Dynamo's `minimax_m3` tool parser reads),
        arguments filled from the tool's required string parameters; otherwise a fixed sentence.

In both modes `--model-path` may name a Hugging Face repo instead of a directory (m3_runtime=docker on the
testbed: the staged mock repos in the mounted HF cache). The repo, and the draft named by
`--speculative-config` JSON's "model" (as a vLLM worker names its EAGLE3 head), are resolved offline with
huggingface_hub's `snapshot_download(repo, revision=..., local_files_only=True)`; a missing or incomplete one
stops the worker with the repo's name and the fix. The engine gets the target's snapshot directory. The mocker
does no speculative decoding: the draft is only resolved (proof it is staged and loadable offline), not used,
and `--speculative-config` is not passed on.

On SIGTERM both modes stop the way `dynamo.vllm` (the GPU workers' engine) does in Dynamo 1.6.1
(dynamo/vllm/main.py calls dynamo/common/utils/graceful_shutdown.py `install_signal_handlers`): unregister the
endpoint instance from discovery, wait the grace period (`DYN_GRACEFUL_SHUTDOWN_GRACE_PERIOD_SECS`, default 5 s)
so the frontend stops routing to it, then shut the runtime down, which finishes the requests in flight. The
1.6.1 mocker alone (dynamo/mocker/main.py `graceful_shutdown`) shuts down at once, with no unregister or grace:
the frontend can route a request to it in that moment and answer 503, a failure the GPU engines do not have.

Runs inside the Dynamo venv only: no m3deploy import.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import sys

NS = "]<]minimax[>["  # MiniMax-M3's tag namespace (Dynamo lib/parsers tool_calling/xml/minimax_m3_parser.rs)
ANSWER = "The scripted engine answers without tools."
ARGUMENT = "Paris"


def _parsers(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--dyn-reasoning-parser", default=None)
    p.add_argument("--dyn-tool-call-parser", default=None)
    return p.parse_known_args(argv)


def _resolve_one(repo: str, revision: str, role: str) -> str:
    """The local snapshot directory of `repo` at `revision`, from the HF cache only (never the network)."""
    from huggingface_hub import constants, snapshot_download

    try:
        path = snapshot_download(repo, revision=revision, local_files_only=True)
    except Exception as e:  # LocalEntryNotFoundError (not in the cache), or a broken snapshot
        raise SystemExit(f"m3-sim-engine: the {role} repo {repo}@{revision} is not in the HF cache "
                         f"{constants.HF_HUB_CACHE} (HF_HUB_OFFLINE={os.environ.get('HF_HUB_OFFLINE', '')}): "
                         f"{type(e).__name__}: {str(e).rstrip('.')}. Fix: stage it on the host "
                         "(m3_weights_source=controller with m3_mock_repo_mb, docs/WEIGHTS.md), then run the deploy "
                         "again") from None
    index = os.path.join(path, "model.safetensors.index.json")
    missing = [n for n in (sorted(set(json.load(open(index))["weight_map"].values())) if os.path.isfile(index)
                           else ["model.safetensors.index.json"]) + ["config.json"]
               if not os.path.isfile(os.path.join(path, n))]
    if missing:
        raise SystemExit(f"m3-sim-engine: the {role} repo {repo}@{revision} is incomplete in the HF cache ({path} "
                         f"lacks {', '.join(missing)}). Fix: stage it again (m3_weights_source=controller, "
                         "docs/WEIGHTS.md), then run the deploy again")
    print(f"m3-sim-engine: loaded {role} {repo}@{revision}: snapshot {os.path.basename(path)} ({path})",
          file=sys.stderr, flush=True)
    return path


def resolve(argv: list[str]) -> list[str]:
    """argv with `--model-path REPO` replaced by the repo's local snapshot directory and `--speculative-config`
    removed, once its draft repo is resolved too (`--revision` applies to the target; the draft's own "revision"
    key, else main). A `--model-path` that is a directory stays as it is."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--model-path")
    p.add_argument("--revision", default="main")
    p.add_argument("--speculative-config")
    opts, rest = p.parse_known_args(argv)
    out = list(rest)
    if opts.speculative_config:
        spec = json.loads(opts.speculative_config)
        if spec.get("model"):
            _resolve_one(spec["model"], spec.get("revision") or "main", "draft")
    if opts.model_path:
        path = opts.model_path if os.path.isdir(opts.model_path) else \
            _resolve_one(opts.model_path, opts.revision, "target")
        out = ["--model-path", path, *out]
    return out


def tool_call_text(prompt: str) -> str | None:
    """The M3 tool-call markup for the first tool the rendered prompt lists, or None without tools."""
    m = re.search(r"<tools>\s*(\{.*?\})\s*(?:\n\{|\n</tools>)", prompt, re.S)
    if not m:
        return None
    tool = json.loads(m.group(1))
    params = tool.get("parameters") or {}
    args = "".join(f"{NS}<{k}>{ARGUMENT}{NS}</{k}>" for k in params.get("required", [])
                   if (params.get("properties", {}).get(k) or {}).get("type", "string") == "string")
    return f"{NS}<tool_call>{NS}<invoke name=\"{tool['name']}\">{args}{NS}</invoke>{NS}</tool_call>"


def run_mocker(argv: list[str]) -> None:
    opts, rest = _parsers(argv)
    rest = resolve(rest)
    import dynamo.mocker.main as mocker

    build = mocker.build_runtime_config

    def with_parsers(engine_args):
        block_size, rc = build(engine_args)
        rc.reasoning_parser = opts.dyn_reasoning_parser
        rc.tool_call_parser = opts.dyn_tool_call_parser
        return block_size, rc

    mocker.build_runtime_config = with_parsers
    parse = mocker.parse_args
    parsed: list[argparse.Namespace] = []

    def keep_args():
        parsed.append(parse())
        return parsed[-1]

    async def unregister_then_shutdown(runtimes: list) -> None:  # replaces the mocker's immediate shutdown
        """Dynamo's own graceful_shutdown_with_discovery, which dynamo.vllm's signal handler runs, over every
        mocker runtime of this process: it unregisters their endpoints, waits the grace period, then shuts them
        down (the first by itself; the others in its cleanup step, just before it)."""
        from dynamo.common.utils.graceful_shutdown import graceful_shutdown_with_discovery

        path = parsed[-1].endpoint.removeprefix("dyn://")

        async def shutdown_the_others() -> None:
            for runtime in runtimes[1:]:
                runtime.shutdown()
        await graceful_shutdown_with_discovery(runtimes[0], [r.endpoint(path) for r in runtimes],
                                               cleanup_callback=shutdown_the_others)

    mocker.parse_args = keep_args
    mocker.graceful_shutdown = unregister_then_shutdown
    sys.argv = ["dynamo.mocker", *rest]
    mocker.main()


def run_scripted(argv: list[str]) -> None:
    opts, rest = _parsers(argv)
    rest = resolve(rest)
    p = argparse.ArgumentParser(prog="m3-sim-engine.py scripted")
    p.add_argument("--model-path", required=True)
    p.add_argument("--model-name", required=True)
    p.add_argument("--endpoint", default="dyn://dynamo.scripted.generate")
    args = p.parse_args(rest)

    import uvloop
    from dynamo.llm import ModelInput, ModelRuntimeConfig, ModelType, WorkerType, register_model
    from dynamo.runtime import DistributedRuntime, dynamo_worker
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(f"{args.model_path}/tokenizer.json")
    eos = [tok.token_to_id("<|im_end|>")]

    async def generate(request, context=None):
        prompt = tok.decode(list(request.get("token_ids") or []), skip_special_tokens=False)
        text = tool_call_text(prompt) or ANSWER
        ids = tok.encode(text, add_special_tokens=False).ids
        limit = (request.get("stop_conditions") or {}).get("max_tokens") or len(ids)
        ids = ids[:limit]
        for i, t in enumerate(ids):
            last = i == len(ids) - 1
            yield {"token_ids": [t], **({"finish_reason": "stop" if len(ids) < limit or not limit else "length"}
                                         if last else {})}
        if not ids:
            yield {"token_ids": eos, "finish_reason": "stop"}

    @dynamo_worker()
    async def worker(runtime: DistributedRuntime):
        from dynamo.common.utils.graceful_shutdown import install_signal_handlers

        endpoint = runtime.endpoint(args.endpoint.removeprefix("dyn://"))
        install_signal_handlers(asyncio.get_running_loop(), runtime, [endpoint])  # as dynamo.vllm does
        rc = ModelRuntimeConfig()
        rc.reasoning_parser = opts.dyn_reasoning_parser
        rc.tool_call_parser = opts.dyn_tool_call_parser
        await register_model(ModelInput.Tokens, ModelType.Chat | ModelType.Completions, endpoint, args.model_path,
                             args.model_name, worker_type=WorkerType.Aggregated, runtime_config=rc)
        await endpoint.serve_endpoint(generate)

    uvloop.run(worker())


if __name__ == "__main__":
    modes = {"mocker": run_mocker, "scripted": run_scripted}
    if len(sys.argv) < 2 or sys.argv[1] not in modes:
        sys.exit(f"usage: {sys.argv[0]} mocker|scripted ARGS...  (see the module docstring)")
    modes[sys.argv[1]](sys.argv[2:])
