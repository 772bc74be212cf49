"""m3deploy's own host operations, each checked with one fact where pyinfra's need two or three: files
(`put_text`: a 0600 file is created with its mode before its content is sent; `put_dir`, `ship_wheelhouse`),
directories, the system user, a unit running (`ensure_started`), one of m3deploy.deploy.hostfiles' files shipped as
`m3deploy render` shows it (`ship`), a cluster-wide barrier, and a command on another host of the run (`run_on`)."""
from __future__ import annotations

import hashlib
import shlex
from io import StringIO
from pathlib import Path

from pyinfra import host, state
from pyinfra.api import FactBase, StringCommand, operation
from pyinfra.api.command import FileUploadCommand

from m3deploy.core.connection import sudo_args
from m3deploy.deploy.hostfile import HostFile


class PathState(FactBase):
    """`<mode>:<user>:<group>:<sha256>` of a file, `dir:<mode>:<user>:<group>` of a directory, `-` if absent,
    `user:<uid>` for `user:NAME` — one command where pyinfra's own ops need two or three facts."""

    @staticmethod
    def default():
        return "-"

    def command(self, path):
        if path.startswith("user:"):
            return f"id -u {shlex.quote(path[5:])} 2>/dev/null | sed 's/^/user:/' || echo -"
        q = shlex.quote(path)
        return (f"if [ -d {q} ]; then stat -c 'dir:%a:%U:%G' {q}; "
                f"elif [ -f {q} ]; then printf '%s:' \"$(stat -c '%a:%U:%G' {q})\"; sha256sum < {q} | cut -d' ' -f1; "
                "else echo -; fi")

    def process(self, output):
        return (output[0].strip() if output else "") or "-"


def mode_digits(mode: str) -> str:
    return str(mode).lstrip("0") or "0"


@operation()
def put_text(text: str, dest: str, mode: str = "0644", user: str = "root", group: str = "root"):
    """Write `text` to `dest` with mode/owner, only when any differs. The file is created with its final mode
    before the content is sent, so a 0600 secret is never readable by others, not even for a moment."""
    want = f"{mode_digits(mode)}:{user}:{group}:{hashlib.sha256(text.encode()).hexdigest()}"
    have = host.get_fact(PathState, path=dest)
    if have == want:
        return
    q = shlex.quote(dest)
    if have.rsplit(":", 1)[-1] != want.rsplit(":", 1)[-1] or have == "-":
        yield (f"mkdir -p {shlex.quote(str(Path(dest).parent))} && touch {q} && chown {user}:{group} {q} && "
               f"chmod {mode} {q}")
        yield FileUploadCommand(StringIO(text), dest)
    yield f"chown {user}:{group} {q} && chmod {mode} {q}"


class DirDigest(FactBase):
    """sha256 over `<name> <sha256>` lines of the named files in a directory ("-" if any is missing)."""

    @staticmethod
    def default():
        return "-"

    def command(self, path, names):
        q = shlex.quote(path)
        return (f"cd {q} 2>/dev/null && sha256sum -- {' '.join(shlex.quote(n) for n in names)} 2>/dev/null "
                "| sha256sum | cut -d' ' -f1 || echo -")

    def process(self, output):
        return (output[0].strip() if output else "") or "-"


def dir_digest(files: dict[str, bytes]) -> str:
    """What DirDigest reports for a directory holding exactly these files' contents."""
    lines = "".join(f"{hashlib.sha256(files[n]).hexdigest()}  {n}\n" for n in files)
    return hashlib.sha256(lines.encode()).hexdigest()


@operation()
def put_dir(src: str, dest: str, names: tuple[str, ...], mode: str = "0644"):
    """Ship the named files of a controller directory, checked with one fact (a digest over all of them)."""
    contents = {n: (Path(src) / n).read_bytes() for n in names}
    if host.get_fact(DirDigest, path=dest, names=tuple(names)) == dir_digest(contents):
        return
    yield f"mkdir -p {shlex.quote(dest)} && chmod 0755 {shlex.quote(dest)}"
    for n in names:
        yield FileUploadCommand(str(Path(src) / n), f"{dest}/{n}")
        yield f"chmod {mode} {shlex.quote(f'{dest}/{n}')}"


@operation()
def ship_wheelhouse(archive: str, dest: str, mode: str = "0755"):
    """A wheelhouse in one transfer: the controller's tar (controller.artifacts.wheelhouse_archive) unpacked into a
    fresh `<dest>.new`, every file checked against its SHA256SUMS, then swapped for `dest` (stale wheels go with the
    old copy). A failed check leaves `dest` as it was and fails the operation."""
    from m3deploy.controller.artifacts import MANIFEST

    d, new, tar = (shlex.quote(p) for p in (dest, f"{dest}.new", f"{dest}.tar"))
    yield f"mkdir -p {shlex.quote(str(Path(dest).parent))} && rm -rf {new} {tar}"
    yield FileUploadCommand(archive, f"{dest}.tar")
    yield (f"install -d -m {mode} -o root -g root {new} && tar -xf {tar} -C {new} --no-same-owner && rm -f {tar} "
           f"&& (cd {new} && sha256sum --quiet --strict -c {MANIFEST}) && rm -rf {d} && mv {new} {d}")


class UnitState(FactBase):
    """`<active> <enabled>` of a systemd unit, in one command."""

    @staticmethod
    def default():
        return "unknown unknown"

    def command(self, unit):
        u_ = shlex.quote(unit)
        return f"echo $(systemctl is-active {u_} 2>/dev/null; systemctl is-enabled {u_} 2>/dev/null) | cut -c1-80"

    def process(self, output):
        return (output[0].strip() if output else "") or "unknown unknown"


@operation()
def ensure_started(unit: str):
    """The unit active and enabled (one fact; pyinfra's systemd.service needs two)."""
    state_ = host.get_fact(UnitState, unit=unit).split()
    active, enabled = (state_ + ["", ""])[:2]
    if enabled != "enabled":
        yield f"systemctl enable {shlex.quote(unit)}"
    if active != "active":
        yield f"systemctl start {shlex.quote(unit)}"


@operation()
def ensure_dir(path: str, mode: str = "0755", user: str = "root", group: str = "root"):
    """A directory with this mode and owner (one fact)."""
    if host.get_fact(PathState, path=path) == f"dir:{mode_digits(mode)}:{user}:{group}":
        return
    q = shlex.quote(path)
    yield f"mkdir -p {q} && chown {user}:{group} {q} && chmod {mode} {q}"


@operation()
def ensure_system_user(user: str, home: str):
    """A system user and group without login or home directory creation (one fact)."""
    if host.get_fact(PathState, path=f"user:{user}") != "-":
        return
    u_ = shlex.quote(user)
    yield (f"getent group {u_} >/dev/null || groupadd --system {u_}; "
           f"useradd --system --gid {u_} --home-dir {shlex.quote(home)} --no-create-home "
           f"--shell /usr/sbin/nologin {u_}")


# An apt install that fetches from the mirror is tried again, after a pause, when it fails: a mirror (or the proxy in
# front of it) that drops connections answers every one of apt's own immediate retries alike (seen on the testbed:
# "503 Connection closed" for docker.io on one host of three, twice in a cold run). pyinfra's own op retries.
APT_RETRIES = {"_retries": 2, "_retry_delay": 20}


def ship(f: HostFile, name: str = ""):
    """Put one of m3deploy.deploy.hostfiles' files on the host, exactly as `m3deploy render` shows it."""
    if f.link:
        from pyinfra.operations import files

        return files.link(name=name or f"Link {f.path} -> {f.link}", path=f.path, target=f.link)
    return put_text(name=name or f"Render {f.path}", text=f.text, dest=f.path, mode=f.mode, user=f.user,
                    group=f.group)


@operation()
def barrier():
    """An operation without commands: pyinfra runs it on every host before any later operation, and it
    never counts as a change."""
    return
    yield  # unreachable: makes this a generator, as pyinfra operations are


def run_on(host_name: str, cmd: str) -> tuple[bool, str]:
    """Run `cmd` on another host of this run, over pyinfra's own connection (at execution time): (ok, output)."""
    h = state.inventory.get_host(host_name)
    ok, out = h.run_shell_command(StringCommand(cmd), **sudo_args(h.data))  # as the host's operations (`_sudo`)
    return ok, "\n".join(out.output_lines) if hasattr(out, "output_lines") else str(out)


def journal_tail(unit: str, lines: int = 40):
    """A logs() callable for readiness: the unit's journal over the pyinfra connection."""
    def fetch() -> str:
        ok, out = host.run_shell_command(
            f"journalctl --no-pager -o short-iso -n {lines} -u {shlex.quote(unit)} 2>&1 || true",
            **sudo_args(host.data))
        return "\n".join(out.output_lines) if hasattr(out, "output_lines") else str(out)
    return fetch
