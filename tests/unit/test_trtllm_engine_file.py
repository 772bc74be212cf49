"""TensorRT-LLM under Dynamo: the engine YAML `--extra-engine-args` names is a host file of the plan, which
`m3deploy render` shows and the manifest lists, mounted read-only into the worker's container; its change
restarts the worker (the unit's files check covers it)."""
from __future__ import annotations

import json

import yaml
from click.testing import CliRunner

from m3deploy.cli import main
from m3deploy.core import build as planmod
from m3deploy.deploy import hostfiles

INVENTORY = '''
control = [("ctl", {"ssh_hostname": "10.40.0.2", "m3_address": "10.40.0.2"})]
workers = [("b200-01", {"ssh_hostname": "10.40.0.11", "m3_address": "10.40.0.11"})]
'''
DATA = {"m3_platform": "b200", "m3_variant": "bf16", "m3_parallel": "tp8-ep", "m3_engine": "trtllm",
        "m3_serving": "dynamo", "m3_features": ["text-only"]}
PATH = "/etc/m3/m3-worker@0.trtllm.yaml"


def _inventory(tmp_path):
    inv = tmp_path / "trt.py"
    inv.write_text(INVENTORY)
    (tmp_path / "group_data").mkdir()
    (tmp_path / "group_data" / "all.py").write_text("".join(f"{k} = {v!r}\n" for k, v in DATA.items()))
    return inv


def test_render_shows_the_engine_yaml_and_the_worker_names_it(tmp_path):
    inv = _inventory(tmp_path)
    res = CliRunner().invoke(main, ["render", str(inv), str(tmp_path / "r"), "--host", "b200-01"])
    assert res.exit_code == 0, res.output
    engine = yaml.safe_load((tmp_path / "r" / "b200-01" / PATH.lstrip("/")).read_text())
    assert engine["trust_remote_code"] is True and engine["kv_cache_config"]["free_gpu_memory_fraction"] == 0.9
    index = json.loads((tmp_path / "r" / "b200-01.json").read_text())
    manifest = json.loads((tmp_path / "r" / "b200-01" / hostfiles.MANIFEST.lstrip("/")).read_text())
    assert PATH in {e["path"] for e in index["files"]} and PATH in manifest["files"]  # teardown removes it
    unit = (tmp_path / "r" / "b200-01" / "etc/systemd/system/m3-worker@0.service").read_text()
    assert f"-v {PATH}:{PATH}:ro" in unit and f"--extra-engine-args {PATH}" in unit


def test_the_worker_restarts_when_its_engine_yaml_changes(tmp_path):
    """roles/workers.py ships it among the ops whose change restarts the unit, and the check that a running unit
    started after its files were written (roles/lifecycle.service_files) covers it."""
    from roles import lifecycle

    plan = planmod.build(str(_inventory(tmp_path)))
    svc = plan.host("b200-01").service("m3-worker@0")
    assert [f.path for f in hostfiles.config_files(svc)] == [PATH]
    assert PATH in lifecycle.service_files(svc)
    # standalone trtllm-serve takes its flags on the command line: no engine YAML
    from m3deploy.core import inventory

    alone = planmod.build(inventory.hosts_from_dict({"workers": [("w", {"m3_address": "10.0.0.9"})]},
                                                    all_data={**DATA, "m3_serving": "standalone"}))
    assert alone.host("w").service("m3-worker@0").files == ()
