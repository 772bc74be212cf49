"""The worst bad inventories of issues #10 and #28 through `pyinfra @fake` runs of deploy.py: pyinfra's deploy
refuses them before any operation on any host (exit 2, one message naming host, key and fix). The full corpus,
with the contracts it checks against, is tests/unit/test_bad_inputs.py."""
from __future__ import annotations

import pytest

from m3deploy.deploy.context import InvalidPlan

CTL = {"ssh_hostname": "10.0.0.1", "m3_address": "10.0.0.1"}
W1 = {"ssh_hostname": "10.0.0.2", "m3_address": "10.0.0.2"}
CLUSTER = {"m3_platform": "sim", "m3_engine": "mocker", "m3_serving": "dynamo", "m3_parallel": "tp1"}
GROUPS = {"control": ["ctl"], "workers": ["w1"], "bad": ["ctl", "w1"]}


@pytest.mark.parametrize("override,host_data,must", [
    # teardown would rm -rf /var/lib and /usr/local on every host
    ({"m3_state": "absent", "m3_hf_cache": "/var/lib"}, {}, ("hosts ctl, w1", "m3_hf_cache", "/var/lib")),
    ({"m3_state": "absent", "m3_venv_root": "/usr/local"}, {}, ("hosts ctl, w1", "m3_venv_root", "/usr/local")),
    # a root ExecStartPre in every unit
    ({"m3_cluster": "prod\n[Service]\nExecStartPre=+/bin/touch /x\n#"}, {}, ("m3_cluster", "a newline")),
    # a ProxyCommand in verify's ssh_config; a CRLF address from a CSV
    ({}, {"w1": {"ssh_hostname": "10.0.0.2\nProxyCommand touch /x"}}, ("host w1", "ssh_hostname", "a newline")),
    ({}, {"w1": {"m3_address": "10.0.0.2\r"}}, ("host w1", "m3_address", "a carriage return")),
    # a typo that would deploy the default
    ({"m3_paralel": "tp8"}, {}, ("m3_paralel", "did you mean m3_parallel?")),
    ({}, {"w1": {"m3_address": "0.0.0.0"}}, ("host w1", "m3_address", "binds every interface")),
    # an API key that the Dynamo frontend would never check (docs/CONTRACTS.md "API keys")
    ({"m3_api_key_file": "/etc/m3/k"}, {}, ("m3_api_key_file", "Dynamo 1.6.1 frontend has no API-key option")),
    # issue #28: a key in Cyrillic, a zone, a derived port past 65535, a path as the model, a plan-owned flag,
    # one address in two spellings
    ({"\u043c3_parallel": "tp1"}, {}, ("U+043C", "did you mean m3_parallel?")),
    ({}, {"w1": {"m3_address": "fe80::10%eth0"}}, ("host w1", "m3_address", "with a zone")),
    ({"m3_system_port": 65535}, {}, ("host w1", "port 65536 for m3-scripted", "m3_system_port <= 65534")),
    ({"m3_model_id": "/models/MiniMax-M3"}, {}, ("m3_model_id", "local path")),
    ({"m3_extra_args": ["--model-name", "m3"]}, {}, ("m3_extra_args", "set m3_served_model_name instead")),
    ({}, {"w1": {"m3_address": "::ffff:10.0.0.1"}}, ("host ctl", "same cluster address 10.0.0.1")),
])
def test_refused_before_any_operation(deploy_file, override, host_data, must):
    data = {"ctl": {**CLUSTER, **CTL, **host_data.get("ctl", {})}, "w1": {**CLUSTER, **W1, **host_data.get("w1", {})}}
    run = deploy_file({n: {"data": d, "facts": {}} for n, d in data.items()}, GROUPS, override_data=override,
                      raises=(InvalidPlan,))
    assert isinstance(run.error, InvalidPlan) and run.error.exit_code == 2
    assert run.state.get_op_order() == [] and all(ops == [] for ops in run.ops_by_host.values())
    err = str(run.error.message)
    assert err.startswith("invalid cluster plan, nothing was changed:")
    line = next((x for x in err.splitlines() if all(m in x for m in must)), "")
    assert line and "Fix" in line, err


def test_allow_reboot_string_false_does_not_reboot(fake):
    """`m3_allow_reboot = "false"` (a string, as a CSV or a careless --data carries it) is False: stop, no reboot."""
    from roles.drivers import deploy_drivers
    from tests.deploy.test_gpu_roles import fresh_facts, hplan

    run = fake(deploy_drivers, facts=fresh_facts(), host_plan=hplan(data={"m3_allow_reboot": "false"}))
    names = [n.split(" | ")[1] for n in run.names]
    assert not any("Reboot" in n for n in names) and any(n.startswith("Stop:") for n in names), names
    run = fake(deploy_drivers, facts=fresh_facts(), host_plan=hplan(data={"m3_allow_reboot": "yes"}))
    assert any("Reboot" in n.split(" | ")[1] for n in run.names)


def test_teardown_deletes_only_confined_paths_and_stamped_venvs(deploy_file):
    data = {"ctl": {**CLUSTER, **CTL}, "w1": {**CLUSTER, **W1}}
    run = deploy_file({n: {"data": d, "facts": {}} for n, d in data.items()}, GROUPS, override_data={"m3_state": "absent"})
    for name in ("ctl", "w1"):
        ops = run.for_host(name)
        removed = [n.split(" | Remove ", 1)[1] for op in ops for n in op.names if " | Remove /" in n]
        bad = [p for p in removed if p != "/etc/apt/apt.conf.d/80m3deploy" and not p.startswith(
            ("/opt/m3/", "/var/lib/m3", "/etc/m3", "/etc/systemd/system/", "/usr/local/lib/m3/"))]
        assert removed and not bad, bad
        assert "/etc/apt/apt.conf.d/80m3deploy" in removed, removed  # apt's retry setting (roles/apt.py)
        venvs = next(op for op in ops if op.name.startswith("Tear down the MiniMax-M3 stack | Remove m3's venvs"))
        assert "/opt/m3/dynamo-*" in venvs.commands[0] and "rmdir -- /opt/m3" in venvs.commands[0]
