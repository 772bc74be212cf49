#!/usr/bin/env bash
# Installs what m3deploy needs on the controller (this machine): Debian packages for the local testbed and the
# loopback tests, and the project itself with its Python dependencies. Idempotent. Run as root.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$(id -u)" != 0 ]; then echo "scripts/install-deps.sh: run as root (the testbed needs network namespaces)" >&2; exit 1; fi
# openssl: the etcd JWT key pair of tests/unit/test_etcd_auth_script.py; rsync: the controller's weights push
# (m3_weights_source=controller); docker.io: the stand-in engine image and tests/e2e/test_docker_runtime_testbed.py
# (which runs its own dockerd on a private socket)
pkgs=(systemd-container debootstrap apt-cacher-ng iproute2 openssh-client etcd-server nats-server curl ca-certificates openssl
      rsync docker.io)
missing=()
for p in "${pkgs[@]}"; do dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
  echo "== apt-get install ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get -o DPkg::Lock::Timeout=900 update -qq
  apt-get -o DPkg::Lock::Timeout=900 install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  # the distribution's own units must not hold the ports the testbed's hosts use on their own addresses
  for svc in etcd nats-server apt-cacher-ng; do
    systemctl disable --now "$svc" >/dev/null 2>&1 || true
    pkill -x "${svc%-server}" >/dev/null 2>&1 || true
  done
  # the distribution's dockerd (default bridge and iptables rules) would cut the testbeds' bridges
  systemctl disable --now docker.service docker.socket >/dev/null 2>&1 || true
fi
echo "== pip install -e . (pyinfra 3.10, paramiko, jinja2, pyyaml, click, rich, openai, pytest, pytest-testinfra, matplotlib)"
python3 -m pip install -q --disable-pip-version-check -e ".[mocker,bench]"
# `m3deploy bench` on the testbed: NVIDIA AIPerf (the version pinned in pyproject's `bench-client` extra) in its own
# venv, so its pins (rich~=14.1, pandas, pillow, ...) never replace this environment's.
aiperf_pin=$(python3 -c 'import tomllib; print(tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["bench-client"][0])')
aiperf_venv="/opt/m3deploy/aiperf-${aiperf_pin#*==}"
if ! "$aiperf_venv/bin/aiperf" --version >/dev/null 2>&1; then
  echo "== $aiperf_pin into $aiperf_venv (the testbed's benchmark client)"
  python3 -m venv "$aiperf_venv"
  "$aiperf_venv/bin/python" -m pip install -q --disable-pip-version-check "$aiperf_pin"
fi
ln -sfn "$aiperf_venv/bin/aiperf" /usr/local/bin/aiperf
