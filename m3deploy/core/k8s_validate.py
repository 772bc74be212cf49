"""Offline admission of a DynamoGraphDeployment, in the operator's three layers (its
deploy/operator/internal/webhook/validation/STRUCTURAL_VALIDATION.md): the CRD's OpenAPI schema (jsonschema), its
CEL rules (x-kubernetes-validations, cel-python), and a pinned subset of the webhook's rules; then the export's own
rules against the plan it came from. Pure: the pinned schema is package data (core/data/k8s/dgd-v1beta1.yaml, its
source and commit in its header). Each problem names its rule and the file the rule comes from.
"""
from __future__ import annotations

import functools
from pathlib import Path
from typing import Any, Callable

import yaml

from m3deploy.core.export_k8s import MAIN, semver_tag

SCHEMA_FILE = Path(__file__).parent / "data" / "k8s" / "dgd-v1beta1.yaml"
CRD = "deploy/operator/config/crd/bases/nvidia.com_dynamographdeployments.yaml"
WEBHOOK_DGD = "deploy/operator/internal/webhook/validation/dynamographdeployment.go"
WEBHOOK_SHARED = "deploy/operator/internal/webhook/validation/shared_v1beta1.go"
RUNTIME_VERSION = "deploy/operator/internal/runtimeversion/runtimeversion.go"
PLAN = "m3deploy/core/export_k8s.py"


def problem(rule: str, source: str, path: str, message: str) -> str:
    return f"{path}: {message} [{rule}; {source}]"


@functools.lru_cache(maxsize=1)
def schema() -> dict[str, Any]:
    return yaml.safe_load(SCHEMA_FILE.read_text())


def _json_schema(node: Any) -> Any:
    """The OpenAPI v3 structural schema as JSON Schema: unknown fields of an object with `properties` are refused
    (kubectl's strict field validation) unless x-kubernetes-preserve-unknown-fields; the x-kubernetes-* keys
    are left to _walk."""
    if isinstance(node, list):
        return [_json_schema(n) for n in node]
    if not isinstance(node, dict):
        return node
    out = {k: _json_schema(v) for k, v in node.items() if not k.startswith("x-kubernetes-") and k != "format"}
    if "$ref" in out:
        return {"$ref": out["$ref"]}
    if node.get("x-kubernetes-int-or-string"):
        out.pop("type", None)
    if "properties" in node and "additionalProperties" not in node and \
            not node.get("x-kubernetes-preserve-unknown-fields"):
        out["additionalProperties"] = False
    return out


def schema_problems(doc: Any) -> list[str]:
    import jsonschema

    root = _json_schema(schema())
    v = jsonschema.Draft7Validator(root)
    out = []
    for e in sorted(v.iter_errors(doc), key=lambda e: list(map(str, e.absolute_path))):
        out.append(problem(f"schema:{e.validator}", CRD, _path(e.absolute_path), e.message))
    return out


def _path(parts) -> str:
    s = ""
    for p in parts:
        s += f"[{p}]" if isinstance(p, int) else (f".{p}" if s else str(p))
    return s or "(root)"


def _resolve(node: dict[str, Any]) -> dict[str, Any]:
    ref = node.get("$ref")
    return schema()["definitions"][ref.rsplit("/", 1)[-1]] if ref else node


def _walk(node: dict[str, Any], value: Any, path: list, visit: Callable) -> None:
    """Call visit(schema node, value, path) for every value the schema describes."""
    node = _resolve(node)
    visit(node, value, path)
    if isinstance(value, dict):
        for k, sub in (node.get("properties") or {}).items():
            if k in value:
                _walk(sub, value[k], path + [k], visit)
        extra = node.get("additionalProperties")
        if isinstance(extra, dict):
            for k, v in value.items():
                if k not in (node.get("properties") or {}):
                    _walk(extra, v, path + [k], visit)
    elif isinstance(value, list) and isinstance(node.get("items"), dict):
        for i, item in enumerate(value):
            _walk(node["items"], item, path + [i], visit)


def list_map_problems(doc: Any) -> list[str]:
    """x-kubernetes-list-type: map with x-kubernetes-list-map-keys: the keys are unique (the apiserver's
    'Duplicate value')."""
    out: list[str] = []

    def visit(node, value, path):
        if node.get("x-kubernetes-list-type") != "map" or not isinstance(value, list):
            return
        keys = node.get("x-kubernetes-list-map-keys") or []
        seen = set()
        for i, item in enumerate(value):
            if not isinstance(item, dict):
                continue
            k = tuple(item.get(x) for x in keys)
            if k in seen:
                out.append(problem("schema:x-kubernetes-list-map-keys", CRD, _path(path + [i]),
                                   f"Duplicate value: {dict(zip(keys, k))}"))
            seen.add(k)

    _walk(schema(), doc, [], visit)
    return out


def _lower_ascii(s):
    import celpy.celtypes as ct

    return ct.StringType(str(s).lower())


@functools.lru_cache(maxsize=None)
def _program(rule: str):
    import celpy

    env = celpy.Environment()
    return env.program(env.compile(rule), functions={"lowerAscii": _lower_ascii})


def cel_problems(doc: Any) -> list[str]:
    """Every x-kubernetes-validations rule on create: a transition rule (oldSelf) is not run, except with
    optionalOldSelf, where oldSelf has no value (Kubernetes' CEL semantics for create)."""
    import celpy
    import celpy.celtypes as celtypes

    out: list[str] = []

    def visit(node, value, path):
        for r in node.get("x-kubernetes-validations") or ():
            rule = r["rule"]
            if "oldSelf" in rule:
                if not r.get("optionalOldSelf"):
                    continue
                rule = rule.replace("oldSelf.hasValue()", "false")
            try:
                ok = _program(rule).evaluate({"self": celpy.json_to_cel(value)})
            except Exception as e:  # a rule that errors refuses the object (the apiserver's behaviour)
                ok = False
                r = {**r, "message": f"{r.get('message', rule)} (evaluation error: {e})"}
            if not (isinstance(ok, celtypes.BoolType) and bool(ok)):
                out.append(problem("cel", CRD, _path(path), f"{r.get('message', rule)} (rule: {r['rule']})"))

    _walk(schema(), doc, [], visit)
    return out


def _main(comp: dict) -> dict | None:
    containers = ((comp.get("podTemplate") or {}).get("spec") or {}).get("containers") or []
    return next((c for c in containers if isinstance(c, dict) and c.get("name") == MAIN), None)


def webhook_problems(doc: dict) -> list[str]:
    """The pinned subset of the operator's DGD webhook (create), each rule with its file:
    - components-required (dynamographdeployment.go validateDynamoGraphDeploymentSpec)
    - main-image, runtime-version-override (shared_v1beta1.go validateDynamoComponentDeploymentSharedSpec with
      runtimeversion.go ParseImageVersion)
    - shared-memory-size, frontend-sidecar, epp-multinode, epp-replicas, epp-config (shared_v1beta1.go)"""
    out: list[str] = []
    comps = (doc.get("spec") or {}).get("components")
    if not comps:
        out.append(problem("webhook:components-required", WEBHOOK_DGD, "spec.components",
                           "Required value: must have at least one component"))
        return out
    for i, c in enumerate(comps):
        p = f"spec.components[{i}]"
        main = _main(c)
        if not main or not main.get("image"):
            out.append(problem("webhook:main-image", WEBHOOK_SHARED, f"{p}.podTemplate.spec.containers" +
                               ("" if not main else f"[name={MAIN}].image"),
                               f"Required value: a container named {MAIN!r} with a non-empty image is required"))
        elif not c.get("runtimeVersionOverride") and not semver_tag(main["image"]):
            out.append(problem("webhook:runtime-version-override", f"{WEBHOOK_SHARED}, {RUNTIME_VERSION}",
                               f"{p}.runtimeVersionOverride",
                               f"Required value: image {main['image']!r} has no semantic-version tag; set "
                               "runtimeVersionOverride to the Dynamo runtime version (MAJOR.MINOR.PATCH)"))
        shm = c.get("sharedMemorySize")
        if isinstance(shm, (int, str)) and str(shm).strip().startswith("-") and str(shm).strip("-0. ") != "":
            out.append(problem("webhook:shared-memory-size", WEBHOOK_SHARED, f"{p}.sharedMemorySize",
                               f"Invalid value: {shm!r}: must be non-negative"))
        side = c.get("frontendSidecar")
        if side is not None:
            names = [x.get("name") for x in ((c.get("podTemplate") or {}).get("spec") or {}).get("containers") or []]
            if side not in names:
                out.append(problem("webhook:frontend-sidecar", WEBHOOK_SHARED, f"{p}.frontendSidecar",
                                   f"Invalid value: {side!r}: must match a podTemplate.spec.containers name"))
        if c.get("type") == "epp":
            if (c.get("multinode") or {}).get("nodeCount", 1) > 1:
                out.append(problem("webhook:epp-multinode", WEBHOOK_SHARED, f"{p}.multinode",
                                   "Forbidden: EPP component cannot be multinode"))
            if c.get("replicas", 1) != 1:
                out.append(problem("webhook:epp-replicas", WEBHOOK_SHARED, f"{p}.replicas",
                                   "Invalid value: EPP component must have exactly 1 replica"))
            if "eppConfig" not in c:
                out.append(problem("webhook:epp-config", WEBHOOK_SHARED, f"{p}.eppConfig",
                                   "Required value: is required for EPP components"))
    return out


def admission_problems(doc: Any) -> list[str]:
    """Schema, then CEL, then the webhook, in admission order: a layer runs only when the one before passed."""
    if not isinstance(doc, dict):
        return [problem("schema:type", CRD, "(root)", "a DynamoGraphDeployment is a mapping")]
    for layer in (lambda d: schema_problems(d) + list_map_problems(d), cel_problems, webhook_problems):
        out = layer(doc)
        if out:
            return out
    return []


def plan_problems(plan, doc: dict) -> list[str]:
    """The export against the plan it came from (m3deploy's own rules, core/export_k8s.py): each component's
    replicas, multinode.nodeCount and GPUs per pod are the plan's; a secret the plan names is a Secret reference,
    never a value; the argv and env are the units' but for the listed differences (core/k8s_parity.py)."""
    from m3deploy.core import export_k8s as ek
    from m3deploy.core.k8s_parity import parity

    out = []
    by_name = {c.get("name"): (i, c) for i, c in enumerate((doc.get("spec") or {}).get("components") or [])}
    for name, _, members in ek.groups(plan):
        if name not in by_name:
            out.append(problem("plan:component", PLAN, "spec.components", f"no component {name!r} (the plan's)"))
            continue
        i, c = by_name[name]
        hp, svc = members[0]
        p = f"spec.components[{i}]"
        if c.get("replicas") != len(members):
            out.append(problem("plan:replicas", PLAN, f"{p}.replicas",
                               f"is {c.get('replicas')!r}; the plan runs {len(members)} engine instance(s) here"))
        nodes = (c.get("multinode") or {}).get("nodeCount", 1)
        if nodes != svc.nnodes:
            out.append(problem("plan:nodeCount", PLAN, f"{p}.multinode.nodeCount",
                               f"is {nodes}; each engine instance spans {svc.nnodes} host(s) in the plan"))
        main = _main(c) or {}
        limits = (main.get("resources") or {}).get("limits") or {}
        gpus = next((int(v) for k, v in limits.items() if k.endswith("/gpu")), 0)
        if gpus != ek.gpus_of(svc):
            out.append(problem("plan:gpus", PLAN, f"{p}.podTemplate.spec.containers[name={MAIN}].resources.limits",
                               f"{gpus} GPU(s) per pod; each rank has {ek.gpus_of(svc)} in the plan"))
    secret_names = {k for _, s in ek.dynamo_clients(plan) for k, _ in s.secret_env} | {"HF_TOKEN"}
    for i, c in enumerate((doc.get("spec") or {}).get("components") or []):
        for e in (_main(c) or {}).get("env") or []:
            if e.get("name") in secret_names and "value" in e:
                out.append(problem("plan:secret-value", PLAN, f"spec.components[{i}].env[name={e['name']}]",
                                   "a secret is written as a value; it must be a valueFrom.secretKeyRef"))
    if not out:
        out += [problem("plan:parity", PLAN, "spec.components", p) for p in parity(plan, doc)[1]]
    return out


def export_problems(plan, doc: Any) -> list[str]:
    """Everything `m3deploy validate --target k8s` and `m3deploy export k8s` check."""
    return admission_problems(doc) or plan_problems(plan, doc)


def checked_export(plan) -> tuple[dict, list[str]]:
    """(export_k8s.export(plan), its problems): what `m3deploy export k8s` writes and `validate --target k8s`
    reports."""
    from m3deploy.core import export_k8s

    out = export_k8s.export(plan)
    return out, export_problems(plan, out["dgd"])
