"""The input contract (issue #10): bad inventories a user could type, each refused before any host is touched
with a message naming the host, the key (or the file) and the fix; or accepted and shown harmless.

The contracts these cases hold m3deploy to:
- systemd 252, systemd.syntax(7) and systemd.exec(7) "EnvironmentFile=": a unit or env-file line ends at a
  newline (\\n) and also at a carriage return (\\r); the env-file parser works on C strings, so a NUL ends the
  file there (the secrets after it are dropped). Hence \\n, \\r and NUL are refused in every value.
- ssh_config(5): one keyword per line; a newline in ssh_hostname starts a new keyword (a `ProxyCommand` that
  runs on the controller when `m3deploy verify` connects).
- etcd 3.4/3.5 `--listen-client-urls` / `--listen-peer-urls`: "list of URLs to listen on ... domain names are
  invalid for binding"; an IPv6 host goes in brackets (RFC 3986 3.2.2), as in every URL and in nats.conf.
- pyinfra 3.10 `--data`: pyinfra_cli/cli.py `_set_override_data` -> pyinfra_cli/util.py `parse_cli_arg`
  ("true"/"false" any case -> bool, then int, then JSON, else the string). `m3deploy --data` uses the same
  function (m3deploy.core.inventory.parse_cli_arg), checked here against pyinfra's own.

Docs: docs/INVENTORY.md holds settings.markdown_table() and settings.readme_table() verbatim; regenerate with
`M3_UPDATE_DOCS=1 python3 -m pytest tests/unit/test_bad_inputs.py -k docs`.
"""
from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from m3deploy.cli import main
from m3deploy.core import build as planmod
from m3deploy.core import inventory, settings
from m3deploy.core.errors import M3Error, ValidationError

ROOT = Path(__file__).resolve().parents[2]

# A valid Dynamo cluster on the sim platform (the testbed's shape): one control host, two workers.
CONTROL = [("ctl", {"ssh_hostname": "10.0.0.1", "m3_address": "10.0.0.1"})]
WORKERS = [("w1", {"ssh_hostname": "10.0.0.2", "m3_address": "10.0.0.2"}),
           ("w2", {"ssh_hostname": "10.0.0.3", "m3_address": "10.0.0.3"})]
CLUSTER = {"m3_platform": "sim", "m3_engine": "mocker", "m3_serving": "dynamo", "m3_parallel": "tp1"}


def hosts(all_data=None, per_host=None, control=CONTROL, workers=WORKERS):
    """The sim cluster with `all_data` over CLUSTER and per-host data merged in ({name: data})."""
    per_host = per_host or {}

    def members(group):
        return [(n, {**d, **per_host.get(n, {})}) for n, d in group]

    return inventory.hosts_from_dict({"control": members(control), "workers": members(workers)},
                                     all_data={**CLUSTER, **(all_data or {})})


def problems(**kw) -> list[str]:
    with pytest.raises(ValidationError) as e:
        planmod.build(hosts(**kw), name="sim")
    return e.value.problems


def refused(*must, **kw) -> str:
    """The one problem that names everything in `must`; it must also name the fix."""
    found = [p for p in problems(**kw) if all(m in p for m in must)]
    assert found, f"no problem names {must}: {problems(**kw)}"
    assert "Fix" in found[0] or "fix" in found[0], found[0]
    return found[0]


def test_the_base_cluster_is_valid():
    plan = planmod.build(hosts(), name="sim")
    assert [h.name for h in plan.hosts] == ["ctl", "w1", "w2"]


# ------------------------------------------------------------------ teardown paths (rm -rf on m3_state=absent)
@pytest.mark.parametrize("key,path", [
    ("m3_hf_cache", "/var/lib"), ("m3_venv_root", "/usr/local"), ("m3_state_dir", "/"), ("m3_hf_cache", "/home/alice"),
    ("m3_venv_root", "/opt"), ("m3_hf_cache", "/data/hf"), ("m3_state_dir", "/var/lib/m3/../.."),
    ("m3_venv_root", "opt/m3"), ("m3_hf_cache", "/usr/share/m3"), ("m3_state_dir", "/etc/m3"),
    ("m3_hf_cache", "/var/lib/m3/"),
])
def test_teardown_paths_must_be_m3_owned(key, path):
    p = refused(f"key {key}: ", all_data={key: path})
    assert p.startswith("hosts ctl, w1, w2"), p  # one message for every host the value reaches


@pytest.mark.parametrize("path", ["/opt/m3", "/var/lib/m3/hf", "/data/m3-hf", "/mnt/nvme0/m3", "/home/alice/m3"])
def test_m3_owned_paths_are_accepted(path):
    planmod.build(hosts(all_data={"m3_hf_cache": path, "m3_venv_root": path}), name="sim")


def test_teardown_role_refuses_an_unconfined_path_itself():
    from roles.teardown import _safe

    assert _safe("/var/lib/m3/hf") == "/var/lib/m3/hf"
    for p in ("/var/lib", "/usr/local", "/"):
        with pytest.raises(M3Error, match="refusing to delete"):
            _safe(p)


def test_teardown_removes_only_m3s_venvs_from_the_venv_root(tmp_path):
    """Run the teardown's shell (bash) on a directory that holds an m3 venv, a user's file and a foreign dir."""
    from roles.artifacts import STAMP
    from roles.teardown import remove_venvs

    root = tmp_path / "m3"
    (root / "dynamo-1.6.1" / "bin").mkdir(parents=True)
    (root / "dynamo-1.6.1" / STAMP).write_text("digest\n")
    (root / "dynamo-0.9-mine").mkdir()  # no stamp: not m3's
    (root / "notes.txt").write_text("keep me\n")
    assert subprocess.run(["bash", "-c", remove_venvs(str(root))]).returncode == 0
    assert sorted(p.name for p in root.iterdir()) == ["dynamo-0.9-mine", "notes.txt"]
    (root / "notes.txt").unlink()
    (root / "dynamo-0.9-mine").rmdir()
    assert subprocess.run(["bash", "-c", remove_venvs(str(root))]).returncode == 0
    assert not root.exists()  # empty: removed


# ------------------------------------------------------------------ unit, env-file and config injection
INJECT = "prod\n[Service]\nExecStartPre=+touch /tmp/x\n#"


@pytest.mark.parametrize("all_data,per_host,key,host", [
    ({"m3_cluster": INJECT}, None, "m3_cluster", "hosts ctl, w1, w2"),
    ({"m3_cluster": "prod\n"}, None, "m3_cluster", "hosts ctl, w1, w2"),  # `$(cat CLUSTER)`'s newline
    (None, {"w1": {"m3_address": "10.0.0.2\r"}}, "m3_address", "host w1"),  # a CRLF CSV
    ({"m3_extra_env": {"NCCL_DEBUG": "INFO\0HF_TOKEN=x"}}, None, "m3_extra_env", "hosts"),  # NUL ends an env file
    ({"m3_extra_env": {"KEY\n": "v"}}, None, "m3_extra_env", "hosts"),  # _ENV_NAME accepted "KEY\n"
    ({"m3_extra_args": ["--max-num-seqs", "8\r"]}, None, "m3_extra_args", "hosts"),
    ({"m3_state_dir": "/var/lib/m3\n"}, None, "m3_state_dir", "hosts"),  # WorkingDirectory=
    (None, {"w2": {"m3_interface": "eth0\n"}}, "m3_interface", "host w2"),
    (None, {"w1": {"ssh_hostname": "10.0.0.2\nProxyCommand touch /tmp/pwned"}}, "ssh_hostname", "host w1"),
    (None, {"w1": {"ssh_user": "root\r"}}, "ssh_user", "host w1"),
])
def test_control_characters_are_refused(all_data, per_host, key, host):
    p = refused(host, key, all_data=all_data, per_host=per_host)
    assert re.search("a newline|a carriage return|a NUL byte", p), p


def test_env_name_with_a_trailing_newline_is_refused_by_the_renderer_too():
    from m3deploy.deploy.render import env_line

    with pytest.raises(M3Error):
        env_line("KEY\n", "v")
    with pytest.raises(M3Error):
        env_line("KEY", "a\0b")


def test_host_name_with_a_newline_is_refused():
    bad = [("w1\nExecStartPre=/bin/sh", {"ssh_hostname": "10.0.0.2", "m3_address": "10.0.0.2"}), WORKERS[1]]
    p = refused("host name", "'w1\\nExecStartPre=/bin/sh'", workers=bad)
    assert "a newline" in p


def test_every_template_field_is_one_line():
    """The choke point under validation: the renderer refuses a control character in any {{ }} field."""
    from dataclasses import replace

    from m3deploy.deploy.render import render

    plan = planmod.build(hosts(), name="sim")
    svc = plan.host("ctl").service("m3-frontend")
    with pytest.raises(M3Error, match="a newline"):
        render("m3-frontend.service.j2", cluster="prod", service=replace(svc, workdir="/x\nExecStartPre=+/bin/sh"),
               user="m3", timeout_start_s=60, stop_timeout_s=10)
    with pytest.raises(M3Error, match="a carriage return"):
        render("m3-frontend.service.j2", cluster="prod\r", service=svc, user="m3", timeout_start_s=60,
               stop_timeout_s=10)


def test_ssh_config_writer_refuses_a_new_option():
    from m3deploy.check.checks import ssh_config_text

    h = inventory.InvHost("w1", ("workers",), {"ssh_hostname": "10.0.0.2\nProxyCommand touch /tmp/pwned"})
    with pytest.raises(M3Error, match="a newline"):
        ssh_config_text([h], "/tmp/ctl")


def test_image_is_shell_quoted_in_preflight():
    from m3deploy.check.preflight import nccl_command

    image = "vllm/vllm-openai:v0.11'; touch /tmp/pwned; echo '"
    cmd = nccl_command(8, image=image)
    assert shlex.quote(f"M3_NCCL_RUNNER docker {image}") in cmd
    assert f"'M3_NCCL_RUNNER docker {image}'" not in cmd
    # the whole command still parses as one shell program, with the image as one word
    assert subprocess.run(["bash", "-n", "-c", cmd]).returncode == 0


# ------------------------------------------------------------------ typo keys, strict types
@pytest.mark.parametrize("typo,meant", [
    ("m3_paralel", "m3_parallel"), ("m3_extra_envs", "m3_extra_env"), ("m3_platfrom", "m3_platform"),
    ("m3_allow_rebot", "m3_allow_reboot"), ("m3_hf_cach", "m3_hf_cache"),
])
def test_typo_keys_are_named_with_did_you_mean(typo, meant):
    p = refused(typo, f"did you mean {meant}?", all_data={typo: "x"})
    assert "it would be ignored" in p


def test_unknown_key_far_from_any_is_still_refused():
    refused("m3_owner_team", "docs/INVENTORY.md", all_data={"m3_owner_team": "infra"})


@pytest.mark.parametrize("text,value", [("false", False), ("False", False), ("no", False), ("0", False),
                                        ("true", True), ("YES", True), ("1", True), (0, False), (1, True)])
def test_booleans_parse_strictly(text, value):
    assert settings.get({"m3_allow_reboot": text}, "m3_allow_reboot") is value
    plan = planmod.build(hosts(all_data={"m3_auth": text}), name="sim")
    assert dict(plan.settings)["m3_auth"] is value


@pytest.mark.parametrize("text", ["nope", "flase", "2", "", []])
def test_non_booleans_are_refused(text):
    refused("m3_allow_reboot", "is not a boolean", all_data={"m3_allow_reboot": text})


@pytest.mark.parametrize("key,text", [
    ("m3_gpu_memory_gb", "141GB"), ("m3_cudagraph_capture_sizes", "1,2,4"), ("m3_nats_max_payload", "32MB"),
    ("m3_max_num_seqs", "256k"), ("m3_mocker_speedup_ratio", "fast"), ("m3_gpus_per_host", 0),
    ("m3_cudagraph_capture_sizes", [1, "2"]), ("m3_nats_max_payload", 1 << 30),
])
def test_numbers_are_typed_not_int_tracebacks(key, text):
    p = "\n".join(problems(all_data={key: text}))
    assert key in p and "Traceback" not in p


def test_a_number_from_a_csv_string_is_accepted():
    plan = planmod.build(hosts(all_data={"m3_nats_max_payload": "33554432"}), name="sim")
    assert dict(plan.settings)["m3_nats_max_payload"] == 33554432


@pytest.mark.parametrize("key,value", [("m3_state", "gone"), ("m3_weights_download", "s3"),
                                       ("m3_nvidia_driver_flavor", "closed"), ("m3_features", "text-only"),
                                       ("m3_extra_env", ["A=1"]), ("m3_dynamo_version", "../../etc"),
                                       ("m3_cluster", "a b"), ("m3_cluster", "../x"),
                                       ("m3_nvidia_driver_branch", "580x"), ("m3_rocm_version", "latest"),
                                       ("m3_docker_packages", ["docker.io; reboot"]), ("m3_gpu_users", ["Bob Smith"]),
                                       ("m3_nvidia_repo_url", "http://mirror/$(reboot)"),
                                       ("m3_container_python", "python3")])
def test_values_outside_their_set_are_refused(key, value):
    assert any(key in p for p in problems(all_data={key: value}))


# ------------------------------------------------------------------ --data: one parser, pyinfra's
DATA_SAMPLES = ["False", "false", "TRUE", "True", "0", "1", "01", "-3", "1.5", "[1, 2]", '{"a": 1}', "null",
                "x", "", "yes", "None", "NaN", "/var/lib/m3", "1e3", '"quoted"', "tp8"]


@pytest.mark.parametrize("text", DATA_SAMPLES)
def test_data_parses_like_pyinfra(text):
    from pyinfra_cli.util import parse_cli_arg

    ours, theirs = inventory.parse_cli_arg(text), parse_cli_arg(text)
    assert (repr(ours), type(ours)) == (repr(theirs), type(theirs))


def test_plan_data_m3_auth_false_plans_auth_off():
    """`m3deploy plan --data m3_auth=False` plans what `pyinfra --data m3_auth=False` deploys: auth off."""
    def plan(*data):
        args = ["plan", "--json", "--no-facts", "inventories/gb200.py", "--data", "m3_serving=dynamo"]
        r = CliRunner().invoke(main, args + [x for d in data for x in ("--data", d)], catch_exceptions=False)
        assert r.exit_code == 0, r.output
        return r.output

    assert '"m3_auth": true' in plan() and "ETCD_AUTH_PASSWORD" in plan()
    off = plan("m3_auth=False")
    assert '"m3_auth": false' in off and "ETCD_AUTH_PASSWORD" not in off


# ------------------------------------------------------------------ topology: duplicates, addresses, ports
# a host listed twice in a group: tests/unit/test_inventory.py test_duplicate_host_names_are_refused


def test_shared_ssh_hostname_is_refused():
    refused("host w1", "ssh_hostname 10.0.0.9", "host w2", per_host={"w1": {"ssh_hostname": "10.0.0.9"},
                                                                     "w2": {"ssh_hostname": "10.0.0.9"}})


def test_shared_address_is_refused():
    refused("host w1", "cluster address 10.0.0.9", per_host={"w1": {"m3_address": "10.0.0.9"},
                                                            "w2": {"m3_address": "10.0.0.9"}})


@pytest.mark.parametrize("addr,why", [("0.0.0.0", "binds every interface"), ("::", "binds every interface"),
                                      ("gpu-01.example.com", "not an IP address"), ("10.0.0.256", "not an IP"),
                                      ("10.0.0.2:22", "not an IP")])
def test_addresses_are_ip_literals(addr, why):
    refused("host w1", "m3_address", why, per_host={"w1": {"m3_address": addr}})


def test_a_dns_ssh_hostname_needs_m3_address():
    w = [("w1", {"ssh_hostname": "gpu-01.example.com"}), WORKERS[1]]
    refused("host w1", "m3_address is not set", "gpu-01.example.com", workers=w)


def test_ipv6_is_bracketed_in_every_url_and_in_nats_conf():
    from m3deploy.deploy.render import render

    v6 = {"ctl": {"m3_address": "fd00::1", "ssh_hostname": "fd00::1"},
          "w1": {"m3_address": "fd00::2", "ssh_hostname": "fd00::2"},
          "w2": {"m3_address": "fd00::3", "ssh_hostname": "fd00::3"}}
    plan = planmod.build(hosts(per_host=v6), name="sim")
    etcd = plan.host("ctl").service("etcd")
    assert "http://[fd00::1]:2379" in etcd.argv and "ctl=http://[fd00::1]:2380" in etcd.argv
    assert plan.endpoint == "http://[fd00::1]:8000/v1"
    assert dict(plan.host("w1").services[0].env)["NATS_SERVER"] == "nats://[fd00::1]:4222"
    assert all("://[" in s.readiness.url for h in plan.hosts for s in h.services if s.readiness and s.readiness.url)
    nats = plan.host("ctl").service("nats")
    port = {p.name: p for p in nats.ports}
    conf = render("nats.conf.j2", cluster="sim", service=nats, client=port["client"], monitor=port["monitor"],
                  store_dir="/x", auth=True, max_payload=1024)
    assert 'listen: "[fd00::1]:4222"' in conf and 'http: "[fd00::1]:8222"' in conf
    # IPv4 stays as it was (no change to deployed nats.conf files)
    assert "listen: 10.0.0.1:4222" in render("nats.conf.j2", cluster="sim", service=nats,
                                             client=port["client"].__class__("client", 4222, "10.0.0.1"),
                                             monitor=port["monitor"], store_dir="/x", auth=True, max_payload=1024)


@pytest.mark.parametrize("key,port,why", [("m3_frontend_port", 70000, "not a TCP port"),
                                          ("m3_system_port", 22, "below 1024"), ("m3_frontend_port", 80, "below 1024"),
                                          ("m3_kv_events_port", -1, "not a TCP port"),
                                          ("m3_master_port", "29500x", "not a whole number")])
def test_ports_are_checked(key, port, why):
    refused(key, why, all_data={key: port})


def test_a_port_on_the_ssh_port_is_refused():
    refused("host ctl", "ssh_port", per_host={"ctl": {"ssh_port": 2222}}, all_data={"m3_frontend_port": 2222})


def test_ports_colliding_on_a_host_are_refused():
    refused("host ctl", "port 8000", all_data={"m3_frontend_port": 8000, "m3_system_port": 8000},
            control=[("ctl", {"ssh_hostname": "10.0.0.1", "m3_address": "10.0.0.1"})],
            workers=[("ctl", {}), WORKERS[1]])


def test_variant_is_checked_on_every_worker_platform():
    w = [("w1", {"m3_address": "10.0.0.2", "m3_platform": "b200"}),
         ("w2", {"m3_address": "10.0.0.3", "m3_platform": "h200"})]
    p = problems(all_data={"m3_platform": None, "m3_engine": "vllm", "m3_serving": "standalone",
                           "m3_parallel": "tp8", "m3_variant": "nvfp4"}, workers=w, control=[])
    assert any("m3_variant" in x and "h200" in x and "w2" in x and "Fix" in x for x in p), p


# ------------------------------------------------------------------ files: syntax, encoding, source named
def validate(tmp_path, inv_text: str, group_data: dict[str, bytes] | None = None):
    inv = tmp_path / "inventories" / "c.py"
    inv.parent.mkdir(parents=True, exist_ok=True)
    inv.write_text(inv_text)
    for name, raw in (group_data or {}).items():
        (tmp_path / "group_data").mkdir(exist_ok=True)
        (tmp_path / "group_data" / name).write_bytes(raw)
    return CliRunner().invoke(main, ["validate", str(inv)], catch_exceptions=False), inv


GOOD_INV = ('control = [("ctl", {"m3_address": "10.0.0.1"})]\n'
            'workers = [("w1", {"m3_address": "10.0.0.2"})]\n')
GD = b'm3_platform = "sim"\nm3_engine = "mocker"\nm3_serving = "dynamo"\nm3_parallel = "tp1"\n'


def test_a_valid_file_inventory(tmp_path):
    r, _ = validate(tmp_path, GOOD_INV, {"all.py": GD})
    assert r.exit_code == 0, r.output


@pytest.mark.parametrize("inv_text,gd,where", [
    ('workers = [("w1", {})\n', GD, "inventories/c.py:1: Python syntax error"),
    (GOOD_INV, GD + b"m3_hf_cache = '/var/lib/m3/hf\n", "group_data/all.py:5: Python syntax error"),
    (GOOD_INV, GD + "m3_model_id = 'caf\u00e9'\n".encode("latin-1"), "group_data/all.py:5: not UTF-8"),
    (GOOD_INV + "x = undefined_name\n", GD, "inventories/c.py:3: NameError"),
])
def test_file_errors_are_one_line_with_file_and_line(tmp_path, inv_text, gd, where):
    r, _ = validate(tmp_path, inv_text, {"all.py": gd})
    assert r.exit_code == 2 and where in r.output, r.output
    assert "Traceback" not in r.output and len(r.output.strip().splitlines()) == 1, r.output


def test_problems_name_the_file_the_key_was_set_in(tmp_path):
    r, _ = validate(tmp_path, GOOD_INV, {"all.py": GD + b"m3_paralel = 'tp8'\n"})
    assert r.exit_code == 2
    assert "hosts ctl, w1 (" in r.output and "group_data/all.py): key m3_paralel" in r.output, r.output


def test_pyinfra_deploy_prints_one_line_for_a_broken_inventory(tmp_path):
    """`pyinfra INVENTORY deploy.py`: config.py has m3deploy read the inventory before pyinfra does."""
    inv = tmp_path / "c.py"
    inv.write_text('workers = [("@fake/w1", {})\n')
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, "-m", "pyinfra", "-y", str(inv), "deploy.py"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=120)
    out = r.stdout + r.stderr
    assert r.returncode == 2, out
    assert f"{inv}:1: Python syntax error" in out and "internal exception" not in out, out
    assert not (ROOT / "pyinfra-debug.log").exists()


# ------------------------------------------------------------------ shipped inventories, docs
@pytest.mark.parametrize("inv", sorted(p.name for p in (ROOT / "inventories").glob("*.py") if p.stem != "testbed"))
def test_shipped_inventories_pass_the_contract(inv):
    from m3deploy.core import inputs

    assert inputs.check_hosts(inventory.load_inventory(ROOT / "inventories" / inv)) == []


DOCS = ROOT / "docs" / "INVENTORY.md"
BEGIN, END = "<!-- keys: generated from m3deploy/core/settings.py -->\n", "<!-- keys: end -->\n"


README_BEGIN = ("<!-- keys:start (generated from m3deploy/core/settings.py README_KEYS: "
                "M3_UPDATE_DOCS=1 python3 -m pytest tests/unit/test_bad_inputs.py -k docs) -->\n")
GENERATED = [(DOCS, BEGIN, END, settings.markdown_table, settings.KEYS),
             (DOCS, README_BEGIN, "<!-- keys:end -->\n", settings.readme_table, settings.README_KEYS)]


@pytest.mark.parametrize("doc,begin,end,table,keys", GENERATED, ids=["INVENTORY.md", "INVENTORY.md-most-set"])
def test_docs_table_is_the_schema(doc, begin, end, table, keys):
    text = doc.read_text()
    table = table()
    if os.environ.get("M3_UPDATE_DOCS"):
        head, rest = text.split(begin, 1)
        doc.write_text(head + begin + table + end + rest.split(end, 1)[1])
        text = doc.read_text()
    assert begin + table + end in text, f"{doc.name} is stale: M3_UPDATE_DOCS=1 pytest -k docs"
    for k in keys:
        assert f"| `{k}` |" in text


@pytest.mark.parametrize("doc", ["README.md", "docs/INVENTORY.md"])
def test_every_key_the_docs_name_exists(doc):
    text = (ROOT / doc).read_text()
    named = set(re.findall(r"`(m3_[a-z0-9_]+)", text))
    assert named and not named - set(settings.KEYS), named - set(settings.KEYS)


# ------------------------------------------------------------------ seed rules (tests/fixtures/seeds/000-serving-recipe.txt)
def amd(platform="mi355x", **data):
    """A standalone vLLM cluster of one 8-GPU AMD worker, with `data` over it."""
    return {"all_data": {"m3_platform": platform, "m3_engine": "vllm", "m3_serving": "standalone",
                         "m3_parallel": "tp8", "m3_variant": "bf16", **data},
            "control": [], "workers": WORKERS[:1]}


def plan_of(**kw):
    return planmod.build(hosts(**kw), name="seed")


@pytest.mark.parametrize("data,key", [
    ({"m3_unset_args": ["--block-size"]}, "m3_unset_args"),
    ({"m3_unset_args": ["--block_size"]}, "m3_unset_args"),
    ({"m3_extra_args": ["--block-size", "16"]}, "m3_extra_args"),
    ({"m3_extra_args": ["--block_size", "16"]}, "m3_extra_args"),
    ({"m3_extra_args": ["--block-size=64"]}, "m3_extra_args"),
    ({"m3_extra_args": {"--block-size": 256}}, "m3_extra_args"),
])
def test_block_size_other_than_128_is_refused(data, key):
    """The seed: "--block-size 128 is mandatory on every platform (MSA sparse/index cache)"."""
    assert "128" in refused(key, "block", **amd(**data))


def test_block_size_128_in_extra_args_is_accepted():
    plan_of(**amd(m3_extra_args=["--block-size", "128"]))


def test_fp8_per_channel_with_encoder_parallel_is_refused_not_silently_dropped():
    assert "encoder-parallel" in refused("fp8-per-channel", **amd(m3_features=["fp8-per-channel", "encoder-parallel"]))


@pytest.mark.parametrize("platform", ["mi300x", "mi325x", "mi350x", "mi355x"])
def test_fp8_per_channel_applies_on_every_amd_platform(platform):
    """The seed lists PTPC under "AMD ROCm (MI350X/MI355X (gfx950), MI300X/MI325X (gfx942))"."""
    plan = plan_of(**amd(platform, m3_features=["fp8-per-channel"]))
    argv = " ".join(" ".join(s.argv) for h in plan.hosts for s in h.services)
    assert "--quantization fp8_per_channel" in argv


@pytest.mark.parametrize("mml", [524289, 1048576])
def test_amd_past_512k_needs_long_context_1m(mml):
    assert "long-context-1m" in refused("m3_max_model_len", "512K", **amd(m3_max_model_len=mml))


def test_amd_1m_with_long_context_1m_is_accepted():
    plan_of(**amd(m3_max_model_len=1048576, m3_features=["long-context-1m"]))
    plan_of(**amd(m3_max_model_len=524288))


@pytest.mark.parametrize("platform", ["mi350x", "mi355x", "mi300x"])
def test_bf16_below_tp8_on_amd_is_refused(platform):
    assert "tp8" in refused("m3_parallel", "BF16 needs TP=8", **amd(platform, m3_parallel="tp4"))


def test_mxfp8_at_tp4_on_mi355x_is_accepted():
    plan_of(**amd("mi355x", m3_parallel="tp4", m3_variant="mxfp8"))


def test_h20_capacity_refusal_names_m3_gpu_memory_gb():
    data = amd("h20", m3_parallel="tp4")
    assert "96 GB" in refused("m3_parallel", "m3_gpu_memory_gb", **data)


# ------------------------------------------------------------------ secrets never in m3_extra_env / m3_extra_args
SECRET = "s3cr3t-value-0123456789"


@pytest.mark.parametrize("name", ["HF_TOKEN", "hf_token", "OPENAI_API_KEY", "NATS_PASSWORD", "AWS_SECRET_ACCESS_KEY",
                                  "VLLM_APIKEY", "Db_Passwd"])
def test_secret_looking_env_names_are_refused_without_the_value(name):
    msg = refused("m3_extra_env", repr(name), all_data={"m3_extra_env": {name: SECRET}})
    assert SECRET not in msg and "m3_hf_token_file" in msg


@pytest.mark.parametrize("args", [["--api-key", SECRET], [f"--api-key={SECRET}"], ["--api_key", SECRET],
                                  {"--api-key": SECRET}, ["--hf-token", SECRET], ["--password", SECRET]])
def test_secret_flags_in_extra_args_are_refused_without_the_value(args):
    msg = refused("m3_extra_args", "secret", all_data={"m3_extra_args": args})
    assert SECRET not in msg


@pytest.mark.parametrize("env,args", [({"VLLM_MAX_TOKENS_PER_EXPERT": "1", "MONKEY_PATCH": "0"}, []),
                                      ({}, ["--max-num-batched-tokens", "8192", "--num-speculative-tokens", "3"])])
def test_names_merely_containing_token_or_key_are_fine(env, args):
    planmod.build(hosts(all_data={"m3_extra_env": env, "m3_extra_args": args}), name="sim")


def _controls(n: int) -> list:
    return [(f"ctl{i}", {"ssh_hostname": f"10.0.0.{10 + i}", "m3_address": f"10.0.0.{10 + i}"}) for i in range(n)]


@pytest.mark.parametrize("n,must", [
    (2, ("2 hosts", "an etcd of 2 has no more fault tolerance than 1 and twice the chance", "or 3")),
    (4, ("4 hosts", "survives no more host failures than a 3-member one", "or 3")),
    (5, ("5 hosts", "1 or 3", "not tested here")),
])
def test_control_groups_other_than_1_or_3_are_refused(n, must):
    """etcd needs a majority: an even control group buys no fault tolerance (docs/OPERATIONS.md HA control plane);
    every control host is named, with the fix."""
    msg = refused("group control", *must, control=_controls(n))
    assert all(f"ctl{i}" in msg for i in range(n)), msg


def test_three_control_hosts_are_accepted():
    plan = planmod.build(hosts(control=_controls(3)), name="sim")
    assert [h.name for h in plan.group("control")] == ["ctl0", "ctl1", "ctl2"]
# ------------------------------------------------------------------ weights source (docs/WEIGHTS.md)
@pytest.mark.parametrize("value,must", [
    ("mirror", "is not a weights source"), ("mirror:", "is not a weights source"), ("s3", "is not a weights source"),
    ("mirror:w12", "mirror:w12 names no host of the inventory (did you mean mirror:w2?)"),
    ("mirror:gpu-9", "mirror:gpu-9 names no host of the inventory. Fix:"),
    ("mirror:ctl", "the mirror ctl is not in the `workers` group"),
])
def test_weights_source_refused(value, must):
    p = refused("key m3_weights_source", must, all_data={"m3_weights_source": value})
    assert "mirror:<host>" in p or "workers group" in p


@pytest.mark.parametrize("value", ["hub", "controller", "shared", "mirror:w2"])
def test_weights_source_accepted(value):
    plan = planmod.build(hosts(all_data={"m3_weights_source": value}), name="sim")
    assert dict(plan.settings)["m3_weights_source"] == value


def test_the_old_shared_cache_key_names_its_replacement():
    p = refused("m3_hf_cache_shared", all_data={"m3_hf_cache_shared": True})
    assert "did you mean m3_weights_source = 'shared'?" in p


@pytest.mark.parametrize("data,must", [
    ({"m3_mock_repo_mb": 300}, "Fix: also set m3_weights_source = 'controller'"),
    ({"m3_weights_fanout": 0, "m3_weights_source": "controller"}, "m3_weights_fanout: 0 is out of range"),
    ({"m3_weights_fanout": "wide", "m3_weights_source": "controller"}, "is not a whole number"),
])
def test_weights_keys_refused(data, must):
    assert must in "\n".join(problems(all_data=data))


def test_mock_repos_give_sim_workers_a_weights_dir():
    plan = planmod.build(hosts(all_data={"m3_weights_source": "controller", "m3_mock_repo_mb": 300}), name="sim")
    assert [(h.name, h.weights_dir, h.weights_gb) for h in plan.hosts] == [
        ("ctl", "", 0), ("w1", "/var/lib/m3/hf", 1), ("w2", "/var/lib/m3/hf", 1)]
    assert [(r.repo, r.role) for r in plan.model_repos] == [(plan.model_id, "target")]
    assert planmod.build(hosts(), name="sim").model_repos == ()  # no mock repos: the testbed stages nothing
# ------------------------------------------------------------------ m3deploy render: refused writes nothing,
# accepted is shown harmless (every file the deploy would write, m3deploy.deploy.hostfiles)
@pytest.mark.parametrize("data,must", [
    (["m3_paralel=tp8"], ("m3_paralel", "did you mean m3_parallel?")),
    (["m3_cluster=prod\n[Service]\nExecStartPre=+/bin/touch /x\n#"], ("m3_cluster", "a newline")),
    (["m3_hf_cache=/var/lib"], ("m3_hf_cache", "/var/lib")),
    (['m3_extra_env={"HF_TOKEN": "hf_SecretValue123"}'], ("m3_extra_env", "HF_TOKEN")),
])
def test_render_refuses_a_bad_inventory_and_writes_nothing(tmp_path, data, must):
    _, inv = validate(tmp_path, GOOD_INV, {"all.py": GD})
    out = tmp_path / "render"
    r = CliRunner().invoke(main, ["render", str(inv), str(out), *[a for d in data for a in ("--data", d)]])
    assert r.exit_code == 2, r.output
    assert any(all(m in line for m in must) and "Fix" in line for line in r.output.splitlines()), r.output
    assert not out.exists() and "hf_SecretValue123" not in r.output


ODD = {"m3_cluster": "prod.eu-west_2",
       "m3_extra_env": {"M3_NOTE": 'a "b" $HOME %h `x` \\ #c; ExecStartPre=/bin/sh'},
       "m3_extra_args": ["--note", 'x $y %h "q" ;rm -rf /\tand a tab']}


def _render_all(all_data=None) -> dict[str, str]:
    from m3deploy.deploy.hostfiles import host_files

    plan = planmod.build(hosts(all_data=all_data), name="sim")
    return {f"{h.name}:{f.path}": f.text for h in plan.hosts for f in host_files(plan, h) if not f.link}


def test_accepted_odd_values_render_as_one_line_each():
    """Legal but odd: a cluster name with . _ -, an env value and an engine arg holding quotes, $, %, `, \\, #, ;
    and a tab. Every file has the lines of the plain cluster's (nothing injected, no section added), the env value
    is one escaped line, and ExecStart gives the engine the arg back exactly (systemd's $$ and %% escapes)."""
    plain, odd = _render_all(), _render_all(ODD)
    assert set(plain) == set(odd)
    for key, text in odd.items():
        extra = text.count("\nM3_NOTE=")  # the engines' env files have the one added line
        assert extra == (key.endswith(".env") and ("m3-worker@" in key or "m3-scripted" in key)), key
        assert len(text.splitlines()) == len(plain[key].splitlines()) + extra, key
        assert text.count("\n[") == plain[key].count("\n["), key
        if key.endswith(".service"):
            assert "prod.eu-west_2" in text and "ExecStartPre=/bin/sh" not in text, key
    w1 = odd["w1:/etc/systemd/system/m3-worker@0.service"]
    (exec_start,) = [ln.split("=", 1)[1] for ln in w1.splitlines() if ln.startswith("ExecStart=")]
    argv = shlex.split(exec_start.replace("%%", "%").replace("$$", "$"))
    assert argv[-2:] == ODD["m3_extra_args"], argv
    env = odd["w1:/etc/m3/m3-worker@0.env"]
    assert 'M3_NOTE="a \\"b\\" \\$HOME %h \\`x\\` \\\\ #c; ExecStartPre=/bin/sh"' in env.splitlines(), env


# ------------------------------------------------------------------ issue #28: the second pass, as a user types it
# Each case: the inventory file, group_data/all.py, `--data` arguments, and what the one refusal line must name.
# Sources of the rules: docs/INVENTORY.md "What is refused"; m3deploy/core/inputs.py names each parser's rule.
SIM_INV = ('control = [("ctl", {"m3_address": "10.0.0.1"})]\n'
           'workers = [("w1", {"m3_address": "10.0.0.2"}), ("w2", {"m3_address": "10.0.0.3"})]\n')
GPU_INV = 'workers = [("g1", {"m3_address": "10.0.1.2"})]\n'
GPU_GD = b'm3_platform = "h200"\nm3_engine = "vllm"\nm3_serving = "standalone"\nm3_parallel = "tp8"\n'
DYN_GD = b'm3_platform = "h200"\nm3_engine = "vllm"\nm3_serving = "dynamo"\nm3_parallel = "tp4"\nm3_variant = "mxfp8"\n'
DYN_INV = 'control = [("ctl", {"m3_address": "10.0.1.1"})]\n' + GPU_INV
BIG = "x" * 200_000


def _gd(base: bytes, extra: str) -> bytes:
    return base + extra.encode()


CORPUS_28 = [
    # keys that read as ours
    ("upper-case-key", SIM_INV, _gd(GD, 'M3_INTERFACE = "ens1f0"\n'), [],
     ("'M3_INTERFACE'", "did you mean m3_interface?", "group_data/all.py")),
    ("cyrillic-em", SIM_INV, _gd(GD, '\u043c3_parallel = "tp1"\n'), [],
     ("U+043C CYRILLIC SMALL LETTER EM", "did you mean m3_parallel?", "group_data/all.py")),
    ("dash-key-inline", SIM_INV.replace('"m3_address": "10.0.0.3"', '"m3-address": "10.0.0.3"'), GD, [],
     ("host w2", "'m3-address'", "did you mean m3_address?", "inventories/c.py")),
    ("upper-key-data", SIM_INV, GD, ["M3_SERVING=dynamo"], ("'M3_SERVING'", "m3_serving", "(--data)")),
    ("mixed-case-key", SIM_INV, _gd(GD, 'M3_Extra_Env = {"NCCL_DEBUG": "INFO"}\n'), [],
     ("'M3_Extra_Env'", "did you mean m3_extra_env?")),
    ("cyrillic-a-after-prefix", SIM_INV.replace('"m3_address": "10.0.0.3"', '"m3_\u0430ddress": "10.0.0.3"'), GD, [],
     ("host w2", "did you mean m3_address?", "CYRILLIC SMALL LETTER A")),
    ("fullwidth-m", SIM_INV.replace('"m3_address": "10.0.0.3"', '"\uff4d3_address": "10.0.0.3"'), GD, [],
     ("host w2", "FULLWIDTH LATIN SMALL LETTER M", "m3_address")),
    ("no-underscore", SIM_INV, _gd(GD, 'm3parallel = "tp1"\n'), [], ("'m3parallel'", "did you mean m3_parallel?")),
    # model ids and paths
    ("model-dotdot", SIM_INV, _gd(GD, 'm3_model_id = "../../models/MiniMax-M3"\n'), [], ("m3_model_id", "local path")),
    ("model-abs-path", SIM_INV, _gd(GD, 'm3_model_id = "/mnt/models/MiniMax-M3"\n'), [],
     ("m3_model_id", "mounts only m3_hf_cache")),
    ("model-space", SIM_INV, _gd(GD, 'm3_model_id = "MiniMax AI/MiniMax-M3"\n'), [],
     ("m3_model_id", "not a Hugging Face repo id")),
    ("model-url", SIM_INV, _gd(GD, 'm3_model_id = "https://huggingface.co/MiniMaxAI/MiniMax-M3"\n'), [],
     ("m3_model_id", "is a URL", "Fix: m3_model_id = 'MiniMaxAI/MiniMax-M3'")),
    ("model-revision", SIM_INV, _gd(GD, 'm3_model_id = "MiniMaxAI/MiniMax-M3@main"\n'), [],
     ("m3_model_id", "Fix: m3_model_id = 'MiniMaxAI/MiniMax-M3'")),
    ("model-home", SIM_INV, GD, ["m3_model_id=~/checkpoints/m3"], ("m3_model_id", "local path", "(--data)")),
    ("model-no-namespace", SIM_INV, _gd(GD, 'm3_model_id = "MiniMax-M3"\n'), [], ("m3_model_id", "no namespace")),
    ("model-dot-git", SIM_INV, _gd(GD, 'm3_model_id = "MiniMaxAI/MiniMax-M3.git"\n'), [],
     ("m3_model_id", "not ending .git")),
    # image references (distribution/reference)
    ("image-upper-registry", GPU_INV, _gd(GPU_GD, 'm3_image = "VLLM/vllm-openai:v0.11.0"\n'), [],
     ("host g1", "m3_image", "as a registry host", "Fix: m3_image = 'vllm/vllm-openai:v0.11.0'")),
    ("image-leading-space", GPU_INV, _gd(GPU_GD, 'm3_image = " vllm/vllm-openai:v0.11.0"\n'), [],
     ("m3_image", "white space", "Fix: m3_image = 'vllm/vllm-openai:v0.11.0'")),
    ("image-docker-flags", GPU_INV, _gd(GPU_GD, 'm3_image = "vllm/vllm-openai:v0.11.0 --privileged"\n'), [],
     ("m3_image", "docker flags '--privileged'")),
    ("image-short-digest", GPU_INV, _gd(GPU_GD, 'm3_image = "vllm/vllm-openai@sha256:1234abcd"\n'), [],
     ("m3_image", "not a docker image reference")),
    ("image-two-tags", GPU_INV, _gd(GPU_GD, 'm3_image = "vllm/vllm-openai:v0.11.0:latest"\n'), [],
     ("m3_image", "not a docker image reference")),
    ("image-upper-path", GPU_INV, _gd(GPU_GD, 'm3_image = "nvcr.io/nvidia/TensorRT-LLM:1.0"\n'), [],
     ("m3_image", "lower case", "Fix: m3_image = 'nvcr.io/nvidia/tensorrt-llm:1.0'")),
    ("image-empty-tag", GPU_INV, GPU_GD, ["m3_image=vllm/vllm-openai:"], ("m3_image", "(--data)")),
    # ports the plan derives
    ("system-port-derived", SIM_INV, _gd(GD, "m3_system_port = 65535\n"), [],
     ("host w1", "m3_system_port = 65535", "port 65536 for m3-scripted", "Fix: m3_system_port <= 65534")),
    ("worker-port-derived", GPU_INV,
     _gd(GPU_GD.replace(b"tp8", b"tp4"), 'm3_variant = "mxfp8"\nm3_worker_port = 65535\n'), [],
     ("host g1", "port 65536 for m3-worker@1", "Fix: m3_worker_port <= 65534")),
    ("kv-events-port-derived", DYN_INV, _gd(DYN_GD, "m3_kv_events_port = 65535\n"), [],
     ("host g1", "m3_kv_events_port", "port 65536", "Fix: m3_kv_events_port <= 65534")),
    # one host, two meanings
    ("v6-two-spellings", ('control = [("ctl", {"m3_address": "fd00:20::10"})]\n'
                          'workers = [("w1", {"m3_address": "fd00:20::11"}),\n'
                          '           ("w2", {"m3_address": "fd00:20:0:0:0:0:0:11"})]\n'),
     GD, [],
     ("host w1", "same cluster address fd00:20::11", "w2: fd00:20:0:0:0:0:0:11")),
    ("v4-mapped", SIM_INV.replace('"10.0.0.3"', '"::ffff:10.0.0.2"'), GD, [],
     ("host w1", "same cluster address 10.0.0.2", "one address spelled differently")),
    ("v6-upper-case", SIM_INV.replace('"10.0.0.2"', '"FD00::2"').replace('"10.0.0.3"', '"fd00::2"'), GD, [],
     ("host w1", "same cluster address fd00::2")),
    ("ssh-dns-case", ('control = [("ctl", {"m3_address": "10.0.0.1"})]\n'
                      'workers = [("w1", {"m3_address": "10.0.0.2", "ssh_hostname": "GPU-01.example.com"}),\n'
                      '           ("w2", {"m3_address": "10.0.0.3", "ssh_hostname": "gpu-01.example.com"})]\n'), GD, [],
     ("host w1", "same ssh_hostname gpu-01.example.com", "inventories/c.py")),
    ("zone", SIM_INV.replace('"10.0.0.3"', '"fe80::10%eth0"'), GD, [],
     ("host w2", "m3_address", "with a zone", "checkBindURLs", "inventories/c.py")),
    ("zone-in-ssh-hostname", SIM_INV.replace('{"m3_address": "10.0.0.3"}', '{"ssh_hostname": "fe80::10%ens1f0"}'),
     GD, [], ("host w2", "m3_address is not set", "with a zone", "Fix: set m3_address to")),
    ("link-local-no-zone", SIM_INV.replace('"10.0.0.3"', '"fe80::10"'), GD, [],
     ("host w2", "m3_address", "link-local", "Linux cannot bind")),
    ("url-v6-unbracketed", SIM_INV, _gd(GD, 'm3_extra_args = ["--otlp-traces-endpoint", "http://fd00::5:4317"]\n'),
     [], ("m3_extra_args", "without brackets", "Fix: [fd00::5]:4317")),
    # flags the plan owns (engines.yaml)
    ("extra-tp", GPU_INV, _gd(GPU_GD, 'm3_extra_args = ["--tensor-parallel-size", "4"]\n'), [],
     ("host g1", "m3_extra_args", "'--tensor-parallel-size'", "set m3_parallel instead")),
    ("extra-tp-alias", GPU_INV, _gd(GPU_GD, 'm3_extra_args = ["-tp", "4"]\n'), [],
     ("m3_extra_args", "'-tp'", "m3_parallel")),
    ("extra-port-dict", GPU_INV, _gd(GPU_GD, 'm3_extra_args = {"--port": 9000}\n'), [],
     ("m3_extra_args", "'--port'", "set m3_worker_port instead")),
    ("extra-served-name-eq", GPU_INV, _gd(GPU_GD, 'm3_extra_args = ["--served-model-name=m3"]\n'), [],
     ("m3_extra_args", "m3_served_model_name")),
    ("extra-host", GPU_INV, _gd(GPU_GD, 'm3_extra_args = ["--host", "0.0.0.0"]\n'), [],
     ("m3_extra_args", "'--host'", "set m3_address instead")),
    ("unset-tp", GPU_INV, _gd(GPU_GD, 'm3_unset_args = ["--tensor-parallel-size"]\n'), [],
     ("m3_unset_args", "'--tensor-parallel-size'", "m3_parallel")),
    ("extra-underscore", GPU_INV, _gd(GPU_GD, 'm3_extra_args = ["--max_model_len", "65536"]\n'), [],
     ("m3_extra_args", "'--max_model_len'", "set m3_max_model_len instead")),
    ("extra-sglang-alias", GPU_INV, _gd(GPU_GD.replace(b'"vllm"', b'"sglang"'),
                                        'm3_extra_args = ["--tensor-parallel-size", "4"]\n'), [],
     ("m3_extra_args", "on sglang", "m3_parallel")),
    ("extra-tp-data", GPU_INV, GPU_GD, ['m3_extra_args=["--tensor-parallel-size", "16"]'],
     ("m3_extra_args", "(--data)", "m3_parallel")),
    # sizes
    ("env-200k", SIM_INV, _gd(GD, f'm3_extra_env = {{"VLLM_EXTRA": "{BIG}"}}\n'), [],
     ("m3_extra_env", "64 KiB", "MAX_ARG_STRLEN")),
    ("arg-200k", SIM_INV, _gd(GD, f'm3_extra_args = ["--note", "{BIG}"]\n'), [],
     ("m3_extra_args", "MAX_ARG_STRLEN")),
    ("rdma-env-70k", SIM_INV.replace('{"m3_address": "10.0.0.3"}', '{"m3_address": "10.0.0.3", "m3_rdma_env": '
                                     '{"NCCL_IB_HCA": "' + "m" * 70_000 + '"}}'),
     GD, [], ("host w2", "m3_rdma_env", "64 KiB", "inventories/c.py")),
]


def _cli(tmp_path, cmd, inv_text, gd, data):
    _, inv = validate(tmp_path, inv_text, {"all.py": gd})
    args = {"validate": ["validate", str(inv)], "plan": ["plan", "--json", "--no-facts", str(inv)],
            "render": ["render", str(inv), str(tmp_path / "out")]}[cmd]
    return CliRunner().invoke(main, args + [x for d in data for x in ("--data", d)])


@pytest.mark.parametrize("name,inv_text,gd,data,must", CORPUS_28, ids=[c[0] for c in CORPUS_28])
def test_corpus_28_refused_by_validate(tmp_path, name, inv_text, gd, data, must):
    """`m3deploy validate`: exit 2, one line naming the host(s), the key, the file it was set in, and the fix."""
    r = _cli(tmp_path, "validate", inv_text, gd, data)
    assert r.exit_code == 2, r.output
    lines = [ln for ln in r.output.splitlines() if all(m in ln for m in must)]
    assert lines, r.output
    assert "Fix" in lines[0] and re.search(r"hosts? \S+", lines[0]), lines[0]
    assert BIG not in r.output  # a 200 KB value is not echoed back
    assert ".py" in lines[0] or "(--data)" in lines[0], lines[0]


@pytest.mark.parametrize("cmd", ["plan", "render"])
@pytest.mark.parametrize("name", ["cyrillic-em", "model-abs-path", "image-docker-flags", "system-port-derived",
                                  "v6-two-spellings", "zone", "extra-tp", "env-200k"])
def test_corpus_28_refused_by_plan_and_render(tmp_path, cmd, name):
    _, inv_text, gd, data, must = next(c for c in CORPUS_28 if c[0] == name)
    r = _cli(tmp_path, cmd, inv_text, gd, data)
    assert r.exit_code == 2 and any(all(m in ln for m in must) for ln in r.output.splitlines()), r.output
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("control,workers,must", [
    ('("n1", {"m3_address": "10.0.0.1"})', '("n1", {"m3_address": "10.0.0.2"})',
     "key m3_address is '10.0.0.1' in group `control` but '10.0.0.2' in group `workers`"),
    ('("n1", {"ssh_hostname": "gpu-a"})', '("n1", {"ssh_hostname": "gpu-b", "m3_address": "10.0.0.2"})',
     "key ssh_hostname is 'gpu-a' in group `control` but 'gpu-b' in group `workers`"),
])
def test_a_host_in_two_groups_with_different_data_is_refused(tmp_path, control, workers, must):
    r, inv = validate(tmp_path, f"control = [{control}]\nworkers = [{workers}]\n", {"all.py": GD})
    assert r.exit_code == 2 and must in r.output and f"{inv}: host n1" in r.output and "Fix" in r.output, r.output


def test_a_host_in_two_groups_with_the_same_data_is_fine(tmp_path):
    r, _ = validate(tmp_path, 'control = [("n1", {"m3_address": "10.0.0.1"})]\n'
                              'workers = [("n1", {"m3_address": "10.0.0.1"}), ("w2", {"m3_address": "10.0.0.2"})]\n',
                    {"all.py": GD})
    assert r.exit_code == 0, r.output


def test_pyinfra_deploy_refuses_a_host_in_two_groups_with_different_data(tmp_path):
    inv = tmp_path / "c.py"
    inv.write_text('control = [("@fake/n1", {"m3_address": "10.0.0.1"})]\n'
                   'workers = [("@fake/n1", {"m3_address": "10.0.0.2"})]\n')
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, "-m", "pyinfra", "-y", str(inv), "deploy.py"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=120, check=False)
    out = r.stdout + r.stderr
    assert r.returncode == 2 and "key m3_address is '10.0.0.1' in group `control`" in out, out


def test_the_kv_events_endpoint_brackets_an_ipv6_address():
    """zmq_tcp(7): an IPv6 endpoint is `tcp://[addr]:port`; unbracketed, the port is read from the address."""
    import json as _json

    w = [("g1", {"m3_address": "fd00:20::11"})]
    plan = planmod.build(hosts(all_data={"m3_platform": "h200", "m3_engine": "vllm", "m3_parallel": "tp8"},
                               control=[("ctl", {"m3_address": "fd00:20::10"})], workers=w), name="v6")
    argv = list(plan.host("g1").service("m3-worker@0").argv)
    cfg = _json.loads(argv[argv.index("--kv-events-config") + 1])
    assert cfg["endpoint"] == "tcp://[fd00:20::11]:5200"


def test_the_renderer_refuses_what_validation_would_have(tmp_path):
    """The choke point: host files are never written from a plan that holds a port past 65535, an image docker
    cannot parse or an unbracketed IPv6 URL, however the plan came to hold it."""
    from dataclasses import replace

    from m3deploy.core.model import Port
    from m3deploy.deploy.hostfiles import host_files

    plan = planmod.build(hosts(), name="sim")
    w1 = plan.host("w1")
    worker = w1.services[0]
    for bad, must in [(replace(worker, ports=(Port("system", 65536, "10.0.0.2"),)), "outside 1024-65535"),
                      (replace(worker, image="Vllm/x:1 --privileged"), "white space"),
                      (replace(worker, argv=(*worker.argv, "--x", "tcp://fd00::2:5200")), "unbracketed IPv6")]:
        hp = replace(w1, services=(bad,))
        with pytest.raises(M3Error, match=must):
            host_files(replace(plan, hosts=(hp,)), hp)


def test_percent_is_literal_in_every_unit_field():
    """systemd.unit(5) "Specifiers": `%h`, `%i`... expand in nearly every setting, `%%` is a literal `%`. A
    state directory holding `%` reaches every unit as `%%`, and systemd reads it back as typed."""
    from m3deploy.deploy.hostfiles import host_files

    plan = planmod.build(hosts(all_data={"m3_state_dir": "/data/m3-%h"}), name="sim")
    units = {f"{h.name}:{f.path}": f.text for h in plan.hosts for f in host_files(plan, h)
             if f.path.endswith(".service") and not f.link}
    assert units
    for name, text in units.items():
        assert not re.search(r"(?<!%)%(?!%)", text.replace("%%", "")), name  # no lone specifier left
        if "WorkingDirectory=" in text:
            (wd,) = [ln.split("=", 1)[1] for ln in text.splitlines() if ln.startswith("WorkingDirectory=")]
            assert wd.replace("%%", "%").startswith("/data/m3-%h/"), (name, wd)


def test_the_watchdog_unit_escapes_percent():
    from m3deploy.deploy.render import render

    text = render("m3-watchdog.service.j2", cluster="sim", unit="m3-frontend.service",
                  url="http://10.0.0.1:8000/live?probe=%41", script="/usr/local/lib/m3/m3-watchdog.py", grace_s=15)
    (line,) = [ln for ln in text.splitlines() if ln.startswith("ExecStart=")]
    assert line.endswith("http://10.0.0.1:8000/live?probe=%%41 15"), line
    assert "Description=" in text and "%41" not in text.replace("%%41", ""), text


def test_the_renderer_bounds_env_lines_and_arguments():
    from m3deploy.deploy.render import env_line, systemd_arg

    assert env_line("A", "x" * 60_000, "docker").startswith("A=")
    with pytest.raises(M3Error, match="64 KiB"):
        env_line("A", "x" * 70_000, "docker")
    with pytest.raises(M3Error, match="MAX_ARG_STRLEN"):
        systemd_arg("x" * 131_072)


def test_repo_ids_we_accept_are_ids_the_hub_accepts():
    """m3deploy.core.repos.is_repo_id is huggingface_hub's validate_repo_id, narrowed to ORG/NAME."""
    validators = pytest.importorskip("huggingface_hub.utils._validators")
    from m3deploy.core import repos

    for rid in ["MiniMaxAI/MiniMax-M3", "a/b", "org_1/m.v2", "x/y-", "x/-y", "x/y.git", "x/y--z", "caf\u00e9/m",
                "x/y..z", "x/" + "a" * 97, "gpt2", "x/y/z", " x/y"]:
        if repos.is_repo_id(rid):
            validators.validate_repo_id(rid)  # raises if the Hub's own check refuses it
