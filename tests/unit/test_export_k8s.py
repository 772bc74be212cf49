"""`m3deploy export k8s` and `validate --target k8s`: the plan as a Kubernetes DynamoGraphDeployment, checked offline
in the operator's admission order (its deploy/operator/internal/webhook/validation/STRUCTURAL_VALIDATION.md):

- the CRD's OpenAPI schema: ai-dynamo/dynamo deploy/operator/config/crd/bases/nvidia.com_dynamographdeployments.yaml
  (the v1beta1 excerpt vendored as m3deploy/core/data/k8s/dgd-v1beta1.yaml, commit in its header), with jsonschema;
- its CEL rules (x-kubernetes-validations of that file), with cel-python;
- the webhook: deploy/operator/internal/webhook/validation/dynamographdeployment.go and shared_v1beta1.go, with
  deploy/operator/internal/runtimeversion/runtimeversion.go for the image tag;
- the plan's own rules and the parity of argv/env with the bare-metal units (m3deploy/core/export_k8s.py,
  m3deploy/core/k8s_parity.py).
"""
from __future__ import annotations

import copy
import json
import subprocess
import sys

import pytest
import yaml

from m3deploy.cli import load_plan
from m3deploy.core import export_k8s as ek
from m3deploy.core import export_slurm
from m3deploy.core import k8s_validate as kv
from m3deploy.core.errors import M3Error, ValidationError
from m3deploy.core.k8s_parity import parity
from tests.unit.test_plan_snapshots import ROOT, SHIPPED, TESTBED_STATE, VARIANTS

CRD = "nvidia.com_dynamographdeployments.yaml"
WEBHOOK_DGD = "dynamographdeployment.go"
WEBHOOK_SHARED = "shared_v1beta1.go"
RUNTIME_VERSION = "runtimeversion.go"
PLAN = "export_k8s.py"


@pytest.fixture(autouse=True)
def _testbed_state(monkeypatch):
    import m3deploy.testbed

    monkeypatch.setattr(m3deploy.testbed, "load_state", lambda *a, **k: TESTBED_STATE)
    monkeypatch.setenv("M3_TESTBED", "m3tb")
    monkeypatch.chdir(ROOT)


def plan_of(inventory: str, data: dict | None = None):
    return load_plan(str(ROOT / "inventories" / f"{inventory}.py"),
                     [f"{k}={json.dumps(v)}" for k, v in (data or {}).items()], facts=False)


def _dynamo_cases():
    """Every shipped inventory and plan-snapshot variant (tests/unit/test_plan_snapshots.py) that builds a Dynamo
    plan; the rest are standalone or refused by the rules."""
    import m3deploy.testbed

    keep = m3deploy.testbed.load_state
    m3deploy.testbed.load_state = lambda *a, **k: TESTBED_STATE
    cases = []
    try:
        for inv in SHIPPED:
            for v, data in VARIANTS.items():
                if inv == "testbed" and v:
                    continue
                try:
                    p = load_plan(str(ROOT / "inventories" / f"{inv}.py"),
                                  [f"{k}={json.dumps(x)}" for k, x in data.items()], facts=False)
                except (ValidationError, M3Error):
                    continue
                if p.serving == "dynamo":
                    cases.append((inv, v))
    finally:
        m3deploy.testbed.load_state = keep
    return cases


import os  # noqa: E402

os.environ.setdefault("M3_TESTBED", "m3tb")
CASES = _dynamo_cases()


def test_the_dynamo_cases_cover_every_engine_and_mode():
    assert len(CASES) >= 16
    engines = {plan_of(i, VARIANTS[v]).engine for i, v in CASES}
    assert engines >= {"vllm", "sglang", "trtllm", "mocker"}
    assert ("gb200_disagg", "") in CASES and ("testbed", "") in CASES


@pytest.mark.parametrize("inventory,variant", CASES, ids=[f"{i}{'--' + v if v else ''}" for i, v in CASES])
def test_every_dynamo_plan_exports_and_validates(inventory, variant):
    plan = plan_of(inventory, VARIANTS[variant])
    out = ek.export(plan)
    dgd = out["dgd"]
    assert kv.export_problems(plan, dgd) == []
    explained, unexplained = parity(plan, dgd)
    assert unexplained == []  # 0 unexplained differences from the bare-metal units
    assert set().union(*explained.values()) <= {d.name for d in ek.DIFFERENCES}
    assert set(explained) == {f"{h.name}/{s.name}" for h, s in ek.dynamo_clients(plan)}
    recipe = export_slurm.recipe(plan)
    assert export_slurm.problems(recipe) == []
    # secrets are references, never values
    text = yaml.safe_dump(dgd)
    for _, s in ek.dynamo_clients(plan):
        for k, _ref in s.secret_env:
            assert f"name: {k}\n  value" not in text
    assert dgd["apiVersion"] == "nvidia.com/v1beta1" and dgd["kind"] == "DynamoGraphDeployment"


def test_disaggregated_pools_are_prefill_and_decode_components():
    plan = plan_of("gb200_disagg")
    comps = {c["name"]: c for c in ek.export(plan)["dgd"]["spec"]["components"]}
    assert {c["type"] for c in comps.values()} == {"frontend", "prefill", "decode"}
    main = comps["prefill"]["podTemplate"]["spec"]["containers"][0]
    assert main["name"] == "main" and main["resources"]["limits"] == {"nvidia.com/gpu": "4"}
    assert "--disaggregation-mode" in main["args"] and "prefill" in main["args"]
    assert all(e.get("name") not in ("ETCD_ENDPOINTS", "NATS_SERVER") for e in main["env"])  # the operator's


def test_multi_host_worker_is_multinode_with_the_operator_launching_ranks():
    plan = plan_of("gb200")  # tp8 over two 4-GPU trays
    worker = next(c for c in ek.export(plan)["dgd"]["spec"]["components"] if c["type"] == "worker")
    assert worker["multinode"] == {"nodeCount": 2} and worker["replicas"] == 1
    args = worker["podTemplate"]["spec"]["containers"][0]["args"]
    assert not {"--nnodes", "--node-rank", "--master-addr", "--headless"} & set(args)
    trt = plan_of("gb200", VARIANTS["trtllm-dynamo"])
    main = next(c for c in ek.export(trt)["dgd"]["spec"]["components"] if c["type"] == "worker")
    main = main["podTemplate"]["spec"]["containers"][0]
    assert main["command"] == ["python3"] and "mpirun" not in " ".join(main["args"])  # the MPI world unwrapped
    assert kv.export_problems(trt, ek.export(trt)["dgd"]) == []


def test_trtllm_engine_yaml_is_a_configmap_mounted_at_the_units_path():
    plan = plan_of("gb200", VARIANTS["trtllm-dynamo"])
    out = ek.export(plan)
    unit = next(s for _, s in ek.dynamo_clients(plan) if s.kind == "worker" and s.files)
    path, text = next((p, t) for p, t in unit.files if p.endswith(".yaml"))  # engines.yaml engine_file
    assert [m["data"] for m in out["configmaps"]] == [{path.rsplit("/", 1)[-1].replace("@", "-"): text}]
    main = next(c for c in out["dgd"]["spec"]["components"] if c["type"] == "worker")["podTemplate"]["spec"]
    assert any(m["mountPath"] == path for m in main["containers"][0]["volumeMounts"])


@pytest.mark.parametrize("image,semver", [
    # deploy/operator/internal/runtimeversion/runtimeversion.go: imageTag + Normalize
    ("nvcr.io/nvidia/ai-dynamo/vllm-runtime:1.6.1", True),
    ("nvcr.io/nvidia/ai-dynamo/vllm-runtime:v1.6", True),
    ("m3deploy/dynamo-vllm:1.6.1-658c4e664604", True),  # a prerelease suffix is still a version
    ("registry:5000/dynamo/vllm-runtime:1.6.1", True),
    ("vllm/vllm-openai@sha256:8896fd7b29fc4ee7ce839f146cb4757984c476ec79d0234ffa8c995dee6e339a", False),
    ("vllm/vllm-openai:nightly-5555a2d8@sha256:8896fd7b29fc4ee7ce839f146cb4757984c476ec79d0234ffa8c995dee6e339a",
     False),
    ("registry:5000/dynamo/vllm-runtime", False),
    ("vllm/vllm-openai:latest", False),
])
def test_semver_tag_follows_the_operators_runtimeversion(image, semver):
    assert ek.semver_tag(image) is semver


def test_a_digest_pinned_image_gets_runtime_version_override():
    digest = "vllm/vllm-openai@sha256:" + "a" * 64
    plan = plan_of("gb200_disagg", {"m3_image": digest, "m3_serving": "dynamo"})
    out = ek.export(plan)
    for c in out["dgd"]["spec"]["components"]:
        image = c["podTemplate"]["spec"]["containers"][0]["image"]
        assert ("runtimeVersionOverride" in c) is (not ek.semver_tag(image))
        if "runtimeVersionOverride" in c:
            assert c["runtimeVersionOverride"] == plan.dynamo_version
    assert kv.export_problems(plan, out["dgd"]) == []


# ---- seeded bad exports: each refused, naming its rule and the file the rule comes from -----------------------

def _base():
    plan = plan_of("gb200")
    return plan, ek.export(plan)["dgd"]


def _worker(d):
    return next(c for c in d["spec"]["components"] if c["type"] == "worker")


def _main(c):
    return c["podTemplate"]["spec"]["containers"][0]


def _set(path, value):
    def f(d):
        node = d
        for k in path[:-1]:
            node = node[k]
        node[path[-1]] = value
    return f


def _w(fn):
    return lambda d: fn(_worker(d))


BAD = [
    # (id, mutation, rule, source)
    ("missing-name", _w(lambda c: c.pop("name")), "schema:required", CRD),
    ("name-pattern", _w(lambda c: c.update(name="worker_0")), "schema:pattern", CRD),
    ("name-too-long", _w(lambda c: c.update(name="w" * 64)), "schema:maxLength", CRD),
    ("type-enum", _w(lambda c: c.update(type="router")), "schema:enum", CRD),
    ("replicas-negative", _w(lambda c: c.update(replicas=-1)), "schema:minimum", CRD),
    ("nodecount-1", _w(lambda c: c.update(multinode={"nodeCount": 1})), "schema:minimum", CRD),
    ("runtime-version-pattern", _w(lambda c: c.update(runtimeVersionOverride="v1.6")), "schema:pattern", CRD),
    ("backend-enum", _set(["spec", "backendFramework"], "tensorrt"), "schema:enum", CRD),
    ("v1alpha1-field", _w(lambda c: c.update(envs=[{"name": "A", "value": "1"}])), "schema:additionalProperties",
     CRD),
    ("args-not-strings", _w(lambda c: _main(c).update(args=["--tp", 8])), "schema:type", CRD),
    ("env-without-name", _w(lambda c: _main(c)["env"].append({"value": "x"})), "schema:required", CRD),
    ("no-containers", _w(lambda c: c["podTemplate"]["spec"].pop("containers")), "schema:required", CRD),
    ("too-many-components", lambda d: d["spec"]["components"].extend(
        copy.deepcopy(_worker(d)) | {"name": f"w{i}"} for i in range(25)), "schema:maxItems", CRD),
    ("duplicate-name", lambda d: d["spec"]["components"].append(copy.deepcopy(_worker(d))),
     "schema:x-kubernetes-list-map-keys", CRD),
    ("shm-pattern", _w(lambda c: c.update(sharedMemorySize="lots")), "schema:pattern", CRD),
    ("two-epp", lambda d: d["spec"]["components"].extend(
        [{"name": "epp-a", "type": "epp"}, {"name": "epp-b", "type": "epp"}]), "cel", CRD),
    ("names-differ-by-case", lambda d: d["spec"]["components"].append(copy.deepcopy(_worker(d)) | {"name": "Worker"}),
     "cel", CRD),
    ("min-available-over-replicas", _w(lambda c: c.update(minAvailable=3)), "cel", CRD),
    ("executor-backend-annotation", _w(lambda c: c["podTemplate"].update(
        metadata={"annotations": {"nvidia.com/vllm-distributed-executor-backend": "slurm"}})), "cel", CRD),
    ("epp-config-on-worker", _w(lambda c: c.update(eppConfig={})), "cel", CRD),
    ("restart-on-create", _set(["spec", "restart"], {"id": "1"}), "cel", CRD),
    ("no-components", _set(["spec", "components"], []), "webhook:components-required", WEBHOOK_DGD),
    ("missing-main", _w(lambda c: _main(c).update(name="engine")), "webhook:main-image", WEBHOOK_SHARED),
    ("main-empty-image", _w(lambda c: _main(c).update(image="")), "webhook:main-image", WEBHOOK_SHARED),
    ("digest-without-override", _w(lambda c: _main(c).update(image="vllm/vllm-openai@sha256:" + "b" * 64)),
     "webhook:runtime-version-override", RUNTIME_VERSION),
    ("latest-without-override", _w(lambda c: _main(c).update(image="vllm/vllm-openai:latest")),
     "webhook:runtime-version-override", WEBHOOK_SHARED),
    ("shm-negative", _w(lambda c: c.update(sharedMemorySize="-1Gi")), "webhook:shared-memory-size", WEBHOOK_SHARED),
    ("frontend-sidecar-unknown", _w(lambda c: c.update(frontendSidecar="frontend")), "webhook:frontend-sidecar",
     WEBHOOK_SHARED),
    ("epp-multinode", lambda d: d["spec"]["components"].append(
        {"name": "epp", "type": "epp", "multinode": {"nodeCount": 2}, "eppConfig": {},
         "podTemplate": {"spec": {"containers": [{"name": "main", "image": "x:1.6.1"}]}}}), "webhook:epp-multinode",
     WEBHOOK_SHARED),
    ("wrong-nodecount", _w(lambda c: c.update(multinode={"nodeCount": 3})), "plan:nodeCount", PLAN),
    ("not-multinode", _w(lambda c: c.pop("multinode")), "plan:nodeCount", PLAN),
    ("wrong-replicas", _w(lambda c: c.update(replicas=2)), "plan:replicas", PLAN),
    ("wrong-gpus", _w(lambda c: _main(c).update(resources={"limits": {"nvidia.com/gpu": "8"}})), "plan:gpus", PLAN),
    ("secret-as-value", _w(lambda c: _main(c)["env"].append({"name": "HF_TOKEN", "value": "hf_x"})),
     "plan:secret-value", PLAN),
    ("changed-flag", _w(lambda c: _main(c).update(args=[("256" if a == "128" else a) for a in _main(c)["args"]])),
     "plan:parity", PLAN),
    ("extra-env", _w(lambda c: _main(c)["env"].append({"name": "VLLM_X", "value": "1"})), "plan:parity", PLAN),
    ("dropped-env", _w(lambda c: _main(c).update(env=[e for e in _main(c)["env"] if e["name"] != "HF_HUB_OFFLINE"])),
     "plan:parity", PLAN),
]


def test_at_least_20_seeded_bad_exports():
    assert len(BAD) >= 20
    assert len({b[0] for b in BAD}) == len(BAD)


@pytest.mark.parametrize("case,mutate,rule,source", BAD, ids=[b[0] for b in BAD])
def test_seeded_bad_export_is_refused_naming_the_rule(case, mutate, rule, source):
    plan, dgd = _base()
    assert kv.export_problems(plan, dgd) == []
    bad = copy.deepcopy(dgd)
    mutate(bad)
    problems = kv.export_problems(plan, bad)
    assert problems, case
    assert any(f"[{rule}" in p and source in p for p in problems), problems


def test_cel_rules_are_the_crds_own():
    """The rules evaluated are the vendored CRD's x-kubernetes-validations, not restated here."""
    text = kv.SCHEMA_FILE.read_text()
    for rule in ("self.filter(c, has(c.type) && c.type == 'epp').size() <= 1",
                 "c2.name.lowerAscii() == c1.name.lowerAscii()"):
        assert rule in text
    assert "01cc1c3b677b20c5dd72d9eb76962dc04b55b8be" in text and CRD in text


# ---- the CLI ---------------------------------------------------------------------------------------------------

def _m3(*args):
    return subprocess.run([sys.executable, "-m", "m3deploy.cli", *args], capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})


def test_cli_export_k8s_writes_a_valid_dgd(tmp_path):
    r = _m3("export", "k8s", "inventories/gb200_disagg.py", str(tmp_path))
    assert r.returncode == 0, r.stderr
    text = (tmp_path / "gb200-disagg.dgd.yaml").read_text()
    doc = yaml.safe_load(text)
    assert kv.export_problems(plan_of("gb200_disagg"), doc) == []
    assert "# left out, and why:" in text and "Secret gb200-disagg-hf-token" in text


def test_cli_export_and_validate_refuse_a_standalone_cluster_with_exit_2(tmp_path):
    for args in (("export", "k8s", "inventories/h200.py", str(tmp_path)),
                 ("export", "slurm", "inventories/h200.py", str(tmp_path)),
                 ("validate", "--target", "k8s", "inventories/h200.py")):
        r = _m3(*args)
        assert r.returncode == 2, r
        assert "m3_serving" in r.stderr and "Fix:" in r.stderr and "Traceback" not in r.stderr
    assert not list(tmp_path.iterdir())  # nothing written


def test_cli_validate_target_k8s_and_slurm():
    for target in ("k8s", "slurm"):
        r = _m3("validate", "--target", target, "inventories/gb200.py")
        assert r.returncode == 0 and f"valid for {target}" in r.stdout, r.stderr


def test_internal_tls_is_refused_naming_the_key():
    plan = plan_of("gb200_disagg", {"m3_internal_tls": True})
    with pytest.raises(M3Error, match="m3_internal_tls"):
        ek.export(plan)


def test_two_workers_on_one_host_are_one_component_with_slot_ports_and_devices_renumbered(tmp_path):
    """Two TP4 engines on one 8-GPU MI355X host: slot 1's ports and GPUs 4-7 become a pod's own (slot-0 ports,
    GPUs 0-3), so both are replicas of one component; the parity check explains exactly those differences."""
    (tmp_path / "inventories").mkdir()
    (tmp_path / "group_data").symlink_to(ROOT / "group_data")
    inv = tmp_path / "inventories" / "mi355x.py"
    inv.write_text('control = [("mi355x-ctl", {"ssh_hostname": "10.60.0.10", "m3_address": "10.60.0.10"})]\n'
                   'workers = [("mi355x-01", {"ssh_hostname": "10.60.0.11", "m3_address": "10.60.0.11"})]\n')
    plan = load_plan(str(inv), ['m3_serving="dynamo"', 'm3_engine="sglang"', "m3_features=[]"], facts=False)
    dgd = ek.export(plan)["dgd"]
    worker = next(c for c in dgd["spec"]["components"] if c["type"] == "worker")
    assert worker["replicas"] == 2
    assert _main(worker)["resources"]["limits"] == {"amd.com/gpu": "4"}
    assert kv.export_problems(plan, dgd) == []
    explained, unexplained = parity(plan, dgd)
    assert unexplained == []
    assert {"slot-ports", "devices"} <= explained["mi355x-01/m3-worker@1"]
    assert not {"slot-ports", "devices"} & explained["mi355x-01/m3-worker@0"]
