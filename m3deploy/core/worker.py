"""One worker rank's service, built once from its inputs (m3deploy.core.build lays the ranks out): the recipe
layers, the user's overrides, the container image, the endpoints, multi-host flags, the launch line, the docker
flags, and what the features decide for it — its pool (m3_disagg), its place in an MPI world (m3deploy.core.mpi),
standby and the mocker's profile (m3_planner), TLS (m3_internal_tls). No feature edits a built worker: each is an
input read here, and every value keeps its provenance (`m3deploy plan --explain`).
"""
from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, replace
from typing import Any, Mapping

import yaml

from m3deploy.core import catalog, control, disagg, layout, mpi, planner, recipes, settings, simengine
from m3deploy.core import generation as gen
from m3deploy.core.inputs import url_host
from m3deploy.core.inventory import InvHost
from m3deploy.core.model import Port, Provenance, Readiness, Service
from m3deploy.core.provenance import launch_provenance, provenance

# m3_api_key_file's key: not generated but read from that controller file (m3deploy.controller.secrets.api_key)
API_KEY_SECRET = "api-key"
CLUSTER_LAYER, PLAN_SOURCE = "cluster", "m3deploy/core/worker.py"  # provenance: a cluster setting; the plan itself
ENGINES_SOURCE = "m3deploy/core/data/engines.yaml"
# the setting behind each env value the plan sets for a worker (provenance), beside the Dynamo clients' shared ones
PLAN_ENV_SETTINGS = {"NCCL_SOCKET_IFNAME": "m3_interface", "GLOO_SOCKET_IFNAME": "m3_interface",
                     "DYN_SYSTEM_PORT": "m3_system_port", **control.ADDRESS_ENV}


@dataclass(frozen=True)
class Rank:
    """One rank of one worker on one host, and what the features decided for it."""

    idx: int  # worker index
    rank: int
    nnodes: int
    slot: int  # the rank's slot on its host (ports, unit name)
    host: InvHost
    address: str
    master: str  # rank 0's address
    rank0_host: str
    devices: tuple[int, ...]
    world: tuple[tuple[str, str, int], ...] = ()  # every rank's (host, address, GPUs), rank order
    after: tuple[str, ...] = ()  # rank 0: the first frontend ("host/service"), when the cluster has one
    standby: bool = False  # m3_planner: a standby host's worker (installed, never started by the deploy)


def service(c: Any, rk: Rank) -> Service:
    """One worker rank's service, in named steps: recipe layers, the user's overrides, the container image, the
    endpoints (ports, readiness, plan env), multi-host flags, the launch line, the docker flags; then its place in
    an MPI world, the planner's inputs and TLS."""
    base, r = draft(c, rk)
    rules = catalog.engine_rules(c.s["m3_engine"], str(settings.get(rk.host.data, "m3_platform")))
    world = mpi.spec(rules, c.s["m3_serving"]) if len(rk.world) > 1 else None
    if world and rk.rank > 0:  # an MPI follower: an sshd in the worker's image, no Dynamo client
        return replace(mpi.follower(base, world, _mpi_port(world, rk), rk.address, rk.master), standby=rk.standby)
    svc = mpi.launcher(base, world, _mpi_port(world, rk), [(a, n) for _, a, n in rk.world],
                       [f"{h}/{base.name}" for h, _, _ in rk.world[1:]]) if world else base
    return _with_features(c, rk, svc)


def _mpi_port(world: Mapping[str, Any], rk: Rank) -> int:
    return int(world["ssh_port"]) + rk.slot


def _with_features(c: Any, rk: Rank, svc: Service) -> Service:
    """The planner's (standby, the mocker's profile) and m3_internal_tls's parts of a worker, the first frontend
    it starts after."""
    prof = c.planner_profile
    argv = svc.argv + (("--planner-profile-data", planner.PROFILE_DIR) if prof else ())
    prov = svc.provenance + ((Provenance("--planner-profile-data", planner.PROFILE_DIR, "feature:m3_planner",
                                         "m3deploy/core/planner.py", c.note("m3_planner")),) if prof else ())
    dynamo = c.s["m3_serving"] == "dynamo"
    tls = control.client_tls(c.client, svc.name, svc.host, svc.image) if dynamo else control.ClientTLS()
    return replace(svc, argv=argv, env=svc.env + tls.env, docker_args=svc.docker_args + tls.docker,
                   files=svc.files + prof, secret_files=svc.secret_files + tls.files, launcher=tls.launcher,
                   tls=bool(tls.launcher), standby=rk.standby, after=tuple(dict.fromkeys(svc.after + rk.after)),
                   provenance=prov + tls.provenance)


def draft(c: Any, rk: Rank) -> tuple[Service, recipes.Resolved]:
    """The rank's service before the features that wrap it (an MPI world, the planner, TLS), and its resolved
    recipe (the scripted engine takes its parsers from it)."""
    s, engine, serving = c.s, c.s["m3_engine"], c.s["m3_serving"]
    info = catalog.platform(str(settings.get(rk.host.data, "m3_platform")))
    rules = catalog.engine_rules(engine, str(settings.get(rk.host.data, "m3_platform")))
    ports = {"kv": int(s["m3_kv_events_port"]) + rk.slot, "system": int(s["m3_system_port"]) + rk.slot,
             "http": int(s["m3_worker_port"]) + rk.slot}
    r = recipes.resolve(_worker_ctx(c, rk, info, ports["kv"]), target="worker", sources=_placeholders(c, rk))
    fill = {"model_id": c.model_id, "served": c.served, "model_dir": c.model_dir, "venv": c.venv,
            "address": rk.address, "http_port": ports["http"], "nnodes": rk.nnodes, "rank": rk.rank,
            "master": rk.master, "master_url_host": url_host(rk.master), "master_port": s["m3_master_port"]}
    _user_overrides(c, rk, r, rules, fill)
    timeout = int(s["m3_readiness_timeout_s"] or r.readiness_timeout_s)
    if rules.get("readiness_extra_s"):
        timeout += int(s[rules["readiness_extra_s"]] or 0)
    # a simulated engine runs in the stand-in engine image with m3_runtime=docker (m3_image overrides it), else
    # natively
    sim_image = bool(rules.get("simulated")) and s["m3_runtime"] == "docker"
    image = (r.image or simengine.sim_image(str(s["m3_dynamo_version"]))) if sim_image else \
        (None if rules.get("simulated") else r.image)
    svc_ports, readiness = _worker_endpoints(c, rk, r, rules, info, ports, image, timeout)
    svc_ports, readiness = _multi_host(rk, r, rules, fill, svc_ports, readiness, timeout)
    svc_ports += disagg.ports(r.args, r.env, rk.address, rules, c.size)  # m3_disagg: KV-transfer ports
    head = _launch_line(c, r, rules, fill)
    docker = _docker_args(c, rk, r, info) if image else []
    files = _engine_files(c, rk, r, rules, docker if image else None)
    image, base_image = _dynamo_image(c, rules, image, sim_image)
    name = f"m3-worker@{rk.slot}"
    # the engine's own HTTP server checks the key (rank 0 serves; headless ranks have no API server)
    api_key_env = ((rules["api_key_env"], API_KEY_SECRET),) if (
        serving != "dynamo" and rk.rank == 0 and s["m3_api_key_file"] and rules.get("api_key_env")) else ()
    return Service(
        name=name, kind="worker", host=rk.host.name, argv=head + tuple(r.argv()), env=tuple(r.env.items()),
        secret_env=(control.dynamo_secret_env(c.client) if serving == "dynamo" else ()) + api_key_env,
        image=image, base_image=base_image, docker_args=tuple(docker), ports=tuple(svc_ports), readiness=readiness,
        after=((f"{rk.rank0_host}/{name}",) if rk.rank > 0 else ()),  # whole hosts: same slot
        env_file=f"/etc/m3/{name}.env", workdir="" if image else f"{c.home}/{name}",  # a native process: its own
        worker=rk.idx, rank=rk.rank, nnodes=rk.nnodes,
        devices=rk.devices if info["vendor"] in ("nvidia", "amd") else (),
        provenance=r.provenance_records() + launch_provenance(head, "plan:launch", ENGINES_SOURCE,
                                                                      c.note("m3_engine")),
        files=files, pool=c.pool), r


def _placeholders(c: Any, rk: Rank) -> dict[str, str]:
    """The setting behind each `{placeholder}` the worker layers read (provenance)."""
    par = c.note(f"m3_disagg.{c.pool}.parallel") if c.pool and disagg.pool_settings(c.s, c.pool).get("parallel") \
        else c.note("m3_parallel")
    addr = c.note("m3_address", rk.host.name)
    return {"tp": par, "dp": par, "parallel": par, "address": addr, "address_url_host": addr,
            "kv_events_port": c.note("m3_kv_events_port") + (f" + slot {rk.slot}" if rk.slot else ""),
            "max_model_len": c.note("m3_max_model_len"), "max_num_seqs": c.note("m3_max_num_seqs"),
            "mocker_speedup_ratio": c.note("m3_mocker_speedup_ratio"),
            "cudagraph_capture_sizes": c.note("m3_cudagraph_capture_sizes") + " with 256, 512, 1024, 2048",
            **dict.fromkeys(("disagg", "bootstrap_port", "nixl_side_channel_port", "kv_transfer_bandwidth",
                             "kv_bytes_per_token"), c.note("m3_disagg") if c.pool else "")}


def scripted(c: Any, rk: Rank, port: int) -> Service:
    """The scripted tool-call engine beside worker 0 (its draft: same env and parsers), a Dynamo client itself."""
    base, r = draft(c, rk)
    svc = simengine.scripted_service(base, r.args, port, c.model_id if base.image else c.model_dir, c.served,
                                     c.home)
    tls = control.client_tls(c.client, svc.name, svc.host, svc.image)
    return replace(svc, env=svc.env + tls.env, docker_args=svc.docker_args + tls.docker,
                   secret_files=svc.secret_files + tls.files, launcher=tls.launcher, tls=bool(tls.launcher),
                   after=rk.after, pool="", provenance=_scripted_provenance(base, svc) + tls.provenance)


def _scripted_provenance(worker0: Service, svc: Service) -> tuple[Provenance, ...]:
    """The scripted engine's flags are its own; its env is worker 0's (their records), less what it sets itself."""
    source = "m3deploy/core/simengine.py"
    env_of = {p.key: p for p in worker0.provenance if p.key.startswith("env:")}
    env = [env_of.get(f"env:{k}") if env_of.get(f"env:{k}") and env_of[f"env:{k}"].value == v else
           Provenance(f"env:{k}", v, "plan:scripted", source) for k, v in svc.env]
    return (launch_provenance(svc.argv[:3], "plan:scripted", source) + provenance(svc.argv, (), "plan:scripted", source)
            + tuple(env))


def _worker_ctx(c: Any, rk: Rank, info: Mapping[str, Any], kv_port: int) -> dict[str, Any]:
    """What the recipe layers' `when:` and `{placeholders}` read for this rank."""
    s = c.s
    sizes = sorted(set(int(x) for x in s["m3_cudagraph_capture_sizes"]) | {256, 512, 1024, 2048})
    return {
        **catalog.model_constants(s["m3_engine"]), "engine": s["m3_engine"], "serving": s["m3_serving"],
        "runtime": s["m3_runtime"], "vendor": info["vendor"], "generation": info["generation"],
        "platform": str(settings.get(rk.host.data, "m3_platform")), "variant": s["m3_variant"],
        "parallel": str(s["m3_parallel"]), "ep": c.ep, "dp_mode": c.mode == "dp", "multi_host": rk.nnodes > 1,
        "features": c.features, "tp": c.size, "dp": c.size, "address": rk.address,
        "address_url_host": url_host(rk.address), "kv_events_port": kv_port,
        "device_ids": ",".join(str(d) for d in rk.devices), "max_model_len": s["m3_max_model_len"],
        "max_num_seqs": s["m3_max_num_seqs"], "mocker_speedup_ratio": s["m3_mocker_speedup_ratio"],
        "cudagraph_capture_sizes": json.dumps(sizes, separators=(",", ":")),
        **disagg.ctx(s, c.pool, rk.slot, c.size)}


def _user_overrides(c: Any, rk: Rank, r: recipes.Resolved, rules: Mapping[str, Any], fill: dict) -> None:
    """The cluster's settings over the layers: the last layer (m3_image, the context cap, the mocker's flags,
    m3_unset_args, m3_extra_args, the host's m3_rdma_env, m3_extra_env). Each value's source is the file (or
    `--data`) the setting was read from."""
    s, where = c.s, c.where
    if s["m3_image"]:
        r.image = s["m3_image"]
        r.provenance["image"] = (r.image, f"{CLUSTER_LAYER}:m3_image", where("m3_image"))
    if s["m3_max_model_len"]:
        r.set_arg(catalog.by_serving(rules["max_model_len"], s["m3_serving"]), str(s["m3_max_model_len"]),
                  f"{CLUSTER_LAYER}:m3_max_model_len", where("m3_max_model_len"))
    if rules.get("simulated") and s["m3_runtime"] == "docker":  # the staged mock repos, named as a GPU worker's
        fill["model_dir"] = c.model_id
        r.set_arg("--speculative-config", simengine.draft_config(), "plan:sim-docker", PLAN_SOURCE,
                  c.note("m3_runtime"))
    for key, flag in (rules.get("settings_args") or {}).items():
        if s[key]:
            r.set_arg(flag, str(s[key]), f"{CLUSTER_LAYER}:{key}", where(key))
    for key in s["m3_unset_args"] or ():
        r.unset(str(key), f"{CLUSTER_LAYER}:m3_unset_args", where("m3_unset_args"))
    for flag, value in recipes.parse_arg_list(s["m3_extra_args"] or []):
        r.set_arg(flag, value, f"{CLUSTER_LAYER}:m3_extra_args", where("m3_extra_args"))
    for k, v in dict(rk.host.data.get("m3_rdma_env") or {}).items():
        r.set_env(k, v, f"{CLUSTER_LAYER}:m3_rdma_env", where("m3_rdma_env", rk.host.name))
    if c.generation and c.generation.suffix:  # its generation's namespace, dynamo-<id> (core/generation.py)
        r.set_env(gen.SUFFIX_ENV, c.generation.suffix, "plan:generation", "m3deploy/core/generation.py",
                  ", ".join(c.generation.sources()))
    for k, v in (s["m3_extra_env"] or {}).items():
        r.set_env(k, v, f"{CLUSTER_LAYER}:m3_extra_env", where("m3_extra_env"))
    disagg.overrides(r, s, c.pool, recipes.parse_arg_list, where("m3_disagg"))  # m3_disagg's pool: over the cluster's


def _worker_endpoints(c: Any, rk: Rank, r: recipes.Resolved, rules: Mapping[str, Any],
                      info: Mapping[str, Any], ports: Mapping[str, int], image: str | None,
                      timeout: int) -> tuple[list[Port], Readiness]:
    """The rank's ports and readiness (Dynamo: its system port; standalone: its HTTP port), and the env the plan
    sets where neither a layer nor the user did (Dynamo's, HF offline, the multi-host socket interface, AMD's
    device list)."""
    s, host, address = c.s, rk.host, rk.address
    plan_env: list[tuple[str, str]] = []
    if s["m3_serving"] == "dynamo":
        whome = "/root" if image else f"{c.home}/m3-worker@{rk.slot}"  # a native process: its own HOME
        plan_env += control.dynamo_env(address, c.client, whome)
        plan_env += [("DYN_SYSTEM_PORT", str(ports["system"])),
                     ("DYN_SYSTEM_USE_ENDPOINT_HEALTH_STATUS", '["generate"]')]
        out = [Port("system", ports["system"], address, key="m3_system_port")]
        if rules.get("kv_events"):
            out.append(Port("kv-events", ports["kv"], "0.0.0.0" if rules.get("kv_events_binds_all") else address,
                            key="m3_kv_events_port"))
        health = ports["system"]
    else:
        out, health = [Port("http", ports["http"], address, key="m3_worker_port")], ports["http"]
        if not image:  # a native engine (a CPU build): its own writable HOME, as a native Dynamo process has
            plan_env.append(("HOME", f"{c.home}/m3-worker@{rk.slot}"))
    readiness = Readiness(kind="http", url=f"http://{url_host(address)}:{health}/health", timeout_s=timeout)
    plan_env.append(("HF_HUB_OFFLINE", "1"))
    if not rules.get("simulated"):  # GPU env
        if rk.nnodes > 1 and host.data.get("m3_interface"):
            plan_env += [("NCCL_SOCKET_IFNAME", str(host.data["m3_interface"])),
                         ("GLOO_SOCKET_IFNAME", str(host.data["m3_interface"]))]
        if info["vendor"] == "amd" and len(rk.devices) < layout.gpus_per_host(host.data):
            plan_env.append(("HIP_VISIBLE_DEVICES", ",".join(map(str, rk.devices))))
    for k, v in plan_env:
        if k not in r.env:
            note = c.client.notes.get(k) or c.note(PLAN_ENV_SETTINGS.get(k, ""), host.name)
            r.set_env(k, v, "plan", PLAN_SOURCE, note)
    return out, readiness


def _multi_host(rk: Rank, r: recipes.Resolved, rules: Mapping[str, Any], fill: Mapping[str, Any],
                ports: list[Port], readiness: Readiness, timeout: int) -> tuple[list[Port], Readiness]:
    """Multi-host ranks: engines.yaml's `multi_host` flags; ranks > 0 are headless, with process-alive readiness
    and without the ports engines.yaml's `followers_without` names (rank 0 starts first)."""
    if rk.nnodes <= 1:
        return ports, readiness
    multi = rules.get("multi_host") or {}
    for flag, value in {**multi.get("all", {}), **(multi.get("followers", {}) if rk.rank > 0 else {})}.items():
        r.set_arg(flag, _fill(value, fill), "plan:multi-host", PLAN_SOURCE)
    if rk.rank > 0:
        readiness = Readiness(kind="process", timeout_s=timeout)
        ports = [p for p in ports if p.name not in rules.get("followers_without", ())]
    return ports, readiness


def _launch_line(c: Any, r: recipes.Resolved, rules: Mapping[str, Any], fill: Mapping[str, Any]) -> tuple:
    """engines.yaml's launch line for the serving mode; standalone engines also get its standalone flags and
    the served name."""
    serving = c.s["m3_serving"]
    head = tuple(_fill(tok, fill) for tok in rules["launch"][serving])
    if serving != "dynamo":
        extra = dict(rules.get("standalone_args") or {})
        if rules.get("served_name_flag") and c.served != c.model_id and rules["served_name_flag"] not in head:
            extra[rules["served_name_flag"]] = "{served}"
        for flag, value in extra.items():
            r.set_arg(flag, _fill(value, fill), "plan", PLAN_SOURCE)
    return head


def _docker_args(c: Any, rk: Rank, r: recipes.Resolved, info: Mapping[str, Any]) -> list[str]:
    """`docker run` flags before the image: the layers', the NVIDIA GPUs of this rank, the HF cache mount."""
    docker = list(r.docker)
    if info["vendor"] == "nvidia":
        gpus_total = layout.gpus_per_host(rk.host.data)
        sel = "all" if len(rk.devices) >= gpus_total else '"device=' + ",".join(map(str, rk.devices)) + '"'
        docker += ["--gpus", sel]
    return docker + ["-v", f"{c.s['m3_hf_cache']}:/root/.cache/huggingface"]


def _engine_files(c: Any, rk: Rank, r: recipes.Resolved, rules: Mapping[str, Any],
                  docker: list[str] | None) -> tuple[tuple[str, str], ...]:
    """engines.yaml's `engine_file` under Dynamo (TensorRT-LLM's engine YAML): a host file the worker's flag names,
    mounted read-only into its container (`docker`, None for a native process)."""
    engine_file = rules.get("engine_file") if c.s["m3_serving"] == "dynamo" else None
    if not engine_file:
        return ()
    path = engine_file["path"].format(slot=rk.slot)
    r.set_arg(engine_file["flag"], path, "plan:engine-file", "m3deploy/core/data/engines.yaml")
    if docker is not None:
        docker += ["-v", f"{path}:{path}:ro"]
    return ((path, yaml.safe_dump(engine_file["options"], sort_keys=True)),)


def _dynamo_image(c: Any, rules: Mapping[str, Any], image: str | None,
                  sim_image: bool) -> tuple[str | None, str | None]:
    """(image, base_image): under Dynamo an engine image runs Dynamo inside it, so the images role builds this
    image on the host, offline, FROM the engine image plus the shipped ai-dynamo wheels (the GB200 lane
    pip-installs ai-dynamo into vLLM's image); the stand-in image holds the Dynamo venv already, and Dynamo's own
    runtime images (engines.yaml `images:` with `dynamo:` the pinned version) bundle it."""
    bundled = str((rules.get("images") or {}).get(image or "", {}).get("dynamo", "")) == str(c.s["m3_dynamo_version"])
    if not image or c.s["m3_serving"] != "dynamo" or sim_image or bundled:
        return image, None
    tag = hashlib.sha256(image.encode()).hexdigest()[:12]
    return f"m3deploy/dynamo-{c.s['m3_engine']}:{c.s['m3_dynamo_version']}-{tag}", image


def _fill(value, fill: Mapping[str, Any]) -> str | None:
    """engines.yaml's `{name}` placeholders, filled from the plan (None stays a boolean flag)."""
    return None if value is None else re.sub(r"\{([a-z_]+)\}", lambda m: str(fill[m.group(1)]), str(value))

