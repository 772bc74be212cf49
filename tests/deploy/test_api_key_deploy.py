"""m3_api_key_file through `pyinfra @fake` runs of deploy.py (tests/deploy/test_deploy_py.py's harness): the key
reaches the standalone vLLM worker only inside its 0600 env file (as VLLM_API_KEY, which `vllm serve` reads:
vllm-project/vllm vllm/entrypoints/openai/api_server.py build_app), never an op name, a command, the unit file or
any other upload; a key file that is missing or readable by others stops the run before any operation (exit 2).
And the deploy's own clients of the API (the serving check, the rollout's request, the pinned request) send it,
against tests/unit/test_api_key.py's stub of vLLM's AuthenticationMiddleware.
"""
from __future__ import annotations

import pytest

from m3deploy.core import build as planmod
from m3deploy.core import inventory
from m3deploy.core.errors import M3Error
from m3deploy.deploy.context import InvalidPlan
from tests.deploy.test_deploy_py import ROOT, Cluster, _runner, controller, op, unit_field  # noqa: F401 (fixture)
from tests.unit.test_api_key import KEY, MODEL, _plan, _VllmStub, stub  # noqa: F401 (fixture)


@pytest.fixture
def key_file(tmp_path):
    p = tmp_path / "api.key"
    p.write_text(KEY + "\n")
    p.chmod(0o600)
    return p


def _cluster(inv: str, override: dict) -> Cluster:
    c = Cluster(inv, override_data=override)
    c.plan = planmod.build(inventory.load_inventory(ROOT / "inventories" / f"{inv}.py", override_data=override),
                           name=inv)
    return c


def test_key_only_in_the_workers_0600_env_file(key_file):
    c = _cluster("h200", {"m3_api_key_file": str(key_file)})
    run = c.run()
    assert run.error is None
    (name,) = [h.name for h in c.hosts]
    ops = run.for_host(name)
    (w,) = [s for s in c.plan.host(name).services if s.kind == "worker"]
    env_op = op(ops, f"Render {w.env_file}")
    assert f"VLLM_API_KEY={KEY}" in env_op.uploads[w.env_file].splitlines()  # docker --env-file: literal
    cmds = env_op.commands
    up = cmds.index(f"UPLOAD {w.env_file}")
    assert any(f"chmod 0600 {w.env_file}" in x and "touch" in x for x in cmds[:up]), cmds  # 0600 before content
    unit = op(ops, f"Render /etc/systemd/system/{w.unit}").uploads[f"/etc/systemd/system/{w.unit}"]
    assert KEY not in unit and "api-key" not in unit_field(unit, "ExecStart")[0]
    for o in run.ops_by_host[name]:
        assert KEY not in o.name and not any(KEY in x for x in o.commands), o.name
        assert all(KEY not in text for dest, text in o.uploads.items() if dest != w.env_file), o.name


def test_readable_key_file_stops_the_deploy_before_any_op(key_file):
    key_file.chmod(0o644)
    c = _cluster("h200", {"m3_api_key_file": str(key_file)})
    run = c.run(raises=(InvalidPlan,))
    assert isinstance(run.error, InvalidPlan) and run.error.exit_code == 2
    assert run.state.get_op_order() == [] and all(ops == [] for ops in run.ops_by_host.values())
    msg = str(run.error.message)
    assert msg.startswith("the controller could not prepare the deploy, nothing was changed:")
    assert f"key m3_api_key_file: {key_file} is readable by others (mode 644). Fix: chmod 600 {key_file}" in msg


def test_deploys_own_requests_send_the_key(stub, key_file):
    """roles/serving.py's serving check, roles/rolling.py's routed request and readiness.pinned_chat."""
    from m3deploy.check import readiness
    from roles import rolling, serving

    plan = _plan(stub, key_file)
    assert serving.one_request(plan.endpoint, MODEL, 5, KEY).startswith("HTTP 200, 2 completion tokens")
    with pytest.raises(M3Error, match="HTTP 401"):
        serving.one_request(plan.endpoint, MODEL, 0)  # without it: refused (one attempt, no retry left)
    rolling._send(plan)()  # urllib raises on a 401
    assert readiness.pinned_chat(plan.endpoint, MODEL, 7, api_key=KEY) == 7
    assert [a for m, p, a in _VllmStub.seen if m == "POST"] == [f"Bearer {KEY}", None, f"Bearer {KEY}",
                                                                 f"Bearer {KEY}"]
