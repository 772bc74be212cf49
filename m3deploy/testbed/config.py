"""Pure parts of the testbed: names, addresses, paths, rendered files, parsing.

Nothing here touches the machine (no subprocess, no /sys); everything is unit-tested.
"""

from __future__ import annotations

import hashlib
import ipaddress
import os
import re
from dataclasses import dataclass

from m3deploy.core.errors import M3Error

DEFAULT_NAME = "m3tb"
DEFAULT_SUBNET = "10.77.0.0/24"
FIRST_HOST_OFFSET = 10          # hosts get .10, .11, ...; the bridge gets .1
APT_PROXY_PORT = 3149          # not 3142: a system apt-cacher-ng may hold *:3142
SUITE = "bookworm"

STATE_ROOT = "/var/lib/m3deploy/testbed"
CACHE_ROOT = os.environ.get("M3_TESTBED_CACHE") or "/var/cache/m3deploy/testbed"  # image + apt cache (CI: cold)
LOCK_PATH = "/run/lock/m3deploy-testbed.lock"
CGROUP_ROOT = "/sys/fs/cgroup"
CGROUP_PARENT = "m3deploy-testbed"     # /sys/fs/cgroup/<hierarchy>/m3deploy-testbed/<name>/<host>
CGROUP_HIERARCHIES = ("systemd", "unified")

# What the image must hold. The image cache is keyed by this list (and the suite).
BASE_INCLUDE = (
    "openssh-server", "python3", "python3-venv", "iproute2", "procps",
    "systemd-sysv", "dbus", "ca-certificates",
)

# Debian packages the machine itself needs (offered by `up --install-deps`).
HOST_DEPS = ("systemd-container", "debootstrap", "apt-cacher-ng", "iproute2")
TOOLS = {  # executable -> Debian package
    "systemd-nspawn": "systemd-container",
    "debootstrap": "debootstrap",
    "apt-cacher-ng": "apt-cacher-ng",
    "ip": "iproute2",
    "unshare": "util-linux",
    "nsenter": "util-linux",
    "ssh": "openssh-client",
    "ssh-keygen": "openssh-client",
}

MAX_HOSTS = 200

# Host options (`up --docker`), fixed once the testbed exists. "docker": a container engine (Debian's docker.io,
# installed by the deploy's runtime role) can run inside the hosts. Measured on Debian 12 / systemd 252, hybrid
# cgroups: without each piece dockerd or `docker run` fails (docs/TESTBED.md "Docker inside the hosts").
# "net-admin": the hosts get CAP_NET_ADMIN in their own network namespace (nspawn drops it by default, so
# `ip addr add` answers "Operation not permitted"): what keepalived needs to take a VRRP address (issue 25).
HOST_OPTIONS = ("docker", "net-admin", "sudo-user")
# `up --sudo-user`: every host also has this non-root user, logging in with the testbed's key, with passwordless
# sudo (Debian's `sudo` package added to the image), for a deploy as a non-root user with sudo (docs/INVENTORY.md)
SUDO_USER = "m3admin"
SUDO_PACKAGE = "sudo"
DOCKER_NSPAWN_ENV = {
    # the host gets its own cgroup v2 tree (delegated by nspawn): runc cannot create cgroups in the v1
    # controllers nspawn mounts read-only ("mkdir /sys/fs/cgroup/cpuset/docker: read-only file system")
    "SYSTEMD_NSPAWN_UNIFIED_HIERARCHY": "1",
    # /proc/sys/net writable (the host has its own network namespace): dockerd sets ip_forward at start
    "SYSTEMD_NSPAWN_API_VFS_WRITABLE": "network",
}


def nspawn_options(options, host_dir: str) -> tuple[list[str], dict[str, str]]:
    """(extra systemd-nspawn arguments, extra environment of nspawn) for a host of a testbed with `options`."""
    args: list[str] = []
    env: dict[str, str] = {}
    if "docker" in options:
        args += [
            "--capability=CAP_NET_ADMIN",          # iptables in the host's own network namespace (docker's NAT chain)
            "--system-call-filter=@keyring",       # runc: "unable to create session key: operation not permitted"
            "--system-call-filter=bpf",            # runc's cgroup v2 device filter
            # overlay2 cannot stack on the host's overlay root ("failed to mount overlay: invalid argument")
            f"--bind={os.path.join(host_dir, 'docker')}:/var/lib/docker",
        ]
        env.update(DOCKER_NSPAWN_ENV)
    elif "net-admin" in options:  # (docker's set has it already)
        args.append("--capability=CAP_NET_ADMIN")
    return args, env


def image_include(include, options) -> tuple[str, ...]:
    """The image's packages for hosts with `options` (`sudo-user` needs sudo)."""
    return tuple(include) + ((SUDO_PACKAGE,) if "sudo-user" in options and SUDO_PACKAGE not in include else ())


def sudo_user_script(user: str = SUDO_USER) -> str:
    """Run as root on a host (idempotent): `user` in group sudo, root's authorized key, NOPASSWD sudo (checked by
    visudo before it is put in place)."""
    home = f"/home/{user}"
    rule = f"/etc/sudoers.d/90-{user}"
    return (f"set -e; id -u {user} >/dev/null 2>&1 || useradd --create-home --shell /bin/bash --groups sudo {user}; "
            f"install -d -m 700 -o {user} -g {user} {home}/.ssh; "
            f"install -m 600 -o {user} -g {user} /root/.ssh/authorized_keys {home}/.ssh/authorized_keys; "
            f"printf '%s\\n' '{user} ALL=(ALL:ALL) NOPASSWD: ALL' > {rule}.tmp; chmod 440 {rule}.tmp; "
            f"visudo -cqf {rule}.tmp; mv {rule}.tmp {rule}")


def check_options(options) -> tuple[str, ...]:
    bad = [o for o in options if o not in HOST_OPTIONS]
    if bad:
        raise M3Error(f"unknown testbed host option(s) {bad}; known: {list(HOST_OPTIONS)}")
    return tuple(sorted(set(options)))
_NAME_RE = re.compile(r"^[a-z][a-z0-9]{0,7}$")

FIX_UP = "run `m3deploy testbed up 3`"


def check_name(name: str) -> str:
    """A testbed name: 1-8 lower-case letters/digits, starting with a letter.

    Kept short because Linux interface names are at most 15 characters
    (`<name>-br`, `<name>-v123`), and the name is the prefix used to find
    (and only ever remove) this testbed's namespaces, links and cgroups.
    """
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise M3Error(
            f"testbed name {name!r} is not valid: use 1-8 lower-case letters or digits, "
            f"starting with a letter (e.g. --name {DEFAULT_NAME})"
        )
    return name


def check_count(n: int) -> int:
    if not isinstance(n, int) or n < 1 or n > MAX_HOSTS:
        raise M3Error(f"host count {n!r} is not valid: give a number from 1 to {MAX_HOSTS} (e.g. `up 3`)")
    return n


def parse_subnet(subnet: str) -> ipaddress.IPv4Network:
    try:
        net = ipaddress.IPv4Network(subnet, strict=True)
    except ValueError as exc:
        raise M3Error(f"--subnet {subnet!r} is not an IPv4 network ({exc}); use e.g. {DEFAULT_SUBNET}") from None
    if net.prefixlen != 24:
        raise M3Error(f"--subnet {subnet} must be a /24 (e.g. {DEFAULT_SUBNET})")
    if not net.is_private:
        raise M3Error(f"--subnet {subnet} is not a private range; use one in 10.0.0.0/8 (e.g. {DEFAULT_SUBNET})")
    return net


def bridge_address(subnet: str) -> str:
    return str(parse_subnet(subnet).network_address + 1)


def host_address(subnet: str, index: int) -> str:
    """Address of host number `index` (1-based): .10, .11, ... of the /24."""
    net = parse_subnet(subnet)
    if index < 1:
        raise M3Error(f"host index {index} must be >= 1")
    offset = FIRST_HOST_OFFSET + index - 1
    if offset >= net.num_addresses - 1:
        raise M3Error(
            f"{subnet} has room for {net.num_addresses - 1 - FIRST_HOST_OFFSET} hosts; "
            f"host {index} does not fit (use fewer hosts)"
        )
    return str(net.network_address + offset)


def host_name(name: str, index: int) -> str:
    return f"{name}-{index:02d}"


def host_index(name: str, hostname: str) -> int | None:
    m = re.fullmatch(re.escape(name) + r"-(\d{2,3})", hostname)
    return int(m.group(1)) if m else None


def bridge_name(name: str) -> str:
    return f"{name}-br"


def veth_name(name: str, index: int) -> str:
    return f"{name}-v{index}"


def netns_name(name: str, index: int) -> str:
    return host_name(name, index)


def owned_by(name: str, ifname_or_ns: str) -> bool:
    """True when a netns / link name belongs to testbed `name` (and not e.g. `<name>2`)."""
    return ifname_or_ns.startswith(name + "-")


@dataclass(frozen=True)
class Paths:
    name: str
    root: str = STATE_ROOT

    @property
    def dir(self) -> str:
        return os.path.join(self.root, self.name)

    @property
    def state(self) -> str:
        return os.path.join(self.dir, "state.json")

    @property
    def key(self) -> str:
        return os.path.join(self.dir, "id_ed25519")

    @property
    def pubkey(self) -> str:
        return self.key + ".pub"

    @property
    def known_hosts(self) -> str:
        return os.path.join(self.dir, "known_hosts")

    @property
    def ssh_config(self) -> str:
        return os.path.join(self.dir, "ssh_config")

    @property
    def control_dir(self) -> str:
        return os.path.join(self.dir, "cm")

    @property
    def hosts_dir(self) -> str:
        return os.path.join(self.dir, "hosts")

    def host_dir(self, host: str) -> str:
        return os.path.join(self.hosts_dir, host)

    @property
    def proxy_dir(self) -> str:
        return os.path.join(self.dir, "apt-proxy")

    @property
    def proxy_cache(self) -> str:
        return os.path.join(CACHE_ROOT, "apt-cache", self.name)


def image_key(include=BASE_INCLUDE, suite: str = SUITE, arch: str = "amd64") -> str:
    items = ",".join(sorted(set(include)))
    digest = hashlib.sha256(f"{suite}|{arch}|{items}".encode()).hexdigest()[:12]
    return f"{suite}-{arch}-{digest}"


def image_dir(include=BASE_INCLUDE, suite: str = SUITE, arch: str = "amd64") -> str:
    return os.path.join(CACHE_ROOT, "images", image_key(include, suite, arch))


# ---------------------------------------------------------------- rendering

def render_ssh_config(name: str, hosts, key: str, known_hosts: str, control_dir: str,
                      persist: str = "10m") -> str:
    """ssh_config for `ssh -F` and testinfra's `--ssh-config`.

    ControlPath matters: testinfra sets ControlMaster but no ControlPath, and without
    one every check opens a fresh connection (3 hosts: 14.9 s instead of 1.5 s).
    """
    out = [f"# m3deploy testbed {name}: generated by `m3deploy testbed up`; do not edit", ""]
    for h in hosts:
        out += [
            f"Host {h['name']}",
            f"    HostName {h['address']}",
            "    User root",
            "    Port 22",
            f"    IdentityFile {key}",
            "    IdentitiesOnly yes",
            f"    UserKnownHostsFile {known_hosts}",
            "    GlobalKnownHostsFile /dev/null",
            "    StrictHostKeyChecking yes",
            "    PasswordAuthentication no",
            "    BatchMode yes",
            "    ConnectTimeout 5",
            "    ControlMaster auto",
            f"    ControlPath {control_dir}/%C",
            f"    ControlPersist {persist}",
            "    LogLevel ERROR",
            "",
        ]
    return "\n".join(out)


def render_known_hosts(hosts) -> str:
    """One line per host: `name,address keytype key` (each host's own key, read from its disk)."""
    lines = []
    for h in hosts:
        key = h.get("host_key")
        if not key:
            continue
        lines.append(f"{h['name']},{h['address']} {key.strip()}")
    return "\n".join(lines) + ("\n" if lines else "")


def render_apt_proxy_conf(bridge_ip: str, port: int = APT_PROXY_PORT) -> str:
    return (
        "// m3deploy testbed: Debian packages come through apt-cacher-ng on the bridge\n"
        f'Acquire::http::Proxy "http://{bridge_ip}:{port}";\n'
        'Acquire::https::Proxy "DIRECT";\n'
        'Acquire::Languages "none";\n'
        'Acquire::Retries "5";\n'  # and apt itself retries a failed download ...
        # ... at once, not after a delay: apt < 3.0.3 (Debian 12's 2.6.1) can wait forever on a delayed retry when
        # another file of the same server is queued behind it (apt commit 5378c38d, LP #2003851; measured here:
        # 1 `apt-get update` in ~10 on 3 fresh hosts hung when the proxy answered one InRelease 503).
        'Acquire::Retries::Delay "false";\n'
    )


def render_etc_hosts(hostname: str, address: str) -> str:
    return (
        "127.0.0.1\tlocalhost\n"
        f"{address}\t{hostname}\n"
        "::1\tlocalhost ip6-localhost ip6-loopback\n"
    )


def render_acng_conf(*, conf_dir, cache_dir, log_dir, bind, port, pid_file, socket_path,
                     security_backend: str) -> str:
    return "\n".join([
        "# m3deploy testbed apt-cacher-ng (bound to the bridge address only)",
        f"CacheDir: {cache_dir}",
        f"LogDir: {log_dir}",
        "SupportDir: /usr/lib/apt-cacher-ng",
        f"Port: {port}",
        f"BindAddress: {bind}",
        f"PidFile: {pid_file}",
        f"SocketPath: {socket_path}",
        "ForeGround: 1",
        f"Remap-debrep: file:deb_mirror*.gz /debian ; file:{conf_dir}/backends_debian",
        "Remap-secdeb: security.debian.org security.debian.org/debian-security "
        "deb.debian.org/debian-security /debian-security cdn-fastly.deb.debian.org/debian-security ; "
        f"{security_backend}",
        "ReportPage: acng-report.html",
        "ExThreshold: 4",
        "PassThroughPattern: ^$",
        # One upstream connection per download, no pipelining (PipelineDepth is 1 without reuse). With reuse,
        # requests of several hosts queue on one kept-alive connection to the mirror; a mirror or middlebox that
        # stops answering on a reused connection then stalls every host behind it for minutes (measured: 3 hosts,
        # apt-get update + install jq, > 200 s and none done; without reuse 19 s). docs/TESTBED.md has the details.
        "ReuseConnections: 0",
        # A mirror that drops connections (seen in a cold CI run, 2026-12-01: 25 packages of docker.io's install
        # answered "503 Connection closed, check DlMaxRetries" on two hosts at once): retry more than the
        # default 2 times before the host's apt sees a failure.
        "DlMaxRetries: 8",
        "",
    ])


def render_sources_list(suite: str = SUITE) -> str:
    """The image's sources: the canonical names, which apt-cacher-ng remaps to the machine's mirror."""
    return (
        f"deb http://deb.debian.org/debian {suite} main\n"
        f"deb http://deb.debian.org/debian {suite}-updates main\n"
        f"deb http://deb.debian.org/debian-security {suite}-security main\n"
    )


# ---------------------------------------------------------------- parsing

def parse_apt_sources(files: dict[str, str]) -> list[tuple[str, list[str]]]:
    """(uri, suites) from one-line `.list` and deb822 `.sources` texts, in file order.

    `files` maps path -> content. Disabled stanzas (`Enabled: no`) and deb-src are skipped.
    """
    out = []
    for path in sorted(files, key=lambda p: (not p.endswith("sources.list"), p)):
        text = files[path]
        if path.endswith(".sources"):
            for stanza in re.split(r"\n\s*\n", text):
                fields = {}
                key = None
                for line in stanza.splitlines():
                    if line.startswith("#") or not line.strip():
                        continue
                    if line[0] in " \t" and key:
                        fields[key] += " " + line.strip()
                        continue
                    if ":" in line:
                        key, val = line.split(":", 1)
                        key = key.strip().lower()
                        fields[key] = val.strip()
                if fields.get("enabled", "yes").lower() == "no":
                    continue
                if "deb" not in fields.get("types", "").split():
                    continue
                for uri in fields.get("uris", "").split():
                    out.append((uri, fields.get("suites", "").split()))
        elif path.endswith(".list"):
            for line in text.splitlines():
                line = line.split("#", 1)[0].strip()
                if not line.startswith("deb "):
                    continue
                parts = line.split()[1:]
                if parts and parts[0].startswith("["):
                    while parts and not parts[0].endswith("]"):
                        parts.pop(0)
                    parts = parts[1:]
                if len(parts) >= 2:
                    out.append((parts[0], [parts[1]]))
    return out


def pick_mirrors(sources, suite: str = SUITE) -> tuple[str, str]:
    """(debian mirror, security mirror) the machine itself uses; deb.debian.org when not found."""
    debian = security = None
    for uri, suites in sources:
        uri = uri.rstrip("/") + "/"
        if security is None and any(s == f"{suite}-security" for s in suites):
            security = uri
        elif debian is None and suite in suites:
            debian = uri
    return (debian or "http://deb.debian.org/debian/", security or "http://deb.debian.org/debian-security/")


def overlapping_interfaces(subnet: str, addrs, own_bridge: str | None = None) -> list[str]:
    """Interfaces (other than `own_bridge`) holding an IPv4 address inside `subnet`.

    `addrs` is `ip -j addr` output (list of {ifname, addr_info: [{family, local, prefixlen}]}).
    """
    net = parse_subnet(subnet)
    hits = []
    for link in addrs:
        ifname = link.get("ifname", "?")
        if own_bridge and ifname == own_bridge:
            continue
        for a in link.get("addr_info", []):
            if a.get("family") != "inet":
                continue
            theirs = ipaddress.IPv4Network(f"{a['local']}/{a.get('prefixlen', 32)}", strict=False)
            if theirs.overlaps(net):
                hits.append(f"{ifname} ({a['local']}/{a.get('prefixlen', 32)})")
    return hits


def inotify_needed(total_hosts: int) -> int:
    """fs.inotify.max_user_instances wanted for `total_hosts` systemd hosts (~8 each + the machine's)."""
    return max(128, 12 * total_hosts)


# ---------------------------------------------------------------- error texts

def err_not_root() -> M3Error:
    return M3Error(
        "the testbed needs root (network namespaces, bridges, mounts, cgroups): "
        "run it as root, e.g. `sudo m3deploy testbed up 3`"
    )


def err_missing_tools(missing: dict[str, str]) -> M3Error:
    pkgs = sorted(set(missing.values()))
    tools = ", ".join(sorted(missing))
    return M3Error(
        f"missing on this machine: {tools}. Fix: `m3deploy testbed up --install-deps ...` "
        f"or `apt-get install -y {' '.join(pkgs)}`"
    )


def err_subnet_taken(subnet: str, hits: list[str], name: str) -> M3Error:
    return M3Error(
        f"the testbed range {subnet} is already used on this machine by {', '.join(hits)}. "
        f"Fix: pick a free /24, e.g. `m3deploy testbed up N --name {name} --subnet 10.79.0.0/24`, "
        "or bring the other testbed down (`m3deploy testbed down --name OTHER`)"
    )


def err_lock_path(path: str, why: str) -> M3Error:
    return M3Error(
        f"the testbed lock {path} {why}; m3deploy opens it only as a regular file owned by root, never through a "
        f"symlink (another user could point it at a file root would then write). Fix: remove it (`sudo rm {path}`) "
        "and run again; m3deploy recreates it (0600, root)"
    )


def err_locked(holder: str, waited_s: float = 0) -> M3Error:
    return M3Error(
        f"another testbed command holds the lock {LOCK_PATH} ({holder or 'unknown holder'})"
        + (f" after waiting {waited_s:.0f} s" if waited_s else "") + ". "
        "Fix: wait for it to finish and run again; if no such command is running, the lock is "
        "released automatically when its process ends"
    )


def err_no_state(name: str) -> M3Error:
    fix = FIX_UP if name == DEFAULT_NAME else f"run `m3deploy testbed up 3 --name {name}`"
    return M3Error(f"no testbed named {name!r} (no {Paths(name).state}). Fix: {fix}")
