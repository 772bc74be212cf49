"""The layout holds (docs/ARCHITECTURE.md "Layers"): imports point one way (the import-linter contracts in
pyproject.toml), no import cycles between project modules, no product module knows about the test connector, and
each service kind is declared once, in the component registry (m3deploy/core/components.py), which the lists
below are derived from."""
from __future__ import annotations

import ast
import re
import shutil
import subprocess
import sys
from pathlib import Path

import grimp
import pytest

from m3deploy.core import components

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
    long = {}
    for p in [*(ROOT / "m3deploy" / "core").rglob("*.py"), *(ROOT / "m3deploy" / "deploy").rglob("*.py")]:
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    long[f"{p.relative_to(ROOT)}:{node.lineno} {node.name}"] = n
    assert long == {}


# ------------------------------------------------------------------------------------------- the components
# docs/ARCHITECTURE.md "Adding a service": each service kind is declared once, in m3deploy/core/components.py

def _role_module(c) -> str:
    return c.role.rsplit(".", 1)[0].split(".", 1)[1]  # "roles.etcd.deploy_etcd" -> "etcd"


SERVICE_ROLES = tuple(dict.fromkeys(_role_module(c) for c in components.all_components()))
# the calls that restart, reload or start a unit (roles/lifecycle.py owns them)
LIFECYCLE_CALLS = ("systemd.daemon_reload(", "restarted=True", "reloaded=True", "any_changed(", "ensure_started(",
                   "start_or_restart(")
# where a component's declaration must not be restated
DECLARED_ONCE_IN = [ROOT / "deploy.py", *(ROOT / "roles").glob("*.py"), *(ROOT / "m3deploy" / "deploy").glob("*.py")]


def _plans():
    """Plans that carry every feature a service kind comes with (the edge, the address, internal TLS, the planner
    with a standby host, monitoring, the mocker's scripted engine; a GPU plan for the GPU exporter)."""
    from m3deploy.core import build, inventory

    sim = {"m3_platform": "sim", "m3_engine": "mocker", "m3_serving": "dynamo", "m3_parallel": "tp1",
           "m3_monitor": True, "m3_edge": True, "m3_vip": "10.0.0.200/24", "m3_internal_tls": True}
    control = [(f"c{i}", {"m3_address": f"10.0.0.{90 + i}"}) for i in (1, 2, 3)]
    workers = [(f"w{i}", {"m3_address": f"10.0.0.{i}"}) for i in (1, 2, 3)]
    out = [build.build(inventory.hosts_from_dict({"control": control, "workers": workers}, all_data=sim), name="a")]
    planned = {**sim, "m3_planner": {"cooldown_s": 30}, "m3_edge": False, "m3_vip": None, "m3_internal_tls": False}
    out.append(build.build(inventory.hosts_from_dict({"control": control[:1], "workers": workers,
                                                      "standby": workers[2:]}, all_data=planned), name="b"))
    out.append(build.build(inventory.load_inventory(ROOT / "inventories" / "h200.py",
                                                    override_data={"m3_monitor": True}), name="h200"))
    return out


def test_every_kind_the_plan_makes_is_a_component_and_every_component_is_made():
    made = {s.kind for p in _plans() for h in p.hosts for s in h.services}
    assert made == {c.kind for c in components.all_components()}


def test_every_component_names_a_role_a_stage_a_template_and_checks_that_exist():
    import importlib

    from m3deploy.check import checks

    check_text = "".join(p.read_text() for p in (ROOT / "m3deploy" / "check").rglob("*.py"))
    for c in components.all_components():
        module, function = c.role.rsplit(".", 1)
        assert callable(getattr(importlib.import_module(module), function)), c.role
        assert c.stage in components.STAGES, c.kind
        assert (ROOT / "templates" / c.template).is_file(), c.template
        assert all((ROOT / x.source).is_file() for x in c.scripts), c.kind
        for check in c.checks:  # a verify group, or the prefix of check ids m3deploy/check makes
            assert check in checks.GROUPS or f'"{check}' in check_text or f'f"{check}/' in check_text, (c.kind, check)


def test_deploy_py_calls_the_components_roles_by_stage_from_the_registry():
    text = (ROOT / "deploy.py").read_text()
    assert [s for s in components.STAGES if f"_deploy(components.{_stage_name(s)})" in text] == list(components.STAGES)
    positions = [text.index(f"_deploy(components.{_stage_name(s)})") for s in components.STAGES]
    assert positions == sorted(positions)  # in the registry's order
    for c in components.all_components():  # no role of a component is called by name
        assert f"{c.role.rsplit('.', 1)[1]}()" not in text, c.role


def _stage_name(stage: str) -> str:
    return next(k for k in ("CONTROL", "WORKERS", "PLANNER", "MONITOR") if getattr(components, k) == stage)


def _literals(path: Path):
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            yield node.lineno, node.value
        elif isinstance(node, ast.JoinedStr):  # f"{UNIT_DIR}/haproxy.service": its literal parts
            for part in node.values:
                if isinstance(part, ast.Constant):
                    yield node.lineno, part.value.lstrip("/")


def _user_mappings(path: Path, kind_user: dict[str, str]):
    """A kind mapped to its registry user again: a dict entry {"etcd": "etcd"}, or USER = "<a component's user>"."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Dict):
            for k, v in zip(node.keys, node.values):
                if isinstance(k, ast.Constant) and isinstance(v, ast.Constant) and k.value in kind_user \
                        and kind_user[k.value] == v.value:
                    yield node.lineno, f"{k.value}: {v.value}"
        elif isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and any(
                isinstance(t, ast.Name) and "USER" in t.id for t in node.targets) \
                and node.value.value in set(kind_user.values()):
            yield node.lineno, f"USER = {node.value.value}"


def declared_twice(paths, root: Path = ROOT) -> list[str]:
    """What a module restates of the registry: a package name, a package unit, a unit template, a kind's user."""
    cs = components.all_components()
    names = {p for c in cs for p in c.packages} | {c.package_unit for c in cs if c.package_unit} | \
        {c.template for c in cs}
    kind_user = {c.kind: c.user for c in cs if c.user}
    out = []
    for path in paths:
        rel = path.relative_to(root)
        out += [f"{rel}:{n}: {v!r}" for n, v in _literals(path) if v in names]
        out += [f"{rel}:{n}: {v}" for n, v in _user_mappings(path, kind_user)]
    return out


def test_no_component_is_declared_in_a_second_place():
    """A package, its masked unit, a unit template or a kind's user is written in m3deploy/core/components.py only:
    deploy.py, the roles and m3deploy/deploy read it from there."""
    assert declared_twice(DECLARED_ONCE_IN) == []


def test_the_check_finds_a_restated_declaration(tmp_path):
    p = tmp_path / "restates.py"
    p.write_text('PACKAGE = "haproxy"\nMASK = f"{UNIT_DIR}/nats-server.service"\nT = "etcd.service.j2"\n'
                 'USERS = {"nats": "nats"}\nUSER = "nats"\n')
    assert len(declared_twice([p], root=tmp_path)) == 5


def test_no_role_imports_another_roles_private_names():
    """What roles share lives in public modules (roles/lifecycle.py, hostops.py, cluster_secrets.py, gpuhost.py,
    rolling.py): no product module imports a private roles module or a private name from one."""
    bad = []
    for path in PRODUCT:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("roles"):
                mods = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
                if any(part.startswith("_") for m in mods for part in m.split(".")[1:]):
                    bad.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert bad == []


def test_no_single_letter_module_alias():
    """`import x as y` names that explain themselves: no one-letter alias in product modules or unit/deploy tests."""
    paths = [*PRODUCT, *(ROOT / "tests" / "unit").rglob("*.py"), *(ROOT / "tests" / "deploy").rglob("*.py")]
    bad = [f"{p.relative_to(ROOT)}:{node.lineno} {a.name} as {a.asname}" for p in paths
           for node in ast.walk(ast.parse(p.read_text())) if isinstance(node, (ast.Import, ast.ImportFrom))
           for a in node.names if a.asname and len(a.asname) == 1]
    assert bad == []


@pytest.mark.parametrize("role", SERVICE_ROLES)
def test_service_roles_restart_only_through_the_one_lifecycle(role):
    """install -> configure -> activate: restart-when-changed is written once (roles/lifecycle.py `activate`)."""
    text = (ROOT / "roles" / f"{role}.py").read_text()
    assert "lifecycle.activate(" in text, f"roles/{role}.py does not activate its services through roles/lifecycle"
    found = [c for c in LIFECYCLE_CALLS if c in text]
    assert not found, f"roles/{role}.py restates the lifecycle ({', '.join(found)}): use roles/lifecycle.activate"
