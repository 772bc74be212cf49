"""pyinfra entry point: `pyinfra inventories/<cluster>.py deploy.py`.

Builds and validates the cluster plan before any operation (an invalid plan stops the run with every
problem listed, and no host is changed), then calls the roles in order for the current host's groups.
Ordering and gating only: flags, env and images come from the plan; install steps live in roles/.

Teardown: `pyinfra inventories/<cluster>.py deploy.py --data m3_state=absent`.
"""
import sys

from pyinfra import host

from m3deploy.context import cluster_plan, host_plan
from m3deploy.errors import ValidationError

try:
    plan = cluster_plan()
except ValidationError as e:
    sys.stderr.write(f"m3deploy: invalid cluster plan, nothing was changed:\n{e}\n")
    raise SystemExit(2)

hp = host_plan()
