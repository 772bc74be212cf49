"""Read a pyinfra inventory file and its group_data/ the way `pyinfra` does, without importing pyinfra.

`m3deploy plan` must answer in well under a second on a 145-host cluster; importing pyinfra's CLI (paramiko,
gevent's monkey-patching) alone costs a third of that. This module follows pyinfra 3.10's rules
(pyinfra_cli/inventory.py: make_inventory_from_files; pyinfra/api/inventory.py; HostData precedence), and
tests/unit/test_inventory.py checks it gives the same hosts, groups and data as pyinfra's own loader on
every shipped inventory.

Precedence, highest first: --data overrides, host data, group data (later groups win; the file-named group
comes after the inventory's own groups), the `all` group's data.
"""
from __future__ import annotations

import ast
import json
import os
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from m3deploy.core.errors import M3Error, plural


def parse_cli_arg(arg):
    """One `--data KEY=VALUE` value, parsed exactly as pyinfra 3.10 parses it (pyinfra_cli/util.py
    `parse_cli_arg`, called from pyinfra_cli/cli.py `_set_override_data`): "true"/"false" in any case -> bool,
    then int(), then JSON, else the string. `m3deploy plan --data` and `pyinfra --data` must plan the same
    cluster; tests/unit/test_bad_inputs.py checks this against pyinfra's own function."""
    if isinstance(arg, list):
        return [parse_cli_arg(a) for a in arg]
    if arg.lower() == "false":
        return False
    if arg.lower() == "true":
        return True
    try:
        return int(arg)
    except (TypeError, ValueError):
        pass
    try:
        return json.loads(arg)
    except ValueError:
        pass
    return arg


def _source(path: Path) -> str:
    """The file's text; a file that is not UTF-8 is refused with the line of its first bad byte."""
    raw = path.read_bytes()
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw[:e.start].count(b"\n") + 1
        raise M3Error(f"{path}:{line}: not UTF-8 text (byte {raw[e.start]:#04x}). Fix: save the file as UTF-8 "
                      "(a spreadsheet export is often Latin-1 or UTF-16)") from None


def _exec(path: Path) -> dict[str, Any]:
    try:
        code = compile(_source(path), str(path), "exec")
    except SyntaxError as e:
        raise M3Error(f"{path}:{e.lineno}: Python syntax error: {e.msg}. Fix: correct that line "
                      "(inventory and group_data files are Python)") from None
    scope: dict[str, Any] = {"__file__": str(path)}
    try:
        exec(code, scope)
    except M3Error:
        raise
    except Exception as e:
        tb = traceback.extract_tb(e.__traceback__)
        line = next((f.lineno for f in reversed(tb) if f.filename == str(path)), None)
        raise M3Error(f"{path}{f':{line}' if line else ''}: {type(e).__name__}: {e}") from None
    return scope


def _imported_names(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(_source(path))):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                names.add((alias.asname or alias.name).split(".")[0])
    return names


def _is_group(key: str, value: Any) -> bool:
    if key.startswith("_"):
        return False
    if isinstance(value, tuple):
        value = value[0] if value else None
    return isinstance(value, list)


def _split(item):
    return item if isinstance(item, tuple) else (item, {})


def group_data_dirs(inventory: Path, cwd: Path, extra: list[str] | None = None) -> list[Path]:
    dirs = [cwd / "group_data"]
    inv_dir = inventory.resolve().parent
    if str(inv_dir) != str(cwd):
        dirs.append(inv_dir / "group_data")
    dirs += [Path(d) for d in extra or []]
    return dirs


def _group_data(dirs: list[Path], sources: dict[str, dict] | None = None) -> dict[str, dict]:
    """{group: data}; `sources` gets {group: {key: file}}."""
    out: dict[str, dict] = {}
    sources = {} if sources is None else sources
    for d in dirs:
        if not d.exists():
            continue
        files = [d] if d.is_file() else [d / f for f in os.listdir(d)]
        for f in files:
            if f.suffix != ".py":
                continue
            attrs = _exec(f)
            keys = attrs["__all__"] if "__all__" in attrs else [k for k in attrs if k not in _imported_names(f)]
            data = {k: v for k, v in attrs.items() if k in keys and not k.startswith("__")}
            out.setdefault(f.stem, {}).update(data)
            sources.setdefault(f.stem, {}).update(dict.fromkeys(data, str(f)))
    return out


def load(path: str | os.PathLike, override_data: Mapping[str, Any] | None = None, cwd: str | None = None,
         group_data_directories: list[str] | None = None) -> list[tuple[str, tuple[str, ...], dict[str, Any]]]:
    """-> [(host name, groups in pyinfra's order, merged data)] in inventory order."""
    return [(n, g, d) for n, g, d, _ in _load(path, override_data, cwd, group_data_directories)]


def _load(path, override_data=None, cwd=None, group_data_directories=None):
    """load(), each host also with {key: the file (or `--data`) its value came from}."""
    path = Path(path)
    if not path.is_file():
        raise M3Error(f"inventory file {path} does not exist (shipped inventories are in inventories/)")
    attrs = _exec(path)
    groups: dict[str, Any] = {k: v for k, v in attrs.items() if _is_group(k, v)}
    _refuse_bad_shapes(path, attrs, groups)  # then _refuse_duplicates
    file_group = file_group_name(path)

    all_hosts, all_data = _all_group(groups)
    if file_group not in groups:
        groups[file_group] = list(all_hosts)

    gdata, gsources = _read_group_data(path, groups, cwd, group_data_directories, override_data)
    inv = str(path)
    resolved: dict[str, tuple[list, dict]] = {}
    src: dict[str, dict] = {}
    for g, members in groups.items():
        data: dict[str, Any] = {}
        if isinstance(members, tuple):
            members, data = members
            data = dict(data)
        src[g] = {**dict.fromkeys(data, inv), **gsources.get(g, {})}
        data.update(gdata.pop(g, {}))
        resolved[g] = (members, data)
    all_src = {**dict.fromkeys(all_data, inv), **gsources.get("all", {})}
    all_data = {**dict(all_data), **gdata.pop("all", {})}
    for g, data in gdata.items():  # group_data for groups the inventory does not define
        resolved[g] = ([], data)
        src[g] = gsources.get(g, {})

    host_data: dict[str, dict] = {}
    host_groups: dict[str, list[str]] = {}
    listed: dict[str, list[tuple[str, dict]]] = {}
    for g, (members, _) in resolved.items():
        for m in members:
            name, data = _split(m)
            host_data.setdefault(name, {}).update(data)
            host_groups.setdefault(name, []).append(g)
            listed.setdefault(name, []).append((g, dict(data)))
    _refuse_conflicts(path, listed)
    for m in all_hosts:
        name, data = _split(m)
        host_data.setdefault(name, {}).update(data)

    out = []
    for m in all_hosts:
        name = _split(m)[0]
        merged, sources = dict(all_data), dict(all_src)
        for g in host_groups.get(name, []):
            merged.update(resolved[g][1])
            sources.update(src[g])
        merged.update(host_data.get(name, {}))
        sources.update(dict.fromkeys(host_data.get(name, {}), inv))
        merged.update(override_data or {})
        sources.update(dict.fromkeys(override_data or {}, "--data"))
        out.append((name, tuple(host_groups.get(name, [])), merged, sources))
    return out


SHIPPED = Path(__file__).resolve().parents[2] / "inventories"  # the checkout's own (beside m3deploy/)


def _read_group_data(path: Path, groups, cwd, extra, override_data) -> tuple[dict[str, dict], dict[str, dict]]:
    """({group: data}, {group: {key: file}}) of every group_data file pyinfra reads for `path`; a borrowed
    m3_cluster refused (unless --data sets it)."""
    gsources: dict[str, dict] = {}
    gdirs = group_data_dirs(path, Path(cwd or os.getcwd()), extra)
    gdata = _group_data(gdirs, gsources)
    if "m3_cluster" not in (override_data or {}):
        _refuse_borrowed_cluster_name(path, set(groups) | {"all"}, gdata, gsources, gdirs)
    return gdata, gsources


def _inventory_stems(path: Path, gdirs: list[Path]) -> dict[str, Path]:
    """{name: file} of the inventory files beside `path`, in the inventories/ beside each group_data directory (the
    repository's layout: the shipped inventories and the user's own), and m3deploy's shipped ones (SHIPPED)."""
    out: dict[str, Path] = {}
    for d in [path.resolve().parent] + [g.resolve().parent / "inventories" for g in gdirs] + [SHIPPED]:
        if d.is_dir():
            for f in sorted(d.glob("*.py")):
                out.setdefault(file_group_name(f), f)
    return out


def _refuse_borrowed_cluster_name(path: Path, groups: set[str], gdata: Mapping[str, dict],
                                  gsources: Mapping[str, dict], gdirs: list[Path]) -> None:
    """A group_data file of this inventory (its own groups, `all`) whose m3_cluster names another inventory's
    cluster: a copy of group_data/h200.py as group_data/mylab.py keeps `m3_cluster = "h200"`, and the cluster's name
    keys the controller's secrets store, CA and deploy record, so the two clusters would share them (and each would
    offer the other's hosts to `m3deploy prune`)."""
    own = file_group_name(path)
    owner: dict[str, str] = {}  # cluster name -> the inventory it belongs to
    for stem in _inventory_stems(path, gdirs):
        if stem != own:
            owner[stem] = stem
            if "m3_cluster" in gdata.get(stem, {}):
                owner[str(gdata[stem]["m3_cluster"])] = stem
    for g in sorted(groups):
        if "m3_cluster" not in gsources.get(g, {}):
            continue
        value, where = str(gdata[g]["m3_cluster"]), gsources[g]["m3_cluster"]
        other = owner.get(value)
        if other and other != own and value != own:
            raise M3Error(
                f"{where}: key m3_cluster = {value!r} is the name of inventory {other}'s cluster, not of {path} "
                f"(a copy of group_data/{other}.py?). The name keys the controller's secrets, CA and deploy record "
                f"(<M3DEPLOY_CONFIG>/<name>/): the two clusters would share them. Fix: remove that line from {where} "
                f"(the cluster is then named {own!r}, after its file) or set m3_cluster = {own!r}")


def _top_level_names(path: Path) -> set[str]:
    """The names an inventory file assigns at its top level (its groups among them), read without running it."""
    try:
        tree = ast.parse(_source(path))
    except (SyntaxError, M3Error):
        return set()
    return {t.id for node in tree.body if isinstance(node, (ast.Assign, ast.AnnAssign))
            for t in (node.targets if isinstance(node, ast.Assign) else [node.target])
            if isinstance(t, ast.Name) and not t.id.startswith("_")}


def unmatched_group_data(path: str | os.PathLike, cwd: str | None = None) -> list[str]:
    """A note for each group_data file this inventory reads none of: its name is no group of the inventory (its
    own, the file's name, `all`) nor any inventory's beside it (group_data/h200.py is inventories/h200.py's,
    group_data/control.py the `control` group's of the inventories that have one). Such a
    file is ignored silently by pyinfra; a validation error names it, since its keys are likely the missing ones."""
    path = Path(path)
    gdirs = group_data_dirs(path, Path(cwd or os.getcwd()), [str(path.resolve().parent.parent / "group_data")])
    groups = {k for k, v in _exec(path).items() if _is_group(k, v)} | {file_group_name(path), "all"}
    others = _inventory_stems(path, gdirs)
    known = groups | set(others) | {n for f in others.values() for n in _top_level_names(f)}
    seen, out = set(), []
    for d in gdirs:
        for f in sorted(d.glob("*.py")) if d.is_dir() else []:
            if f.stem not in known and f.resolve() not in seen:
                seen.add(f.resolve())
                out.append(f"note: {f} matches no group of {path} ({', '.join(sorted(groups))}), so none of its "
                           f"keys apply. Fix: name it after the group it is for, e.g. "
                           f"{f.parent / (file_group_name(path) + '.py')} for every host of {path}")
    return out


def _all_group(groups: dict[str, Any]) -> tuple[list, dict[str, Any]]:
    """pyinfra's `all` group (taken out of `groups`): the inventory's own, with its data, else every host of every
    group in order."""
    if "all" in groups:
        all_hosts = groups.pop("all")
        return (list(all_hosts[0]), dict(all_hosts[1])) if isinstance(all_hosts, tuple) else (all_hosts, {})
    names: list = []
    for members in groups.values():
        for m in members[0] if isinstance(members, tuple) else members:
            if _split(m)[0] not in names:
                names.append(_split(m)[0])
    return names, {}


HOST_SHAPE = ('write a host as "name" or ("name", {"key": value, ...}), e.g. ("h200-01", {"ssh_hostname": '
              '"10.0.0.2"}); a group as a list of hosts, or ([hosts], {group data})')


def _refuse_bad_shapes(path: Path, attrs: Mapping[str, Any], groups: Mapping[str, Any]) -> None:
    """Every entry pyinfra 3.10 would read as a host or a group, in the shapes it takes (pyinfra/api/inventory.py
    make_hosts_and_groups): a host is a name or (name, dict), a group a list of hosts or (list, dict). Anything
    else crashes pyinfra's loader with a traceback ("dictionary update sequence element #0 ..."), so it is refused
    here, naming the file, the group, the entry and the fix. A top-level tuple of names (`workers = ("a", "b")`)
    is no group to pyinfra (silently no hosts): refused too."""
    problems = []
    for g, members in groups.items():
        if isinstance(members, tuple):
            if len(members) != 2 or not isinstance(members[1], dict):
                problems.append(f"{path}: group `{g}` is a tuple of {plural(len(members), 'item')}, "
                                f"{type(members[1]).__name__ if len(members) > 1 else ''} data; {HOST_SHAPE}")
                continue
            members = members[0]
        for i, m in enumerate(members, 1):
            name, data = (m[0], m[1]) if isinstance(m, tuple) and len(m) == 2 else (m, {})
            if isinstance(m, tuple) and len(m) != 2:
                why = f"a tuple of {plural(len(m), 'item')}"
            elif not isinstance(name, str) or not name.strip():
                why = f"its name is {name!r} ({type(name).__name__}), not a host name"
            elif not isinstance(data, dict):
                why = f"its data is {data!r} ({type(data).__name__}), not a dict"
            elif any(not isinstance(k, str) for k in data):
                why = f"a data key is not a string: {next(k for k in data if not isinstance(k, str))!r}"
            else:
                continue
            problems.append(f"{path}: group `{g}`, host entry {i} ({m!r:.60}): {why}. Fix: {HOST_SHAPE}")
    for k, v in attrs.items():
        if (not k.startswith("_") and k not in groups and isinstance(v, tuple) and v
                and all(isinstance(x, str) for x in v)):
            problems.append(f"{path}: `{k}` is a tuple ({v!r:.60}), which pyinfra does not read as a group (it "
                            f"would have no hosts). Fix: a list, `{k} = [{', '.join(repr(x) for x in v[:2])}]`")
    if problems:
        raise M3Error("\n".join(problems))
    _refuse_duplicates(path, groups)


def _refuse_duplicates(path: Path, groups: Mapping[str, Any]) -> None:
    """A host listed twice in one group: pyinfra would merge the two silently (the second's data wins)."""
    problems = []
    for g, members in groups.items():
        members = members[0] if isinstance(members, tuple) else members
        names = [_split(m)[0] for m in members]
        for n in dict.fromkeys(x for x in names if names.count(x) > 1):
            problems.append(f"{path}: host {n} is listed {names.count(n)} times in group `{g}`; pyinfra would "
                            "merge them into one host. Fix: give each host its own name (or delete the copy)")
    if problems:
        raise M3Error("\n".join(problems))


def _refuse_conflicts(path: Path, listed: Mapping[str, list[tuple[str, dict]]]) -> None:
    """A host listed in two groups with different values for one key: pyinfra keeps the later group's silently
    (the plan would bind one address and ssh to another, or read one of two platforms)."""
    problems = []
    for name, entries in listed.items():
        for key in dict.fromkeys(k for _, d in entries for k in d):
            seen = [(g, d[key]) for g, d in entries if key in d]
            if len({repr(v) for _, v in seen}) > 1:
                values = " but ".join(f"{v!r} in group `{g}`" for g, v in seen)
                problems.append(f"{path}: host {name}: key {key} is {values}; pyinfra would keep {seen[-1][1]!r} "
                                f"and drop the rest silently. Fix: give {key} one "
                                "value (set it once, on the host's entry in one group)")
    if problems:
        raise M3Error("\n".join(problems))


@dataclass(frozen=True)
class InvHost:
    """One inventory host as the plan sees it: name, groups, merged data."""

    name: str
    groups: tuple[str, ...]
    data: Mapping[str, Any]
    sources: Mapping[str, str] = field(default_factory=dict, compare=False)  # key -> file it was set in


def load_inventory(path: str | os.PathLike, override_data: Mapping[str, Any] | None = None) -> list[InvHost]:
    """Load a pyinfra inventory file (with group_data/) as `pyinfra` does (m3deploy.core.inventory)."""
    path = Path(path)
    extra = [str(path.resolve().parent.parent / "group_data")]
    return [InvHost(name=n, groups=g, data=d, sources=src)
            for n, g, d, src in _load(path, override_data, cwd=str(Path.cwd()), group_data_directories=extra)]


def hosts_from_dict(groups: Mapping[str, list], all_data: Mapping[str, Any] | None = None,
                    group_data: Mapping[str, Mapping[str, Any]] | None = None) -> list[InvHost]:
    """Build inventory hosts from plain data (tests, benchmarks): {"control": [(name, data)], "workers": [...]}."""
    order: list[str] = []
    host_groups: dict[str, list[str]] = {}
    host_data: dict[str, dict] = {}
    for g, members in groups.items():
        for m in members:
            name, data = (m, {}) if isinstance(m, str) else m
            if name not in host_groups:
                order.append(name)
                host_groups[name] = []
                host_data[name] = {}
            host_groups[name].append(g)
            host_data[name].update(data)
    out = []
    for name in order:
        merged: dict[str, Any] = dict(all_data or {})
        for g in host_groups[name]:
            merged.update((group_data or {}).get(g, {}))
        merged.update(host_data[name])
        out.append(InvHost(name=name, groups=tuple(host_groups[name]), data=merged))
    return out


def file_group_name(path: str | os.PathLike) -> str:
    """The group pyinfra makes of every host of an inventory file: the file's name without its extension
    (pyinfra_cli/inventory.py make_inventory_from_files: `name.rsplit(".", 1)[0]`)."""
    return Path(path).name.rsplit(".", 1)[0]


def cluster_name(hosts: list[InvHost], inventory: str | os.PathLike | None = None) -> str:
    """The cluster's name, decided here and nowhere else (every CLI command and the deploy build the plan
    through m3deploy.core.build.build, which calls this): `m3_cluster` where it is set, else the inventory
    file's name (`inventories/mylab.py` -> `mylab`), else `cluster` (a plan built from data, with no file).
    It names the controller's secrets store and deploy record (~/.config/m3deploy/<name>/)."""
    for h in hosts:
        if h.data.get("m3_cluster"):
            return str(h.data["m3_cluster"])
    return file_group_name(inventory) if inventory else "cluster"
