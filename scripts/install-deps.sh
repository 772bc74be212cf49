#!/usr/bin/env bash
# Installs what m3deploy needs on the controller (this machine), as root, idempotently:
# - Debian/Ubuntu packages for the local testbed and the loopback tests (apt-get);
# - m3deploy itself, editable from this clone, in a virtual environment this script owns
#   (/opt/m3deploy/venv, or $M3DEPLOY_VENV), made with the distribution's own Python (/usr/bin/python3, or
#   $M3DEPLOY_PYTHON; 3.10 to 3.12). The distribution's site-packages are never touched: Debian 12 and Ubuntu
#   24.04 mark their python3 EXTERNALLY-MANAGED (PEP 668) and refuse `pip install`, and this script never passes
#   --break-system-packages. `m3deploy` and `pyinfra` are linked into /usr/local/bin.
#
#   bash scripts/install-deps.sh            what the demo needs
#   bash scripts/install-deps.sh --bench    ...and what `m3deploy bench` needs: matplotlib (its plots) and the testbed's
#                                           benchmark client, NVIDIA AIPerf, in its own venv
#   bash scripts/install-deps.sh --test     ...and the test tools (ruff, import-linter); scripts/test.sh passes both
#   bash scripts/install-deps.sh --yes      ...and do, without asking, what would change something of another clone's
#                                           (CI: scripts/test.sh passes it when $CI is set)
#
# What it never does without saying so: it stops and disables only the units of packages it has just installed
# (Debian starts etcd, nats-server, apt-cacher-ng, docker, prometheus on install; they would hold the testbed's
# ports and cut its bridges), never one that was there before; it asks before re-pointing the shared venv or the
# /usr/local/bin links at this clone when they belong to another one (no terminal: it refuses and says how).
set -euo pipefail
cd "$(dirname "$0")/.."
want_bench=0 want_test=0 yes=0
for a in "$@"; do
  case "$a" in
    --bench) want_bench=1 ;;
    --test) want_test=1 ;;
    --yes) yes=1 ;;
    *) echo "scripts/install-deps.sh: unknown option $a (options: --bench, --test, --yes)" >&2; exit 2 ;;
  esac
done
if [ "$(id -u)" != 0 ]; then
  echo "scripts/install-deps.sh: run as root (apt-get, and the testbed needs network namespaces). Without root, install" \
       "m3deploy by hand into a venv: README.md \"Installing by hand\"" >&2
  exit 1
fi
here=$(pwd -P)
# confirm "what": yes with --yes or a "y" typed at a terminal; else exit 1 naming --yes
confirm() {
  [ "$yes" = 1 ] && return 0
  if [ -t 0 ]; then
    read -r -p "scripts/install-deps.sh: $1 [y/N] " answer
    case "$answer" in y|Y|yes) return 0 ;; esac
  fi
  echo "scripts/install-deps.sh: not done: $1. Pass --yes to do it, or set M3DEPLOY_VENV=/some/other/venv for a venv" \
       "of this clone's own" >&2
  exit 1
}
# One install at a time on this machine: two at once (two terminals, or a test run beside a demo) would rebuild the
# shared benchmark client's venv under each other. The second one waits.
exec 9>/run/lock/m3deploy-install.lock
if ! flock -n 9; then
  echo "== waiting for another scripts/install-deps.sh on this machine (/run/lock/m3deploy-install.lock)"
  flock 9
fi
py="${M3DEPLOY_PYTHON:-/usr/bin/python3}"
venv="${M3DEPLOY_VENV:-/opt/m3deploy/venv}"

# python3-venv: Debian and Ubuntu ship the venv module's pip (ensurepip) in a package of its own.
# openssl: the etcd JWT key pair of tests/unit/test_etcd_auth_script.py; rsync: the controller's weights push
# (m3_weights_source=controller); docker.io: the stand-in engine image and tests/e2e/test_docker_runtime_testbed.py
# (which runs its own dockerd on a private socket); keepalived: `keepalived --config-test` of the rendered
# keepalived.conf in tests/unit/test_vip_plan.py (its package unit does not start: no /etc/keepalived/keepalived.conf)
# prometheus: `promtool test rules` of the generated rules in tests/unit/test_rule_windows.py
# haproxy: the edge's rendered haproxy.cfg run in front of stand-in frontends in tests/unit/test_edge_haproxy.py, and
# `haproxy -c` of it with the TLS profile in tests/unit/test_tls_profile.py
pkgs=(python3 python3-venv systemd-container debootstrap apt-cacher-ng iproute2 openssh-client etcd-server nats-server
      curl ca-certificates openssl rsync docker.io keepalived prometheus haproxy)
missing=()
for p in "${pkgs[@]}"; do dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
  echo "== apt-get install ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get -o DPkg::Lock::Timeout=900 update -qq
  apt-get -o DPkg::Lock::Timeout=900 install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  # the units these packages just started must not hold the ports the testbed's hosts use on their own addresses,
  # and the distribution's dockerd (default bridge and iptables rules) would cut the testbeds' bridges: stopped and
  # disabled, each named; a package that was already installed keeps its units as they are
  declare -A units=([etcd-server]="etcd" [nats-server]="nats-server" [apt-cacher-ng]="apt-cacher-ng"
                    [docker.io]="docker.service docker.socket" [prometheus]="prometheus"
                    [haproxy]="haproxy")
  for p in "${missing[@]}"; do
    [ -n "${units[$p]:-}" ] || continue
    echo "== $p was just installed: systemctl disable --now ${units[$p]} (the testbed needs its ports and bridges)"
    # shellcheck disable=SC2086
    systemctl disable --now ${units[$p]} >/dev/null 2>&1 || true
  done
fi

# The distribution's Python, 3.10 to 3.12 (Ubuntu 22.04, Debian 12, Ubuntu 24.04).
if ! "$py" -c 'import sys; sys.exit(0 if (3, 10) <= sys.version_info[:2] <= (3, 12) else 1)' 2>/dev/null; then
  echo "scripts/install-deps.sh: $py is $("$py" --version 2>&1 || echo missing); m3deploy needs Python 3.10 to 3.12." \
       "Fix: M3DEPLOY_PYTHON=/path/to/python3.X bash scripts/install-deps.sh" >&2
  exit 1
fi
pyver=$("$py" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
# A venv made by another Python (or a half-made one) is made anew.
if ! "$venv/bin/python" -c "import sys; sys.exit(0 if '%d.%d' % sys.version_info[:2] == '$pyver' else 1)" 2>/dev/null \
   || [ ! -x "$venv/bin/pip" ]; then
  echo "== $py -m venv $venv (Python $pyver)"
  rm -rf "$venv"
  mkdir -p "$(dirname "$venv")"
  "$py" -m venv "$venv"
fi
# the venv's m3deploy: an editable install of which clone (none yet: empty)
# (asked from /: python puts its working directory first on sys.path, which would find this clone)
owner=$(cd / && "$venv/bin/python" -c 'import m3deploy, os; print(os.path.dirname(os.path.dirname(os.path.realpath(m3deploy.__file__))))' \
        2>/dev/null </dev/null || true)
if [ -n "$owner" ] && [ "$owner" != "$here" ]; then
  confirm "$venv runs m3deploy from $owner; re-point it at this clone ($here)"
fi
extras="mocker"
[ "$want_bench" = 1 ] && extras="$extras,bench"
[ "$want_test" = 1 ] && extras="$extras,test"
echo "== $venv/bin/pip install -e .[$extras] (pyinfra 3.10, paramiko, jinja2, pyyaml, click, rich, openai, pytest, pytest-testinfra, jsonschema, cel-python)"
"$venv/bin/python" -m pip install -q --disable-pip-version-check -e ".[$extras]"
# /usr/local/bin/{m3deploy,pyinfra}: the shared venv's only (a venv of M3DEPLOY_VENV's own is used by its path:
# scripts/test.sh puts its bin/ first on PATH); made where missing or broken, re-pointed from another venv only
# when confirmed
if [ "$venv" = /opt/m3deploy/venv ]; then
  for tool in m3deploy pyinfra; do
    link="/usr/local/bin/$tool" to="$venv/bin/$tool"
    if [ -L "$link" ] && [ -e "$link" ] && [ "$(readlink "$link")" != "$to" ]; then
      confirm "$link points to $(readlink "$link"); re-point it to $to"
    fi
    [ "$(readlink "$link" 2>/dev/null)" = "$to" ] || { echo "== ln -sfn $to $link"; ln -sfn "$to" "$link"; }
  done
else
  echo "== $venv is a venv of its own: run $venv/bin/m3deploy (/usr/local/bin is left as it is)"
fi

if [ "$want_bench" = 1 ]; then
  # `m3deploy bench` on the testbed: NVIDIA AIPerf (the version pinned in pyproject's `bench-client` extra) in its
  # own venv, so its pins (rich~=14.1, pandas, pillow, ...) never replace m3deploy's.
  aiperf_pin=$(sed -n 's/^bench-client = \["\([^"]*\)"\]/\1/p' pyproject.toml)
  case "$aiperf_pin" in aiperf==*) ;; *) echo "scripts/install-deps.sh: no bench-client pin in pyproject.toml" >&2; exit 1 ;; esac
  aiperf_venv="/opt/m3deploy/aiperf-${aiperf_pin#*==}"
  if ! "$aiperf_venv/bin/aiperf" --version >/dev/null 2>&1; then
    echo "== $aiperf_pin into $aiperf_venv (the testbed's benchmark client)"
    rm -rf "$aiperf_venv"
    "$py" -m venv "$aiperf_venv"
    "$aiperf_venv/bin/python" -m pip install -q --disable-pip-version-check "$aiperf_pin"
  fi
  ln -sfn "$aiperf_venv/bin/aiperf" /usr/local/bin/aiperf
fi
