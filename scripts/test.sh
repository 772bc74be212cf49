#!/usr/bin/env bash
# The test command (README): installs what the tests need (scripts/install-deps.sh --bench --test: Debian packages,
# m3deploy's venv with the test tools, the benchmark client), then runs every test with that venv's Python:
# unit (plan, recipes, validation, rendering, parsers), deploy (pyinfra @fake runs of deploy.py for every shipped
# inventory), e2e (the local testbed: real SSH, systemd, etcd, NATS and Dynamo with the mocker engine).
# Without arguments it runs them in lanes, several pytest processes at once (scripts/test_lanes.py). Extra arguments
# go to one pytest instead (e.g. `bash scripts/test.sh -m "not e2e"`). Run as root; without root, the unit
# tests alone run from a venv of your own (README "Installing by hand").
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh --bench --test ${CI:+--yes}  # CI: re-point what another clone set up, unasked
venv="${M3DEPLOY_VENV:-/opt/m3deploy/venv}"
export PATH="$venv/bin:$PATH"  # the tests' `m3deploy`, `pyinfra`, `python3` are the venv's
lint-imports  # imports point one way (pyproject.toml [tool.importlinter]; docs/ARCHITECTURE.md)
ruff check .  # the linter (pyproject.toml [tool.ruff])
if [ $# -eq 0 ]; then
  exec python scripts/test_lanes.py  # every test, the e2e modules side by side on their own testbeds (M3_TEST_JOBS)
fi
exec python -m pytest -p no:cacheprovider "$@"
