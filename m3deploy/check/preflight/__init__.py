"""Preflight: compare a host's facts with its part of the plan, before anything is changed.

- `check_host(hp, facts) -> list[Check]`: pure; `facts` is `m3deploy.facts.gather_facts()`'s dict.
- `env_from_facts(facts) -> dict`: NCCL/GLOO socket interface and RDMA HCAs derived from facts, for
  the plan to use where the user set none (the lead records them with provenance "facts").
- `nccl_command(...)` / `parse_nccl_output(...)`: the opt-in NCCL all-reduce check (`--nccl`).
- `run_preflight(...)`: connects with pyinfra (SSH, `@local`, ...), gathers facts, changes nothing; the
  command `m3deploy preflight` (m3deploy.cli.preflight) prints its table per host.
"""
from __future__ import annotations

import base64
import json
import re
import shlex
from dataclasses import asdict
from pathlib import Path
from typing import Any

from m3deploy.core import catalog
from m3deploy.core.catalog import version_tuple
from m3deploy.core.model import HostPlan

NCCL_SCRIPT = Path(__file__).with_name("nccl_allreduce.py")
NCCL_MARKER = "M3_NCCL_RESULT "
# Variables that must reach the all-reduce processes unchanged (NVLink multicast off on shared hosts, etc.)
NCCL_PASSTHROUGH_ENV = ("NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST", "NVSHMEM_DISABLE_NVLS",
                        "NCCL_SOCKET_IFNAME", "NCCL_IB_HCA", "NCCL_DEBUG", "CUDA_VISIBLE_DEVICES")


from m3deploy.check.preflight.result import Check  # noqa: E402  (the one result type of every check)
from m3deploy.core.errors import plural  # noqa: E402
from m3deploy.core.netenv import env_from_facts  # noqa: E402,F401  (public here too)

# --------------------------------------------------------------------------------------------
# Checks
# --------------------------------------------------------------------------------------------

def _norm_model(name: str) -> str:
    n = name.lower().replace("nvidia", "").replace("amd", "").replace("instinct", "")
    return re.sub(r"[\s_-]+", " ", n).strip()


def model_matches(expected: str, actual: str) -> bool:
    """"NVIDIA H200" matches "NVIDIA H200" and "NVIDIA H200 NVL"; "AMD Instinct MI300X" matches
    amd-smi's "Instinct MI300X" / "AMD Instinct MI300X VF"."""
    e, a = _norm_model(expected), _norm_model(actual)
    if not e:
        return True
    return a == e or a.startswith(e + " ")


def _gb(n_bytes: int) -> str:
    return f"{n_bytes / 1e9:.0f} GB"


def check_host(hp: HostPlan, facts: dict[str, Any]) -> list[Check]:
    """Every check for one host. GPU checks only where the plan gives the host GPUs (hp.gpus > 0)."""
    checks = [_check_os(hp, facts)]
    if hp.gpus > 0:
        checks += _gpu_checks(hp, facts)
    checks.append(_check_disk(hp, facts))
    checks.append(_check_shm(hp, facts))
    if hp.needs_rdma:
        checks.append(_check_rdma(hp, facts))
    from m3deploy.check.preflight import kvfabric

    return checks + kvfabric.host_checks(hp, facts)  # m3_disagg: the KV fabric of prefill/decode hosts


def _check_os(hp: HostPlan, facts: dict) -> Check:
    os_ = facts.get("os") or {}
    desc = f"{os_.get('pretty') or os_.get('id', '?')} kernel {os_.get('kernel', '?')}"
    supported = catalog.supported_os()
    if hp.gpus > 0 and (os_.get("id"), os_.get("version_id")) not in supported:
        names = "/".join(sorted(v for _, v in supported))
        return Check("os", True, f"{desc} (the driver roles install on Ubuntu {names} only; "
                     "preinstalled drivers are used as found)")
    return Check("os", True, desc)


def _gpu_checks(hp: HostPlan, facts: dict) -> list[Check]:
    out: list[Check] = []
    vendor = facts.get("gpu_vendor", "")
    gpus = facts.get("gpus") or []
    names = sorted({g.get("name", "") for g in gpus})
    driver = facts.get("driver") or {}
    where = f"host {hp.name}"

    if facts.get("gpu_error"):
        out.append(Check("gpu-driver-loaded", False, f"nvidia-smi failed: {facts['gpu_error']}",
                         "reboot the host if the driver was just installed or upgraded (driver/library "
                         "mismatch), else reinstall the driver (`pyinfra -y INVENTORY deploy.py`: the drivers role)"))

    if vendor != hp.gpu_vendor:
        out.append(Check("gpu-vendor", False, f"{where}: plan expects {hp.gpu_vendor or '?'} GPUs, found "
                         f"{vendor or 'none'}", "install the GPU driver (drivers role) or fix m3_platform "
                         "for this host"))
    else:
        out.append(Check("gpu-vendor", True, vendor))

    count_ok = len(gpus) >= hp.gpus
    extra = f" (plan uses {hp.gpus})" if len(gpus) > hp.gpus else ""
    out.append(Check("gpu-count", count_ok, f"{plural(len(gpus), 'GPU')} found, plan needs {hp.gpus}{extra}",
                     "" if count_ok else "check the GPUs are seated and visible (nvidia-smi / amd-smi list), "
                     "or lower the host's GPU count in the inventory"))

    if gpus:
        bad = [n for n in names if not model_matches(hp.gpu_model, n)]
        out.append(Check("gpu-model", not bad, f"found {', '.join(names)}; plan expects {hp.gpu_model}",
                         "" if not bad else "use the inventory/platform matching this hardware (m3_platform)"))
        out.append(Check("gpu-mixed", len(names) <= 1, "one GPU model" if len(names) <= 1 else
                         f"mixed GPU models on one host: {', '.join(names)}",
                         "" if len(names) <= 1 else "use hosts with one GPU model (tensor parallelism "
                         "needs identical GPUs)"))
        if hp.gpu_memory_gb:
            low = [g for g in gpus if g.get("memory_mib", 0) * 2**20 / 1e9 < hp.gpu_memory_gb * 0.95]
            mem = min(g.get("memory_mib", 0) for g in gpus)
            out.append(Check("gpu-memory", not low, f"{mem} MiB per GPU (plan: {hp.gpu_memory_gb} GB)",
                             "" if not low else "check MIG/partitioning or the platform of this host"))

    if hp.gpu_vendor == "nvidia":  # the driver the plan's driver section names (a wrong vendor: gpu-vendor above)
        ver = driver.get("version") or ""
        branch = version_tuple(ver)[:1]
        min_branch = hp.driver.branch  # the plan's driver section: what the drivers role installs
        ok = bool(branch) and branch[0] >= min_branch
        detail = f"NVIDIA driver {ver or 'not loaded'}"
        if driver.get("flavor"):
            detail += f" ({driver['flavor']} kernel module)"
        if driver.get("cuda_version"):
            detail += f", CUDA {driver['cuda_version']}"
        out.append(Check("driver", ok, detail + f"; need branch >= {min_branch}",
                         "" if ok else f"install driver branch {min_branch}+ (m3_nvidia_driver_branch; "
                         "drivers role), then reboot"))
        migs = [g for g in gpus if str(g.get("mig", "")).lower() == "enabled"]
        if gpus:
            out.append(Check("mig", not migs, "MIG disabled" if not migs else
                             f"MIG enabled on GPU(s) {', '.join(str(g['index']) for g in migs)}",
                             "" if not migs else "sudo nvidia-smi -mig 0 (then reset the GPUs or reboot)"))
    elif hp.gpu_vendor == "amd":
        rocm = driver.get("rocm_version") or ""
        rocm_min = hp.driver.rocm
        ok = bool(rocm) and version_tuple(rocm)[:2] >= version_tuple(rocm_min)[:2]
        out.append(Check("driver", ok, f"ROCm {rocm or 'not installed'}, amdgpu {driver.get('version') or '?'}"
                         f"; need ROCm >= {rocm_min}",
                         "" if ok else f"install ROCm {rocm_min}+ with amdgpu-install (drivers role)"))
        dev = facts.get("amd_devices") or {}
        ok = bool(dev.get("kfd")) and bool(dev.get("dri"))
        out.append(Check("amd-devices", ok, f"/dev/kfd {'present' if dev.get('kfd') else 'missing'}, "
                         f"/dev/dri {'present' if dev.get('dri') else 'missing'}",
                         "" if ok else "load the amdgpu driver (modprobe amdgpu; drivers role), then reboot"))

    reboot = facts.get("reboot") or {}
    out.append(Check("reboot", not reboot.get("required"),
                     "; ".join(reboot.get("reasons") or []) or "no reboot pending",
                     "" if not reboot.get("required") else
                     "reboot the host, or deploy with m3_allow_reboot=True to let the drivers role reboot it"))
    return out


def _check_disk(hp: HostPlan, facts: dict) -> Check:
    disk = facts.get("disk") or {}
    avail = int(disk.get("avail_bytes") or 0)
    where = disk.get("checked") or hp.weights_dir or "/"
    if not hp.weights_gb:
        return Check("disk", True, f"{_gb(avail)} free at {where} (no weights to store)")
    need = hp.weights_gb * 10**9
    ok = avail >= need
    at = hp.weights_dir + (f" (checked {where})" if where != hp.weights_dir else "")
    return Check("disk", ok, f"{_gb(avail)} free at {at}; weights need {hp.weights_gb} GB",
                 "" if ok else f"free {_gb(need - avail)} on {disk.get('mount') or where} or set m3_hf_cache "
                 "to a directory on a larger filesystem")


def _check_shm(hp: HostPlan, facts: dict) -> Check:
    shm = facts.get("shm") or {}
    size = int(shm.get("size_bytes") or 0)
    if not hp.shm_min_gb:
        return Check("shm", True, f"/dev/shm {size / 2**30:.0f} GiB")
    ok = size >= hp.shm_min_gb * 2**30
    return Check("shm", ok, f"/dev/shm {size / 2**30:.0f} GiB; need {hp.shm_min_gb} GiB",
                 "" if ok else f"remount larger: mount -o remount,size={hp.shm_min_gb}G /dev/shm "
                 "(and in /etc/fstab)")


def _check_rdma(hp: HostPlan, facts: dict) -> Check:
    rdma = facts.get("rdma") or []
    active = [d for d in rdma if d.get("active")]
    if not rdma:
        return Check("rdma", False, "no RDMA devices in /sys/class/infiniband; a worker on this host spans hosts",
                     "install MLNX_OFED/DOCA or rdma-core and check the HCAs, or set NCCL_IB_DISABLE=1 "
                     "via m3_extra_env to fall back to TCP (slow)")
    desc = ", ".join(f"{d['device']}:{d['port']} {d.get('state') or '?'} {d.get('link_layer') or ''}"
                     f"{' -> ' + d['netdev'] if d.get('netdev') else ''}".strip() for d in rdma)
    return Check("rdma", bool(active), desc, "" if active else "bring the HCA ports up (cabling, subnet "
                 "manager for InfiniBand, or the RoCE interface)")


# --------------------------------------------------------------------------------------------
# Env from facts
# --------------------------------------------------------------------------------------------

# --------------------------------------------------------------------------------------------
# NCCL all-reduce (opt-in)
# --------------------------------------------------------------------------------------------

def worker_image(hp: HostPlan) -> str:
    for s in hp.services:
        if s.kind == "worker" and s.image:
            return s.image
    return ""


def nccl_command(gpus: int, image: str = "", sizes_mib: str = "8,64,256,1024") -> str:
    """A shell command that writes the all-reduce script to a temp dir and runs it across `gpus`
    GPUs: with the host's python3 when it has torch, else in `image` via docker. Reads nothing else
    and leaves nothing behind."""
    b64 = base64.b64encode(NCCL_SCRIPT.read_bytes()).decode()
    n = max(int(gpus), 1)
    run = f"-m torch.distributed.run --standalone --nproc-per-node={n} "
    env = f"M3_NCCL_SIZES_MIB={shlex.quote(sizes_mib)}"
    docker_env = " ".join(f"-e {v}" for v in NCCL_PASSTHROUGH_ENV) + f" -e {env}"
    lines = [
        "d=$(mktemp -d) || exit 1",
        "trap 'rm -rf \"$d\"' EXIT",
        f"echo {b64} | base64 -d > \"$d/nccl_allreduce.py\"",
        "if python3 -c 'import torch' >/dev/null 2>&1; then "
        f"echo 'M3_NCCL_RUNNER host'; {env} python3 {run}\"$d/nccl_allreduce.py\"",
    ]
    if image:
        lines[-1] += ("; elif command -v docker >/dev/null 2>&1; then "
                      f"echo {shlex.quote(f'M3_NCCL_RUNNER docker {image}')}; "
                      f"docker run --rm --gpus all --ipc=host --network=host {docker_env} -v \"$d\":/m3 "
                      f"--entrypoint python3 {shlex.quote(image)} {run}/m3/nccl_allreduce.py")
    lines[-1] += "; else echo 'M3_NCCL_RUNNER none'; exit 3; fi"
    return "; ".join(lines)


def parse_nccl_output(text: str, min_busbw_gbps: float = 0.0) -> Check:
    runner = ""
    for line in text.splitlines():
        if line.startswith("M3_NCCL_RUNNER "):
            runner = line.split(" ", 1)[1].strip()
        if line.startswith(NCCL_MARKER):
            try:
                r = json.loads(line[len(NCCL_MARKER):])
            except ValueError:
                break
            sizes = ", ".join(f"{x['size_mib']} MiB {x['busbw_gbps']} GB/s" for x in r.get("results", []))
            ok = bool(r.get("correct")) and (r.get("world_size", 0) < 2 or r.get("busbw_gbps", 0) >= min_busbw_gbps)
            bw = (f"bus bandwidth {r.get('busbw_gbps')} GB/s peak ({sizes})" if r.get("world_size", 0) > 1
                  else "one GPU: sums right, no bus traffic to measure")
            detail = (f"{r.get('world_size')} x {r.get('gpu')} via {runner or '?'}, NCCL {r.get('nccl')}: {bw}"
                      f"{'' if r.get('correct') else '; WRONG SUM'}")
            return Check("nccl-allreduce", ok, detail, "" if ok else
                         "check NVLink/PCIe topology (nvidia-smi topo -m), fabric manager, and NCCL_DEBUG=INFO")
    if runner == "none":
        return Check("nccl-allreduce", False, "neither torch on the host nor docker with the worker image",
                     "install the container runtime and image (runtime/images roles) first")
    tail = " | ".join(text.strip().splitlines()[-3:])
    return Check("nccl-allreduce", False, f"no result from the all-reduce: {tail[-400:]}",
                 "run again with NCCL_DEBUG=INFO in the environment")


def run_nccl_check(host, hp: HostPlan, min_busbw_gbps: float = 0.0, timeout: int = 600) -> Check:
    from pyinfra.api import StringCommand

    status, output = host.run_shell_command(StringCommand(nccl_command(hp.gpus, worker_image(hp))),
                                            _timeout=timeout)
    text = "\n".join(output.output_lines)
    return parse_nccl_output(text, min_busbw_gbps)


# --------------------------------------------------------------------------------------------
# Running it (pyinfra API) and the CLI
# --------------------------------------------------------------------------------------------

def pyinfra_inventory(path: str, override_data: dict | None = None):
    """The pyinfra Inventory for an inventory file (with group_data/ and --data), loaded as m3deploy.core.inventory
    does (preflight connects to its hosts; the plan comes from m3deploy.cli.load)."""
    from pyinfra.api import State
    from pyinfra.context import ctx_state
    from pyinfra_cli.inventory import make_inventory

    p = Path(path)
    extra = []
    for cand in (p.resolve().parent.parent / "group_data", Path.cwd() / "group_data"):
        if cand.is_dir() and str(cand) not in extra:
            extra.append(str(cand))
    with ctx_state.use(State()):
        return make_inventory(str(p), override_data=override_data, cwd=str(Path.cwd()),
                              group_data_directories=extra)


def run_kv_transfer_checks(state_hosts: dict, cluster, floor_gbps: float | None = None) -> dict[str, Check]:
    """`--kv-transfer`: ucx_perftest GPU to GPU between each (prefill host, decode host) pair of the plan
    (m3deploy.check.preflight.kvfabric); {"prefill->decode": Check}. `state_hosts`: {name: connected pyinfra host}."""
    import gevent
    from pyinfra.api import StringCommand

    from m3deploy.check.preflight import kvfabric

    out = {}
    for p, d in kvfabric.transfer_pairs(cluster):
        srv, cli = kvfabric.perftest_commands(cluster.host(d), cluster.host(p), worker_image(cluster.host(p)))
        server = gevent.spawn(state_hosts[d].run_shell_command, StringCommand(srv), _timeout=150)
        gevent.sleep(2)  # the server listens first
        _, output = state_hosts[p].run_shell_command(StringCommand(cli), _timeout=150)
        server.join(timeout=150)
        out[f"{p}->{d}"] = kvfabric.parse_perftest("\n".join(output.output_lines),
                                                   floor_gbps or kvfabric.KV_FLOOR_GBPS, f"{p} -> {d}")
    return out


def run_preflight(inventory, cluster, hosts: tuple[str, ...] = (), nccl: bool = False,
                  kv_transfer: bool = False) -> dict[str, dict]:
    """Connect, gather facts, check. Returns {host: {"plan": HostPlan, "facts": {...}, "checks": [Check]}}."""
    from pyinfra.api import Config, State
    from pyinfra.api.connect import connect_all, disconnect_all

    from m3deploy.facts import gather_facts

    config = Config()
    state = State(inventory, config, check_for_changes=False)
    if hosts:
        known = {h.name for h in inventory}
        missing = [h for h in hosts if h not in known]
        if missing:
            from m3deploy.core.errors import M3Error

            raise M3Error(f"--host {', '.join(missing)}: not in the inventory (hosts: {', '.join(sorted(known))})")
        state.limit_hosts = [h for h in inventory if h.name in hosts]
    connect_all(state)
    report: dict[str, dict] = {}
    try:
        for host in inventory:
            if hosts and host.name not in hosts:
                continue
            try:
                hp = cluster.host(host.name)
            except KeyError:
                continue
            if not host.connected:
                report[host.name] = {"plan": hp, "facts": {}, "checks": [
                    Check("connect", False, f"could not connect to {host.name}",
                          "check the address, SSH user and key in the inventory")]}
                continue
            facts = gather_facts(host, hp.weights_dir or "/", gpu=hp.gpus > 0)
            checks = check_host(hp, facts)
            if nccl and hp.gpus > 0:
                checks.append(run_nccl_check(host, hp, float(dict(hp.data).get("m3_nccl_min_busbw_gbps", 0) or 0)))
            report[host.name] = {"plan": hp, "facts": facts, "checks": checks}
        if kv_transfer:
            for pair, check in run_kv_transfer_checks({h.name: h for h in inventory if h.connected}, cluster).items():
                report[pair.split("->")[0]]["checks"].append(check)
    finally:
        disconnect_all(state)
    from m3deploy.controller import factcache

    factcache.save(cluster.name, {h: r["facts"] for h, r in report.items() if r["facts"]})
    return report


def render_report(report: dict[str, dict], console=None) -> None:
    from rich.console import Console
    from rich.table import Table

    console = console or Console()
    for name, r in report.items():
        hp = r["plan"]
        ok = all(c.ok for c in r["checks"])
        title = (f"{name} ({hp.platform or 'control'}, {plural(hp.gpus, 'GPU')}) - "
                 f"{'[green]OK[/green]' if ok else '[red]FAILED[/red]'}")
        table = Table(title=title, title_justify="left", show_lines=False)
        table.add_column("check")
        table.add_column("")
        table.add_column("detail", overflow="fold")
        table.add_column("fix", overflow="fold")
        for c in r["checks"]:
            table.add_row(c.name, "[green]ok[/green]" if c.ok else "[red]FAIL[/red]", c.detail, c.fix)
        console.print(table)


def report_json(report: dict[str, dict]) -> dict[str, Any]:
    return {name: {"ok": all(c.ok for c in r["checks"]), "checks": [asdict(c) for c in r["checks"]],
                   "facts": r["facts"], "env_from_facts": env_from_facts(r["facts"]) if r["facts"] else {}}
            for name, r in report.items()}
