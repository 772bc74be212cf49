"""Controller caches that are safe under concurrency: one builder, atomic publish, no deletion under a reader.

pyinfra 3 loads deploy.py for every host at once, in gevent greenlets (pyinfra_cli/util.py:
`state.pool.spawn(load_file, host)`, after `gevent.monkey.patch_all()` in pyinfra_cli/__init__.py), and two
processes can share one controller (two deploys of two clusters, `m3deploy artifacts` beside a deploy). So every
controller cache (wheelhouse, mock model, image archives, secrets store) is built under `locked(path)`:

- an in-process lock first (a `threading.Lock`, which gevent's monkey-patching makes cooperative: a waiting
  greenlet yields to the one building), then
- an `fcntl.flock` on `<path>.lock` for other processes, taken non-blocking and polled with `time.sleep`
  (a blocking flock would stop every greenlet of the process, the holder included).

Builders write into a private temporary path and publish with one `rename`/`os.replace`; a complete copy is never
deleted, since a reader (another host's greenlet, another process) may be reading it.
"""
from __future__ import annotations

import contextlib
import fcntl
import os
import threading
import time
from pathlib import Path

from m3deploy.core.errors import M3Error

DEFAULT_TIMEOUT_S = 1800.0  # a cold wheelhouse build downloads ~250 MB
_POLL_S = 0.2

_guard = threading.Lock()
_inproc: dict[str, threading.Lock] = {}


def _inproc_lock(key: str) -> threading.Lock:
    with _guard:
        return _inproc.setdefault(key, threading.Lock())


@contextlib.contextmanager
def locked(path: str | os.PathLike, what: str = "", timeout_s: float | None = None, log=None):
    """Hold the build lock of the cache entry `path` (the lock file is `<path>.lock`, beside it).

    Waits for another builder (greenlet, thread or process) up to `timeout_s`; says once that it waits."""
    lock_path = Path(str(path) + ".lock")
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    timeout_s = DEFAULT_TIMEOUT_S if timeout_s is None else timeout_s
    deadline = time.monotonic() + timeout_s
    inproc = _inproc_lock(str(lock_path.resolve()))
    while not inproc.acquire(timeout=_POLL_S):
        if time.monotonic() > deadline:
            raise _timeout(lock_path, what, timeout_s)
    try:
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            said = False
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        raise _timeout(lock_path, what, timeout_s) from None
                    if log and not said:
                        log(f"waiting for another process to finish {what or path} ({lock_path})")
                        said = True
                    time.sleep(_POLL_S)
            try:
                yield
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)
    finally:
        inproc.release()


def _timeout(lock_path: Path, what: str, timeout_s: float) -> M3Error:
    return M3Error(f"waited {timeout_s:.0f} s for the lock {lock_path} ({what or 'a controller cache'}); another "
                   f"m3deploy process still holds it. Fix: let it finish (see `fuser {lock_path}`), then run again")


def publish_symlink(link: Path, target_name: str) -> None:
    """Point `link` at `target_name` (a sibling) atomically: readers see the old or the new target, never none."""
    tmp = link.with_name(f".{link.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    os.symlink(target_name, tmp)
    os.replace(tmp, link)


def build_dir_once(pointer: Path, what: str, cached, build, digest, names) -> Path:
    """The directory a small pointer file names, built at most once on this controller (the mock and tiny models).

    `cached()` is the complete published directory or None; else, under the lock, `build()` gives the files
    (name -> text or bytes), written into a private directory and published as `<pointer's folder>/<digest[:16]>`
    with one rename (an incomplete one there is set aside, never deleted under a reader); then the pointer is
    replaced atomically. `names`: the files a complete directory holds."""
    import tempfile

    root = pointer.parent
    with locked(pointer, what):
        d = cached()
        if d is None:
            files = build()
            d = root / digest(files)[:16]
            if not all((d / n).is_file() for n in names):
                root.mkdir(parents=True, exist_ok=True)
                work = Path(tempfile.mkdtemp(prefix=".build-", dir=root))
                os.chmod(work, 0o755)
                for name, data in files.items():
                    (work / name).write_bytes(data if isinstance(data, bytes) else data.encode())
                if d.exists():  # incomplete: set aside, never deleted under a reader
                    d.rename(root / f".broken-{d.name}-{os.getpid()}-{time.time_ns()}")
                work.rename(d)
            tmp = pointer.with_name(f".{pointer.name}.{os.getpid()}.tmp")
            tmp.write_text(d.name + "\n")
            os.replace(tmp, pointer)
    return d
