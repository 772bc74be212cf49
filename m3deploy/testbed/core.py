"""Bring a local testbed of systemd hosts up and down (root only).

A host = a network namespace on a private bridge + an overlay root filesystem over the shared
Debian image + systemd as PID 1 under systemd-nspawn, started from a per-host cgroup and reached
over SSH with strict host-key checking. See docs/TESTBED.md.

Everything this module creates carries the testbed name as a prefix (`<name>-01`, `<name>-br`,
`<name>-v1`, cgroup `m3deploy-testbed/<name>/...`), so `down` can find and remove a crashed or
half-built testbed, and only ever touches its own.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

from m3deploy.core.errors import M3Error, plural

from . import config
from . import image as testbed_image
from .machine import (
    _ensure_bridge,
    _ensure_host_net,
    _ensure_proxy,
    _proxy_pids,
    _raise_inotify,
    _restore_inotify,
)
from .system import (
    _alive,
    _all_pids,
    _cgroup_dirs,
    _cgroup_pids,
    _cmdline,
    _ip_json,
    _links,
    _Log,
    _netns,
    _port_open,
    _run,
    _ssh_banner,
    _write,
    _write_atomic,
    cgroup_bases,
    locked,
)

# ------------------------------------------------------------------ preflight

def preflight(install_deps: bool = False, log=print) -> None:
    if os.geteuid() != 0:
        raise config.err_not_root()
    missing = {t: p for t, p in config.TOOLS.items() if not shutil.which(t)}
    if missing and install_deps:
        pkgs = sorted(set(config.HOST_DEPS) | set(missing.values()))
        log(f"installing {' '.join(pkgs)} (apt-get)")
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        res = subprocess.run(["apt-get", "-o", "DPkg::Lock::Timeout=900", "install", "-y", *pkgs],
                             capture_output=True, text=True, env=env)
        if res.returncode != 0:
            raise M3Error(f"apt-get install {' '.join(pkgs)} failed:\n{res.stderr[-2000:]}\n"
                          "Fix: run `apt-get update` and try again")
        missing = {t: p for t, p in config.TOOLS.items() if not shutil.which(t)}
    if missing:
        raise config.err_missing_tools(missing)
    bases = cgroup_bases()
    if not bases or (config.CGROUP_ROOT not in bases and not any(b.endswith("/systemd") for b in bases)):
        raise M3Error("no usable cgroup hierarchy (need /sys/fs/cgroup/systemd or cgroup v2 at "
                      "/sys/fs/cgroup). Fix: mount cgroups (a normal Debian 12 machine has them)")


# ------------------------------------------------------------------ state

def load_state(name: str = config.DEFAULT_NAME, root: str = config.STATE_ROOT) -> dict:
    """The testbed's state.json as a dict; M3Error naming the fix when there is none."""
    config.check_name(name)
    path = config.Paths(name, root).state
    try:
        with open(path) as f:
            return json.load(f)
    except FileNotFoundError:
        raise config.err_no_state(name) from None
    except PermissionError:
        raise M3Error(f"cannot read {path}: permission denied. Fix: run as root (e.g. with sudo)") from None
    except ValueError as exc:
        raise M3Error(f"{path} is not valid JSON ({exc}). Fix: `m3deploy testbed down --name {name}` "
                      f"then `m3deploy testbed up 3 --name {name}`") from None


def _save_state(state: dict) -> None:
    p = config.Paths(state["name"])
    _write_atomic(p.state, json.dumps(state, indent=2, sort_keys=True) + "\n")


def list_testbeds() -> list[str]:
    try:
        return sorted(d for d in os.listdir(config.STATE_ROOT)
                      if os.path.isfile(os.path.join(config.STATE_ROOT, d, "state.json")))
    except FileNotFoundError:
        return []



# ------------------------------------------------------------------ hosts

def _nspawn_pids(name: str) -> dict[int, str]:
    """pid -> host name of every systemd-nspawn of testbed `name` (found from /proc)."""
    found = {}
    marker = f"--network-namespace-path=/run/netns/{name}-"
    for pid in _all_pids():
        cl = _cmdline(pid)
        if cl and os.path.basename(cl[0]) == "systemd-nspawn":
            for arg in cl:
                if arg.startswith(marker):
                    found[pid] = arg.rsplit("/", 1)[1]
    return found


def _seed_upper(p: config.Paths, host: str, address: str, bridge_ip: str) -> str:
    """Write the host's own files into its overlay upper dir (before boot). Returns its machine-id."""
    upper = os.path.join(p.host_dir(host), "upper")
    for d, mode in (("", 0o755), ("etc", 0o755), ("root", 0o700), ("root/.ssh", 0o700),
                    ("etc/apt", 0o755), ("etc/apt/apt.conf.d", 0o755)):
        path = os.path.join(upper, d)
        os.makedirs(path, exist_ok=True)
        os.chmod(path, mode)
    mid_path = os.path.join(upper, "etc/machine-id")
    mid = ""
    if os.path.exists(mid_path):
        with open(mid_path) as f:
            mid = f.read().strip()
    if len(mid) != 32:
        mid = uuid.uuid4().hex
        _write(mid_path, mid + "\n", 0o444)
    if not os.path.exists(os.path.join(upper, "etc/hostname")):
        _write(os.path.join(upper, "etc/hostname"), host + "\n")
        _write(os.path.join(upper, "etc/hosts"), config.render_etc_hosts(host, address))
    with open(p.pubkey) as f:
        _write(os.path.join(upper, "root/.ssh/authorized_keys"), f.read(), 0o600)
    _write(os.path.join(upper, "etc/apt/apt.conf.d/01m3-testbed-proxy"), config.render_apt_proxy_conf(bridge_ip))
    return mid


def _launch(p: config.Paths, name: str, host: str, ns: str, image: str, mid: str, options=()) -> int:
    hd = p.host_dir(host)
    extra_args, extra_env = config.nspawn_options(options, hd)
    if "docker" in options:
        os.makedirs(os.path.join(hd, "docker"), mode=0o710, exist_ok=True)
    upper, work, merged = (os.path.join(hd, d) for d in ("upper", "work", "merged"))
    for d in (work, merged):
        os.makedirs(d, exist_ok=True)
    procs = []
    for cg in _cgroup_dirs(name, host):
        os.makedirs(cg, exist_ok=True)
        procs.append(os.path.join(cg, "cgroup.procs"))
    nspawn = ["systemd-nspawn", "--quiet", "--boot", "--register=no", "--keep-unit",
              "--console=passive", "--link-journal=no", "-D", merged, "-M", host, f"--hostname={host}",
              f"--uuid={mid}", "--resolv-conf=off", "--timezone=off",
              f"--network-namespace-path=/run/netns/{ns}", *extra_args]
    mount = ["mount", "-t", "overlay", "overlay", "-o",
             f"lowerdir={image},upperdir={upper},workdir={work}", merged]
    inner = f"{shlex.join(mount)} && exec {shlex.join(nspawn)}"
    script = "".join(f"echo $$ > {shlex.quote(pr)} && " for pr in procs) + \
        f"exec unshare --mount --propagation private /bin/sh -c {shlex.quote(inner)}"
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "SYSTEMD_NSPAWN_LOCK": "0", "LANG": "C.UTF-8", **extra_env}
    with open(os.path.join(hd, "console.log"), "ab") as out:
        proc = subprocess.Popen(["/bin/sh", "-c", script], stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True, close_fds=True,
                                cwd="/", env=env)
    return proc.pid


def _read_host_key(p: config.Paths, host: str) -> str | None:
    path = os.path.join(p.host_dir(host), "upper/etc/ssh/ssh_host_ed25519_key.pub")
    try:
        with open(path) as f:
            parts = f.read().split()
    except OSError:
        return None
    if len(parts) >= 2 and parts[0] == "ssh-ed25519":
        return f"{parts[0]} {parts[1]}"
    return None


def _console_tail(p: config.Paths, host: str, n: int = 2000) -> str:
    try:
        with open(os.path.join(p.host_dir(host), "console.log"), errors="replace") as f:
            return f.read()[-n:]
    except OSError:
        return ""


# ------------------------------------------------------------------ up

def up(n: int, name: str = config.DEFAULT_NAME, subnet: str | None = None, install_deps: bool = False,
       include=None, timeout: float = 90.0, options=(), log=print) -> dict:
    """Bring testbed `name` to at least `n` running hosts. Idempotent. Returns the state."""
    config.check_name(name)
    config.check_count(n)
    say = _Log(log)
    preflight(install_deps, log=say)
    p = config.Paths(name)
    with locked(f"up {n} --name {name}"):
        say(f"testbed {name}: want {plural(n, 'host')}")
        try:
            old = load_state(name)
        except M3Error:
            old = None
        if old and subnet and subnet != old["subnet"]:
            raise M3Error(f"testbed {name!r} already runs on {old['subnet']}, not {subnet}. Fix: "
                          f"`m3deploy testbed down --name {name}` first, or leave out --subnet")
        subnet = old["subnet"] if old else (subnet or config.DEFAULT_SUBNET)
        config.parse_subnet(subnet)
        config.host_address(subnet, n)  # fits?
        options = config.check_options(options)
        if old and options and tuple(old.get("options", ())) != options:
            raise M3Error(f"testbed {name!r} was made with host options {old.get('options', [])}, not "
                          f"{list(options)}. Fix: `m3deploy testbed down --name {name}` first, or leave them out")
        options = tuple(old.get("options", ())) if old else options
        include = tuple(old["include"]) if old else config.image_include(include or config.BASE_INCLUDE, options)
        changes: list[str] = []
        hits = config.overlapping_interfaces(subnet, _ip_json("-4", "addr", "show"),
                                             own_bridge=config.bridge_name(name))
        if hits:  # before anything is made
            raise config.err_subnet_taken(subnet, hits, name)

        os.makedirs(p.dir, mode=0o755, exist_ok=True)
        os.makedirs(p.control_dir, mode=0o700, exist_ok=True)
        if old and not os.path.isdir(old["image"]):
            raise M3Error(f"testbed {name!r} was built on image {old['image']}, which is gone "
                          f"(cache purged?). Fix: `m3deploy testbed down --name {name}` then up again")
        image = old["image"] if old else testbed_image.ensure_image(include, log=say)
        if not os.path.exists(p.key):
            _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"m3deploy-testbed-{name}",
                  "-f", p.key])
            changes.append("SSH key")
        os.chmod(p.key, 0o600)

        br = _ensure_bridge(name, subnet, say, changes)
        bridge_ip = config.bridge_address(subnet)
        proxy = _ensure_proxy(name, bridge_ip, say, changes)
        if changes:
            say(f"bridge {br} {bridge_ip}/24, apt proxy {proxy['url']}")

        count = max(n, len(old["hosts"]) if old else 0)
        total = count + sum(len(load_state(o)["hosts"]) for o in list_testbeds() if o != name)
        if _raise_inotify(name, total, say):
            changes.append("sysctl fs.inotify.max_user_instances")

        running = _nspawn_pids(name)           # pid -> netns
        by_ns = {ns: pid for pid, ns in running.items()}
        netns, links = _netns(), _links()
        hosts, launched = [], []
        old_hosts = {h["name"]: h for h in (old or {}).get("hosts", [])}
        for i in range(1, count + 1):
            host, ns = config.host_name(name, i), config.netns_name(name, i)
            addr = config.host_address(subnet, i)
            h = {"name": host, "index": i, "address": addr, "netns": ns,
                 "veth": config.veth_name(name, i), "dir": p.host_dir(host),
                 "cgroups": _cgroup_dirs(name, host)}
            _ensure_host_net(name, i, subnet, br, netns, links, changes)
            pid = by_ns.get(ns)
            if pid and _alive(pid):
                h["pid"] = pid
                h["machine_id"] = old_hosts.get(host, {}).get("machine_id") or ""
            else:
                stray = set()
                for cg in _cgroup_dirs(name, host):   # leftovers of a crashed host
                    for d, _, files in os.walk(cg):
                        with contextlib.suppress(OSError):
                            stray.update(int(x) for x in open(os.path.join(d, "cgroup.procs")).read().split())
                if stray:
                    _kill(stray, signal.SIGKILL)
                    _wait_gone(stray, 5)
                mid = _seed_upper(p, host, addr, bridge_ip)
                h["pid"] = _launch(p, name, host, ns, image, mid, options)
                h["machine_id"] = mid
                launched.append(h)
                changes.append(f"host {host}")
            hosts.append(h)
        if launched:
            say(f"booting {plural(len(launched), 'host')}: {', '.join(h['name'] for h in launched)}")

        # Wait for each host: its own SSH host key on its disk, then sshd answering on its address.
        pending = {h["name"]: h for h in hosts}
        deadline = time.monotonic() + timeout
        while pending:
            for hname, h in list(pending.items()):
                if not _alive(h["pid"]):
                    raise M3Error(f"host {hname} stopped while booting. Console:\n{_console_tail(p, hname)}\n"
                                  f"Fix: see {h['dir']}/console.log; `m3deploy testbed down --name {name}` "
                                  "then up again")
                key = h.get("host_key") or _read_host_key(p, hname)
                if key:
                    h["host_key"] = key
                    if _ssh_banner(h["address"]):
                        del pending[hname]
            if pending and time.monotonic() > deadline:
                names = ", ".join(sorted(pending))
                raise M3Error(f"hosts did not answer SSH within {timeout:.0f} s: {names}. Console of "
                              f"{min(pending)}:\n{_console_tail(p, min(pending))}\nFix: run `up` again "
                              f"(it resumes), or `m3deploy testbed down --name {name}`")
            if pending:
                time.sleep(0.05)
        if launched:
            say(f"{plural(len(launched), 'host')} up, sshd answering")

        known = config.render_known_hosts(hosts)
        cfg = config.render_ssh_config(name, hosts, p.key, p.known_hosts, p.control_dir)
        for path, text in ((p.known_hosts, known), (p.ssh_config, cfg)):
            try:
                with open(path) as f:
                    same = f.read() == text
            except OSError:
                same = False
            if not same:
                _write_atomic(path, text)
                changes.append(os.path.basename(path))
        if "sudo-user" in options:  # the non-root user with sudo, on every host (idempotent)
            for h in hosts:
                _run(["ssh", "-F", p.ssh_config, h["name"], config.sudo_user_script()])
        state = {
            "version": 1,
            "name": name,
            "subnet": subnet,
            "bridge": {"name": br, "address": bridge_ip},
            "image": image,
            "include": list(include),
            "options": list(options),
            "apt_proxy": proxy,
            "ssh": {"private_key": p.key, "public_key": p.pubkey, "known_hosts": p.known_hosts,
                    "ssh_config": p.ssh_config, "control_dir": p.control_dir, "user": "root",
                    **({"sudo_user": config.SUDO_USER} if "sudo-user" in options else {})},
            "state_dir": p.dir,
            "hosts": hosts,
        }
        if old != state:
            _save_state(state)
        if changes:
            say(f"testbed {name}: {plural(len(hosts), 'host')} up ({', '.join(h['address'] for h in hosts[:3])}"
                f"{', ...' if len(hosts) > 3 else ''}); ssh -F {p.ssh_config} {hosts[0]['name']}")
        else:
            extra = f" (has {len(hosts)} > {n}; `down` first to shrink)" if len(hosts) > n else ""
            say(f"testbed {name}: no change, {plural(len(hosts), 'host')} up{extra}")
        state["changed"] = bool(changes)
        return state


# ------------------------------------------------------------------ down

def _wait_gone(pids, timeout: float) -> list[int]:
    deadline = time.monotonic() + timeout
    left = [p for p in pids if _alive(p)]
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = [p for p in left if _alive(p)]
    return left


def _kill(pids, sig) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def down(name: str = config.DEFAULT_NAME, purge_cache: bool = False, log=print) -> list[str]:
    """Remove everything testbed `name` made (works from state and from discovery by prefix)."""
    config.check_name(name)
    say = _Log(log)
    if os.geteuid() != 0:
        raise config.err_not_root()
    p = config.Paths(name)
    removed: list[str] = []
    with locked(f"down --name {name}"):
        try:
            state = load_state(name)
        except M3Error:
            state = {}
        # 1. hosts: SIGTERM to nspawn = clean poweroff of the host's systemd.
        nspawn = set(_nspawn_pids(name))
        for h in state.get("hosts", []):
            if h.get("pid") and "systemd-nspawn" in " ".join(_cmdline(h["pid"])[:1]):
                nspawn.add(h["pid"])
        if nspawn:
            say(f"stopping {plural(len(nspawn), 'host')}")
            _kill(nspawn, signal.SIGTERM)
            left = _wait_gone(nspawn, 15)
            if left:
                say(f"{plural(len(left), 'host')} did not power off in 15 s: killing")
                _kill(left, signal.SIGKILL)
            removed.append(f"{plural(len(nspawn), 'host')}")
        for _ in range(3):
            stray = _cgroup_pids(name)
            if not stray:
                break
            _kill(stray, signal.SIGKILL)
            _wait_gone(stray, 3)
        # 2. the apt proxy and ssh control masters
        proxies = _proxy_pids(name)
        if proxies:
            _kill(proxies, signal.SIGTERM)
            left = _wait_gone(proxies, 5)
            _kill(left, signal.SIGKILL)
            _wait_gone(left, 2)
            removed.append("apt proxy")
        masters = [pid for pid in _all_pids()
                   if (cl := _cmdline(pid)) and cl[0].startswith("ssh:") and p.control_dir + "/" in cl[0]]
        _kill(masters, signal.SIGTERM)
        # 3. network: namespaces (takes their veth peers along), then leftover links, bridge last
        for ns in _netns():
            if config.owned_by(name, ns):
                _run(["ip", "netns", "del", ns], check=False)
                removed.append(f"netns {ns}")
        br = config.bridge_name(name)
        for link in sorted(_links(), key=lambda name: name == br):
            if config.owned_by(name, link):
                _run(["ip", "link", "del", link], check=False)
                removed.append(f"link {link}")
        # 4. mounts (normally none: overlays live in each host's private mount namespace)
        mounts = _run(["findmnt", "-rn", "-o", "TARGET"], check=False).stdout.split()
        for m in sorted((m for m in mounts if m.startswith(p.dir + "/")), reverse=True):
            _run(["umount", "-l", m], check=False)
            removed.append(f"mount {m}")
        # 5. cgroups, deepest first
        for top in _cgroup_dirs(name):
            if not os.path.isdir(top):
                continue
            for dirpath, _d, _f in sorted(os.walk(top), key=lambda t: -t[0].count("/")):
                for _ in range(20):
                    try:
                        os.rmdir(dirpath)
                        break
                    except FileNotFoundError:
                        break
                    except OSError:
                        _kill(_cgroup_pids(name), signal.SIGKILL)
                        time.sleep(0.05)
            parent = os.path.dirname(top)
            with contextlib.suppress(OSError):
                os.rmdir(parent)  # m3deploy-testbed/, only when no other testbed uses it
            removed.append(f"cgroups {top}")
        # 6. what the tools leave: nspawn's propagate dirs; /run/netns (a mount `ip netns add`
        #    makes) once no namespace at all is left in it
        prop = "/run/systemd/nspawn/propagate"
        if os.path.isdir(prop):
            for d in os.listdir(prop):
                if config.owned_by(name, d):
                    shutil.rmtree(os.path.join(prop, d), ignore_errors=True)
            for d in (prop, os.path.dirname(prop)):
                with contextlib.suppress(OSError):
                    os.rmdir(d)
        if os.path.isdir("/run/netns") and not os.listdir("/run/netns"):
            for _ in range(4):
                if _run(["umount", "/run/netns"], check=False).returncode != 0:
                    break
            with contextlib.suppress(OSError):
                os.rmdir("/run/netns")
        # 7. sysctl, files
        _restore_inotify(name, say)
        if os.path.isdir(p.dir):
            # a deployed host's overlay holds ~0.8 GB (the Dynamo venv, wheelhouse, model): one `rm -rf` per
            # host, all at once, instead of shutil.rmtree one host after another
            dirs = [os.path.join(p.hosts_dir, h) for h in os.listdir(p.hosts_dir)] if os.path.isdir(p.hosts_dir) else []
            if dirs:
                say(f"removing {len(dirs)} host filesystem(s)")
                for proc in [subprocess.Popen(["rm", "-rf", "--one-file-system", d]) for d in dirs]:
                    proc.wait()
            shutil.rmtree(p.dir)
            removed.append(p.dir)
        for d in (config.STATE_ROOT, os.path.dirname(config.STATE_ROOT)):
            with contextlib.suppress(OSError):
                os.rmdir(d)
        if purge_cache:
            for path in (p.proxy_cache, os.path.join(config.CACHE_ROOT, "images")):
                if os.path.exists(path):
                    shutil.rmtree(path)
                    removed.append(path)
            for path in (os.path.join(config.CACHE_ROOT, "apt-cache"), config.CACHE_ROOT):
                with contextlib.suppress(OSError):
                    os.rmdir(path)
        say(f"testbed {name}: down" + ("" if removed else " (nothing was there)"))
    return removed


# ------------------------------------------------------------------ status & ssh

def ssh_argv(name: str, host: str, *cmd: str) -> list[str]:
    st = load_state(name)
    return ["ssh", "-F", st["ssh"]["ssh_config"], host, *cmd]


def run_on(name: str, host: str, cmd: str, timeout: float = 60, check: bool = False):
    """Run a shell command on a testbed host over SSH (strict host keys). Returns CompletedProcess."""
    res = subprocess.run(ssh_argv(name, host, cmd), capture_output=True, text=True, timeout=timeout)
    if check and res.returncode != 0:
        raise M3Error(f"{host}: `{cmd}` failed (exit {res.returncode}): {res.stderr.strip()}")
    return res


def _container_pid1(nspawn_pid: int) -> int | None:
    try:
        with open(f"/proc/{nspawn_pid}/task/{nspawn_pid}/children") as f:
            kids = f.read().split()
        return int(kids[0]) if kids else None
    except OSError:
        return None


def _host_status(name: str, h: dict) -> dict:
    out = {"name": h["name"], "address": h["address"], "netns": h["netns"],
           "process": _alive(h.get("pid")), "sshd": False, "systemd": "absent"}
    if not out["process"]:
        return out
    out["sshd"] = _ssh_banner(h["address"], timeout=1.0)
    try:
        res = run_on(name, h["name"], "systemctl is-system-running", timeout=10)
        if res.returncode == 255:
            raise OSError(res.stderr)
        out["systemd"] = res.stdout.strip() or "unknown"
        out["ssh_login"] = True
    except (OSError, subprocess.TimeoutExpired):
        out["ssh_login"] = False
        pid1 = _container_pid1(h["pid"])
        if pid1:
            res = _run(["nsenter", "-t", str(pid1), "-m", "-u", "-i", "-n", "-p",
                        "systemctl", "is-system-running"], check=False)
            out["systemd"] = res.stdout.strip() or "unknown"
    return out


def status(name: str = config.DEFAULT_NAME) -> dict:
    if os.geteuid() != 0:
        raise config.err_not_root()
    st = load_state(name)
    with ThreadPoolExecutor(max_workers=16) as ex:
        hosts = list(ex.map(lambda h: _host_status(name, h), st["hosts"]))
    proxy_up = _port_open(st["bridge"]["address"], config.APT_PROXY_PORT)
    return {"name": name, "subnet": st["subnet"], "bridge": st["bridge"],
            "bridge_present": st["bridge"]["name"] in _links(),
            "apt_proxy": {**st["apt_proxy"], "answers": proxy_up},
            "ssh_config": st["ssh"]["ssh_config"], "hosts": hosts}
