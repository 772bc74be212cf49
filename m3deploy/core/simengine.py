"""The testbed's GPU-free engines (files/m3-sim-engine.py on hosts), as plan services.

- Mocker workers run `m3-sim-engine.py mocker ...`: Dynamo's mocker whose model card names the frontend's
  reasoning and tool-call parsers (`--dyn-reasoning-parser`, `--dyn-tool-call-parser` from the recipe, as
  for `dynamo.vllm`), and `--reasoning` makes it emit M3's think delimiters (mock tokenizer ids).
- `m3-scripted` (one per mocker cluster, on the first worker host) runs `m3-sim-engine.py scripted`: a
  deterministic Dynamo worker that answers a request carrying tools with one MiniMax-M3 tool call, under its
  own model name `<served>-scripted`, with the same parser flags as the workers. `smoke/tool-call` sends
  there: the mocker's random tokens can never form a tool call.
"""
from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from m3deploy.core.inputs import url_host
from m3deploy.core.model import ClusterPlan, Port, Readiness, Service

# shipped by roles/workers.py from files/m3-sim-engine.py; the mocker's launch in data/engines.yaml runs it
SIM_ENGINE = "/usr/local/lib/m3/m3-sim-engine.py"
# m3_runtime=docker: the stand-in engine image (built on the controller by m3deploy.controller.simimage from the
# testbed's rootfs + the Dynamo venv + this script); it declares vLLM's ENTRYPOINT ["vllm", "serve"]
SIM_IMAGE = "m3deploy/sim-engine"
# m3_runtime=docker: the mock EAGLE3 draft repo the workers name in --speculative-config, as a GPU worker names
# its draft head; staged beside the mock target (m3_mock_repo_mb) and resolved offline by the wrapper, never used
# (the mocker does no speculative decoding)
SIM_DRAFT = "m3deploy/mock-minimax-m3-eagle3"
SCRIPTED = "m3-scripted"
SCRIPTED_SUFFIX = "-scripted"
PARSER_FLAGS = ("--dyn-reasoning-parser", "--dyn-tool-call-parser")


def sim_image(dynamo_version: str) -> str:
    return f"{SIM_IMAGE}:{dynamo_version}"


def draft_config() -> str:
    return json.dumps({"method": "eagle3", "model": SIM_DRAFT, "num_speculative_tokens": 3}, separators=(",", ":"))


def _flag(argv: tuple[str, ...], flag: str) -> str | None:
    return argv[argv.index(flag) + 1] if flag in argv[:-1] else None


def scripted_service(worker: Service, args: Mapping[str, Any], port: int, model_dir: str, served: str,
                     home: str) -> Service:
    """The scripted engine beside `worker` (a mocker worker service, before TLS): same env, the parsers its recipe
    set (`args`: the worker's resolved flags), its own system port, HOME, env file and model name."""
    argv = (worker.argv[0], SIM_ENGINE, "scripted", "--model-path", model_dir,
            "--model-name", served + SCRIPTED_SUFFIX)
    for flag in PARSER_FLAGS:
        if args.get(flag) is not None:
            argv += (flag, str(args[flag]))
    address = worker.port("system").address
    env = dict(worker.env)
    env.update(HOME="/root" if worker.image else f"{home}/{SCRIPTED}", DYN_SYSTEM_PORT=str(port))
    return replace(worker, name=SCRIPTED, kind="scripted", argv=argv, env=tuple(env.items()),
                   ports=(Port("system", port, address, key="m3_system_port"),),
                   readiness=Readiness(kind="http", url=f"http://{url_host(address)}:{port}/health",
                                       timeout_s=worker.readiness.timeout_s if worker.readiness else 120),
                   env_file=f"/etc/m3/{SCRIPTED}.env", workdir="" if worker.image else f"{home}/{SCRIPTED}",
                   worker=-1, rank=0, nnodes=1,
                   devices=(), provenance=())


def scripted(plan: ClusterPlan) -> Service | None:
    return next((s for h in plan.hosts for s in h.services if s.kind == "scripted"), None)


def tool_call_model(plan: ClusterPlan) -> str:
    """The model smoke/tool-call asks: the scripted engine's where the plan has one, else the served model."""
    s = scripted(plan)
    return _flag(s.argv, "--model-name") if s is not None else plan.served_model_name
