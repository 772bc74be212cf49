"""The plan as a Kubernetes DynamoGraphDeployment (nvidia.com/v1beta1, Dynamo's operator): pure, no I/O.

`export(plan)` reads the same ClusterPlan the deploy carries out (m3deploy.core.build) and returns the DGD and the
ConfigMaps its pods mount, as plain data. Each Dynamo client of the plan (the frontends, every worker rank 0, the
scripted engine) becomes a component whose `main` container runs the unit's argv and env token for token, except
the differences `DIFFERENCES` lists (each with its reason; `bare_metal_view` undoes them, and
tests/unit/test_export_k8s.py checks that nothing else differs). What the operator brings itself (etcd, NATS, their
credentials, the multi-node launch) is left out, and `LEFT_OUT` says why. Secrets are Secret references (names),
never values. docs/TARGETS.md.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from m3deploy.core import catalog, control, simengine
from m3deploy.core.errors import M3Error
from m3deploy.core.model import ClusterPlan, HostPlan, Service

API_VERSION = "nvidia.com/v1beta1"
KIND = "DynamoGraphDeployment"
MAIN = "main"  # api/v1beta1/dynamocomponentdeployment_types.go MainContainerName
POD_IP = "POD_IP"  # the downward API's status.podIP: what a unit's cluster address becomes in a pod
HF_MOUNT = "/root/.cache/huggingface"  # where every engine container reads the HF cache (core/worker.py)
SECRET_KEY_OF = {"HF_TOKEN": "HF_TOKEN"}

# the env a Dynamo client of the plan uses to reach the control plane m3deploy runs (core/control.py dynamo_env,
# dynamo_secret_env): the operator's platform runs etcd and NATS and sets these in every pod it renders
CONTROL_ENV = ("ETCD_ENDPOINTS", "ETCD_AUTH_USERNAME", "M3_ETCD_AUTH_TOKEN", "NATS_SERVER", "NATS_AUTH_USERNAME")
CONTROL_SECRETS = tuple(k for k, _ in control.DYN_SECRET_ENV)


@dataclass(frozen=True)
class Difference:
    """One way a component's `main` container may differ from the bare-metal unit's argv and env, and why."""

    name: str
    what: str
    why: str


DIFFERENCES = (
    Difference("address", "the host's cluster address (m3_address), in argv and env values, is `$(POD_IP)`",
               "a pod has its own address, known only when it starts: Kubernetes expands `$(POD_IP)` in args and env "
               "(POD_IP from the downward API, status.podIP)"),
    Difference("control-plane", f"env {', '.join(CONTROL_ENV)} and secret env {', '.join(CONTROL_SECRETS)} are "
               "left out", "the operator's platform chart runs etcd and NATS and injects their endpoints into every "
               "component it renders; m3deploy's etcd/NATS and their passwords do not exist there"),
    Difference("interpreter", "a native process's interpreter (the plan's Dynamo venv python) is `python3`",
               "the pod runs the container image, whose python3 has ai-dynamo installed; there is no host venv"),
    Difference("home", "a native process's HOME (its /var/lib/m3 directory) is /root",
               "that directory is a host path; the container runs as root with a writable /root (Dynamo writes "
               "$HOME/.cache/dynamo)"),
    Difference("slot-ports", "a worker in slot N>0 of its host uses the slot-0 ports (system, KV events, ...)",
               "slots exist because several workers share one host's network; each pod has its own"),
    Difference("devices", "host GPU indices (--device-ids, CUDA_/HIP_VISIBLE_DEVICES) count from 0",
               "the device plugin gives each pod its GPUs (resources.limits nvidia.com/gpu), numbered from 0"),
    Difference("multi-node", "the multi-host flags (engines.yaml multi_host: --nnodes, --node-rank, --master-addr, "
               "--headless, --dist-init-addr) are left out, and an MPI world's mpirun/sshd wrapper "
               "(engines.yaml mpi_world) is unwrapped to the command it starts",
               "multinode.nodeCount makes the operator render a leader and worker pods and add each rank's flags "
               "and launcher itself (for TensorRT-LLM its own mpirun); ranks > 0 have no argv of their own"),
    Difference("hf-token", "env HF_TOKEN from Secret `<cluster>-hf-token` (optional) is added",
               "bare metal stages the weights from the controller (m3_hf_token_file); in a pod the engine may "
               "download them into the shared cache with the token, which is only ever a Secret reference"),
)

# what the export leaves to the operator or drops, with the reason (the DGD's comments and docs/TARGETS.md)
LEFT_OUT = {
    "etcd, nats": "the Dynamo platform chart (its etcd and NATS subcharts) runs them; the operator wires every "
                  "component to them (the `control-plane` difference)",
    "m3_edge (HAProxy), m3_vip (keepalived)": "a Kubernetes Service/Ingress in front of the frontend component does "
                                              "that job; m3deploy's edge and VIP are host services",
    "m3_monitor (Prometheus, exporters)": "the cluster's Prometheus (operator: PodMonitor/ServiceMonitor) scrapes pods",
    "m3_planner": "Dynamo's planner runs on Kubernetes as a `planner` component in kubernetes mode, not the virtual "
                  "mode with m3deploy's actuator and standby agents",
    "docker flags": "--network host, --ipc, --gpus, --device: the pod's network, /dev/shm (sharedMemorySize), "
                    "resources.limits and device plugins (a GB200 ComputeDomain for IMEX) replace them",
}


def dns_name(text: str) -> str:
    """A DNS-1123 name from the cluster's (metadata.name; the components' names follow the CRD's pattern)."""
    out = re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")
    return out[:63].rstrip("-") or "m3"


def dynamo_clients(plan: ClusterPlan) -> list[tuple[HostPlan, Service]]:
    return [(h, s) for h in plan.hosts for s in h.services if s.kind in ("frontend", "worker", "scripted")]


def refuse(plan: ClusterPlan) -> None:
    """The plans the DGD cannot carry: M3Error naming the setting and the fix."""
    if plan.serving != "dynamo":
        raise M3Error(f"cluster {plan.name}: m3_serving is {plan.serving!r}; `m3deploy export` writes Dynamo "
                      "deployments. Fix: --data m3_serving=dynamo (or set it in group_data)")
    if any(s.launcher for _, s in dynamo_clients(plan)):
        raise M3Error(f"cluster {plan.name}: m3_internal_tls is on; its certificates and launcher are for "
                      "m3deploy's etcd and NATS, which the operator replaces with its own. Fix: --data "
                      "m3_internal_tls=false for the export (the operator's platform has its own TLS settings)")


def image_of(plan: ClusterPlan, svc: Service) -> str:
    """The image a component's pods run: the unit's; the frontend (native on bare metal) runs in the first worker's
    image, which has ai-dynamo in it as Dynamo's own recipes do; a native mocker in the stand-in engine image,
    which holds the Dynamo venv."""
    if svc.kind == "frontend":
        svc = next((s for _, s in dynamo_clients(plan) if s.kind == "worker" and s.image), svc)
    return svc.image or simengine.sim_image(plan.dynamo_version)


def semver_tag(image: str) -> bool:
    """Does the image's tag give a Dynamo runtime version? deploy/operator/internal/runtimeversion/runtimeversion.go
    (imageTag, Normalize): the tag after the last ':' past the last '/', digest stripped, `v?MAJOR.MINOR[.PATCH]`
    with an optional -prerelease/+build."""
    ref = image.strip().split("@", 1)[0]
    slash, colon = ref.rfind("/"), ref.rfind(":")
    if colon <= slash:
        return False
    return bool(re.fullmatch(r"[vV]?[0-9]+\.[0-9]+(?:\.[0-9]+)?(?:-[0-9A-Za-z][0-9A-Za-z.-]*)?"
                             r"(?:\+[0-9A-Za-z][0-9A-Za-z.-]*)?", ref[colon + 1:]))


@dataclass(frozen=True)
class View:
    """A unit's command as its `main` container runs it, and what was changed to get there (for the parity check)."""

    command: tuple[str, ...]
    args: tuple[str, ...]
    env: tuple[tuple[str, str], ...]
    secret_env: tuple[tuple[str, str], ...]


def multi_host_flags(plan: ClusterPlan) -> dict[str, bool]:
    """{flag: takes a value} of engines.yaml's multi_host for the plan's engine."""
    multi = catalog.engines()[plan.engine].get("multi_host") or {}
    return {f: v is not None for part in ("all", "followers") for f, v in (multi.get(part) or {}).items()}


def unwrap_mpi(plan: ClusterPlan, argv: tuple[str, ...]) -> tuple[str, ...]:
    """An MPI world's launcher argv (core/mpi.py launcher: mpirun ... WRAP COMMAND) -> COMMAND."""
    world = (catalog.engines()[plan.engine].get("mpi_world") or {}).get(plan.serving)
    wrap = list(world["wrap"]) if world else []
    for i in range(len(argv) - len(wrap) + 1):
        if wrap and list(argv[i:i + len(wrap)]) == wrap:
            return argv[i + len(wrap):]
    return argv


def _without_flags(argv: tuple[str, ...], flags: dict[str, bool]) -> tuple[str, ...]:
    out, skip = [], False
    for tok in argv:
        if skip:
            skip = False
            continue
        if tok in flags:
            skip = flags[tok]
            continue
        out.append(tok)
    return tuple(out)


def slot_of(svc: Service) -> int:
    m = re.fullmatch(r"m3-worker@(\d+)", svc.name)
    return int(m.group(1)) if m else 0


def _swap(value: str, pairs: list[tuple[str, str]]) -> str:
    for old, new in pairs:
        value = value.replace(old, new)
    return value


def _substitutions(hp: HostPlan, svc: Service) -> tuple[list[tuple[str, str]], dict]:
    """(substring pairs for the address and slot ports, exact-token pairs for ports and device lists)."""
    slot = slot_of(svc) if svc.kind == "worker" else 0
    ports = [(p.port, p.port - slot) for p in svc.ports] if slot else []
    sub = [(f"{hp.address}:{a}", f"{hp.address}:{b}") for a, b in ports] + [(hp.address, f"$({POD_IP})")]
    exact = {str(a): str(b) for a, b in ports}
    if svc.devices and list(svc.devices) != list(range(len(svc.devices))):
        exact[",".join(map(str, svc.devices))] = ",".join(map(str, range(len(svc.devices))))
    return sub, exact


def view(plan: ClusterPlan, hp: HostPlan, svc: Service) -> View:
    """The unit's argv and env as the component's `main` container runs them (DIFFERENCES applied)."""
    argv = unwrap_mpi(plan, svc.argv) if svc.mpi == "launcher" else svc.argv
    if svc.nnodes > 1:
        argv = _without_flags(argv, multi_host_flags(plan))
    sub, exact = _substitutions(hp, svc)

    def tok(v: str) -> str:
        return exact.get(v, _swap(v, sub))

    head = "python3" if plan.venv and argv[0].startswith(f"{plan.venv}/") else argv[0]
    env = tuple((k, "/root" if k == "HOME" and not svc.image else tok(v)) for k, v in svc.env
                if k not in CONTROL_ENV)
    secrets = tuple((k, ref) for k, ref in svc.secret_env if k not in CONTROL_SECRETS)
    return View((head,), tuple(tok(a) for a in argv[1:]), env, secrets)


def _env_list(plan: ClusterPlan, v: View) -> list[dict[str, Any]]:
    cluster = dns_name(plan.name)
    out: list[dict[str, Any]] = [{"name": POD_IP, "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}]
    out += [{"name": k, "value": val} for k, val in v.env]
    out += [{"name": k, "valueFrom": {"secretKeyRef": {"name": f"{cluster}-{ref}", "key": k}}}
            for k, ref in v.secret_env]
    out.append({"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": f"{cluster}-hf-token", "key": "HF_TOKEN",
                                                                   "optional": True}}})
    return out


def _mounts(plan: ClusterPlan, svc: Service, args: tuple[str, ...]) -> tuple[list[dict], list[dict], list[dict]]:
    """(volumeMounts, volumes, configmaps): the HF cache as the cluster's PVC; a file the plan writes beside the
    unit that the container's command names (TensorRT-LLM's engine YAML) as a ConfigMap at the same path (an MPI
    world's hostfile and ssh config are the operator's: the multi-node difference)."""
    cluster = dns_name(plan.name)
    mounts = [{"name": "hf-cache", "mountPath": HF_MOUNT}]
    volumes = [{"name": "hf-cache", "persistentVolumeClaim": {"claimName": f"{cluster}-hf-cache"}}]
    maps = []
    for i, (path, text) in enumerate(svc.files):
        if not any(path in a for a in args):
            continue
        cm = f"{cluster}-{dns_name(svc.name)}-{i}"
        key = re.sub(r"[^-._a-zA-Z0-9]", "-", path.rsplit("/", 1)[-1])  # a ConfigMap key's characters
        mounts.append({"name": f"file-{i}", "mountPath": path, "subPath": key, "readOnly": True})
        volumes.append({"name": f"file-{i}", "configMap": {"name": cm}})
        maps.append({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": cm}, "data": {key: text}})
    return mounts, volumes, maps


def gpus_of(svc: Service) -> int:
    """The GPUs of one rank: a pod's resources.limits."""
    return len(svc.devices) if svc.devices else 0


def _component(plan: ClusterPlan, name: str, ctype: str, group: list[tuple[HostPlan, Service]]) -> tuple[dict, list]:
    hp, svc = group[0]
    v = view(plan, hp, svc)
    image = image_of(plan, svc)
    mounts, volumes, maps = _mounts(plan, svc, v.args)
    main: dict[str, Any] = {"name": MAIN, "image": image, "command": list(v.command), "args": list(v.args),
                            "env": _env_list(plan, v), "volumeMounts": mounts}
    gpus = gpus_of(svc)
    if gpus:
        vendor = "amd.com/gpu" if hp.gpu_vendor == "amd" else "nvidia.com/gpu"
        main["resources"] = {"limits": {vendor: str(gpus)}}
    comp: dict[str, Any] = {"name": name, "type": ctype, "replicas": len(group)}
    if svc.nnodes > 1:
        comp["multinode"] = {"nodeCount": svc.nnodes}
    if not semver_tag(image):  # the operator cannot read the runtime version from the tag (a digest pin, a sha)
        comp["runtimeVersionOverride"] = plan.dynamo_version
    comp["podTemplate"] = {"spec": {"containers": [main], "volumes": volumes}}
    return comp, maps


def groups(plan: ClusterPlan) -> list[tuple[str, str, list[tuple[HostPlan, Service]]]]:
    """(component name, type, [(host, unit)]): the frontends; workers by pool and identical container (rank 0 of
    each engine instance); the scripted engine."""
    out: list[tuple[str, str, list]] = []
    fronts = [(h, s) for h, s in dynamo_clients(plan) if s.kind == "frontend"]
    if fronts:
        out.append(("Frontend", "frontend", fronts))
    buckets: dict[tuple, list] = {}
    for w in plan.workers:
        host, unit = w.services[0].split("/", 1)
        hp = plan.host(host)
        svc = hp.service(unit)
        v = view(plan, hp, svc)
        key = (svc.pool or "worker", v, image_of(plan, svc), svc.nnodes, gpus_of(svc), svc.files)
        buckets.setdefault(key, []).append((hp, svc))
    seen: dict[str, int] = {}
    for key, members in buckets.items():
        base = key[0]
        seen[base] = seen.get(base, 0) + 1
        out.append((base if seen[base] == 1 else f"{base}-{seen[base]}", base, members))
    out += [("scripted", "worker", [(h, s)]) for h, s in dynamo_clients(plan) if s.kind == "scripted"]
    return out


def export(plan: ClusterPlan) -> dict[str, Any]:
    """{"dgd": the DynamoGraphDeployment, "configmaps": [...], "secrets": [Secret names the pods reference],
    "left_out": {...}}; M3Error for a plan it cannot carry."""
    refuse(plan)
    comps, maps = [], []
    for name, ctype, members in groups(plan):
        comp, cms = _component(plan, name, ctype, members)
        comps.append(comp)
        maps += cms
    spec: dict[str, Any] = {}
    if plan.engine in ("vllm", "sglang", "trtllm"):
        spec["backendFramework"] = plan.engine
    spec["components"] = comps
    dgd = {"apiVersion": API_VERSION, "kind": KIND,
           "metadata": {"name": dns_name(plan.name), "labels": {"app.kubernetes.io/managed-by": "m3deploy"}},
           "spec": spec}
    secrets = sorted({e["valueFrom"]["secretKeyRef"]["name"] for c in comps
                      for e in c["podTemplate"]["spec"]["containers"][0]["env"]
                      if "secretKeyRef" in e.get("valueFrom", {})})
    return {"dgd": dgd, "configmaps": maps, "secrets": secrets, "left_out": dict(LEFT_OUT)}
