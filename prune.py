"""pyinfra deploy file of `m3deploy prune` (m3deploy/cli/prune.py), not run by hand: drains and tears down the
hosts of the inventory that `prune` writes (hosts the cluster's inventory no longer names, reached with their
connection data from the deploy record), each by its own /etc/m3/manifest.json (roles/teardown.prune_host).
"""
from roles.failfast import stop_on_unreachable_or_failed_hosts

stop_on_unreachable_or_failed_hosts()

from roles.teardown import prune_host  # noqa: E402

prune_host()
