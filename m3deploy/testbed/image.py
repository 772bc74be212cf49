"""The shared Debian image every testbed host boots from (lower layer of each host's overlay).

Built once with `debootstrap --variant=minbase` and cached under
/var/cache/m3deploy/testbed/images/<suite>-<arch>-<hash of the include list>/rootfs.
Hosts never write to it: each gets a private overlay upper dir.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import time

from m3deploy.core.errors import M3Error

from . import config

SSHD_CONF = """\
# m3deploy testbed: key-only root login, one host key made at first boot
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
HostKey /etc/ssh/ssh_host_ed25519_key
UseDNS no
"""

# Each host makes its own SSH host key at first boot. ExecStartPre is reset so the key exists
# before Debian's own `sshd -t` check runs.
SSH_DROPIN = """\
[Service]
ExecStartPre=
ExecStartPre=/bin/sh -c 'test -s /etc/ssh/ssh_host_ed25519_key || ssh-keygen -q -t ed25519 -N "" -f /etc/ssh/ssh_host_ed25519_key'
ExecStartPre=/usr/sbin/sshd -t
"""  # noqa: E501 (a unit file: one ExecStartPre= a line)

# Units that make no sense in a container host or would fight the deploy (apt locks).
MASKED = (
    "getty.target", "console-getty.service", "container-getty@.service", "getty@.service",
    "serial-getty@.service", "apt-daily.timer", "apt-daily-upgrade.timer",
    "apt-daily.service", "apt-daily-upgrade.service", "e2scrub_all.timer",
    "e2scrub_reap.service", "fstrim.timer", "systemd-firstboot.service",
)


def machine_arch() -> str:
    try:
        return subprocess.run(["dpkg", "--print-architecture"], capture_output=True, text=True,
                              check=True).stdout.strip() or "amd64"
    except (OSError, subprocess.CalledProcessError):
        return "amd64"


def machine_sources() -> dict[str, str]:
    files = {}
    for path in ["/etc/apt/sources.list", *glob.glob("/etc/apt/sources.list.d/*.list"),
                 *glob.glob("/etc/apt/sources.list.d/*.sources")]:
        try:
            with open(path) as f:
                files[path] = f.read()
        except OSError:
            pass
    return files


def machine_mirrors() -> tuple[str, str]:
    return config.pick_mirrors(config.parse_apt_sources(machine_sources()))


def _write(root: str, rel: str, text: str, mode: int = 0o644) -> None:
    path = os.path.join(root, rel.lstrip("/"))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)
    os.chmod(path, mode)


def customize(root: str) -> None:
    """Turn a fresh debootstrap tree into a host image (no per-host identity inside)."""
    for key in glob.glob(os.path.join(root, "etc/ssh/ssh_host_*")):
        os.unlink(key)
    # Empty machine-id: each host gets its own, written into its upper dir before first boot.
    _write(root, "etc/machine-id", "", 0o444)
    dbus_id = os.path.join(root, "var/lib/dbus/machine-id")
    if os.path.lexists(dbus_id):
        os.unlink(dbus_id)
        os.symlink("/etc/machine-id", dbus_id)
    _write(root, "etc/ssh/sshd_config.d/10-m3-testbed.conf", SSHD_CONF)
    _write(root, "etc/systemd/system/ssh.service.d/10-m3-hostkeys.conf", SSH_DROPIN)
    wants = os.path.join(root, "etc/systemd/system/multi-user.target.wants")
    os.makedirs(wants, exist_ok=True)
    if not os.path.lexists(os.path.join(wants, "ssh.service")):
        os.symlink("/lib/systemd/system/ssh.service", os.path.join(wants, "ssh.service"))
    for unit in MASKED:
        link = os.path.join(root, "etc/systemd/system", unit)
        if os.path.lexists(link):
            os.unlink(link)
        os.symlink("/dev/null", link)
    _write(root, "etc/apt/sources.list", config.render_sources_list())
    for f in glob.glob(os.path.join(root, "etc/apt/sources.list.d/*")):
        os.unlink(f)
    os.makedirs(os.path.join(root, "root/.ssh"), mode=0o700, exist_ok=True)
    os.chmod(os.path.join(root, "root/.ssh"), 0o700)
    _write(root, "etc/hostname", "localhost\n")
    # Keep the image small: no apt lists / debs (hosts fetch fresh lists through the proxy).
    for pattern in ("var/cache/apt/archives/*.deb", "var/lib/apt/lists/*_*"):
        for f in glob.glob(os.path.join(root, pattern)):
            os.unlink(f)


def ensure_image(include=config.BASE_INCLUDE, log=print) -> str:
    """Path of the image rootfs for `include`, building it when not cached."""
    arch = machine_arch()
    target = config.image_dir(include, config.SUITE, arch)
    rootfs = os.path.join(target, "rootfs")
    if os.path.exists(os.path.join(target, ".complete")):
        return rootfs
    os.makedirs(os.path.dirname(target), exist_ok=True)
    for stale in glob.glob(target + ".tmp-*"):
        shutil.rmtree(stale, ignore_errors=True)
    if os.path.exists(target):
        shutil.rmtree(target)
    tmp = f"{target}.tmp-{os.getpid()}"
    mirror, _ = machine_mirrors()
    log(f"building the host image (debootstrap --variant=minbase {config.SUITE}, once; ~1 min) from {mirror}")
    t0 = time.monotonic()
    cmd = ["debootstrap", "--variant=minbase", f"--arch={arch}", f"--include={','.join(include)}",
           config.SUITE, os.path.join(tmp, "rootfs"), mirror]
    logfile = f"{tmp}.log"
    os.makedirs(tmp, exist_ok=True)
    with open(logfile, "w") as lf:
        rc = subprocess.run(cmd, stdout=lf, stderr=subprocess.STDOUT,
                            env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"}).returncode
    if rc != 0:
        with open(logfile) as lf:
            tail = "".join(lf.readlines()[-15:])
        shutil.rmtree(tmp, ignore_errors=True)
        raise M3Error(
            f"debootstrap of the host image failed (exit {rc}) from mirror {mirror}:\n{tail}\n"
            f"Fix: check that this machine reaches {mirror} (`apt-get update` works), then run `up` again; "
            f"full log: {logfile}"
        )
    customize(os.path.join(tmp, "rootfs"))
    with open(os.path.join(tmp, "include.txt"), "w") as f:
        f.write("\n".join(include) + "\n")
    open(os.path.join(tmp, ".complete"), "w").close()
    os.rename(tmp, target)
    os.replace(logfile, target + ".log")
    log(f"host image ready in {time.monotonic() - t0:.0f} s: {rootfs}")
    return rootfs
