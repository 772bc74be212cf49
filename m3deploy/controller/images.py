"""Air-gapped images: `m3deploy save-images INVENTORY DIR` pulls every image the plan runs (the engine images;
for Dynamo workers their base image, since the Dynamo image is built on the host) on the controller, once, and
`docker save`s each to DIR. Deploy with `--data m3_image_archive_dir=DIR`: hosts `docker load` instead of pulling.
Images m3deploy builds on the controller (`m3deploy/...`: the stand-in engine image, m3deploy.controller.simimage) are
never pulled, and are saved again when the archive holds another image id than the controller's (rebuilt).
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

from m3deploy.controller.cachelock import locked
from m3deploy.core.errors import M3Error


def image_archive_name(image: str) -> str:
    """"nvcr.io/nvidia/vllm:26.01@sha256:ab.." -> "nvcr.io_nvidia_vllm_26.01_sha256_ab...tar"."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", image) + ".tar"


def built_here(image: str) -> bool:
    """Images m3deploy builds on the controller (the stand-in engine image): no registry has them, never pulled."""
    return image.startswith("m3deploy/")


def archive_image_id(tar: Path) -> str:
    """The image id inside a `docker save` archive: its manifest.json's Config blob (`<hex>.json` in docker 20.10,
    `blobs/sha256/<hex>` in OCI-layout archives) is the image's config, whose sha256 the id is."""
    import json
    import tarfile

    try:
        with tarfile.open(tar) as t:
            manifest = json.load(t.extractfile("manifest.json"))
    except (OSError, KeyError, ValueError, tarfile.TarError):
        return ""
    config = manifest[0].get("Config", "") if manifest else ""
    return "sha256:" + Path(config).name.removesuffix(".json") if config else ""


def local_image_id(image: str) -> str:
    r = subprocess.run(["docker", "image", "inspect", "--format", "{{.Id}}", image], capture_output=True, text=True)
    return r.stdout.strip() if r.returncode == 0 else ""


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
            local = built_here(image)
            if tar.is_file() and not force and (not local or archive_image_id(tar) == local_image_id(image)):
                log(f"{tar.name}: already saved")
                out.append(tar)
                continue
            part = tar.with_name(f".{tar.name}.{os.getpid()}.part")
            pull = [] if local else [["docker", "pull", image]]
            for cmd in (*pull, ["docker", "save", image, "-o", str(part)]):
                log("$ " + " ".join(cmd))
                r = subprocess.run(cmd, capture_output=True, text=True)
                if r.returncode != 0:
                    part.unlink(missing_ok=True)
                    raise M3Error(f"{' '.join(cmd)} failed: {r.stderr.strip()[-500:]}")
            part.replace(tar)
        out.append(tar)
    return out
