"""The stand-in engine image for `m3_runtime=docker` (mocker workers in containers, as GPU workers run):
built on the controller with docker, once per set of inputs, under the cache lock.

Inputs (their digest is the image's label `io.m3deploy.inputs`; a changed input rebuilds the image under the same
tag, so hosts see a new image id, as when a vendor moves a tag):
- the base root filesystem, `m3_sim_image_rootfs` (inventories/testbed.py: the testbed's debootstrap image,
  m3deploy/testbed/image.py), `docker import`ed as `m3deploy/sim-rootfs:<digest>`;
- the hosts' ai-dynamo wheelhouse (m3deploy.controller.artifacts), installed into the venv at the plan's path,
  offline (`docker build --network none`);
- files/m3-sim-engine.py (the mocker / scripted engine) at m3deploy.core.simengine.SIM_ENGINE.

It declares `ENTRYPOINT ["vllm", "serve"]` and `WORKDIR /vllm-workspace` as vllm/vllm-openai does
(vllm-project/vllm docker/Dockerfile, stage vllm-openai; docs/CONTRACTS.md) and has no `vllm`: a container started
without the plan's `--entrypoint` fails here as it would on a GPU host.
"""
from __future__ import annotations

import hashlib
import os
import shlex
import shutil
import subprocess
import tempfile
from pathlib import Path

from m3deploy.controller import artifacts
from m3deploy.controller.cachelock import locked
from m3deploy.core.errors import M3Error
from m3deploy.core.simengine import SIM_ENGINE

REPO = Path(__file__).resolve().parents[2]
SIM_ENGINE_SRC = REPO / "files" / "m3-sim-engine.py"
LABEL = "io.m3deploy.inputs"
ENTRYPOINT = ("vllm", "serve")  # vllm/vllm-openai's

DOCKERFILE = """# Built by m3deploy (m3deploy/controller/simimage.py): the testbed's stand-in for an engine image.
FROM {base}
COPY wheels/ /tmp/m3-wheels/
RUN {install} && {venv}/bin/python -c 'import dynamo.frontend, dynamo.mocker' && rm -rf /tmp/m3-wheels
COPY m3-sim-engine.py {sim_engine}
WORKDIR /vllm-workspace
ENTRYPOINT {entrypoint}
LABEL {label}="{digest}" io.m3deploy.dynamo-version="{version}"
"""


def _docker(*args: str, check: bool = True, **kw) -> subprocess.CompletedProcess:
    if not shutil.which("docker"):
        raise M3Error("m3_runtime=docker builds the stand-in engine image with docker on the controller, and this "
                      "machine has no docker CLI. Fix: apt-get install docker.io and start dockerd (docs/TESTBED.md)")
    r = subprocess.run(["docker", *args], capture_output=True, text=True, **kw)
    if check and r.returncode != 0:
        raise M3Error(f"docker {' '.join(args[:3])} ... failed on the controller: {r.stderr.strip()[-600:]}. "
                      "Fix: is dockerd running and DOCKER_HOST right (docs/TESTBED.md)?")
    return r


def image_id(image: str) -> str:
    """The controller's image id of `image` ("" when it has none)."""
    r = _docker("image", "inspect", "--format", "{{.Id}}", image, check=False)
    return r.stdout.strip() if r.returncode == 0 else ""


def _label(image: str) -> str:
    r = _docker("image", "inspect", "--format", "{{index .Config.Labels \"%s\"}}" % LABEL, image, check=False)
    return r.stdout.strip() if r.returncode == 0 else ""


def _link_or_copy(src, dst):
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def _rootfs_digest(rootfs: Path) -> str:
    """The testbed image's directory is named by the hash of what it holds (suite, arch, package list)."""
    return hashlib.sha256(str(rootfs.resolve()).encode()).hexdigest()[:16]


def dockerfile(base: str, version: str, venv: str, wheelhouse: Path, digest: str) -> str:
    install = " && ".join(artifacts.install_commands(version, "/tmp/m3-wheels", venv,
                                                     requirements=artifacts.read_requirements(wheelhouse)))
    entry = "[" + ", ".join(f'"{w}"' for w in ENTRYPOINT) + "]"
    return DOCKERFILE.format(base=base, install=install, venv=shlex.quote(venv), sim_engine=SIM_ENGINE,
                             entrypoint=entry, label=LABEL, digest=digest, version=version)


def inputs_digest(rootfs: Path, wheelhouse: Path, version: str, venv: str) -> str:
    h = hashlib.sha256()
    for part in (_rootfs_digest(rootfs), artifacts.manifest_digest(wheelhouse),
                 artifacts.sha256_file(SIM_ENGINE_SRC), dockerfile("BASE", version, venv, wheelhouse, "")):
        h.update(part.encode() + b"\0")
    return h.hexdigest()[:16]


def is_current(image: str, rootfs: str, version: str, venv: str) -> bool:
    wheelhouse = artifacts.current_wheelhouse(version)
    return bool(wheelhouse and rootfs and _label(image) == inputs_digest(Path(rootfs), wheelhouse, version, venv))


def ensure(image: str, rootfs: str, version: str, venv: str, log=None) -> str:
    """Build `image` unless the controller has it built from these inputs; returns its image id."""
    say = log or (lambda m: None)
    root = Path(rootfs or "")
    if not rootfs or not (root / "usr/bin/python3").exists():
        raise M3Error(f"m3_runtime=docker: m3_sim_image_rootfs={rootfs!r} is no root filesystem with python3. "
                      "Fix: inventories/testbed.py sets it from the testbed's state (`m3deploy testbed up N --docker`)")
    wheelhouse = artifacts.ensure_wheelhouse(version, log=log)
    digest = inputs_digest(root, wheelhouse, version, venv)
    if _label(image) == digest:
        return image_id(image)
    cache = artifacts.cache_root() / "sim-image"
    with locked(cache / digest, f"the stand-in engine image {image}", log=log):
        if _label(image) == digest:  # another process built it meanwhile
            return image_id(image)
        base = f"m3deploy/sim-rootfs:{_rootfs_digest(root)}"
        if not image_id(base):
            say(f"docker import {root} as {base}")
            tar = subprocess.Popen(["tar", "-C", str(root), "--numeric-owner", "-c", "."], stdout=subprocess.PIPE)
            _docker("import", "-", base, stdin=tar.stdout)
            if tar.wait() != 0:
                raise M3Error(f"tar of {root} failed (exit {tar.returncode})")
        cache.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=cache, prefix=".build-") as ctx:
            shutil.copytree(wheelhouse, Path(ctx) / "wheels", copy_function=_link_or_copy)
            shutil.copy(SIM_ENGINE_SRC, Path(ctx) / "m3-sim-engine.py")
            (Path(ctx) / "Dockerfile").write_text(dockerfile(base, version, venv, wheelhouse, digest))
            say(f"docker build {image} (inputs {digest}, offline)")
            _docker("build", "--network", "none", "-t", image, ctx)
    return image_id(image)
