#!/usr/bin/env bash
# The test command (README): installs what the tests need (scripts/install-deps.sh --bench --test: Debian packages,
# m3deploy's venv with the test tools, the benchmark client), then runs every test with that venv's Python:
# unit (plan, recipes, validation, rendering, parsers), deploy (pyinfra @fake runs of deploy.py for every shipped
# inventory), e2e (the local testbed: real SSH, systemd, etcd, NATS and Dynamo with the mocker engine).
# Extra arguments go to pytest (e.g. `bash scripts/test.sh -m "not e2e"`). Run as root; without root, the unit
# tests alone run from a venv of your own (README "Installing by hand").
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh --bench --test
venv="${M3DEPLOY_VENV:-/opt/m3deploy/venv}"
export PATH="$venv/bin:$PATH"  # the tests' `m3deploy`, `pyinfra`, `python3` are the venv's
lint-imports  # imports point one way (pyproject.toml [tool.importlinter]; docs/ARCHITECTURE.md)
ruff check .  # the linter (pyproject.toml [tool.ruff])
exec python -m pytest -p no:cacheprovider "$@"
