"""Controller caches under concurrency, as pyinfra and users really run them (m3deploy.controller.cachelock).

Contract (pyinfra 3.10, pyinfra_cli/util.py): deploy.py is loaded for every host at once, `state.pool.spawn(
load_file, host)` in gevent greenlets after `gevent.monkey.patch_all()` (pyinfra_cli/__init__.py); and two
processes may share one controller (two deploys, or `m3deploy artifacts` beside a deploy). Round 1's wheelhouse
was built by every greenlet at once, each swap deleting the directory another was reading.

These tests run real pip (`pip download --no-index --find-links DIR`, the `--from DIR` path of an air-gapped
controller) on tiny wheels made here, in several processes and in gevent greenlets at once.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

from m3deploy.controller import artifacts

REPO = Path(__file__).resolve().parents[2]
VERSION = "9.9.9"


def make_wheel(d: Path, name: str, version: str, requires=()) -> Path:
    """A minimal valid py3-none-any wheel (pip download accepts it)."""
    dist = f"{name.replace('-', '_')}-{version}"
    path = d / f"{dist}-py3-none-any.whl"
    meta = "Metadata-Version: 2.1\nName: %s\nVersion: %s\n%s" % (
        name, version, "".join(f"Requires-Dist: {r}\n" for r in requires))
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(f"{name.replace('-', '_')}/__init__.py", "")
        z.writestr(f"{dist}.dist-info/METADATA", meta)
        z.writestr(f"{dist}.dist-info/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                                              "Tag: py3-none-any\n")
        z.writestr(f"{dist}.dist-info/RECORD", "")
    return path


@pytest.fixture
def source(tmp_path) -> Path:
    """A directory of wheels an air-gapped controller brought: ai-dynamo and what it needs."""
    src = tmp_path / "brought"
    src.mkdir()
    make_wheel(src, "ai-dynamo", VERSION, [f"ai-dynamo-runtime=={VERSION}", "aisimulate==0.13.0",
                                           'tomli; python_version < "3.11"', "msgspec>=0.1"])
    make_wheel(src, "ai-dynamo-runtime", VERSION)
    make_wheel(src, "msgspec", "0.19.0", ["typing-extensions"])
    make_wheel(src, "typing-extensions", "4.12.0")
    make_wheel(src, "pip", "99.0")
    return src


def run_parallel(code: str, n: int, env: dict) -> list[dict]:
    """Start n Python processes at once on `code` (which prints one JSON line) and collect their results."""
    procs = [subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], cwd=REPO, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(n)]
    out = []
    for p in procs:
        so, se = p.communicate(timeout=300)
        assert p.returncode == 0, f"a concurrent builder failed ({p.returncode}):\n{se[-3000:]}"
        out.append(json.loads(so.strip().splitlines()[-1]))
    return out


def test_from_dir_builds_a_verified_wheelhouse_offline(tmp_path, monkeypatch, source):
    monkeypatch.setenv("M3DEPLOY_CACHE", str(tmp_path / "cache"))
    artifacts._checked.clear()
    logs = []
    d = artifacts.ensure_wheelhouse(VERSION, source=source, log=logs.append)
    assert d == artifacts.current_wheelhouse(VERSION)
    assert sorted(artifacts.read_manifest(d)) == sorted(p.name for p in source.glob("*.whl"))
    assert artifacts.verify_wheelhouse(d) == []
    # the placeholder aisimulate is skipped; markers evaluated for the hosts' Python 3.11
    assert artifacts.read_requirements(d) == [f"ai-dynamo-runtime=={VERSION}", "msgspec>=0.1"]
    assert any("--no-index --find-links" in m for m in logs), logs  # pip never asked an index


def test_the_planners_host_gets_its_imports_and_a_clear_fix_without_them(tmp_path, monkeypatch, source):
    """The planner's target (m3_planner planner='local'): aisimulate as the setting asks (ai-dynamo pins 0.13.0, on
    NVIDIA's index) and the planner's other imports join REQUIREMENTS, in a wheelhouse of their own; a controller
    that cannot get aisimulate stops with the fix before any host is touched."""
    monkeypatch.setenv("M3DEPLOY_CACHE", str(tmp_path / "cache"))
    artifacts._checked.clear()
    target = artifacts.Target(extra=("aisimulate==0.13.0.dev1", "scikit-learn"))
    with pytest.raises(artifacts.M3Error) as e:  # the source has neither yet
        artifacts.ensure_wheelhouse(VERSION, source=source, target=target)
    assert "m3_planner" in str(e.value) and "https://pypi.nvidia.com" in str(e.value) and "Fix:" in str(e.value)
    assert artifacts.current_wheelhouse(VERSION, target) is None
    make_wheel(source, "aisimulate", "0.13.0.dev1", ["numpy"])
    make_wheel(source, "numpy", "2.1.0")
    make_wheel(source, "scikit-learn", "1.9.1")
    d = artifacts.ensure_wheelhouse(VERSION, source=source, target=target)
    assert artifacts.read_requirements(d) == [f"ai-dynamo-runtime=={VERSION}", "msgspec>=0.1",
                                              "aisimulate==0.13.0.dev1", "scikit-learn"]
    assert {"aisimulate-0.13.0.dev1-py3-none-any.whl", "numpy-2.1.0-py3-none-any.whl"} <= set(artifacts.read_manifest(d))
    plain = artifacts.ensure_wheelhouse(VERSION, source=source)  # the other hosts': without them, apart
    assert plain.parent != d.parent and "aisimulate" not in " ".join(artifacts.read_manifest(plain))


def test_processes_and_greenlets_at_once_build_once_and_all_succeed(tmp_path, source):
    """3 processes, each with 4 gevent greenlets (pyinfra's model), ask for the same cold wheelhouse at once."""
    env = {**os.environ, "M3DEPLOY_CACHE": str(tmp_path / "cache"), "PYTHONPATH": str(REPO)}
    code = f"""
        from gevent import monkey; monkey.patch_all()
        import gevent, json
        from m3deploy.controller import artifacts
        logs = []
        jobs = [gevent.spawn(artifacts.ensure_wheelhouse, {VERSION!r}, source={str(source)!r},
                             log=logs.append) for _ in range(4)]
        gevent.joinall(jobs, raise_error=True)
        paths = {{str(j.value) for j in jobs}}
        print(json.dumps({{"paths": sorted(paths), "builds": sum(m.startswith("building the") for m in logs)}}))
    """
    results = run_parallel(code, 3, env)
    paths = {p for r in results for p in r["paths"]}
    assert len(paths) == 1, results  # every greenlet of every process got the same published copy
    assert sum(r["builds"] for r in results) == 1, results  # built once, by one greenlet of one process
    d = Path(paths.pop())
    assert artifacts.verify_wheelhouse(d) == []
    home = d.parent
    assert not list(home.glob(".build-*")), "a builder left its temporary directory"


def test_a_reader_keeps_its_copy_when_a_new_one_is_published(tmp_path, monkeypatch, source):
    monkeypatch.setenv("M3DEPLOY_CACHE", str(tmp_path / "cache"))
    artifacts._checked.clear()
    first = artifacts.ensure_wheelhouse(VERSION, source=source)
    held = {p.name: p.read_bytes() for p in first.iterdir() if p.is_file()}  # a host's greenlet is shipping these
    (first / artifacts.REQS_FILE).unlink()  # now it no longer verifies: the next caller must build anew
    artifacts._checked.clear()
    make_wheel(source, "typing-extensions", "4.13.0")  # and the new build differs
    second = artifacts.ensure_wheelhouse(VERSION, source=source)
    assert second != first and artifacts.current_wheelhouse(VERSION) == second
    assert first.is_dir() and all((first / n).read_bytes() == b for n, b in held.items() if n != artifacts.REQS_FILE)


def test_secrets_generated_once_across_processes(tmp_path):
    env = {**os.environ, "M3DEPLOY_CONFIG": str(tmp_path / "config"), "PYTHONPATH": str(REPO)}
    code = """
        import json
        from m3deploy.controller import secrets
        print(json.dumps(secrets.ensure_secrets("prod")))
    """
    results = run_parallel(code, 4, env)
    assert all(r == results[0] for r in results), "two deploys generated different passwords"
    path = tmp_path / "config" / "prod" / "secrets.json"
    assert json.loads(path.read_text()) == results[0]
    assert oct(path.stat().st_mode & 0o777) == "0o600"


def test_mock_model_published_whole_across_processes(tmp_path):
    env = {**os.environ, "M3DEPLOY_CACHE": str(tmp_path / "cache"), "PYTHONPATH": str(REPO)}
    code = """
        import json
        from m3deploy.controller import mockmodel
        d = mockmodel.ensure_model_dir()
        print(json.dumps({"dir": str(d), "files": sorted(p.name for p in d.iterdir())}))
    """
    results = run_parallel(code, 3, env)
    from m3deploy.controller import mockmodel

    assert len({r["dir"] for r in results}) == 1
    assert all(r["files"] == sorted(mockmodel.FILES) for r in results)
