"""Local testbed: N simulated bare-metal hosts (netns + overlay rootfs + systemd + sshd) on one machine.

Python API (used by tests, inventories/testbed.py and the CLI):

    from m3deploy.testbed import load_state, up, down, status, run_on
    st = load_state("m3tb")      # M3Error naming the fix ("run `m3deploy testbed up 3`") when absent
    st["hosts"][0]["address"], st["ssh"]["ssh_config"], st["ssh"]["known_hosts"]

CLI: `m3deploy testbed up N [--name NAME]`, `status`, `down` (see m3deploy/testbed/cli.py, docs/TESTBED.md).
"""

from .config import DEFAULT_NAME, DEFAULT_SUBNET, Paths
from .core import down, list_testbeds, load_state, run_on, ssh_argv, status, up

__all__ = ["DEFAULT_NAME", "DEFAULT_SUBNET", "Paths", "down", "list_testbeds", "load_state",
           "run_on", "ssh_argv", "status", "up"]
