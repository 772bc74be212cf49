#!/usr/bin/env python3
"""Compare one of Dynamo's own DynamoGraphDeployment recipes (recipes/minimax-m3/.../deploy.yaml, v1beta1 or
v1alpha1) field by field with `m3deploy export k8s` of an inventory, per component type: replicas, nodeCount, GPUs,
image, the engine module, each engine flag and each env var. Also runs m3deploy's offline admission
(m3deploy.core.k8s_validate) on the recipe itself. Prints a Markdown report (benchmarks/results/k8s-roundtrip-*.md).

    python3 scripts/dgd-roundtrip.py RECIPE.yaml INVENTORY [--data KEY=VALUE ...]
"""
from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from m3deploy.cli import load_plan  # noqa: E402
from m3deploy.core import export_k8s, k8s_validate  # noqa: E402


def _command(container: dict) -> tuple[list[str], dict[str, str]]:
    """(the process a container runs: command + args, or the `exec` line of a `sh -c` script; the env the script
    exports with plain values)."""
    argv = list(container.get("command") or []) + list(container.get("args") or [])
    env: dict[str, str] = {}
    if argv[:1] and argv[0] in ("/bin/sh", "/bin/bash", "sh", "bash") and len(argv) >= 3:
        for line in argv[-1].splitlines():
            line = line.strip()
            if line.startswith("export ") and "=" in line and "$" not in line:
                k, v = line[len("export "):].split("=", 1)
                env[k] = v
            if line.startswith("exec "):
                return shlex.split(line)[1:], env
    return argv, env


def _flags(argv: list[str]) -> tuple[str, dict[str, str]]:
    module = next((argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "-m"), argv[0] if argv else "")
    start = argv.index(module) + 1 if module in argv else 0
    out, i = {}, start
    while i < len(argv):
        if argv[i].startswith("--"):
            if i + 1 < len(argv) and not argv[i + 1].startswith("--"):
                out[argv[i]] = argv[i + 1]
                i += 2
                continue
            out[argv[i]] = "(flag)"
        i += 1
    return module, out


def components(doc: dict) -> dict[str, dict]:
    """{type: {replicas, nodeCount, gpus, image, module, flags, env}} of a v1beta1 or v1alpha1 DGD."""
    out = {}
    spec = doc["spec"]
    shared_env = {e["name"]: e.get("value", "(ref)") for e in spec.get("envs") or spec.get("env") or []}
    items = [(c.get("type"), c, _main(c)) for c in spec.get("components") or []]
    items += [(c.get("componentType"), c, (c.get("extraPodSpec") or {}).get("mainContainer") or {})
              for c in (spec.get("services") or {}).values()]
    for ctype, c, main in items:
        argv, script_env = _command(main)
        module, flags = _flags(argv)
        limits = (main.get("resources") or {}).get("limits") or (c.get("resources") or {}).get("limits") or {}
        gpus = next((str(v) for k, v in limits.items() if k.endswith("gpu")), "-")
        env = {**shared_env, **{e["name"]: e.get("value", "(ref)") for e in main.get("env") or []}, **script_env}
        out[ctype] = {"replicas": str(c.get("replicas", 1)), "nodeCount": str((c.get("multinode") or {}).get(
            "nodeCount", 1)), "gpus": gpus, "image": main.get("image", "-"), "module": module, "flags": flags,
            "env": env}
    return out


def _main(c: dict) -> dict:
    return next((x for x in ((c.get("podTemplate") or {}).get("spec") or {}).get("containers") or []
                 if x.get("name") == "main"), {})


def report(recipe_path: str, inventory: str, data: list[str]) -> str:
    docs = [d for d in yaml.safe_load_all(Path(recipe_path).read_text()) if d]
    recipe = next(d for d in docs if d.get("kind") == "DynamoGraphDeployment")
    plan = load_plan(inventory, data, facts=False)
    ours = export_k8s.export(plan)["dgd"]
    theirs_c, ours_c = components(recipe), components(ours)
    lines = [f"### {recipe_path} vs `m3deploy export k8s {inventory}" + "".join(f" --data {d}" for d in data) + "`",
             "", f"- recipe apiVersion: {recipe['apiVersion']}; ours: {ours['apiVersion']}",
             "- m3deploy's offline admission of the recipe itself: "
             + (("; ".join(k8s_validate.admission_problems(recipe)) or "passes")
                if recipe["apiVersion"].endswith("v1beta1") else "not run (v1alpha1: the pinned schema is v1beta1's)"),
             ""]
    lines += ["| component | field | Dynamo's recipe | m3deploy export | same |", "|---|---|---|---|---|"]
    for ctype in sorted(set(theirs_c) | set(ours_c), key=str):
        t, o = theirs_c.get(ctype, {}), ours_c.get(ctype, {})
        fields = [(k, t.get(k, "(none)"), o.get(k, "(none)")) for k in ("replicas", "nodeCount", "gpus", "image",
                                                                        "module")]
        for kind in ("flags", "env"):
            tf, of = t.get(kind, {}), o.get(kind, {})
            fields += [(f"{kind[:-1] if kind == 'flags' else 'env'} {k}", tf.get(k, "(none)"), of.get(k, "(none)"))
                       for k in sorted(set(tf) | set(of))]
        for name, a, b in fields:
            same = "yes" if a == b else "no"
            lines.append(f"| {ctype} | `{name}` | `{_cell(a)}` | `{_cell(b)}` | {same} |")
    return "\n".join(lines) + "\n"


def _cell(v) -> str:
    s = json.dumps(v) if not isinstance(v, str) else v
    return s.replace("|", "\\|")[:90]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("recipe")
    ap.add_argument("inventory")
    ap.add_argument("--data", action="append", default=[])
    a = ap.parse_args()
    print(report(a.recipe, a.inventory, a.data))


if __name__ == "__main__":
    main()
