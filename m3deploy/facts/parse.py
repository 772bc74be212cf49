"""Pure parsers of GPU-host command output (unit-tested on captured output); m3deploy.facts.host runs them.

Every fact's command is safe on any Linux host: where a tool, file or device is missing it prints
nothing (or a marker) and exits 0, so a GPU-free control host or the "sim" platform gathers empty
values instead of failing. Parsers never raise on odd input; they return the fact's empty value.

`gather_facts(host, weights_dir)` collects them all into one JSON-able dict (the shape
`m3deploy.check.preflight.check_host()` and `env_from_facts()` read); `assemble()` is the pure half of
it, so tests and fixtures can build the same dict from raw command outputs.
"""
from __future__ import annotations

import json
import re
from typing import Any

from m3deploy.core.catalog import version_tuple

# --------------------------------------------------------------------------------------------
# NVIDIA
# --------------------------------------------------------------------------------------------

NVIDIA_QUERY_FIELDS = (
    "index", "name", "uuid", "pci.bus_id", "driver_version", "memory.total", "compute_cap",
    "persistence_mode", "mig.mode.current",
)
_NVIDIA_KEYS = ("index", "name", "uuid", "bus_id", "driver_version", "memory_mib", "compute_cap",
                "persistence", "mig")
NVIDIA_SMI_MARKER = "##m3:nvidia-smi##"


def parse_nvidia_query(text: str) -> dict[str, Any]:
    """`nvidia-smi --query-gpu=<NVIDIA_QUERY_FIELDS> --format=csv,noheader,nounits` (stderr merged).

    Returns {"gpus": [...], "error": ""}; lines that are not GPU rows (e.g. "Failed to initialize
    NVML: Driver/library version mismatch") are joined into "error".
    """
    gpus: list[dict[str, Any]] = []
    errors: list[str] = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line == NVIDIA_SMI_MARKER:
            continue
        cells = [c.strip() for c in line.split(",")]
        if len(cells) != len(_NVIDIA_KEYS) or not cells[0].isdigit():
            errors.append(line)
            continue
        gpu: dict[str, Any] = dict(zip(_NVIDIA_KEYS, cells))
        gpu["index"] = int(cells[0])
        gpu["memory_mib"] = _int(cells[5].split()[0]) if cells[5] else 0
        gpu["persistence"] = cells[7]
        gpu["mig"] = cells[8]
        gpus.append(gpu)
    return {"gpus": gpus, "error": "\n".join(errors)}


def parse_proc_driver_version(text: str) -> dict[str, str]:
    """/proc/driver/nvidia/version -> {"version": "580.159.04", "flavor": "open"|"proprietary"}."""
    for line in text.splitlines():
        if line.startswith("NVRM version:"):
            m = re.search(r"\s(\d+\.\d+(?:\.\d+)?)\s", line + " ")
            flavor = "open" if "Open Kernel Module" in line else "proprietary"
            return {"version": m.group(1) if m else "", "flavor": flavor}
    return {"version": "", "flavor": ""}


def parse_cuda_version(text: str) -> str:
    """The "CUDA Version: 13.0" of nvidia-smi's header (or `nvidia-smi -q`)."""
    m = re.search(r"CUDA Version\s*:?\s*([0-9]+\.[0-9]+)", text)
    return m.group(1) if m else ""


def parse_topo_matrix(text: str) -> dict[str, dict[str, str]]:
    """`nvidia-smi topo -m` -> {"GPU0": {"GPU1": "NV18", ...}, ...} (GPU and NIC rows only)."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", text)  # the header row is underlined with ANSI codes
    header: list[str] = []
    out: dict[str, dict[str, str]] = {}
    for line in text.splitlines():
        if not line.strip() or line.startswith("Legend"):
            if out:
                break
            continue
        cells = line.split("\t")
        cells = [c.strip() for c in cells]
        if not header:
            header = [c for c in cells if c]
            header = [c for c in header if re.fullmatch(r"(GPU|NIC|mlx\w*)\d*\w*", c)]
            continue
        name, values = cells[0], cells[1:]
        if not re.fullmatch(r"(GPU|NIC)\d+", name):
            continue
        row = {}
        for peer, val in zip(header, values):
            if peer != name:
                row[peer] = val
        out[name] = row
    return out


def parse_nvlink_status(text: str) -> dict[str, dict[str, Any]]:
    """`nvidia-smi nvlink -s` -> {"0": {"name": "NVIDIA H200", "links": 18, "active": 18,
    "gbps": 478.1}} (gbps: the sum of the active links' per-direction GB/s)."""
    out: dict[str, dict[str, Any]] = {}
    cur: dict[str, Any] | None = None
    for line in text.splitlines():
        m = re.match(r"GPU (\d+): (.*?)(?: \(UUID: .*\))?$", line.strip())
        if m:
            cur = {"name": m.group(2), "links": 0, "active": 0, "gbps": 0.0}
            out[m.group(1)] = cur
            continue
        m = re.match(r"Link (\d+): (.*)$", line.strip())
        if m and cur is not None:
            cur["links"] += 1
            speed = re.match(r"([0-9.]+) GB/s", m.group(2))
            if speed:
                cur["active"] += 1
                cur["gbps"] = round(cur["gbps"] + float(speed.group(1)), 3)
    return out


def parse_dpkg_versions(text: str) -> dict[str, str]:
    """`dpkg-query -W -f='${Package}=${Version}=${db:Status-Abbrev}\\n' ...` -> installed {pkg: version}."""
    out = {}
    for line in text.splitlines():
        parts = line.strip().split("=")
        if len(parts) >= 2 and parts[0] and parts[1]:
            if len(parts) >= 3 and parts[2] and not parts[2].startswith("ii"):
                continue
            out[parts[0]] = parts[1]
    return out


def upstream_version(deb_version: str) -> str:
    """"580.159.04-0ubuntu0.24.04.1" -> "580.159.04"; "1:2.3-4" -> "2.3"."""
    v = deb_version.split(":", 1)[-1]
    return v.rsplit("-", 1)[0] if "-" in v else v


def nvidia_driver_branch(version: str) -> int:
    return (version_tuple(version) or (0,))[0]


# --------------------------------------------------------------------------------------------
# AMD
# --------------------------------------------------------------------------------------------

def _mib(value: Any) -> int:
    """amd-smi reports VRAM as 196592, "196592 MB" or {"value": 196592, "unit": "MB"}."""
    unit = "MB"
    if isinstance(value, dict):
        unit = str(value.get("unit", "MB"))
        value = value.get("value")
    if isinstance(value, str):
        parts = value.split()
        if len(parts) == 2:
            unit = parts[1]
        value = parts[0] if parts else ""
    n = _int(value)
    scale = {"B": 1 / 2**20, "KB": 1 / 1024, "MB": 1, "MIB": 1, "GB": 1024, "GIB": 1024}
    return int(n * scale.get(unit.upper(), 1))


def parse_amd_smi_static(text: str) -> list[dict[str, Any]]:
    """`amd-smi static --asic --vram --driver --bus --json` (list, or {"gpu_data": [...]} in newer
    releases) -> [{"index", "name", "gfx", "memory_mib", "bus_id", "driver_version"}]."""
    data = _json(text)
    if isinstance(data, dict):
        data = data.get("gpu_data", data.get("gpus", []))
    if not isinstance(data, list):
        return []
    gpus = []
    for i, g in enumerate(data):
        if not isinstance(g, dict):
            continue
        asic = g.get("asic") or {}
        vram = g.get("vram") or {}
        driver = g.get("driver") or {}
        bus = g.get("bus") or {}
        gpus.append({
            "index": _int(g.get("gpu", i)),
            "name": str(asic.get("market_name", "")).strip(),
            "gfx": str(asic.get("target_graphics_version", "")).strip(),
            "memory_mib": _mib(vram.get("size", vram.get("vram_size", 0))),
            "bus_id": str(bus.get("bdf", "")),
            "driver_version": str(driver.get("version", driver.get("driver_version", ""))),
        })
    return gpus


def parse_rocm_smi_json(text: str) -> list[dict[str, Any]]:
    """`rocm-smi --showproductname --showmeminfo vram --showdriverversion --showbus --json`
    -> the same shape as parse_amd_smi_static (cards "card0".. in order)."""
    data = _json(text)
    if not isinstance(data, dict):
        return []
    system = data.get("system") if isinstance(data.get("system"), dict) else {}
    gpus = []
    for key in sorted((k for k in data if re.fullmatch(r"card\d+", k)), key=lambda k: int(k[4:])):
        c = data[key] if isinstance(data[key], dict) else {}
        total_b = _int(c.get("VRAM Total Memory (B)", 0))
        gpus.append({
            "index": int(key[4:]),
            "name": str(c.get("Card Series", c.get("Card series", ""))).strip(),
            "gfx": str(c.get("GFX Version", "")).strip(),
            "memory_mib": total_b // 2**20,
            "bus_id": str(c.get("PCI Bus", "")),
            "driver_version": str(c.get("Driver version", system.get("Driver version", ""))),
        })
    return gpus


def parse_rocm_topology(text: str) -> dict[str, dict[str, str]]:
    """`rocm-smi --showtopotype --json` -> {"GPU0": {"GPU1": "XGMI"}, ...}."""
    data = _json(text)
    out: dict[str, dict[str, str]] = {}
    if not isinstance(data, dict):
        return out
    for block in data.values():
        if not isinstance(block, dict):
            continue
        for k, v in block.items():
            m = re.search(r"between DRM devices (\d+) and (\d+)", k)
            if m:
                a, b = f"GPU{m.group(1)}", f"GPU{m.group(2)}"
                out.setdefault(a, {})[b] = str(v)
                out.setdefault(b, {})[a] = str(v)
    return out


def parse_rocm_version(text: str) -> str:
    """/opt/rocm/.info/version ("7.2.0-43" or "7.2.0") -> "7.2.0"."""
    line = text.strip().splitlines()[0] if text.strip() else ""
    m = re.match(r"(\d+\.\d+(?:\.\d+)?)", line)
    return m.group(1) if m else ""


# --------------------------------------------------------------------------------------------
# Host: network, RDMA, disk, shm, OS, docker, services, reboot
# --------------------------------------------------------------------------------------------

def parse_ip_addr(text: str) -> dict[str, tuple[str, int]]:
    """`ip -o -4 addr show` -> {address: (interface, prefix length)}: where each IPv4 address of the host sits."""
    out: dict[str, tuple[str, int]] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 4 and parts[2] == "inet" and "/" in parts[3]:
            a, _, n = parts[3].partition("/")
            out[a] = (parts[1].split("@", 1)[0], int(n) if n.isdigit() else 32)
    return out


def parse_proc_net_route(text: str) -> str:
    """/proc/net/route -> the interface of the default route with the lowest metric ("" if none)."""
    best: tuple[int, str] | None = None
    for line in text.splitlines()[1:]:
        cells = line.split()
        if len(cells) < 8 or cells[1] != "00000000":
            continue
        if cells[7] != "00000000":  # mask must be 0.0.0.0
            continue
        flags = int(cells[3], 16) if re.fullmatch(r"[0-9A-Fa-f]+", cells[3]) else 0
        if not flags & 0x1:  # RTF_UP
            continue
        metric = _int(cells[6])
        if best is None or metric < best[0]:
            best = (metric, cells[0])
    return best[1] if best else ""


def parse_rdma(text: str) -> list[dict[str, Any]]:
    """Lines `dev=mlx5_0 port=1 state=4: ACTIVE phys=5: LinkUp link_layer=InfiniBand netdev=ib0`."""
    out = []
    for line in text.splitlines():
        kv = dict(re.findall(r"(\w+)=((?:(?!\s\w+=).)*)", line.strip()))
        if "dev" not in kv:
            continue
        state = kv.get("state", "").strip()
        out.append({
            "device": kv["dev"].strip(),
            "port": _int(kv.get("port", "1")),
            "state": state.split(":", 1)[-1].strip() if state else "",
            "phys_state": kv.get("phys", "").split(":", 1)[-1].strip(),
            "link_layer": kv.get("link_layer", "").strip(),
            "netdev": kv.get("netdev", "").strip(),
            "active": "ACTIVE" in state,
            "roce": kv.get("link_layer", "").strip() == "Ethernet",
        })
    return out


def _size_bytes(tok: str) -> int | None:
    """"268435456" -> int; df -h's "256G" / "4.0K" / "1.5T" -> bytes (binary units); else None."""
    if tok.isdigit():
        return int(tok)
    m = re.fullmatch(r"([0-9.]+)([KMGTP])", tok)
    if not m:
        return None
    return int(float(m.group(1)) * 1024 ** ("KMGTP".index(m.group(2)) + 1))


def parse_df(text: str, mount: str | None = None) -> dict[str, Any]:
    """`df -B1 --output=size,avail,target PATH` (what FreeSpace runs), or plain `df`/`df -h` output
    (Filesystem Size Used Avail Use% Mounted on), plus an optional `checked=PATH` line. With several
    rows, the one mounted at `mount`, else the first."""
    out: dict[str, Any] = {"checked": "", "size_bytes": 0, "avail_bytes": 0, "mount": ""}
    rows = []
    for line in text.splitlines():
        if line.startswith("checked="):
            out["checked"] = line.split("=", 1)[1].strip()
            continue
        cells = line.split()
        if len(cells) == 3:
            size, avail, target = _size_bytes(cells[0]), _size_bytes(cells[1]), cells[2]
        elif len(cells) >= 6 and cells[4].endswith("%"):
            size, avail, target = _size_bytes(cells[1]), _size_bytes(cells[3]), cells[5]
        else:
            continue
        if size is not None and avail is not None:
            rows.append({"size_bytes": size, "avail_bytes": avail, "mount": target})
    pick = [r for r in rows if r["mount"] == mount] if mount else rows
    if pick:
        out.update(pick[0])
    return out


def parse_os_release(text: str) -> dict[str, str]:
    """/etc/os-release + KERNEL=/ARCH= lines -> {"id", "version_id", "codename", "pretty", "kernel", "arch"}."""
    kv = {}
    for line in text.splitlines():
        if "=" in line:
            k, v = line.split("=", 1)
            kv[k.strip()] = v.strip().strip('"')
    return {
        "id": kv.get("ID", ""), "version_id": kv.get("VERSION_ID", ""),
        "codename": kv.get("VERSION_CODENAME", kv.get("UBUNTU_CODENAME", "")),
        "pretty": kv.get("PRETTY_NAME", ""), "kernel": kv.get("KERNEL", ""), "arch": kv.get("ARCH", ""),
    }


def parse_docker(text: str) -> dict[str, Any]:
    """Lines `present=yes`, `client=Docker version 27.3.1, build ...`, `server=27.3.1`,
    `ctk=NVIDIA Container Toolkit CLI version 1.17.0`, then `--- daemon.json` and its JSON."""
    out: dict[str, Any] = {"present": False, "version": "", "server_running": False,
                           "nvidia_ctk": "", "daemon_json": None, "nvidia_runtime": False,
                           "default_runtime": ""}
    head, _, daemon = text.partition("--- daemon.json")
    for line in head.splitlines():
        k, _, v = line.partition("=")
        v = v.strip()
        if k == "present":
            out["present"] = v == "yes"
        elif k == "client" and v:
            m = re.search(r"version ([0-9][\w.\-+~]*)", v)
            out["version"] = out["version"] or (m.group(1).rstrip(",") if m else "")
        elif k == "server" and v:
            out["version"] = v
            out["server_running"] = True
        elif k == "ctk" and v:
            m = re.search(r"version ([0-9][\w.\-]*)", v)
            out["nvidia_ctk"] = m.group(1) if m else v
    if daemon.strip():
        data = _json(daemon)
        out["daemon_json"] = data if isinstance(data, dict) else None
        if isinstance(data, dict):
            out["nvidia_runtime"] = "nvidia" in (data.get("runtimes") or {})
            out["default_runtime"] = str(data.get("default-runtime", ""))
    return out


def parse_services(text: str) -> dict[str, dict[str, str]]:
    """Lines `NAME ENABLED ACTIVE` -> {NAME: {"enabled": ..., "active": ...}} ("" when unknown)."""
    out = {}
    for line in text.splitlines():
        cells = line.split()
        if not cells:
            continue
        enabled = cells[1] if len(cells) > 1 else ""
        active = cells[2] if len(cells) > 2 else ""
        out[cells[0]] = {"enabled": enabled, "active": active,
                         "present": enabled not in ("", "not-found", "missing")}
    return out


def parse_amd_devices(text: str) -> dict[str, Any]:
    """Lines `kfd=yes`, `dri=card0 card1 renderD128 ...`, `groups=root video render`."""
    out: dict[str, Any] = {"kfd": False, "dri": [], "groups": []}
    for line in text.splitlines():
        k, _, v = line.partition("=")
        if k == "kfd":
            out["kfd"] = v.strip() == "yes"
        elif k == "dri":
            out["dri"] = v.split()
        elif k == "groups":
            out["groups"] = v.split()
    return out


def parse_reboot(text: str) -> dict[str, Any]:
    """Lines `file=yes`, `pkg=linux-image-...`, `<mod>_loaded=VER`, `<mod>_installed=VER`,
    `<mod>_pkg=VER` -> {"required": bool, "reasons": [...], "loaded": {...}, "installed": {...}}."""
    kv: dict[str, str] = {}
    pkgs: list[str] = []
    for line in text.splitlines():
        k, _, v = line.partition("=")
        if k == "pkg":
            pkgs.append(v.strip())
        elif k:
            kv[k.strip()] = v.strip()
    reasons = []
    if kv.get("file") == "yes":
        reasons.append("/var/run/reboot-required exists" + (f" ({', '.join(pkgs)})" if pkgs else ""))
    loaded, installed = {}, {}
    for mod in ("nvidia", "amdgpu"):
        lv = kv.get(f"{mod}_loaded", "")
        iv = kv.get(f"{mod}_installed", "") or upstream_version(kv.get(f"{mod}_pkg", ""))
        loaded[mod], installed[mod] = lv, iv
        if lv and iv and lv != iv:
            reasons.append(f"loaded {mod} kernel module {lv} differs from the installed {iv}")
    return {"required": bool(reasons), "reasons": reasons, "packages": pkgs,
            "loaded": loaded, "installed": installed}


def parse_kv(text: str) -> dict[str, str]:
    out = {}
    for line in text.splitlines():
        k, sep, v = line.partition("=")
        if sep:
            out[k.strip()] = v.strip()
    return out


def parse_docker_image(text: str) -> dict[str, Any]:
    """`docker image inspect --format '{{.Id}} {{range .RepoDigests}}{{.}},{{end}}' IMAGE`
    -> {"present", "id", "digests"}."""
    for line in text.splitlines():
        cells = line.split()
        if cells and cells[0].startswith("sha256:"):
            digests = [d for d in (cells[1].split(",") if len(cells) > 1 else []) if d]
            return {"present": True, "id": cells[0], "digests": digests}
    return {"present": False, "id": "", "digests": []}


def _int(v: Any) -> int:
    try:
        return int(float(str(v).strip()))
    except (TypeError, ValueError):
        try:
            return int(str(v).strip(), 0)
        except (TypeError, ValueError):
            return 0


def _json(text: str) -> Any:
    text = text.strip()
    if not text:
        return None
    start = min((i for i in (text.find("{"), text.find("[")) if i >= 0), default=-1)
    if start < 0:
        return None
    try:
        return json.loads(text[start:])
    except ValueError:
        return None
