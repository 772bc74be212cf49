"""The layout holds (docs/ARCHITECTURE.md "Layers"): imports point one way (the import-linter contracts in
pyproject.toml), no import cycles between project modules, and no product module knows about the test connector."""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import grimp
import pytest

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = [ROOT / "deploy.py", *(ROOT / "m3deploy").rglob("*.py"), *(ROOT / "roles").rglob("*.py")]


def _cycles(graph) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.find_modules_directly_imported_by(v):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for m in sorted(graph.modules):
        if m not in index:
            visit(m)
    return out


def test_no_import_cycles():
    assert _cycles(grimp.build_graph("m3deploy", "roles", cache_dir=None)) == []  # no cache: a read-only checkout


def test_no_product_module_knows_the_fake_connector():
    hits = [f"{p.relative_to(ROOT)}:{i}" for p in PRODUCT
            for i, line in enumerate(p.read_text().splitlines(), 1) if re.search(r"fake", line, re.I)]
    assert hits == []


def test_import_contracts():
    # import-linter's console script beside this Python (its venv's bin/, on PATH or not), else on PATH
    here = Path(sys.executable).with_name("lint-imports")
    exe = str(here) if here.is_file() else shutil.which("lint-imports")
    if not exe:
        pytest.fail("import-linter is not installed: pip install -e '.[test]' (scripts/install-deps.sh --test)")
    r = subprocess.run([exe, "--no-cache"], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]


def test_test_file_basenames_are_unique():
    """tests/ has no __init__.py, so pytest (rootdir-relative, "prepend" import mode) imports each test file as a
    top-level module named by its basename: two `test_x.py` in different folders stop the whole run at collection
    ("import file mismatch"), in CI after every unit test passed. It happened twice; caught here in a second."""
    seen: dict[str, list[str]] = {}
    for p in sorted((ROOT / "tests").rglob("test_*.py")):
        seen.setdefault(p.name, []).append(str(p.relative_to(ROOT)))
    assert {n: ps for n, ps in seen.items() if len(ps) > 1} == {}


MAX_MODULE_LINES = 600  # a module one reader can hold (issue 22)
MAX_FUNCTION_LINES = 60  # in core/ and deploy/: decisions in short, named steps


def test_no_product_module_is_over_600_lines():
    long = {str(p.relative_to(ROOT)): n for p in PRODUCT if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES}
    assert long == {}


def test_no_function_in_core_or_deploy_is_over_60_lines():
    import ast

    long = {}
    for p in [*(ROOT / "m3deploy" / "core").rglob("*.py"), *(ROOT / "m3deploy" / "deploy").rglob("*.py")]:
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    long[f"{p.relative_to(ROOT)}:{node.lineno} {node.name}"] = n
    assert long == {}


# the roles of the plan's services, and the calls that restart, reload or start a unit (roles/_units.py owns them)
SERVICE_ROLES = ("etcd", "nats", "frontend", "workers", "monitor", "edge")
LIFECYCLE_CALLS = ("systemd.daemon_reload(", "restarted=True", "reloaded=True", "any_changed(", "ensure_started(",
                   "start_or_restart(")


@pytest.mark.parametrize("role", SERVICE_ROLES)
def test_service_roles_restart_only_through_the_one_lifecycle(role):
    """install -> configure -> activate: restart-when-changed is written once (roles/_units.py `activate`)."""
    text = (ROOT / "roles" / f"{role}.py").read_text()
    assert "u.activate(" in text, f"roles/{role}.py does not activate its services through roles/_units.activate"
    found = [c for c in LIFECYCLE_CALLS if c in text]
    assert not found, f"roles/{role}.py restates the lifecycle ({', '.join(found)}): use roles/_units.activate"
