"""The commands the plan gives the real images, checked against what those images declare.

Sources (read from the projects' own Dockerfiles; docs/CONTRACTS.md lists them):
- vllm-project/vllm docker/Dockerfile, final stage `FROM vllm-openai-base AS vllm-openai`:
  `ENTRYPOINT ["vllm", "serve"]` (older releases: `["python3", "-m", "vllm.entrypoints.openai.api_server"]`);
  vllm/vllm-openai-rocm is built the same way. An image built FROM one of them (our Dynamo worker image,
  roles/images.py) inherits it. Arguments after the image are appended to the ENTRYPOINT, so
  `docker run IMAGE vllm serve M` runs `vllm serve vllm serve M`: "unrecognized arguments".
- sgl-project/sglang docker/Dockerfile and NVIDIA/TensorRT-LLM docker/Dockerfile.multi (stage `release`) declare
  no ENTRYPOINT and inherit their CUDA / NGC PyTorch base's `/opt/nvidia/nvidia_entrypoint.sh`.
- Docker: `--entrypoint` replaces the image's ENTRYPOINT and clears its CMD; the arguments after the image
  become the entrypoint's arguments.

So every container the plan starts names its program with `--entrypoint`, and what follows the image is exactly
the rest of the plan's argv.
"""
from __future__ import annotations

import json

import pytest

from m3deploy.check.preflight import nccl_command
from m3deploy.cli import load_plan, pretty_service
from m3deploy.core import catalog
from tests.unit.test_plan_snapshots import CASES, ROOT, VARIANTS, _testbed_state  # noqa: F401 (fixture)


def _plan(inventory: str, variant: str):
    return load_plan(str(ROOT / "inventories" / f"{inventory}.py"),
                     [f"{k}={json.dumps(v)}" for k, v in VARIANTS[variant].items()], facts=False)


def _containers(plan):
    return [s for h in plan.hosts for s in h.services if s.image]


VALID = []
for _inv, _var in CASES:
    try:
        _p = _plan(_inv, _var)
    except Exception:  # rejected variants are covered by the plan snapshots
        continue
    if _containers(_p):
        VALID.append((_inv, _var))


def test_every_engine_declares_its_image_contract():
    for engine, rules in catalog.engines().items():
        if engine != "mocker":
            assert rules.get("image_entrypoint"), f"engines.yaml: {engine} has no image_entrypoint"


@pytest.mark.parametrize("inventory,variant", VALID, ids=[f"{i}{'--' + v if v else ''}" for i, v in VALID])
def test_container_workers_name_their_entrypoint(inventory, variant):
    plan = _plan(inventory, variant)
    image_ep = catalog.engines()[plan.engine]["image_entrypoint"]
    for s in _containers(plan):
        cmd = list(s.command)
        assert cmd[:2] == ["docker", "run"]
        at = cmd.index(s.image)
        assert cmd[at - 2:at] == ["--entrypoint", s.argv[0]], (s.host, s.name, cmd)
        after = cmd[at + 1:]
        assert [s.argv[0], *after] == list(s.argv), "the container runs exactly the plan's argv"
        assert after[:len(image_ep)] != image_ep and after[:1] != [s.argv[0]], (
            f"{s.host}/{s.name}: argv after the image repeats the entrypoint: {after[:3]}")
        assert s.entrypoint == s.argv[0]
        # what `m3deploy plan` prints is the same command
        printed = pretty_service(s).replace("\\\n", " ").split()
        assert printed[printed.index("--entrypoint") + 1] == s.argv[0]


def test_vllm_plan_runs_serve_once():
    plan = _plan("b200", "")
    s = next(s for s in _containers(plan) if s.kind == "worker")
    cmd = list(s.command)
    after = cmd[cmd.index(s.image) + 1:]
    assert cmd[cmd.index(s.image) - 1] == "vllm" and after[0] == "serve" and after.count("serve") == 1
    assert plan.to_dict()["hosts"][s.host]["services"][0]["command"] == cmd


def test_nccl_preflight_container_names_its_entrypoint():
    image = "vllm/vllm-openai@sha256:" + "a" * 64
    cmd = nccl_command(8, image)
    docker = cmd[cmd.index("docker run"):]
    assert f"--entrypoint python3 {image} -m torch.distributed.run" in docker

