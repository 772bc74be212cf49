"""Port collisions refused by `m3deploy validate` (exit 2) naming the key behind each port, the host, the file the
user set it in and the key to change (m3deploy.core.ports; issue 35): two services of one host on one port (the
second fails its bind long after drivers and weights are in place), or a service on sshd's port (ssh_port).
A key file that is a directory says so (m3_api_key_file; the TLS files: tests/unit/test_user_tls.py).
"""
from __future__ import annotations

import pytest

from tests.unit.test_user_tls import run_validate

INV = ('control = [("ctl", {"m3_address": "10.0.0.1"})]\n'
       'workers = [("w1", {"m3_address": "10.0.0.2"}), ("w2", {"m3_address": "10.0.0.3"})]\n')
GD = 'm3_platform = "sim"\nm3_engine = "mocker"\nm3_serving = "dynamo"\nm3_parallel = "tp1"\n'
DISAGG = "m3_disagg = {'prefill': {'workers': 1}, 'decode': {'workers': 1}, "
PLANNER_INV = INV.rstrip("\n") + '\nstandby = [("s1", {"m3_address": "10.0.0.4"})]\nworkers.append(standby[0])\n'


def run(tmp_path, extra: str, inv: str = INV):
    return run_validate(tmp_path, extra, inv, GD)


CASES = [
    ("edge-vs-prometheus", "m3_edge = True\nm3_monitor = True\nm3_prometheus_port = 8443\n", INV,
     ("host ctl (", "group_data/all.py)", "port 8443", "m3-edge (https, m3_edge_port)",
      "m3-prometheus (http, m3_prometheus_port)", "Fix: set m3_prometheus_port")),
    ("edge-vs-etcd", "m3_edge = True\nm3_edge_port = 2379\n", INV,
     ("host ctl (", "group_data/all.py)", "port 2379", "etcd (client, a fixed port", "Fix: set m3_edge_port")),
    ("prometheus-vs-frontend", "m3_monitor = True\nm3_prometheus_port = 8000\n", INV,
     ("host ctl (", "group_data/all.py", "group_data/control.py", "m3-frontend (http, m3_frontend_port)", "Fix: set m3_frontend_port or m3_prometheus_port")),
    ("planner-vs-edge", "m3_edge = True\nm3_planner = {'max': 2, 'port': 8443}\n", PLANNER_INV,
     ("host ctl (", "group_data/all.py)", "port 8443", "m3_planner.port", "m3_edge_port", "Fix: set")),
    ("disagg-bootstrap-vs-system", DISAGG + "'bootstrap_port': 9090}\n", INV,
     ("host w1 (", "group_data/all.py)", "port 9090", "(bootstrap, m3_disagg.bootstrap_port)",
      "(system, m3_system_port)", "Fix: set m3_disagg.bootstrap_port")),
    ("node-exporter-on-sshd", "m3_monitor = True\nm3_node_exporter_port = 2222\n",
     INV.replace('("w1", {"m3_address": "10.0.0.2"})', '("w1", {"m3_address": "10.0.0.2", "ssh_port": 2222})'),
     ("host w1 (", "group_data/all.py", "inventories/c.py", "key m3_node_exporter_port", "port 2222",
      "is the host's ssh_port", "Fix: set m3_node_exporter_port to another port")),
    ("sshd-on-node-exporter", "m3_monitor = True\n",
     INV.replace('("w1", {"m3_address": "10.0.0.2"})', '("w1", {"m3_address": "10.0.0.2", "ssh_port": 9100})'),
     ("host w1 (", "inventories/c.py)", "key m3_node_exporter_port", "port 9100", "is the host's ssh_port",
      "or move sshd (ssh_port)")),
]


@pytest.mark.parametrize("name,extra,inv,must", CASES, ids=[c[0] for c in CASES])
def test_port_collisions_name_the_keys(tmp_path, name, extra, inv, must):
    r = run(tmp_path, extra, inv)
    assert r.exit_code == 2, r.output
    assert any(all(m in ln for m in must) for ln in r.output.splitlines()), r.output
    assert "Traceback" not in r.output


def test_the_same_settings_apart_are_valid(tmp_path):
    r = run(tmp_path, "m3_edge = True\nm3_monitor = True\n" + DISAGG + "'bootstrap_port': 8998}\n")
    assert r.exit_code == 0, r.output


def test_an_api_key_file_that_is_a_directory_says_so(tmp_path):
    r = run(tmp_path, f"m3_edge = True\nm3_api_key_file = {str(tmp_path)!r}\n")
    assert r.exit_code == 2 and f"key m3_api_key_file: {tmp_path} is a directory, not a file" in r.output, r.output
    assert "hosts ctl, w1, w2 (" in r.output and "group_data/all.py): key m3_api_key_file" in r.output, r.output
    assert "Fix" in r.output


def test_a_nixl_side_channel_range_over_another_port_is_refused(tmp_path):
    """vLLM's NIXL side channel takes one port per TP rank (VLLM_NIXL_SIDE_CHANNEL_PORT + 0..TP-1, the next worker on
    the host TP further on): with tp4, 9087 takes 9087-9090, and 9090 is the first worker's system port
    (m3_system_port)."""
    inv = ('control = [("ctl", {"m3_address": "10.0.1.1"})]\n'
           'workers = [("g1", {"m3_address": "10.0.1.2"}), ("g2", {"m3_address": "10.0.1.3"})]\n')
    gd = ('m3_platform = "h200"\nm3_engine = "vllm"\nm3_serving = "dynamo"\nm3_parallel = "tp4"\n'
          'm3_variant = "mxfp8"\n')
    pools = "m3_disagg = {'prefill': {'workers': 2}, 'decode': {'workers': 2}, 'nixl_side_channel_port': %d}\n"
    r = run_validate(tmp_path, pools % 9087, inv, gd)
    assert r.exit_code == 2, r.output
    assert any(all(m in ln for m in ("host g1 (", "9090", "(nixl, ports 9087-9090, m3_disagg.nixl_side_channel_"
                                     "port)", "(system, m3_system_port)", "Fix: set m3_disagg.nixl_side_channel_port"))
               for ln in r.output.splitlines()), r.output
    ok = run_validate(tmp_path, pools % 6000, inv, gd)  # 6000-6003 and 6004-6007: free
    assert ok.exit_code == 0, ok.output
