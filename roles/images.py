"""Container images: pull each image the host's services run (by digest when the plan pins one,
`name@sha256:...`), or, air-gapped, upload a `docker save` archive from the controller and
`docker load` it. Skips images already in the host's store.

Reads host_plan().services[].image. Data keys:
- m3_image_archive_dir: a controller directory holding `<image as file name>.tar` (made with
  `docker save IMAGE -o DIR/<name>.tar`; see `image_archive_name()`); when set, hosts never pull.
"""
from __future__ import annotations

import re
import shlex
from pathlib import Path

from pyinfra import host
from pyinfra.api import deploy
from pyinfra.operations import files, server

from m3deploy import facts as F
from m3deploy.errors import M3Error

REMOTE_DIR = "/var/lib/m3/images"


def image_archive_name(image: str) -> str:
    """"nvcr.io/nvidia/vllm:26.01@sha256:ab.." -> "nvcr.io_nvidia_vllm_26.01_sha256_ab...tar"."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", image) + ".tar"


@deploy("Container images")
def deploy_images():
    from m3deploy import context

    hp = context.host_plan()
    archive_dir = host.data.get("m3_image_archive_dir")
    for image in dict.fromkeys(s.image for s in hp.services if s.image):
        if host.get_fact(F.DockerImage, image=image)["present"]:
            continue
        if not archive_dir:
            server.shell(name=f"Pull {image}", commands=[f"docker pull {shlex.quote(image)}"])
            continue
        tar = Path(archive_dir).expanduser() / image_archive_name(image)
        if not tar.is_file():
            raise M3Error(f"host {host.name}: image {image}: {tar} is missing on the controller "
                          f"(m3_image_archive_dir). Fix: docker pull {image} && docker save {image} -o {tar}")
        remote = f"{REMOTE_DIR}/{tar.name}"
        files.put(name=f"Upload {tar.name}", src=str(tar), dest=remote, mode="600", create_remote_dir=True)
        server.shell(name=f"Load {image}", commands=[f"docker load -i {shlex.quote(remote)}",
                                                     f"rm -f {shlex.quote(remote)}"])
