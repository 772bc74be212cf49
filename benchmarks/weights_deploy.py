"""pyinfra deploy file running only the weights step of deploy.py (benchmarks/weights_fanout.py, the weights
e2e test): `pyinfra -y inventories/testbed.py benchmarks/weights_deploy.py --data m3_weights_source=controller
--data m3_mock_repo_mb=300`. Same plan, same role (roles/weights.py) as deploy.py."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from m3deploy.deploy.context import cluster_plan, host_plan  # noqa: E402
from roles.failfast import stop_on_unreachable_or_failed_hosts  # noqa: E402
from roles.weights import deploy_weights  # noqa: E402

stop_on_unreachable_or_failed_hosts()
cluster_plan()
if host_plan().weights_dir:
    deploy_weights()
