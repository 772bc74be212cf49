"""pyinfra inventory for the local testbed (`m3deploy testbed up N`).

Reads /var/lib/m3deploy/testbed/<name>/state.json; name from env M3_TESTBED (default "m3tb"), which also names the
cluster (m3_cluster: the controller keeps its secrets and deploy record in <M3DEPLOY_CONFIG>/<name>/).
The first M3_TESTBED_CONTROL hosts (default 1) are `control`, the rest `workers`. M3_TESTBED_HOSTS (comma-separated
names, default every host of the testbed) keeps only those: a host left out is out of the inventory, as if deleted
from a static one (scale in: docs/OPERATIONS.md "Scale in").
Cluster-wide choices for the testbed (m3_engine="mocker", m3_platform="sim", ...) live in
group_data/testbed.py, not here. With no testbed up this raises an M3Error naming the fix.

    pyinfra -y inventories/testbed.py deploy.py

Disaggregated (docs/DISAGG.md): mocker prefill and decode workers on separate hosts, the first worker host the
prefill pool, the next the decode pool (a 3-host testbed: 1 control + 2 workers), then verify's disagg checks:

    pyinfra -y inventories/testbed.py deploy.py --data 'm3_disagg={"prefill":{"workers":1},"decode":{"workers":1}}'
    m3deploy verify inventories/testbed.py --data 'm3_disagg={"prefill":{"workers":1},"decode":{"workers":1}}'
"""

import os as _os

from m3deploy.core.errors import M3Error as _M3Error
from m3deploy.testbed import load_state as _load_state

_name = _os.environ.get("M3_TESTBED", "m3tb")
_state = _load_state(_name)
if _os.environ.get("M3_TESTBED_HOSTS"):
    _keep = [n.strip() for n in _os.environ["M3_TESTBED_HOSTS"].split(",") if n.strip()]
    _unknown = sorted(set(_keep) - {h["name"] for h in _state["hosts"]})
    if _unknown:
        raise _M3Error(f"M3_TESTBED_HOSTS names {', '.join(_unknown)}, not hosts of testbed {_name!r} "
                       f"({', '.join(h['name'] for h in _state['hosts'])})")
    _state = {**_state, "hosts": [h for h in _state["hosts"] if h["name"] in _keep]}
try:
    _n_control = int(_os.environ.get("M3_TESTBED_CONTROL", "1"))
except ValueError:
    raise _M3Error(f"M3_TESTBED_CONTROL={_os.environ['M3_TESTBED_CONTROL']!r} is not a number; "
                   "set it to how many testbed hosts form the control group (e.g. 1)") from None
if not 1 <= _n_control <= len(_state["hosts"]):
    raise _M3Error(f"M3_TESTBED_CONTROL={_n_control} does not fit testbed {_name!r} with "
                   f"{len(_state['hosts'])} host(s); use 1..{len(_state['hosts'])} or "
                   f"`m3deploy testbed up {_n_control + 1} --name {_name}`")


def _host(h):
    return (h["name"], {
        "ssh_hostname": h["address"],
        "ssh_user": "root",
        "ssh_key": _state["ssh"]["private_key"],
        "ssh_known_hosts_file": _state["ssh"]["known_hosts"],
        "ssh_strict_host_key_checking": "yes",
        "m3_address": h["address"],
        "m3_interface": "eth0",
        # one cluster per testbed: its own secrets store and deploy record (<M3DEPLOY_CONFIG>/<testbed name>/),
        # so two testbeds on one machine never share them
        "m3_cluster": _name,
        # m3_runtime=docker: the stand-in engine image is built from the hosts' own root filesystem
        **({"m3_sim_image_rootfs": _state["image"]} if _state.get("image") else {}),
    })


control = [_host(h) for h in _state["hosts"][:_n_control]]
workers = [_host(h) for h in _state["hosts"][_n_control:]]
# m3_planner (docs/PLANNER.md): the last M3_TESTBED_STANDBY worker hosts (default 0) are also `standby`: staged by
# the deploy, started and drained by the planner's actuator
_n_standby = int(_os.environ.get("M3_TESTBED_STANDBY", "0") or 0)
if _n_standby:
    standby = workers[-_n_standby:]
