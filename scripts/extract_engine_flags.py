#!/usr/bin/env python3
"""Extract the command-line contract of an engine from its real wheel, statically (no import, no torch).

    python3 scripts/extract_engine_flags.py vllm    WHEEL            [-o DIR]
    python3 scripts/extract_engine_flags.py sglang  WHEEL            [-o DIR]
    python3 scripts/extract_engine_flags.py dynamo  WHEEL RUNTIME_WHEEL [--runtime-python PY] [-o DIR]

Writes DIR/<package>-<version>.json (default DIR: tests/fixtures/engine-flags): for each parser the plan drives
(`vllm serve`, `python3 -m dynamo.vllm`, `python3 -m sglang.launch_server`, ...), its source files inside the
wheel, every flag it declares and the flag's choices where they are known statically; and the environment
variable names the package's source mentions under its own prefixes. tests/unit/test_engine_flags.py checks every
rendered command against these files.

How flags are found (Python's ast over the wheel's .py files, nothing imported):
- `*.add_argument(...)`, Dynamo's `add_argument(flag_name=..., obsolete_flag=...)` and
  `add_negatable_bool_argument(...)`: the literal option strings; `action=argparse.BooleanOptionalAction` and the
  negatable helper also give `--no-<flag>`; `choices=` a literal list, a module-level list constant, `[..] + NAME`.
- vLLM's `add_argument("--x", **kwargs["x"])` with `kwargs = get_kwargs(SomeConfig)`: the field's annotation
  says whether it is a bool (then `--no-x` too) or a Literal (its choices); `vllm serve`'s frontend flags are the
  fields of its FrontendArgs dataclasses (vllm/entrypoints/launchers/cli_args.py add_cli_args).
- SGLang's declarative fields (sglang/srt/arg_groups/fields/*.py: `name: A[T, "help"]` / `A[T, Arg(...)]`):
  `--name` (or Arg cli_name) plus Arg aliases, Literal or Arg choices; no_cli fields skipped
  (sglang/srt/arg_groups/arg_utils.py add_cli_args_from_dataclass).
- Dynamo's `--dyn-tool-call-parser` / `--dyn-reasoning-parser` take their choices from the Rust runtime
  (`dynamo._core.get_tool_parser_names()` / `get_reasoning_parser_names()`): read by running
  `--runtime-python` (a Python with ai-dynamo-runtime installed; it installs without a GPU) if given.
- Environment names: every string constant `PREFIX_[A-Z0-9_]+` in the package's .py files (and, for Dynamo, in the
  runtime's compiled extension, where the Rust runtime reads DYN_*, ETCD_*, NATS_*): a superset of what is read,
  enough to catch a misspelt name.

TensorRT-LLM has no wheel on PyPI for this machine: tests/fixtures/engine-flags/tensorrt-llm-*.json is written from
the tagged source by hand and names the commit it was read at.
"""
from __future__ import annotations

import argparse
import ast
import hashlib
import json
import re
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tests" / "fixtures" / "engine-flags"

CLI_ARGS = "vllm/entrypoints/launchers/cli_args.py|vllm/entrypoints/common/cli_args.py"
# parser name -> the wheel files whose arguments it parses (dataclass classes as `path::Class,Class`)
PARSERS = {
    "vllm": {
        "engine": ["vllm/engine/arg_utils.py"],
        # vllm 0.31: entrypoints/launchers/cli_args.py; 0.33: entrypoints/common/cli_args.py (`a|b`: the first present)
        "serve": [CLI_ARGS + "::BaseFrontendArgs,FrontendArgs", CLI_ARGS],
    },
    "sglang": {
        "server": ["sglang/srt/server_args.py", "sglang/srt/arg_groups/fields/*.py"],
    },
    "ai-dynamo": {
        "runtime": ["dynamo/common/configuration/groups/runtime_args.py",
                    "dynamo/common/configuration/groups/frontend_decoding_args.py"],
        "dynamo.vllm": ["dynamo/vllm/backend_args.py"],
        "dynamo.sglang": ["dynamo/sglang/backend_args.py"],
        "dynamo.trtllm": ["dynamo/trtllm/backend_args.py", "dynamo/common/configuration/groups/router_args.py",
                          "dynamo/common/configuration/groups/kv_router_args.py"],
        "dynamo.frontend": ["dynamo/frontend/frontend_args.py", "dynamo/common/configuration/groups/router_args.py",
                            "dynamo/common/configuration/groups/kv_router_args.py",
                            "dynamo/common/configuration/groups/ais_perf_args.py"],
        "dynamo.mocker": ["dynamo/mocker/args.py"],
    },
}
ENV_PREFIXES = {"vllm": ["VLLM_"], "sglang": ["SGLANG_", "SGL_"], "ai-dynamo": ["DYN_", "ETCD_", "NATS_"]}
RUNTIME_CHOICES = {"get_tool_parser_names": "tool_parsers", "get_reasoning_parser_names": "reasoning_parsers"}
# Facts a data file records beside the flags: (module file, symbol); the test and validation cite them
SYMBOLS = {
    "vllm": [("vllm/v1/engine/utils.py", "get_engine_zmq_addresses"), ("vllm/exceptions.py", "VLLMClientError")],
}


def _wheel_meta(z: zipfile.ZipFile) -> tuple[str, str]:
    meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
    text = z.read(meta).decode()
    name = re.search(r"^Name: (.+)$", text, re.MULTILINE).group(1).strip()
    version = re.search(r"^Version: (.+)$", text, re.MULTILINE).group(1).strip()
    return name.lower(), version


def _lit(node, consts):
    """A literal (list of) string(s), a module constant, or `[...] + CONST`; None when not static."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
        out = []
        for e in node.elts:
            v = _lit(e, consts)
            if v is None:
                return None
            out += v
        return out
    if isinstance(node, ast.Name) and node.id in consts:
        return consts[node.id]
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        a, b = _lit(node.left, consts), _lit(node.right, consts)
        return None if a is None or b is None else a + b
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in RUNTIME_CHOICES:
        return [f"@runtime:{RUNTIME_CHOICES[node.func.id]}"]
    return None


def _literal_choices(ann, aliases):
    """Choices of a `Literal[...]` annotation (through Optional/Annotated/`| None` and module aliases)."""
    if isinstance(ann, ast.Name) and ann.id in aliases:
        return aliases[ann.id]
    if isinstance(ann, ast.BinOp) and isinstance(ann.op, ast.BitOr):
        return _literal_choices(ann.left, aliases) or _literal_choices(ann.right, aliases)
    if isinstance(ann, ast.Subscript):
        base = ann.value.attr if isinstance(ann.value, ast.Attribute) else getattr(ann.value, "id", "")
        inner = ann.slice
        if base == "Literal":
            vals = inner.elts if isinstance(inner, ast.Tuple) else [inner]
            out = [v.value for v in vals if isinstance(v, ast.Constant) and isinstance(v.value, str)]
            return out if len(out) == len(vals) else None
        if base in ("Optional", "Annotated", "A"):
            first = inner.elts[0] if isinstance(inner, ast.Tuple) else inner
            return _literal_choices(first, aliases)
    return None


def _is_bool(ann) -> bool:
    if isinstance(ann, ast.Name):
        return ann.id == "bool"
    if isinstance(ann, ast.BinOp):
        return _is_bool(ann.left) or _is_bool(ann.right)
    if isinstance(ann, ast.Subscript) and getattr(ann.value, "id", "") in ("Optional", "Annotated", "A"):
        first = ann.slice.elts[0] if isinstance(ann.slice, ast.Tuple) else ann.slice
        return _is_bool(first)
    return False


class Source:
    """The parsed .py files of one wheel: module constants, Literal aliases and class field annotations."""

    def __init__(self, z: zipfile.ZipFile):
        self.z = z
        self.trees: dict[str, ast.Module] = {}
        self.consts: dict[str, list[str]] = {}
        self.aliases: dict[str, list[str]] = {}
        self.classes: dict[str, tuple[list[str], dict[str, ast.expr]]] = {}  # name -> (bases, field -> annotation)

    def tree(self, path: str) -> ast.Module:
        if path not in self.trees:
            self.trees[path] = ast.parse(self.z.read(path).decode())
        return self.trees[path]

    def index(self, prefix: str) -> None:
        for n in self.z.namelist():
            if n.startswith(prefix) and n.endswith(".py"):
                try:
                    t = self.tree(n)
                except SyntaxError:
                    continue
                for node in t.body:
                    targets = node.targets if isinstance(node, ast.Assign) else \
                        [node.target] if isinstance(node, ast.AnnAssign) and node.value is not None else []
                    for tgt in targets:
                        if isinstance(tgt, ast.Name) and node.value is not None:
                            v = _lit(node.value, self.consts)
                            if v is not None:
                                self.consts.setdefault(tgt.id, v)
                            lc = _literal_choices(node.value, self.aliases)
                            if lc:
                                self.aliases.setdefault(tgt.id, lc)
                    if isinstance(node, ast.ClassDef):
                        fields = {s.target.id: s.annotation for s in node.body
                                  if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)}
                        bases = [b.id if isinstance(b, ast.Name) else getattr(b, "attr", "") for b in node.bases]
                        self.classes.setdefault(node.name, (bases, fields))

    def fields(self, cls: str, path: str | None = None) -> dict[str, ast.expr]:
        """`cls`'s annotated fields, its bases' first; `path`: the file defining it (class names repeat)."""
        bases, own = self.classes.get(cls, ([], {}))
        node = next((n for n in self.tree(path).body if isinstance(n, ast.ClassDef) and n.name == cls), None) \
            if path else None
        if node is not None:
            bases = [b.id if isinstance(b, ast.Name) else getattr(b, "attr", "") for b in node.bases]
            own = {s.target.id: s.annotation for s in node.body
                   if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)}
        out: dict[str, ast.expr] = {}
        for b in bases:
            if b != cls:
                out.update(self.fields(b))
        out.update(own)
        return out

    def files(self, spec: str) -> list[str]:
        names = set(self.z.namelist())
        alts = spec.split("::")[0].split("|")
        path = next((a for a in alts if a in names), alts[0])
        if "*" in path:
            rx = re.compile(re.escape(path).replace(r"\*", r"[^/]+") + "$")
            return sorted(n for n in self.z.namelist() if rx.match(n))
        return [path]


def _add(flags: dict, names, choices, negatable: bool) -> None:
    for n in names:
        if not n.startswith("-"):
            continue
        prev = flags.get(n)
        flags[n] = choices if choices is not None else prev
        if negatable and n.startswith("--"):
            flags.setdefault("--no-" + n[2:], None)


def _kw(call: ast.Call, name: str):
    return next((k.value for k in call.keywords if k.arg == name), None)


def calls_flags(src: Source, path: str, flags: dict, env: set) -> None:
    """Every add_argument-style call in one file."""
    tree = src.tree(path)
    for fn in ast.walk(tree):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Module)):
            continue
        kw_of: dict[str, str] = {}  # local `x_kwargs = get_kwargs(Cls)`
        for node in ast.walk(fn):
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) and \
                    getattr(node.value.func, "id", "") == "get_kwargs" and node.value.args:
                cls = node.value.args[0]
                for t in node.targets:
                    if isinstance(t, ast.Name) and isinstance(cls, ast.Name):
                        kw_of[t.id] = cls.id
        for call in ast.walk(fn):
            if not isinstance(call, ast.Call):
                continue
            fname = call.func.attr if isinstance(call.func, ast.Attribute) else getattr(call.func, "id", "")
            if fname not in ("add_argument", "add_negatable_bool_argument", "add_frontend_decoding_arg"):
                continue
            names = [a.value for a in call.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
            for k in ("flag_name", "obsolete_flag"):
                v = _kw(call, k)
                if isinstance(v, ast.Constant) and isinstance(v.value, str):
                    names.append(v.value)
            ev = _kw(call, "env_var")
            if isinstance(ev, ast.Constant) and isinstance(ev.value, str):
                env.add(ev.value)
            action = _kw(call, "action")
            negatable = fname == "add_negatable_bool_argument" or (
                isinstance(action, ast.Attribute) and action.attr == "BooleanOptionalAction")
            ch = _kw(call, "choices")
            choices = _lit(ch, src.consts) if ch is not None else None
            for k in call.keywords:  # **x_kwargs["field"]
                if k.arg is None and isinstance(k.value, ast.Subscript) and isinstance(k.value.value, ast.Name) \
                        and k.value.value.id in kw_of and isinstance(k.value.slice, ast.Constant):
                    ann = src.fields(kw_of[k.value.value.id]).get(k.value.slice.value)
                    if ann is not None:
                        negatable = negatable or _is_bool(ann)
                        choices = choices if choices is not None else _literal_choices(ann, src.aliases)
            _add(flags, names, sorted(set(choices)) if choices else None, negatable)


def dataclass_flags(src: Source, path: str, classes: list[str], flags: dict, sglang: bool) -> None:
    """Fields that become flags: vLLM's FrontendArgs (bool: negatable), SGLang's `A[T, ...]` fields."""
    for cls in classes:
        for name, ann in src.fields(cls, path).items():
            if name.startswith("_"):
                continue
            names, choices = ["--" + name.replace("_", "-")], _literal_choices(ann, src.aliases)
            if sglang:
                if not (isinstance(ann, ast.Subscript) and getattr(ann.value, "id", "") in ("A", "Annotated")):
                    continue
                meta = ann.slice.elts[1] if isinstance(ann.slice, ast.Tuple) and len(ann.slice.elts) > 1 else None
                if isinstance(meta, ast.Call) and getattr(meta.func, "id", "") == "Arg":
                    no_cli = _kw(meta, "no_cli")
                    if isinstance(no_cli, ast.Constant) and no_cli.value is True:
                        continue
                    cli = _kw(meta, "cli_name")
                    if isinstance(cli, ast.Constant):
                        names = [cli.value]
                    names += _lit(_kw(meta, "aliases"), src.consts) or [] if _kw(meta, "aliases") is not None else []
                    ch = _kw(meta, "choices")
                    choices = (_lit(ch, src.consts) if ch is not None else None) or choices
                _add(flags, names, sorted(set(choices)) if choices else None, False)
            else:
                _add(flags, names, sorted(set(choices)) if choices else None, _is_bool(ann))


def sglang_field_classes(src: Source, path: str) -> list[str]:
    return [n.name for n in src.tree(path).body if isinstance(n, ast.ClassDef)]


def env_names(z: zipfile.ZipFile, prefixes: list[str], extra_blobs: list[bytes] = ()) -> list[str]:
    alt = "|".join(map(re.escape, prefixes))
    rx = re.compile(rf"^(?:{alt})[A-Z0-9_]+$")
    out = set()
    for n in z.namelist():
        if n.endswith(".py"):
            try:
                t = ast.parse(z.read(n).decode())
            except (SyntaxError, UnicodeDecodeError):
                continue
            out |= {c.value for c in ast.walk(t) if isinstance(c, ast.Constant) and isinstance(c.value, str)
                    and rx.match(c.value)}
    brx = re.compile(rb"(?:" + b"|".join(re.escape(p.encode()) for p in prefixes) + rb")[A-Z0-9_]{2,}")
    split = re.compile(f"(?={alt})")
    for blob in extra_blobs:  # Rust string literals lie back to back: split at each prefix
        out |= {p for m in brx.findall(blob) for p in split.split(m.decode()) if rx.match(p)}
    return sorted(out)


def runtime_choices(python: str) -> dict[str, list[str]]:
    code = ("import json; from dynamo._core import get_tool_parser_names as t, get_reasoning_parser_names as r; "
            "print(json.dumps({'tool_parsers': sorted(t()), 'reasoning_parsers': sorted(r())}))")
    return json.loads(subprocess.run([python, "-c", code], check=True, capture_output=True, text=True).stdout)


def extract(kind: str, wheel: Path, runtime_wheel: Path | None = None, runtime_python: str | None = None) -> dict:
    z = zipfile.ZipFile(wheel)
    package, version = _wheel_meta(z)
    top = {"vllm": "vllm/", "sglang": "sglang/", "dynamo": "dynamo/"}[kind]
    src = Source(z)
    src.index(top)
    parsers, declared_env = {}, set()
    for pname, specs in PARSERS[package].items():
        flags: dict = {}
        files = []
        for spec in specs:
            for path in src.files(spec):
                files.append(path)
                if "::" in spec:
                    dataclass_flags(src, path, spec.split("::")[1].split(","), flags, sglang=False)
                elif kind == "sglang" and "/arg_groups/fields/" in path:
                    dataclass_flags(src, path, sglang_field_classes(src, path), flags, sglang=True)
                else:
                    calls_flags(src, path, flags, declared_env)
        parsers[pname] = {"sources": sorted(set(files)), "flags": dict(sorted(flags.items()))}
    out = {"package": package, "version": version, "wheel": wheel.name,
           "sha256": hashlib.sha256(wheel.read_bytes()).hexdigest(),
           "extracted_by": "scripts/extract_engine_flags.py", "parsers": parsers}
    blobs = []
    if runtime_wheel:
        rz = zipfile.ZipFile(runtime_wheel)
        rpkg, rver = _wheel_meta(rz)
        out["runtime"] = {"package": rpkg, "version": rver, "wheel": runtime_wheel.name,
                          "sha256": hashlib.sha256(runtime_wheel.read_bytes()).hexdigest()}
        blobs = [rz.read(n) for n in rz.namelist() if n.endswith(".so")]
        if runtime_python:
            out["runtime"].update(runtime_choices(runtime_python))
            out["runtime"]["choices_from"] = "dynamo._core get_tool_parser_names() / get_reasoning_parser_names()"
    out["env"] = {"prefixes": ENV_PREFIXES[package],
                  "names": sorted(set(env_names(z, ENV_PREFIXES[package], blobs)) | declared_env)}
    facts = {}
    for path, symbol in SYMBOLS.get(package, ()):
        text = z.read(path).decode() if path in z.namelist() else ""
        facts[f"{path}:{symbol}"] = bool(re.search(rf"^(?:def|class) {symbol}\b|^{symbol}\s*=", text, re.MULTILINE))
    if facts:
        out["symbols"] = facts
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("kind", choices=["vllm", "sglang", "dynamo"])
    ap.add_argument("wheel", type=Path)
    ap.add_argument("runtime_wheel", type=Path, nargs="?")
    ap.add_argument("--runtime-python", help="a Python with ai-dynamo-runtime installed (parser name choices)")
    ap.add_argument("-o", "--out", type=Path, default=OUT)
    a = ap.parse_args(argv)
    data = extract(a.kind, a.wheel, a.runtime_wheel, a.runtime_python)
    a.out.mkdir(parents=True, exist_ok=True)
    path = a.out / f"{data['package']}-{data['version']}.json"
    path.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    n = sum(len(p["flags"]) for p in data["parsers"].values())
    print(f"{path}: {n} flags in {len(data['parsers'])} parsers, {len(data['env']['names'])} env names")
    return 0


if __name__ == "__main__":
    sys.exit(main())
