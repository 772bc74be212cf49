"""Worker generations (issue 38): the id decided once from the versions that define a generation, the namespace
suffix the workers register under, the catalog's version-skew policy refusing a change before any host (validate
and the deploy), and `m3deploy plan --diff-deployed` showing a generation change with its order."""
from __future__ import annotations

import pytest
from click.testing import CliRunner

from m3deploy.cli import load_plan, main
from m3deploy.controller import deployed
from m3deploy.core import generation as gen
from m3deploy.core.errors import ValidationError
from tests.unit.test_plan_snapshots import ROOT

INV = str(ROOT / "inventories" / "gb200_disagg.py")  # Dynamo, two control hosts' frontends, prefill + decode


@pytest.fixture(autouse=True)
def _config(tmp_path, monkeypatch):
    monkeypatch.setenv("M3DEPLOY_CONFIG", str(tmp_path / "config"))


def _env(plan, kind):
    return [dict(s.env) for h in plan.hosts for s in h.services if s.kind == kind]


def _record(plan):
    for hp in plan.hosts:
        deployed.write_host(plan, hp, {"dynamo": plan.dynamo_version})


def test_every_worker_registers_under_its_generation_and_frontends_discover_all():
    plan = load_plan(INV, [], facts=False)
    g = plan.generation
    assert g.id.startswith("g") and len(g.id) == 9 and g.dynamo_version == "1.6.1"
    workers = _env(plan, "worker")
    assert workers and all(e[gen.SUFFIX_ENV] == g.id for e in workers)  # prefill and decode: one namespace
    # frontends set no namespace: Dynamo's frontend then discovers every namespace (one WorkerSet per generation)
    assert all(gen.SUFFIX_ENV not in e and "DYN_NAMESPACE" not in e for e in _env(plan, "frontend"))


def test_the_generation_follows_what_defines_it_and_only_that():
    base = load_plan(INV, [], facts=False).generation
    assert set(base.card) == {"m3_max_model_len", "m3_disagg"}  # the inventory sets them: its card's
    # flags the model card does not carry roll in place: the same generation
    for data in (["m3_max_num_seqs=64"], ['m3_extra_args=["--max-num-batched-tokens", "8192"]'],
                 ['m3_extra_env={"VLLM_LOGGING_LEVEL": "DEBUG"}']):
        assert load_plan(INV, data, facts=False).generation == base, data
    for data in (['m3_dynamo_version="1.6.0"'], ['m3_image="nvcr.io/nvidia/ai-dynamo/vllm-runtime:1.6.0"']):
        assert load_plan(INV, data, facts=False).generation.id != base.id, data


@pytest.mark.parametrize("data, key", [
    (["m3_max_model_len=65536"], "m3_max_model_len"),  # the card's context length (the inventory's: 40000)
    (['m3_served_model_name="m3"'], "m3_served_model_name"),  # its display name
    (['m3_extra_args=["--custom-jinja-template", "/etc/m3/chat.jinja"]'], "m3_extra_args"),  # its chat template
    (['m3_unset_args=["--router-mode"]'], "m3_unset_args"),  # its advertised router config
])
def test_a_change_of_the_model_card_is_a_new_generation_and_namespace(data, key):
    """Dynamo's frontend rejects a worker whose model card differs from its WorkerSet's (seen with vLLM on the
    testbed: the rolled worker was listed and never sent a request): such a change rolls into a new namespace."""
    base = load_plan(INV, [], facts=False)
    plan = load_plan(INV, data, facts=False)
    g = plan.generation
    assert g.id != base.generation.id and key in g.card and key in g.describe()
    assert all(e[gen.SUFFIX_ENV] == g.id for e in _env(plan, "worker"))
    # `plan --explain` names the key among the suffix's sources
    r = CliRunner().invoke(main, ["plan", INV, "--no-facts", "--explain", "--data", data[0]])
    line = next(ln for ln in r.output.splitlines() if f"env:{gen.SUFFIX_ENV}" in ln)
    assert g.id in line and key in line.split(" from ", 1)[1], line
    # the record shows it as a generation change, and its roll back sets the key back (to its default here)
    _record(base)
    change = deployed.generation_change(plan, deployed.load(plan.name))
    assert change[0].startswith(f"generation change: {base.generation.id} on ") and key in change[0]
    assert f"into namespace dynamo-{g.id}" in "\n".join(change)
    _record(plan)
    back = deployed.rollback_data(deployed.load(plan.name))
    assert any(b.startswith(f"{key}=") for b in back), back
    assert load_plan(INV, back, facts=False).generation == base.generation


def test_skew_policy_pairs_from_the_catalog():
    assert gen.skew_allowed("1.6.1", "1.6.1")
    assert gen.skew_allowed("1.6.1", "1.6.0") and gen.skew_allowed("1.6.0", "1.6.1")
    assert not gen.skew_allowed("1.6.1", "1.5.0")
    assert gen.change_problems("1.6.0", "1.6.1", "x") == []


def test_a_skew_the_policy_forbids_is_refused_by_validate_and_the_deploy(tmp_path):
    old = load_plan(INV, ['m3_dynamo_version="1.5.0"'], facts=False)
    _record(old)
    new = load_plan(INV, [], facts=False)
    with pytest.raises(ValidationError) as e:  # what deploy.py's cluster_plan raises before any host
        deployed.refuse_skew(new)
    msg = str(e.value)
    assert "m3_dynamo_version" in msg and "1.5.0" in msg and "1.6.1" in msg and "version_skew" in msg
    r = CliRunner().invoke(main, ["validate", INV])
    assert r.exit_code == 2 and "Dynamo 1.5.0" in r.output and "Traceback" not in r.output
    # an allowed pair passes
    _record(load_plan(INV, ['m3_dynamo_version="1.6.0"'], facts=False))
    deployed.refuse_skew(new)
    assert CliRunner().invoke(main, ["validate", INV]).exit_code == 0


def test_diff_deployed_shows_a_generation_change_with_its_order():
    old = load_plan(INV, ['m3_dynamo_version="1.6.0"'], facts=False)
    _record(old)
    new = load_plan(INV, [], facts=False)
    lines = deployed.diff(new, deployed.load(new.name))
    head = lines[0]
    assert head.startswith(f"generation change: {old.generation.id} on ") and new.generation.id in head
    assert "dynamo 1.6.1" in head
    order = "\n".join(lines[1:5])
    assert order.index("frontends restart") < order.index("workers roll") < order.index("verify")
    assert f"dynamo-{new.generation.id}" in order
    r = CliRunner().invoke(main, ["plan", INV, "--no-facts", "--diff-deployed"])
    assert r.exit_code == 1 and "generation change" in r.output
    # the same generation again: no generation line
    _record(new)
    assert not any(x.startswith("generation change") for x in deployed.diff(new, deployed.load(new.name)))


def test_the_record_keeps_the_generation_to_roll_back_to():
    old = load_plan(INV, ['m3_dynamo_version="1.6.0"'], facts=False)
    _record(old)
    assert deployed.rollback_data(deployed.load(old.name)) == []  # nothing replaced yet
    new = load_plan(INV, [], facts=False)
    _record(new)
    _record(new)  # a deploy of the same generation keeps what the change replaced
    back = deployed.rollback_data(deployed.load(new.name))
    assert "m3_dynamo_version=1.6.0" in back
    r = CliRunner().invoke(main, ["plan", INV, "--no-facts", "--diff-deployed"])
    assert r.exit_code == 0 and "--data m3_dynamo_version=1.6.0" in r.output
    # the roll back it names is the previous generation, and the skew policy allows it
    again = load_plan(INV, back, facts=False)
    assert again.generation == old.generation
    deployed.refuse_skew(again)


def test_a_generation_change_keeps_the_previous_venv_and_images_on_the_host():
    """roles/manifest.py: the leftovers of a generation change are split; the previous venv and images stay, named
    in the new manifest (teardown removes them; the next deploy of the same generation removes them)."""
    from m3deploy.deploy import shrink

    old = {"venvs": ["/opt/m3/dynamo-1.6.0"], "images": ["m3deploy/dynamo-mocker:1.6.0-x"],
           "files": ["/etc/m3/m3-worker@1.env"]}
    new = {"m3deploy_manifest": 1, "venvs": ["/opt/m3/dynamo-1.6.1"], "images": ["m3deploy/dynamo-mocker:1.6.1-x"],
           "files": []}
    gone = shrink.leftovers(old, new)
    assert gone["venvs"] == ["/opt/m3/dynamo-1.6.0"]
    now, written = shrink.keep_previous_generation(gone, new)
    assert now["venvs"] == [] and now["images"] == [] and "/etc/m3/m3-worker@1.env" in now["files"]
    assert written["venvs"] == ["/opt/m3/dynamo-1.6.1", "/opt/m3/dynamo-1.6.0"]
    assert written["images"][-1] == "m3deploy/dynamo-mocker:1.6.0-x" and written["m3deploy_manifest"] == 1
    # the next deploy of the same generation: the previous venv is a leftover again, and goes
    assert shrink.leftovers(written, new)["venvs"] == ["/opt/m3/dynamo-1.6.0"]


def test_a_model_card_change_under_the_planner_is_refused_before_any_host():
    """With m3_planner the workers stay in the namespace `dynamo` (the planner addresses it): a card change
    cannot move them to their own WorkerSet, so the deploy and validate refuse it, naming the key and the fix."""
    from m3deploy.core import build, inventory, planner

    def plan(**data):
        workers = [(f"w{i}", {"m3_address": f"10.0.0.{i}"}) for i in (1, 2, 3)]
        groups = {"control": [("c1", {"m3_address": "10.0.0.99"})], "workers": workers, "standby": workers[2:]}
        return build.build(inventory.hosts_from_dict(groups, all_data={
            "m3_platform": "sim", "m3_parallel": "tp1", "m3_engine": "mocker", "m3_serving": "dynamo",
            "m3_planner": {"cooldown_s": 30}, **data}), name="t")

    old = plan()
    assert old.generation.namespace == planner.NAMESPACE
    assert all(gen.SUFFIX_ENV not in e for e in _env(old, "worker"))
    _record(old)
    assert deployed.skew_problems(plan(m3_max_num_seqs=8), deployed.load("t")) == []  # not in the card: rolls
    problems = deployed.skew_problems(plan(m3_max_model_len=2048), deployed.load("t"))
    assert len(problems) == 1 and problems[0].startswith("key m3_max_model_len: the deploy record (")
    assert "runs unset, the plan 2048" in problems[0] and "without m3_planner" in problems[0]
    with pytest.raises(ValidationError):
        deployed.refuse_skew(plan(m3_max_model_len=2048))
    # a record written before the card counted (no "card"): nothing known to compare, nothing refused
    doc = deployed.load("t")
    for e in doc["hosts"].values():
        e["planned"]["generation"].pop("card", None)
    assert deployed.skew_problems(plan(m3_max_model_len=2048), doc) == []
    # without the planner the same change is a generation change into a new namespace: allowed
    free = load_plan(INV, ["m3_max_model_len=65536"], facts=False)
    assert free.generation.namespace == f"dynamo-{free.generation.id}"
    _record(load_plan(INV, [], facts=False))
    assert deployed.skew_problems(free, deployed.load(free.name)) == []
