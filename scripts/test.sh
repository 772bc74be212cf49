#!/usr/bin/env bash
# The test command (README): installs what the tests need, then runs every test:
# unit (plan, recipes, validation, rendering, parsers), deploy (pyinfra @fake runs of deploy.py for every shipped
# inventory), e2e (the local testbed: real SSH, systemd, etcd, NATS and Dynamo with the mocker engine).
# Extra arguments go to pytest (e.g. `bash scripts/test.sh -m "not e2e"`).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
lint-imports  # imports point one way (pyproject.toml [tool.importlinter]; docs/ARCHITECTURE.md)
exec python3 -m pytest -p no:cacheprovider "$@"
