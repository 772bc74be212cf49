#!/usr/bin/env bash
# The README's first command from the outside, timed: a fresh clone of this checkout's HEAD, `env -i` with root's
# default PATH (so `python3` is the distribution's), a fresh HOME (pip's cache empty) and every m3deploy cache, the
# venv and the testbed image in fresh directories. Run as root; it leaves the testbed up (`m3deploy testbed down`).
#   bash benchmarks/cold_demo.sh            # Debian packages as they are on this machine
# For "a machine with nothing installed", purge them first (this removes them from this machine):
#   apt-get purge -y systemd-container debootstrap apt-cacher-ng etcd-server nats-server docker.io rsync \
#     python3-venv python3.11-venv containerd runc && apt-get autoremove -y && apt-get clean
set -euo pipefail
src="$(cd "$(dirname "$0")/.." && pwd)"
work=$(mktemp -d /tmp/m3deploy-cold-demo.XXXXXX)
git clone -q "$src" "$work/clone"
mkdir -p "$work/home"
cd "$work/clone"
start=$(date +%s.%N)
env -i HOME="$work/home" PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
  M3DEPLOY_VENV="$work/venv" M3DEPLOY_CACHE="$work/cache" M3DEPLOY_CONFIG="$work/config" \
  M3_TESTBED_CACHE="$work/testbed-cache" bash scripts/demo.sh > "$work/demo.log" 2>&1
end=$(date +%s.%N)
grep -E "host image ready|wheelhouse .* built in|passed, [0-9]+ failed" "$work/demo.log" || true
printf 'cold demo: %.1f s (log: %s/demo.log; load average now: %s)\n' "$(awk -v a="$start" -v b="$end" 'BEGIN { print b - a }')" "$work" \
  "$(cut -d' ' -f1-3 /proc/loadavg)"
