"""The testbed's system helpers: commands, `ip -j`, processes and cgroups, atomic writes, port probes, and the
global lock (m3deploy.testbed.core brings testbeds up and down with them)."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import shlex
import socket
import stat
import subprocess
import sys
import time

from m3deploy.core.errors import M3Error

from . import config


class _Log:
    def __init__(self, log):
        self.t0 = time.monotonic()
        self.log = log

    def __call__(self, msg: str) -> None:
        if self.log:
            self.log(f"[{time.monotonic() - self.t0:5.1f}s] {msg}")


def _run(cmd, check=True, **kw) -> subprocess.CompletedProcess:
    res = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if check and res.returncode != 0:
        raise M3Error(f"command failed (exit {res.returncode}): {shlex.join(cmd)}\n{res.stderr.strip()}")
    return res


def _ip_json(*args) -> list:
    out = _run(["ip", "-j", *args], check=False).stdout.strip()
    try:
        return json.loads(out) if out else []
    except ValueError:
        return []


def _links() -> list[str]:
    return [link["ifname"] for link in _ip_json("link", "show")]


def _netns() -> list[str]:
    return [n["name"] for n in _ip_json("netns", "list")]


def _cmdline(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
    except OSError:
        return []


def _alive(pid) -> bool:
    if not pid:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _all_pids() -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


def _write_atomic(path: str, text: str, mode: int = 0o644) -> None:
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(text)
    os.chmod(tmp, mode)
    os.replace(tmp, path)


def _write(path: str, text: str, mode: int = 0o644) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    _write_atomic(path, text, mode)


def _ssh_banner(address: str, port: int = 22, timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection((address, port), timeout=timeout) as s:
            s.settimeout(timeout)
            return s.recv(64).startswith(b"SSH-")
    except OSError:
        return False


def _port_open(address: str, port: int, timeout: float = 0.3) -> bool:
    try:
        with socket.create_connection((address, port), timeout=timeout):
            return True
    except OSError:
        return False


def cgroup_bases() -> list[str]:
    """Cgroup hierarchies a host is placed in: named systemd (v1) + unified (v2) on hybrid machines."""
    if os.path.exists(os.path.join(config.CGROUP_ROOT, "cgroup.controllers")):
        return [config.CGROUP_ROOT]
    return [os.path.join(config.CGROUP_ROOT, h) for h in config.CGROUP_HIERARCHIES
            if os.path.isdir(os.path.join(config.CGROUP_ROOT, h))]


def _cgroup_dirs(name: str, host: str | None = None) -> list[str]:
    parts = [config.CGROUP_PARENT, name] + ([host] if host else [])
    return [os.path.join(b, *parts) for b in cgroup_bases()]


def _cgroup_pids(name: str) -> set[int]:
    pids = set()
    for top in _cgroup_dirs(name):
        for dirpath, _dirs, files in os.walk(top):
            if "cgroup.procs" in files:
                try:
                    with open(os.path.join(dirpath, "cgroup.procs")) as f:
                        pids.update(int(x) for x in f.read().split())
                except OSError:
                    pass
    return pids


# ------------------------------------------------------------------ lock

@contextlib.contextmanager
def locked(what: str, timeout_s: float | None = None):
    """Global flock: one testbed command at a time changes the machine (bridges, sysctls, image).
    A second command waits for it (like apt's lock), up to $M3_TESTBED_LOCK_TIMEOUT seconds (default 120)."""
    if timeout_s is None:
        timeout_s = float(os.environ.get("M3_TESTBED_LOCK_TIMEOUT", "120"))
    path = config.LOCK_PATH
    os.makedirs(os.path.dirname(path), exist_ok=True)
    try:  # no O_TRUNC: a waiting command must not wipe the holder's line
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise config.err_lock_path(path, "is a symlink") from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise config.err_lock_path(path, "is not a regular file")
        if st.st_uid != 0:
            raise config.err_lock_path(path, f"is owned by uid {st.st_uid}, not root")
        deadline = time.monotonic() + timeout_s
        told = False
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as exc:
                if exc.errno not in (errno.EAGAIN, errno.EACCES):
                    raise
                holder = os.pread(fd, 300, 0).decode(errors="replace").strip()
                if time.monotonic() >= deadline:
                    raise config.err_locked(holder, timeout_s) from None
                if not told:
                    sys.stderr.write(f"waiting for the testbed lock ({holder or 'held'}) ...\n")
                    told = True
                time.sleep(0.2)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()}: {what}\n".encode(), 0)
        try:
            yield
        finally:
            os.ftruncate(fd, 0)
    finally:
        os.close(fd)
