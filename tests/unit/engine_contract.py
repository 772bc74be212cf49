"""Every flag, choice and environment variable of a rendered command, checked against what the pinned engine's own
source declares (tests/fixtures/engine-flags/*.json, written by scripts/extract_engine_flags.py from the wheels;
TensorRT-LLM's from its tagged source). Used by tests/unit/test_engine_flags.py.

Which lists apply to a service: the launch (`vllm serve`, `python3 -m dynamo.sglang`, ...) names the parsers;
the image's engine version (m3deploy/core/data/engines.yaml `images:`) names the engine's file; Dynamo's file is
the plan's dynamo_version.
"""
from __future__ import annotations

import functools
import json
from pathlib import Path

from m3deploy.core import catalog, simengine

ROOT = Path(__file__).resolve().parents[2]
FLAGS_DIR = ROOT / "tests" / "fixtures" / "engine-flags"
PACKAGE = {"vllm": "vllm", "sglang": "sglang", "trtllm": "tensorrt-llm"}

# launch -> (engine whose version the image names, its parsers, Dynamo's parsers)
LAUNCHES = {
    ("vllm", "serve"): ("vllm", ("engine", "serve"), ()),
    ("-m", "dynamo.vllm"): ("vllm", ("engine",), ("runtime", "dynamo.vllm")),
    ("-m", "sglang.launch_server"): ("sglang", ("server",), ()),
    ("-m", "dynamo.sglang"): ("sglang", ("server",), ("runtime", "dynamo.sglang")),
    ("trtllm-serve", "serve"): ("trtllm", ("serve",), ()),
    ("-m", "dynamo.trtllm"): ("trtllm", (), ("runtime", "dynamo.trtllm")),
    ("-m", "dynamo.frontend"): (None, (), ("dynamo.frontend",)),
    (simengine.SIM_ENGINE, "mocker"): (None, (), ("dynamo.mocker",)),
}
# dynamic flag families a parser accepts besides its list (dynamo/trtllm/dynamic_flags.py)
DYNAMIC_PREFIX = {"dynamo.trtllm": "--trtllm."}
# Environment variables owned by something other than the engine (not checked against its source), with the owner
FOREIGN_ENV = {
    "NCCL_": "NCCL", "UCX_": "UCX", "GLOO_": "PyTorch Gloo", "TORCH_": "PyTorch", "HF_": "huggingface_hub",
    "NVIDIA_": "NVIDIA Container Toolkit", "HIP_": "ROCm HIP runtime", "GPU_MAX_HW_QUEUES": "ROCm HIP runtime",
    "HOME": "the process", "M3_": "m3deploy", "OMPI_": "Open MPI", "CUDA_": "CUDA", "PYTHONUNBUFFERED": "CPython",
}
USER_LAYERS = ("cluster:m3_extra_args", "cluster:m3_extra_env")  # the user's own, not the recipe's


@functools.cache
def load(package: str, version: str) -> dict:
    path = FLAGS_DIR / f"{package}-{version}.json"
    if not path.exists():
        raise AssertionError(f"no flag list for {package} {version} ({path.relative_to(ROOT)}): extract it with "
                             "scripts/extract_engine_flags.py from the wheel")
    return json.loads(path.read_text())


def engine_version(image: str | None, engine: str) -> str | None:
    """The engine version engines.yaml writes beside the image (None: the image is not in the table)."""
    entry = (catalog.engines()[engine].get("images") or {}).get(image or "")
    return str(entry["version"]) if entry else None


def _launch(argv: tuple[str, ...]) -> tuple[tuple, int] | None:
    for i in range(len(argv) - 1):
        if (argv[i], argv[i + 1]) in LAUNCHES:
            return LAUNCHES[(argv[i], argv[i + 1])], i + 2
    return None


def _pairs(argv):
    """(flag, value or None) for each `--flag [value]` / `--flag=value`; positionals are skipped."""
    out, i = [], 0
    while i < len(argv):
        tok = argv[i]
        if tok.startswith("--"):
            if "=" in tok:
                out.append(tuple(tok.split("=", 1)))
            elif i + 1 < len(argv) and not argv[i + 1].startswith("--"):
                out.append((tok, argv[i + 1]))
                i += 1
            else:
                out.append((tok, None))
        i += 1
    return out


def service_problems(plan, svc) -> list[str]:
    """Unknown flags, invalid choices and unknown env names of one service, each naming the flag, the engine file
    and the plan source (the layer file) that set it."""
    found = _launch(svc.argv)
    if found is None:
        return []
    (engine, eparsers, dparsers), start = found
    where = f"host {svc.host} {svc.name}"
    prov = {p.key: p for p in svc.provenance}
    lists: list[tuple[str, dict, dict]] = []  # (file, flags, runtime choices)
    problems: list[str] = []
    data = {}
    if engine:
        image = svc.base_image or svc.image
        version = engine_version(image, engine)
        if version is None:
            return [(f"{where}: image {image!r} has no engine version in m3deploy/core/data/engines.yaml "
                     f"({engine} images:), so its flags cannot be checked")]
        data[engine] = load(PACKAGE[engine], version)
        lists += [(f"{PACKAGE[engine]}-{version}.json", data[engine]["parsers"][p]["flags"], {}) for p in eparsers]
    if dparsers:
        dyn = data["dynamo"] = load("ai-dynamo", plan.dynamo_version)
        lists += [(f"ai-dynamo-{plan.dynamo_version}.json", dyn["parsers"][p]["flags"], dyn.get("runtime", {}))
                  for p in dparsers]
        if "dynamo.mocker" in dparsers:  # files/m3-sim-engine.py takes these two off and puts them in the card
            lists.append((f"ai-dynamo-{plan.dynamo_version}.json",
                          {f: dyn["parsers"]["runtime"]["flags"][f] for f in simengine.PARSER_FLAGS},
                          dyn.get("runtime", {})))
    files = ", ".join(sorted({f for f, _, _ in lists}))
    for flag, value in _pairs(svc.argv[start:]):
        p = prov.get(flag)
        if p is not None and p.layer in USER_LAYERS:
            continue
        src = f"set by {p.layer} ({p.source})" if p else "set by the plan (m3deploy/core/build.py, engines.yaml)"
        names = {flag, flag.replace("_", "-")} if engine == "vllm" else {flag}  # vLLM: FlexibleArgumentParser
        hit = [(f, fl[n], rt) for f, fl, rt in lists for n in names if n in fl]
        if not hit:
            if any(flag.startswith(DYNAMIC_PREFIX.get(d, "\0")) for d in dparsers):
                continue
            problems.append(f"{where}: {flag} is unknown to {files}; {src}")
            continue
        for f, choices, rt in hit:
            if choices and value is not None:
                allowed = [c for ch in choices
                           for c in (rt.get(ch.split(":", 1)[1], []) if ch.startswith("@runtime:") else [ch])]
                if allowed and value not in allowed:
                    problems.append(f"{where}: {flag} {value!r} is not a choice of {f} "
                                    f"({', '.join(allowed[:50])}); {src}")
    for key, _ in svc.env:
        p = prov.get(f"env:{key}")
        if p is not None and p.layer in USER_LAYERS:
            continue
        if any(key.startswith(k) for k in FOREIGN_ENV):
            continue
        owner = next((e for e, d in data.items() if any(key.startswith(x) for x in d["env"]["prefixes"])), None)
        src = f"set by {p.layer} ({p.source})" if p else "set by the plan (m3deploy/core/build.py)"
        if owner is None:
            problems.append(f"{where}: env {key} belongs to no engine this service runs ({', '.join(data) or 'none'})"
                            f" and no owner in FOREIGN_ENV; {src}")
        elif key not in data[owner]["env"]["names"]:
            problems.append(f"{where}: env {key} is not read by {owner} ({data[owner]['package']} "
                            f"{data[owner]['version']}); {src}")
    return problems


def plan_problems(plan) -> list[str]:
    return [p for hp in plan.hosts for svc in hp.services for p in service_problems(plan, svc)]
