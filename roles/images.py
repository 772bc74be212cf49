"""Container images: pull each image the host's services run (by digest when the plan pins one,
`name@sha256:...`), or, air-gapped, upload a `docker save` archive from the controller and
`docker load` it. Skips images already in the host's store.

Under Dynamo a GPU worker runs `python3 -m dynamo.<engine>` inside the engine's image: the plan names that
image `m3deploy/dynamo-<engine>:<version>-<hash of the base>` and its `base_image`. This role gets the base
image as above, ships the controller's ai-dynamo wheelhouse built for the container's Python and CPU
(m3deploy.controller.artifacts.Target: `m3_container_python`, default 3.12; the platform's arch) and builds the image
on the host with `docker build --network none` — offline, as the GB200 lane's `pip install ai-dynamo`.

Reads host_plan().services[].image / .base_image, cluster_plan().dynamo_version. Data keys:
- m3_image_pull: 'missing' (default) pulls only images the host lacks; 'always' pulls every tag on every deploy
  (a digest reference is immutable and never re-pulled), so a moved `:nightly` is noticed; the deploy record
  (roles/record.py) then holds the digest each container runs.
- m3_image_archive_dir: a controller directory holding `<image as file name>.tar` (made by
  `m3deploy save-images INVENTORY DIR`); when set, hosts never pull. An image the host has is loaded again when the
  archive holds another image id (a moved tag, a rebuilt stand-in image): the workers running it restart
  (`image_changed`, read by roles/workers.py), the others stay.
"""
from __future__ import annotations

import shlex
from io import StringIO
from pathlib import Path

from pyinfra import host
from pyinfra.api import deploy
from pyinfra.operations import files, server

from m3deploy import facts
from m3deploy.core.errors import M3Error
from roles import hostops

REMOTE_DIR = "/var/lib/m3/images"


from m3deploy.controller.images import archive_image_id, image_archive_name  # noqa: E402  (one rule for save and load)

DOCKERFILE = """# Built by m3deploy (roles/images.py): the engine image plus ai-dynamo {version}, offline.
FROM {base}
COPY . /tmp/m3-wheels/
RUN python3 -m pip install --no-index --find-links /tmp/m3-wheels -r /tmp/m3-wheels/REQUIREMENTS \\
 && python3 -m pip install --no-index --no-deps --find-links /tmp/m3-wheels ai-dynamo=={version} \\
 && python3 -c "import dynamo.{engine}" && rm -rf /tmp/m3-wheels
LABEL io.m3deploy.base-image="{base}" io.m3deploy.dynamo-version="{version}"
"""


_changed: dict[tuple[str, str], object] = {}  # (host, image) -> the op that pulled/loaded/built it on this run


def image_changed(image: str):
    """The op that put `image` on this host in this run (None: the host kept the image it had)."""
    return _changed.get((host.name, image))


def _archive(image: str, archive_dir) -> Path:
    tar = Path(archive_dir).expanduser() / image_archive_name(image)
    if not tar.is_file():
        raise M3Error(f"host {host.name}: image {image}: {tar} is missing on the controller "
                      f"(m3_image_archive_dir). Fix: m3deploy save-images INVENTORY {archive_dir}")
    return tar


def _get(image: str, archive_dir):
    """Pull `image`, or load it from the controller's `docker save` archive (air-gapped)."""
    if not archive_dir:
        return server.shell(name=f"Pull {image}", commands=[f"docker pull {shlex.quote(image)}"])
    tar = _archive(image, archive_dir)
    remote = f"{REMOTE_DIR}/{tar.name}"
    files.put(name=f"Upload {tar.name}", src=str(tar), dest=remote, mode="600", create_remote_dir=True)
    return server.shell(name=f"Load {image}", commands=[f"docker load -i {shlex.quote(remote)}",
                                                        f"rm -f {shlex.quote(remote)}"])


def _build(svc, version: str, archive_dir):
    """Build the plan's Dynamo worker image FROM its base image, offline, with the shipped wheels."""
    from m3deploy.controller import artifacts, prepare

    if not host.get_fact(facts.DockerImage, image=svc.base_image)["present"]:
        _get(svc.base_image, archive_dir)
    from m3deploy.deploy import context

    target = prepare.container_target(context.host_plan())  # the one prepare built before any host op
    local = artifacts.ensure_wheelhouse(version, target=target)
    remote = f"{REMOTE_DIR}/build-{svc.image.split(':', 1)[1]}"
    hostops.ship_wheelhouse(name=f"Ship the {target.abi} {target.arch} wheelhouse for {svc.image} (one archive, "
                                 f"checked against {artifacts.MANIFEST})",
                            archive=str(artifacts.wheelhouse_archive(local)), dest=remote, mode="0700")
    engine = svc.argv[2].split(".", 1)[1] if len(svc.argv) > 2 and svc.argv[2].startswith("dynamo.") else "vllm"
    files.put(name=f"Render {remote}/Dockerfile", dest=f"{remote}/Dockerfile", mode="0644",
              src=StringIO(DOCKERFILE.format(base=svc.base_image, version=version, engine=engine)))
    return server.shell(name=f"Build {svc.image} (offline, FROM {svc.base_image})", commands=[
        f"docker build --network none -t {shlex.quote(svc.image)} {shlex.quote(remote)}",
        f"rm -rf {shlex.quote(remote)}"])


@deploy("Container images")
def deploy_images():
    from m3deploy.deploy import context

    hp = context.host_plan()
    if hp.images is None:  # no container and no GPU on this host
        return
    archive_dir = hp.images.archive_dir
    built = {s.image: s for s in hp.services if s.image and s.base_image}
    always = hp.images.pull == "always" and not archive_dir
    for image in dict.fromkeys(s.image for s in hp.services if s.image):
        _changed.pop((host.name, image), None)  # only this run's op counts (several runs in one process: tests)
        pull = always and "@sha256:" not in image and image not in built
        have = host.get_fact(facts.DockerImage, image=image)
        if archive_dir and have["present"] and image not in built:  # the archive may hold a moved tag
            pull = archive_image_id(_archive(image, archive_dir)) != have["id"]
        if have["present"] and not pull:
            continue
        if image in built:
            _changed[(host.name, image)] = _build(built[image], context.cluster_plan().dynamo_version, archive_dir)
            continue
        op = _get(image, archive_dir)
        if archive_dir or not have["present"]:  # new here, or another id from the archive (an `always` pull of a
            _changed[(host.name, image)] = op   # tag cannot tell at plan time; the deploy record has its digest)
