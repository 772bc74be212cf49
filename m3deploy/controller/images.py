"""Air-gapped images: `m3deploy save-images INVENTORY DIR` pulls every image the plan runs (the engine images;
for Dynamo workers their base image, since the Dynamo image is built on the host) on the controller, once, and
`docker save`s each to DIR. Deploy with `--data m3_image_archive_dir=DIR`: hosts `docker load` instead of pulling.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from m3deploy.controller.cachelock import locked
from m3deploy.core.errors import M3Error


def image_archive_name(image: str) -> str:
    """"nvcr.io/nvidia/vllm:26.01@sha256:ab.." -> "nvcr.io_nvidia_vllm_26.01_sha256_ab...tar"."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", image) + ".tar"


def images_to_save(plan) -> list[str]:
    """What hosts would pull: each service's image, or its base image when the host builds it."""
    return list(dict.fromkeys(s.base_image or s.image for h in plan.hosts for s in h.services if s.image))


def save(images: list[str], directory: Path, force: bool = False, log=print) -> list[Path]:
    if not shutil.which("docker"):
        raise M3Error("save-images needs the docker CLI on this machine (the controller). Fix: install Docker, "
                      "or run `docker pull IMAGE && docker save IMAGE -o DIR/<name>.tar` where Docker runs")
    directory.mkdir(parents=True, exist_ok=True)
    out = []
    for image in images:
        tar = directory / image_archive_name(image)
        with locked(tar, f"the archive of {image}", log=log):  # one saver per archive; readers see whole files
            if tar.is_file() and not force:
                log(f"{tar.name}: already saved")
                out.append(tar)
                continue
            part = tar.with_name(f".{tar.name}.{os.getpid()}.part")
            for cmd in (["docker", "pull", image], ["docker", "save", image, "-o", str(part)]):
                log("$ " + " ".join(cmd))
                r = subprocess.run(cmd, capture_output=True, text=True)
                if r.returncode != 0:
                    part.unlink(missing_ok=True)
                    raise M3Error(f"{' '.join(cmd)} failed: {r.stderr.strip()[-500:]}")
            part.replace(tar)
        out.append(tar)
    return out
