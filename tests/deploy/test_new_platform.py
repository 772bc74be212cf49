"""A newcomer adds a platform with YAML only (docs/ARCHITECTURE.md "Adding a platform"): a catalog entry and one
recipe layer in a directory named by M3DEPLOY_RECIPES. The plan, validation, preflight and the drivers role
follow from the catalog entry; no Python changes."""
from __future__ import annotations

import pytest

from m3deploy import facts as host_facts
from m3deploy.check.preflight import check_host
from m3deploy.core import build as planmod
from m3deploy.core import catalog, inventory
from m3deploy.core.errors import ValidationError
from roles.drivers import deploy_drivers

CATALOG = """\
platforms:
  h100: {vendor: nvidia, generation: hopper, gpu_model: "NVIDIA H100 80GB HBM3", gpus_per_host: 8,
         gpu_memory_gb: 80, arch: x86_64, fabric: hgx}
"""
LAYER = """\
layers:
  - name: platform:h100
    when: {platform: [h100], engine: vllm}
    image: vllm/vllm-openai:v0.21.0
    env:
      VLLM_H100_EXAMPLE: "1"
"""


@pytest.fixture
def h100(tmp_path, monkeypatch):
    (tmp_path / "layers").mkdir()
    (tmp_path / "catalog.yaml").write_text(CATALOG)
    (tmp_path / "layers" / "35-h100.yaml").write_text(LAYER)
    monkeypatch.setenv(catalog.EXTRA_ENV, str(tmp_path))
    return tmp_path


def plan(**data):
    groups = {"workers": [("h100-01", {"m3_address": "10.0.0.11"})]}
    return planmod.build(inventory.hosts_from_dict(groups, all_data={"m3_platform": "h100", "m3_variant": "mxfp8",
                                                                     "m3_parallel": "tp8", **data}), name="h100")


def test_plan_follows_the_catalog_entry_and_the_layer(h100):
    p = plan()
    hp = p.host("h100-01")
    assert (hp.gpu_vendor, hp.gpu_model, hp.gpus, hp.gpu_memory_gb) == ("nvidia", "NVIDIA H100 80GB HBM3", 8, 80)
    (w,) = hp.services
    assert w.image == "vllm/vllm-openai:v0.21.0" and ("VLLM_H100_EXAMPLE", "1") in w.env
    assert w.argv[w.argv.index("--tensor-parallel-size") + 1] == "8"
    src = {pv.key: pv.source for pv in w.provenance}
    assert src["image"] == str(h100 / "layers" / "35-h100.yaml")


def test_validation_reads_the_new_platform(h100):
    with pytest.raises(ValidationError) as e:
        plan(m3_variant="bf16")  # 1025 GB of weights > 8 x 80 GB
    assert any("8 x 80 GB = 640 GB" in x for x in e.value.problems), e.value.problems
    with pytest.raises(ValidationError) as e:
        plan(m3_parallel="tp16")  # two hosts per worker, one host listed
    assert any("multiple of 2 hosts" in x for x in e.value.problems), e.value.problems


def test_preflight_expects_the_catalog_gpus(h100):
    hp = plan().host("h100-01")
    gpus = [{"index": i, "name": "NVIDIA H100 80GB HBM3", "memory_mib": 81559, "driver_version": "580.95.05",
             "mig": "Disabled"} for i in range(8)]
    facts = host_facts.assemble({"NvidiaSmi": {"present": True, "gpus": gpus, "error": ""},
                        "NvidiaDriver": {"version": "580.95.05", "flavor": "open", "cuda_version": "13.0"}})
    checks = {c.name: c for c in check_host(hp, facts)}
    assert checks["gpu-count"].ok and checks["gpu-model"].ok and checks["gpu-memory"].ok and checks["driver"].ok
    facts["gpus"] = facts["gpus"][:4]
    assert not {c.name: c for c in check_host(hp, facts)}["gpu-count"].ok


def test_drivers_role_runs_the_fabric_of_the_catalog_entry(h100, fake):
    hp = plan().host("h100-01")
    os_ = host_facts.parse_os_release('ID=ubuntu\nVERSION_ID="24.04"\nVERSION_CODENAME=noble\nKERNEL=6.8.0-50-generic\n'
                             'ARCH=x86_64\n')
    run = fake(deploy_drivers, facts={host_facts.OsInfo: os_}, host_plan=hp)
    assert "Install nvidia-driver-580-open, nvidia-fabricmanager-580" in [n.split(" | ")[1] for n in run.names]
