"""What the controller must hold before any host's work starts, for one plan, and making it so once.

A deploy needs, on the controller (m3deploy.controller.artifacts, m3deploy.controller.mockmodel,
m3deploy.controller.images):
- the ai-dynamo wheelhouse for the hosts' Python (hosts running a native frontend or mocker worker);
- one wheelhouse per engine container's Python and CPU where a host builds a Dynamo worker image
  (`m3_container_python`, default 3.12; the platform's `arch` in the catalog);
- the mock model, when the engine is the mocker;
- `docker save` archives of the plan's images, when `m3_image_archive_dir` is set (made by `m3deploy
  save-images`, or by `m3deploy artifacts --images`).

deploy.py builds them once, before the per-host work (m3deploy.deploy.context.cluster_plan), and `m3deploy artifacts
INVENTORY` builds or checks (`--check`) the same list by hand.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from m3deploy.controller import artifacts
from m3deploy.core import catalog
from m3deploy.core.errors import M3Error
from m3deploy.core.simengine import SIM_IMAGE


@dataclass(frozen=True)
class Need:
    kind: str  # "wheelhouse" | "mock-model" | "tiny-model" | "sim-image" | "image-archive"
    label: str  # what a person reads
    hosts: tuple[str, ...]  # which hosts need it
    version: str = ""
    target: artifacts.Target = artifacts.HOSTS
    served_name: str = ""
    image: str = ""
    archive_dir: str = ""
    rootfs: str = ""
    venv: str = ""


def container_target(hp, platforms=None) -> artifacts.Target:
    """The Python and CPU of a host's engine container, for which its Dynamo worker image's wheelhouse is built
    (the plan's images.container_python; the platform's `arch` in the catalog). roles/images.py reads the same
    answer."""
    if platforms is None:
        platforms = catalog.catalog()["platforms"]
    return artifacts.Target.container(hp.images.container_python,
                                      platforms.get(hp.platform, {}).get("arch", "x86_64"))


def needs(plan) -> list[Need]:
    """Every controller artifact a deploy of `plan` reads, in build order (nothing for a teardown)."""
    if plan.state == "absent":
        return []
    platforms = catalog.catalog()["platforms"]
    wheel: dict[artifacts.Target, list[str]] = {}
    archives: dict[tuple[str, str], list[str]] = {}
    mocker: list[str] = []
    tiny: list[str] = []
    sim: dict[tuple[str, str], list[str]] = {}
    for h in plan.hosts:
        for s in h.services:
            if s.kind in ("frontend", "worker") and not s.image:
                wheel.setdefault(artifacts.host_target(plan, h), []).append(h.name)
            if s.kind == "worker" and plan.engine == "mocker":
                mocker.append(h.name)
            if s.kind == "worker" and catalog.cpu_build(plan.engine, h.platform):
                tiny.append(h.name)
            if s.image and s.image.startswith(SIM_IMAGE + ":"):
                sim.setdefault((s.image, h.images.sim_rootfs), []).append(h.name)
            if s.image and s.base_image:
                target = container_target(h, platforms)
                wheel.setdefault(target, []).append(h.name)
            if s.image and h.images.archive_dir:
                archives.setdefault((s.base_image or s.image, h.images.archive_dir), []).append(h.name)
    out = []
    for target, hosts in wheel.items():
        if not plan.dynamo_version:
            raise M3Error(f"hosts {sorted(set(hosts))} run Dynamo but the plan has no dynamo_version "
                          "(set m3_dynamo_version)")
        where = ("hosts" if target == artifacts.HOSTS else "the planner's host" if target.extra
                 else f"hosts, with {', '.join(target.engine)}" if target.engine else "engine containers")
        out.append(Need("wheelhouse", f"ai-dynamo=={plan.dynamo_version} wheelhouse for the {where} "
                        f"({target.abi}, {target.arch})", tuple(dict.fromkeys(hosts)),
                        version=plan.dynamo_version, target=target))
    if mocker:
        from m3deploy.controller import mockmodel

        name = plan.served_model_name or mockmodel.NAME
        out.append(Need("mock-model", f"mock model {name!r} (tokenizer only)", tuple(dict.fromkeys(mocker)),
                        served_name=name))
    if tiny:
        from m3deploy.controller import tinymodel

        name = plan.served_model_name or tinymodel.NAME
        out.append(Need("tiny-model", f"tiny model {name!r} (random weights, for {plan.engine}'s CPU build)",
                        tuple(dict.fromkeys(tiny)), served_name=name))
    for (image, rootfs), hosts in sim.items():
        out.append(Need("sim-image", f"stand-in engine image {image} (docker, on the controller)",
                        tuple(dict.fromkeys(hosts)), version=plan.dynamo_version, image=image, rootfs=rootfs,
                        venv=plan.venv))
    for (image, archive_dir), hosts in archives.items():
        out.append(Need("image-archive", f"docker save archive of {image}", tuple(dict.fromkeys(hosts)),
                        image=image, archive_dir=archive_dir))
    return out


def _archive(need: Need) -> Path:
    from m3deploy.controller.images import image_archive_name

    return Path(need.archive_dir).expanduser() / image_archive_name(need.image)


def check(need: Need) -> tuple[Path | None, list[str]]:
    """(where it is, problems): verifies without building anything."""
    if need.kind == "wheelhouse":
        cur = artifacts.current_wheelhouse(need.version, need.target)
        if cur is None:
            return None, [f"{artifacts.wheelhouse_dir(need.version, need.target)}: not built"]
        return cur, artifacts.verify_wheelhouse(cur)
    if need.kind == "mock-model":
        from m3deploy.controller import mockmodel

        d = mockmodel.cached_model_dir(need.served_name)
        return d, ([] if d else ["not built"])
    if need.kind == "tiny-model":
        from m3deploy.controller import tinymodel

        d = tinymodel.cached_model_dir(need.served_name)
        return d, ([] if d else ["not built"])
    if need.kind == "sim-image":
        from m3deploy.controller import simimage

        ok = simimage.is_current(need.image, need.rootfs, need.version, need.venv)
        return None, ([] if ok else [f"{need.image}: not built from its current inputs"])
    tar = _archive(need)
    return tar, ([] if tar.is_file() else [f"{tar}: missing (m3deploy save-images INVENTORY {need.archive_dir})"])


def ensure(need: Need, log=None, source: str | None = None, save_images: bool = False) -> Path:
    """Build `need` if it is not already there and verified (once, under its lock); return where it is."""
    if need.kind == "wheelhouse":
        return artifacts.ensure_wheelhouse(need.version, target=need.target, log=log, source=source)
    if need.kind == "mock-model":
        from m3deploy.controller import mockmodel

        return mockmodel.ensure_model_dir(need.served_name)
    if need.kind == "tiny-model":
        from m3deploy.controller import tinymodel

        return tinymodel.ensure_model_dir(need.served_name)
    if need.kind == "sim-image":
        from m3deploy.controller import simimage

        simimage.ensure(need.image, need.rootfs, need.version, need.venv, log=log)
        return Path(need.rootfs)
    tar = _archive(need)
    if need.image.startswith(SIM_IMAGE + ":"):  # built here (the sim-image need, before): saved again when rebuilt
        from m3deploy.controller import images

        images.save([need.image], tar.parent, log=log or (lambda m: None))
    if not tar.is_file():
        if not save_images:
            raise M3Error(f"hosts {list(need.hosts)}: image {need.image}: {tar} is missing on the controller "
                          f"(m3_image_archive_dir). Fix: m3deploy save-images INVENTORY {need.archive_dir}")
        from m3deploy.controller import images

        images.save([need.image], tar.parent, log=log or (lambda m: None))
    return tar


def ensure_all(plan, log=None) -> dict[Need, Path]:
    """What deploy.py runs once before any host's operations."""
    return {n: ensure(n, log=log) for n in needs(plan)}
