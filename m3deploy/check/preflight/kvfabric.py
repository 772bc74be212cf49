"""Preflight of the KV fabric of disaggregated serving (m3_disagg) on GPU hosts: the network NIXL moves each
request's KV cache over, from a prefill worker to a decode worker (docs/DISAGG.md "KV fabric preflight").

- `host_checks(hp, facts)` (pure; part of preflight.check_host on every GPU host running a prefill or decode worker):
  `kv-rdma`: RDMA ports usable by UCX: ACTIVE ports, and every device the worker's UCX_NET_DEVICES names is one
  of them (UCX ignores a device it cannot open and falls back to what is left: TCP);
  `kv-gpu-nic`: each GPU has an RDMA NIC behind the same PCIe switch or host bridge (`nvidia-smi topo -m`: PIX,
  PXB, PHB or NODE), not only across the CPUs' interconnect (SYS), which halves GPUDirect RDMA bandwidth.
- `transfer_pairs(plan)`: every (prefill host, decode host) pair; `perftest_commands(...)`: ucx_perftest (UCX's
  own benchmark, in every image that ships UCX for NIXL: Dynamo's runtime images, vLLM's NIXL build) as server on
  the decode host and client on the prefill host, GPU memory to GPU memory over the worker's UCX env;
  `parse_perftest(text, floor)`: the check `kv-transfer` from its `Final:` line against KV_FLOOR_GBPS.
"""
from __future__ import annotations

import re
import shlex
from typing import Any, Mapping

from m3deploy.check.preflight.result import Check
from m3deploy.core.errors import plural
from m3deploy.core.model import ClusterPlan, HostPlan

# The bandwidth floor of one prefill -> decode transfer, GB/s. A 400 Gb/s NDR port moves ~48 GB/s; UCX over TCP on
# the same hosts moves a few GB/s and adds ~1.8 s to the first transfer (ai-dynamo/dynamo PR 1314: "Time to init
# xfer: 1800 ms" with TCP selected, 0.16 ms with RDMA). 10 GB/s (80 Gb/s) sits well above any TCP fallback and
# well below one healthy RDMA port: below it the KV moves over the wrong transport (docs/DISAGG.md).
KV_FLOOR_GBPS = 10.0
PERFTEST_PORT = 13337  # ucx_perftest's default server port
PERFTEST_BYTES = 64 << 20  # 64 MiB: ~540 tokens of MiniMax-M3 BF16 KV (catalog.yaml model.kv_bytes_per_token)
NEAR = ("PIX", "PXB", "PHB", "NODE")  # nvidia-smi topo -m: a GPU and a NIC on one NUMA node's PCIe tree


def _fabric_workers(hp: HostPlan):
    return [s for s in hp.services if s.kind == "worker" and any(p.name in ("nixl", "bootstrap") for p in s.ports)]


def host_checks(hp: HostPlan, facts: Mapping[str, Any]) -> list:
    workers = _fabric_workers(hp)
    if not workers or hp.gpus <= 0:
        return []
    rdma = facts.get("rdma") or []
    active = {d["device"] for d in rdma if d.get("active")}
    named = {x.split(":")[0] for s in workers for k, v in s.env if k == "UCX_NET_DEVICES" for x in v.split(",")
             if x and x != "all"}
    desc = ", ".join(f"{d['device']}:{d.get('port', 1)} {d.get('state', '?')}" for d in rdma) or "none"
    bad = sorted(named - active)
    ok = bool(active) and not bad
    rdma_check = Check("kv-rdma", ok, f"RDMA ports {desc}" + (f"; UCX_NET_DEVICES names {', '.join(bad)}, not an "
                                                               "active port" if bad else ""),
                       "" if ok else "bring an HCA port up (or fix m3_rdma_env UCX_NET_DEVICES): without one UCX "
                       "moves the KV over TCP (~1.8 s per transfer)")
    return [rdma_check, _affinity(facts)]


def _affinity(facts: Mapping[str, Any]):
    matrix = (facts.get("topology") or {}).get("matrix") or {}
    gpus = sorted((g for g in matrix if g.startswith("GPU")), key=lambda g: int(g[3:]))
    nics = {n for g in gpus for n in matrix[g] if not n.startswith("GPU")}
    if not gpus or not nics:
        return Check("kv-gpu-nic", False, f"`nvidia-smi topo -m` shows {plural(len(gpus), 'GPU')} and no NIC",
                     "install the HCA driver (MLNX_OFED/DOCA or rdma-core) so the NICs appear in the GPU topology")
    far = [g for g in gpus if not any(matrix[g].get(n) in NEAR for n in nics)]
    best = {g: min((matrix[g][n] for n in nics if n in matrix[g]), key=lambda r: (NEAR + ("SYS",)).index(r)
                   if r in NEAR + ("SYS",) else 9) for g in gpus}
    detail = ", ".join(f"{g}: {best[g]}" for g in gpus)
    return Check("kv-gpu-nic", not far, f"nearest NIC per GPU: {detail}",
                 "" if not far else f"{', '.join(far)} reach every NIC only across the CPU interconnect (SYS): put "
                 "the workers on GPUs with a NIC on their PCIe tree, or add NICs there")


def transfer_pairs(plan: ClusterPlan) -> list[tuple[str, str]]:
    """(prefill host, decode host) of every pair a request can take (a host of each pool)."""
    from m3deploy.core.disagg import pool_of

    pool = {}
    for h in plan.hosts:
        for s in h.services:
            if s.kind == "worker" and pool_of(s):
                pool.setdefault(pool_of(s), []).append(h.name)
    return [(p, d) for p in dict.fromkeys(pool.get("prefill", [])) for d in dict.fromkeys(pool.get("decode", []))]


def _ucx_env(hp: HostPlan) -> str:
    env = {k: v for s in _fabric_workers(hp) for k, v in s.env if k.startswith("UCX_")}
    return " ".join(f"-e {shlex.quote(f'{k}={v}')}" for k, v in sorted(env.items()))


def perftest_commands(server: HostPlan, client: HostPlan, image: str) -> tuple[str, str]:
    """(server command on the decode host, client command on the prefill host): `ucx_perftest` GPU to GPU, tag
    bandwidth, in the worker image with the worker's UCX env (docker, as the workers run)."""
    args = f"-t tag_bw -m cuda -s {PERFTEST_BYTES} -n 20 -p {PERFTEST_PORT}"
    run = "docker run --rm --network host --gpus all --ipc=host --entrypoint ucx_perftest"
    srv = f"timeout 120 {run} {_ucx_env(server)} {shlex.quote(image)} {args}"
    cli = f"timeout 120 {run} {_ucx_env(client)} {shlex.quote(image)} {shlex.quote(server.address)} {args}"
    return srv, cli


_FINAL = re.compile(r"^\s*Final:\s+(.*)$", re.M)


def parse_perftest(text: str, floor_gbps: float = KV_FLOOR_GBPS, pair: str = ""):
    """ucx_perftest's `Final:` row (iterations; overhead 50%ile/average/overall usec; bandwidth average/overall
    MB/s; message rate average/overall: the columns of its table, e.g. openucx/ucx issue 10649's
    `Final: 1000 0.240 1675.942 1671.351 46615.58 46743.62 597 598`) -> the check `kv-transfer` (overall bandwidth
    vs the floor)."""
    m = _FINAL.search(text or "")
    nums = [float(x) for x in m.group(1).split()] if m else []
    if len(nums) < 6:
        tail = " | ".join((text or "").strip().splitlines()[-3:])[:300]
        return Check("kv-transfer", False, f"{pair}: no ucx_perftest result ({tail or 'no output'})",
                     "run the pair's ucx_perftest by hand (docs/DISAGG.md); check UCX_TLS/UCX_NET_DEVICES")
    gbps = nums[5] * (1 << 20) / 1e9  # ucx_perftest's MB/s are MiB/s -> GB/s
    ok = gbps >= floor_gbps
    return Check("kv-transfer", ok, f"{pair}: {gbps:.1f} GB/s GPU to GPU (floor {floor_gbps:g} GB/s), "
                                    f"latency {nums[3]:.1f} us",
                 "" if ok else "UCX is not on RDMA between these hosts (TCP fallback?): check `ucx_info -d` in the "
                 "image, UCX_TLS, UCX_NET_DEVICES and the HCA ports")
