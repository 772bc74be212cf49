"""What `testbed up` sets on this machine besides the hosts: the inotify limit (restored by `down`), the bridge,
each host's network namespace and veth pair, and the apt proxy the hosts install through."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time

from m3deploy.core.errors import M3Error

from . import config, image
from .system import _all_pids, _cmdline, _ip_json, _links, _port_open, _run, _write

SYSCTL_FILE = os.path.join(config.STATE_ROOT, ".sysctl.json")
INOTIFY = "/proc/sys/fs/inotify/max_user_instances"


# ------------------------------------------------------------------ sysctl

def _read_int(path: str) -> int:
    with open(path) as f:
        return int(f.read().strip())


def _raise_inotify(name: str, total_hosts: int, log) -> bool:
    need = config.inotify_needed(total_hosts)
    cur = _read_int(INOTIFY)
    try:
        with open(SYSCTL_FILE) as f:
            rec = json.load(f)
    except (OSError, ValueError):
        rec = None
    if cur >= need:
        return False
    if rec is None:
        rec = {"fs.inotify.max_user_instances": cur, "raised_by": []}
    if name not in rec["raised_by"]:
        rec["raised_by"].append(name)
    _write(SYSCTL_FILE, json.dumps(rec) + "\n")
    with open(INOTIFY, "w") as f:
        f.write(str(need))
    log(f"fs.inotify.max_user_instances {cur} -> {need} (restored by `down`)")
    return True


def _restore_inotify(name: str, log) -> None:
    try:
        with open(SYSCTL_FILE) as f:
            rec = json.load(f)
    except (OSError, ValueError):
        return
    if name in rec.get("raised_by", []):
        rec["raised_by"].remove(name)
    others = [n for n in rec.get("raised_by", []) if n != name and os.path.isdir(config.Paths(n).dir)]
    if others:
        rec["raised_by"] = others
        _write(SYSCTL_FILE, json.dumps(rec) + "\n")
        return
    orig = rec["fs.inotify.max_user_instances"]
    with open(INOTIFY, "w") as f:
        f.write(str(orig))
    os.unlink(SYSCTL_FILE)
    log(f"fs.inotify.max_user_instances restored to {orig}")


# ------------------------------------------------------------------ network

def _ensure_bridge(name: str, subnet: str, log, changes: list) -> str:
    br = config.bridge_name(name)
    addr = config.bridge_address(subnet)
    links = _links()
    hits = config.overlapping_interfaces(subnet, _ip_json("-4", "addr", "show"), own_bridge=br)
    if hits:
        raise config.err_subnet_taken(subnet, hits, name)
    if br not in links:
        # Bridged host-to-host traffic must not go through the machine's iptables (br_netfilter).
        res = _run(["ip", "link", "add", br, "type", "bridge", "nf_call_iptables", "0",
                    "nf_call_ip6tables", "0", "nf_call_arptables", "0"], check=False)
        if res.returncode != 0:
            _run(["ip", "link", "add", br, "type", "bridge"])
        changes.append(f"bridge {br}")
    have = [a["local"] for link in _ip_json("-4", "addr", "show", "dev", br) for a in link.get("addr_info", [])]
    if addr not in have:
        _run(["ip", "addr", "add", f"{addr}/24", "dev", br])
        changes.append(f"address {addr}/24 on {br}")
    _run(["ip", "link", "set", br, "up"])
    return br


def _ensure_host_net(name: str, i: int, subnet: str, br: str, netns: list, links: list,
                     changes: list) -> None:
    ns, veth, addr = config.netns_name(name, i), config.veth_name(name, i), config.host_address(subnet, i)
    if ns not in netns:
        _run(["ip", "netns", "add", ns])
        changes.append(f"netns {ns}")
    inside = [link["ifname"] for link in _ip_json("-n", ns, "link", "show")]
    if "eth0" not in inside:
        if veth in links:
            _run(["ip", "link", "del", veth])
        _run(["ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns])
        changes.append(f"veth {veth}")
    _run(["ip", "link", "set", veth, "master", br, "up"])
    have = [a["local"] for link in _ip_json("-n", ns, "-4", "addr", "show", "dev", "eth0")
            for a in link.get("addr_info", [])]
    if addr not in have:
        _run(["ip", "-n", ns, "addr", "add", f"{addr}/24", "dev", "eth0"])
    _run(["ip", "-n", ns, "link", "set", "lo", "up"])
    _run(["ip", "-n", ns, "link", "set", "eth0", "up"])


# ------------------------------------------------------------------ apt proxy

def _proxy_pids(name: str) -> list[int]:
    conf = os.path.join(config.Paths(name).proxy_dir, "conf")
    out = []
    for pid in _all_pids():
        cl = _cmdline(pid)
        if cl and os.path.basename(cl[0]) == "apt-cacher-ng" and conf in cl:
            out.append(pid)
    return out


def _ensure_proxy(name: str, bridge_ip: str, log, changes: list) -> dict:
    p = config.Paths(name)
    port = config.APT_PROXY_PORT
    running = _proxy_pids(name)
    if running and _port_open(bridge_ip, port):
        return {"pid": running[0], "url": f"http://{bridge_ip}:{port}"}
    for pid in running:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    if _port_open(bridge_ip, port):
        raise M3Error(f"port {bridge_ip}:{port} is taken by another program; the testbed's apt proxy "
                      "needs it. Fix: stop that program (e.g. a system apt-cacher-ng listening on all "
                      "addresses: `systemctl stop apt-cacher-ng`)")
    conf, logd, run = (os.path.join(p.proxy_dir, d) for d in ("conf", "log", "run"))
    for d in (conf, logd, run, p.proxy_cache):
        os.makedirs(d, exist_ok=True)
    debian, security = image.machine_mirrors()
    _write(os.path.join(conf, "backends_debian"), debian + "\n")
    _write(os.path.join(conf, "acng.conf"), config.render_acng_conf(
        conf_dir=conf, cache_dir=p.proxy_cache, log_dir=logd, bind=bridge_ip, port=port,
        pid_file=os.path.join(run, "pid"), socket_path=os.path.join(run, "socket"),
        security_backend=security.rstrip("/")))
    cmd = ["apt-cacher-ng", "-c", conf]
    with open(os.path.join(logd, "stdout.log"), "ab") as out:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True, close_fds=True, cwd="/")
    deadline = time.monotonic() + 10
    while not _port_open(bridge_ip, port):
        if proc.poll() is not None or time.monotonic() > deadline:
            with open(os.path.join(logd, "stdout.log")) as f:
                tail = f.read()[-1500:]
            raise M3Error(f"apt-cacher-ng did not start on {bridge_ip}:{port}:\n{tail}\n"
                          f"Fix: see {logd}; `m3deploy testbed down --name {name}` then up again")
        time.sleep(0.02)
    changes.append(f"apt proxy {bridge_ip}:{port} (backend {debian})")
    return {"pid": proc.pid, "url": f"http://{bridge_ip}:{port}"}
