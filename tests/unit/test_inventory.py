"""m3deploy.core.inventory reads inventory files exactly as pyinfra 3.10 does (same hosts, groups, data)."""
from __future__ import annotations

from pathlib import Path

import pytest

from m3deploy.core import inventory
from m3deploy.core.errors import M3Error

ROOT = Path(__file__).resolve().parents[2]
FILES = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "inventories").glob("*.py") if p.stem != "testbed")
FILES.append("benchmarks/inventories/gb200_nvl72x8.py")


def pyinfra_view(path, override=None):
    from pyinfra.api import State
    from pyinfra.context import ctx_state
    from pyinfra_cli.inventory import make_inventory

    extra = [str((ROOT / path).resolve().parent.parent / "group_data")]
    with ctx_state.use(State()):
        inv = make_inventory(path, override_data=override or {}, cwd=str(ROOT), group_data_directories=extra)
    return [(h.name, tuple(h.groups), {k: v for k, v in h.data.dict().items()}) for h in inv]


@pytest.mark.parametrize("path", FILES)
def test_same_as_pyinfra(path, monkeypatch):
    monkeypatch.chdir(ROOT)
    extra = [str((ROOT / path).resolve().parent.parent / "group_data")]
    ours = inventory.load(path, {"m3_state": "absent"}, cwd=str(ROOT), group_data_directories=extra)
    theirs = pyinfra_view(path, {"m3_state": "absent"})
    assert [n for n, _, _ in ours] == [n for n, _, _ in theirs]
    for (n, g1, d1), (_, g2, d2) in zip(ours, theirs):
        assert set(g1) == {str(g) for g in g2}, n
        m3 = {k: v for k, v in d2.items() if k.startswith(("m3_", "ssh_"))}
        assert {k: v for k, v in d1.items() if k.startswith(("m3_", "ssh_"))} == m3, n
        assert d1["m3_state"] == "absent"


def _load_error(tmp_path, text: str) -> tuple[str, str]:
    """(the inventory's path, the message loading it raised)."""
    bad = tmp_path / "bad.py"
    bad.write_text(text)
    with pytest.raises(M3Error) as e:
        inventory.load(bad)
    return str(bad), str(e.value)


def test_errors_name_the_file(tmp_path):
    path, err = _load_error(tmp_path, "workers = [('a', {})]\nraise RuntimeError('boom')\n")
    assert f"{path}:2: RuntimeError: boom" in err


def test_duplicate_host_names_are_refused(tmp_path):
    """pyinfra merges a host listed twice in one group into one (the second's data wins): refused instead."""
    path, err = _load_error(tmp_path, 'workers = [("w1", {"m3_address": "10.0.0.2"}), ("w1", {"m3_address": "10.0.0.3"})]\n')
    assert err.startswith(path) and "host w1 is listed 2 times in group `workers`" in err and "Fix" in err
