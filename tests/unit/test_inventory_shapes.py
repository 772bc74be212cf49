"""Malformed inventories and output paths (issue 36): every shape pyinfra's loader would crash on (or silently read as
no hosts) is refused with one message naming the file, the group, the entry and the fix, under `m3deploy validate`
and under `pyinfra INVENTORY deploy.py` (config.py reads the inventory before pyinfra does); `render` and
`dashboards` into a folder that cannot be made say so. No output holds a traceback."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CONTROL = 'control = [("c1", {"ssh_hostname": "10.0.0.1", "m3_platform": "h200"})]\n'
SHAPES = {  # name: (the workers line, words the message must hold)
    "address-as-data": ('workers = [("h200-01", "10.0.0.2")]', ["group `workers`", "host entry 1", "not a dict"]),
    "one-tuple": ('workers = [("h200-01",)]', ["host entry 1", "a tuple of 1 item"]),
    "three-tuple": ('workers = [("h200-01", {}, "x")]', ["host entry 1", "a tuple of 3 item"]),
    "number": ("workers = [123]", ["host entry 1", "not a host name"]),
    "none": ('workers = ["w1", None]', ["host entry 2", "not a host name"]),
    "dict-host": ('workers = [{"h200-01": {}}]', ["host entry 1", "not a host name"]),
    "empty-name": ('workers = [("", {})]', ["host entry 1", "not a host name"]),
    "group-data-not-dict": ('workers = (["w1"], "h200")', ["group `workers`", "str data"]),
    "group-tuple-of-3": ('workers = (["w1"], {}, {})', ["group `workers`", "tuple of 3"]),
    "tuple-of-names": ('workers = ("h200-01", "10.0.0.2")', ["`workers` is a tuple", "a list"]),
    "non-string-key": ('workers = [("w1", {1: "x"})]', ["host entry 1", "not a string"]),
}
FIX = 'write a host as "name" or ("name", {'


def _inventory(tmp_path: Path, line: str) -> Path:
    inv = tmp_path / "mine.py"
    inv.write_text(CONTROL + line + "\n")
    return inv


def _m3deploy(*args: str, cwd=REPO) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "m3deploy.cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=120)


@pytest.mark.parametrize("shape", SHAPES)
def test_validate_names_the_entry_and_the_fix(shape, tmp_path):
    line, words = SHAPES[shape]
    r = _m3deploy("validate", str(_inventory(tmp_path, line)))
    out = r.stdout + r.stderr
    assert r.returncode == 2, out
    assert "Traceback" not in out and "mine.py" in out, out
    for w in words:
        assert w in out, (w, out)
    assert FIX in out or "a list" in out, out


@pytest.mark.parametrize("shape", ["address-as-data", "group-data-not-dict", "number", "tuple-of-names"])
def test_pyinfra_stops_before_loading_it_with_the_same_message(shape, tmp_path):
    pyinfra = shutil.which("pyinfra", path=os.path.dirname(sys.executable)) or shutil.which("pyinfra")
    line, words = SHAPES[shape]
    r = subprocess.run([pyinfra, "-y", str(_inventory(tmp_path, line)), "deploy.py"], cwd=REPO,
                       capture_output=True, text=True, timeout=120)
    out = r.stdout + r.stderr
    assert r.returncode != 0, out
    assert "Traceback" not in out and "internal exception" not in out, out
    assert "nothing was changed" in out and words[0] in out, out


@pytest.mark.parametrize("command", ["render", "dashboards"])
def test_an_outdir_that_cannot_be_made_is_named_with_the_fix(command, tmp_path):
    (tmp_path / "a-file").write_text("")
    r = _m3deploy(command, "inventories/h200.py", str(tmp_path / "a-file" / "out"))
    out = r.stdout + r.stderr
    assert r.returncode == 2, out
    assert "Traceback" not in out and "cannot write into OUTDIR" in out and "Not a directory" in out, out
