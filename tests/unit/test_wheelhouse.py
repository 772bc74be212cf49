import hashlib
import shutil
import subprocess
import zipfile
from pathlib import Path

import pytest

from m3deploy.controller import artifacts
from m3deploy.core.errors import M3Error


def fake_wheelhouse(d):
    d.mkdir()
    (d / "a-1.0-py3-none-any.whl").write_bytes(b"wheel a")
    (d / "b-2.0-cp311-cp311-manylinux_2_17_x86_64.whl").write_bytes(b"wheel b")
    (d / artifacts.REQS_FILE).write_text("a\nb>=2\n")
    artifacts.write_manifest(d)
    return d


def test_manifest_roundtrip_and_verify(tmp_path):
    d = fake_wheelhouse(tmp_path / "wh")
    sums = artifacts.read_manifest(d)
    assert sums["a-1.0-py3-none-any.whl"] == hashlib.sha256(b"wheel a").hexdigest()
    assert artifacts.verify_wheelhouse(d) == []
    assert artifacts.read_requirements(d) == ["a", "b>=2"]
    # sha256sum format, so `sha256sum -c SHA256SUMS` works on hosts
    assert (d / "SHA256SUMS").read_text().splitlines()[0].split("  ")[1] == "a-1.0-py3-none-any.whl"


def test_verify_finds_changed_missing_and_unlisted(tmp_path):
    d = fake_wheelhouse(tmp_path / "wh")
    (d / "a-1.0-py3-none-any.whl").write_bytes(b"tampered")
    (d / "b-2.0-cp311-cp311-manylinux_2_17_x86_64.whl").unlink()
    (d / "c-3.0-py3-none-any.whl").write_bytes(b"extra")
    problems = "\n".join(artifacts.verify_wheelhouse(d))
    assert "a-1.0" in problems and "sha256 differs" in problems
    assert "b-2.0" in problems and "missing" in problems
    assert "c-3.0" in problems and "not listed" in problems
    assert artifacts.verify_wheelhouse(d, deep=False)  # presence problems even without hashing


def test_bad_manifest_is_a_clear_error(tmp_path):
    d = tmp_path / "wh"
    d.mkdir()
    with pytest.raises(M3Error, match="missing"):
        artifacts.read_manifest(d)
    (d / "SHA256SUMS").write_text("nothex  x.whl\n")
    with pytest.raises(M3Error, match="not a sha256sum line"):
        artifacts.read_manifest(d)


def test_ensure_is_a_noop_when_complete(tmp_path, monkeypatch):
    monkeypatch.setenv("M3DEPLOY_CACHE", str(tmp_path))
    home = artifacts.wheelhouse_dir("9.9.9")
    home.mkdir(parents=True)
    d = artifacts.publish_wheelhouse(fake_wheelhouse(home / ".build-x"), "9.9.9")
    assert d.parent == home and (home / artifacts.CURRENT).resolve() == d.resolve()
    monkeypatch.setattr(artifacts, "_pip_download", lambda *a, **k: pytest.fail("downloaded again"))
    assert artifacts.ensure_wheelhouse("9.9.9") == d


def test_install_commands_are_offline():
    cmds = artifacts.install_commands("1.6.1", "/opt/m3/wheelhouse/dynamo-1.6.1", "/opt/m3/dynamo-1.6.1",
                                      requirements=["ai-dynamo-runtime==1.6.1", "aiohttp<4,>=3.14.3"])
    assert cmds[0] == "python3 -m venv --without-pip /opt/m3/dynamo-1.6.1"
    for c in cmds[1:]:
        assert "--no-index" in c and "--find-links /opt/m3/wheelhouse/dynamo-1.6.1" in c
        assert "--no-compile" in c  # byte-compiling all 7,792 modules was 2/3 of a host's venv build
    assert "--no-deps" in cmds[-1] and "ai-dynamo==1.6.1" in cmds[-1]
    assert cmds[2].count("ai-dynamo-runtime==1.6.1") == 1


def test_archive_is_one_reproducible_tar_of_what_the_manifest_lists(tmp_path):
    """A host gets the wheelhouse in one transfer (roles/artifacts.py ship_wheelhouse): the tar holds every listed
    wheel, SHA256SUMS and REQUIREMENTS, nothing else, and two builds of the same wheels are the same bytes."""
    import tarfile

    digests = []
    for d in (tmp_path / "a", tmp_path / "b"):
        d.mkdir()
        (d / "x-1.0-py3-none-any.whl").write_bytes(b"wheel x")
        (d / "pip-25.0-py3-none-any.whl").write_bytes(b"wheel pip")
        (d / artifacts.REQS_FILE).write_text("x==1.0\n")
        artifacts.write_manifest(d)
        (d / "stray.txt").write_text("not in the manifest")
        out = artifacts.wheelhouse_archive(d)
        assert out == d / artifacts.ARCHIVE and artifacts.wheelhouse_archive(d) == out  # made once
        digests.append(artifacts.sha256_file(out))
        with tarfile.open(out) as t:
            assert sorted(t.getnames()) == sorted(["x-1.0-py3-none-any.whl", "pip-25.0-py3-none-any.whl",
                                                   artifacts.MANIFEST, artifacts.REQS_FILE])
            assert t.extractfile("x-1.0-py3-none-any.whl").read() == b"wheel x"
        assert not artifacts.verify_wheelhouse(d)  # the archive beside the wheels is no unlisted wheel
    assert digests[0] == digests[1]


def test_a_wheel_rewritten_after_its_check_is_hashed_again(tmp_path, monkeypatch):
    """ensure_wheelhouse skips re-hashing files unchanged since they last hashed right (a re-run's cost), but a
    wheel rewritten since then is hashed again and the copy is not used."""
    monkeypatch.setenv("M3DEPLOY_CACHE", str(tmp_path / "cache"))
    artifacts._checked.clear()
    work = artifacts.wheelhouse_dir("9.9.9") / ".build-t"
    work.mkdir(parents=True)
    (work / "a-1.0-py3-none-any.whl").write_bytes(b"good")
    (work / artifacts.REQS_FILE).write_text("a==1.0\n")
    artifacts.write_manifest(work)
    pub = artifacts.publish_wheelhouse(work, "9.9.9")
    assert artifacts.ensure_wheelhouse("9.9.9") == pub and (pub / artifacts.VERIFIED).is_file()
    artifacts._checked.clear()
    assert artifacts.ensure_wheelhouse("9.9.9") == pub  # unchanged: served without hashing
    (pub / "a-1.0-py3-none-any.whl").write_bytes(b"evil")
    artifacts._checked.clear()
    monkeypatch.setattr(artifacts, "_pip_download", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("rebuild")))
    with pytest.raises(RuntimeError, match="rebuild"):  # the corrupt copy is not used: a rebuild starts
        artifacts.ensure_wheelhouse("9.9.9")


def _wheel(directory, name: str, version: str, module: str) -> None:
    """A minimal pure-Python wheel (PEP 427): one module, METADATA, WHEEL, RECORD."""
    dist = f"{name.replace('-', '_')}-{version}"
    files = {f"{module}.py": f"VERSION = {version!r}\n",
             f"{dist}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
             f"{dist}.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: m3deploy-test\nRoot-Is-Purelib: true\n"
                                        "Tag: py3-none-any\n"}
    with zipfile.ZipFile(directory / f"{dist}-py3-none-any.whl", "w") as z:
        for n, text in files.items():
            z.writestr(n, text)
        z.writestr(f"{dist}.dist-info/RECORD", "".join(f"{n},,\n" for n in [*files, f"{dist}.dist-info/RECORD"]))


def test_install_commands_build_a_working_venv_offline_with_the_real_pip(tmp_path):
    """The commands a host runs (roles/artifacts.py), run for real: the distribution's python3 and the pip wheel
    Debian/Ubuntu ship with python3-venv (/usr/share/python-wheels, what scripts/install-deps.sh installs), on a
    wheelhouse of stand-in ai-dynamo wheels. pip's own argparse decides whether an option is where it belongs
    (`--no-compile` is an `install` option: before the subcommand pip refuses it)."""
    bundled = sorted(Path("/usr/share/python-wheels").glob("pip-*.whl"))
    if not bundled:
        pytest.fail("no pip wheel in /usr/share/python-wheels: apt-get install python3-venv "
                    "(scripts/install-deps.sh does)")
    wh = tmp_path / "wh"
    wh.mkdir()
    shutil.copy(bundled[-1], wh)
    _wheel(wh, "ai-dynamo-runtime", "1.6.1", "m3_stand_in_runtime")
    _wheel(wh, "ai-dynamo", "1.6.1", "m3_stand_in_dynamo")
    venv = tmp_path / "venv"
    cmds = artifacts.install_commands("1.6.1", str(wh), str(venv), python="/usr/bin/python3",
                                      requirements=["ai-dynamo-runtime==1.6.1"])
    for c in cmds:
        r = subprocess.run(["bash", "-c", c], capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"})
        assert r.returncode == 0, f"{c}\n{r.stdout}{r.stderr}"
    site = next((venv / "lib").glob("python3*/site-packages"))
    assert not list(site.rglob("m3_stand_in_*.pyc"))  # not byte-compiled at install (install_commands' docstring)
    r = subprocess.run([str(venv / "bin" / "python"), "-B", "-c", "import m3_stand_in_dynamo, m3_stand_in_runtime"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
