#!/bin/bash
# Aggregated against disaggregated serving on the same testbed hosts, in one run (docs/DISAGG.md "Bench"):
#   bring up a 3-host testbed (1 control + 2 mocker workers), deploy aggregated (2 workers, each prefill + decode),
#   `m3deploy bench` (the seed's workload), redeploy the same hosts disaggregated (1 prefill + 1 decode worker, all
#   at once: a rolling switch stops at its first worker, since a prefill worker beside an aggregated one serves
#   nothing; docs/DISAGG.md), `m3deploy bench --compare` against the first run; the reports (report.json,
#   report.md, latency.png, workers.png, compare.md, compare.png) go to benchmarks/results/disagg-compare-<UTC>/,
#   with the machine's load before and after each run. The testbed is taken down at the end.
#     bash benchmarks/disagg_compare.sh            # testbed m3pd3, 10.122.0.0/24 (M3_TESTBED / M3_SUBNET move it)
set -euo pipefail
cd "$(dirname "$0")/.."
NAME=${M3_TESTBED:-m3pd3}
SUBNET=${M3_SUBNET:-10.122.0.0/24}
OUT=${OUT:-benchmarks/results/disagg-compare-$(date -u +%Y-%m-%d-%H%M)}
DATA=(--data 'm3_disagg={"prefill":{"workers":1},"decode":{"workers":1}}' --data m3_rollout=all-at-once)
export M3_TESTBED=$NAME M3_TESTBED_CONTROL=1
mkdir -p "$OUT"
trap 'm3deploy testbed down --name "$NAME" >/dev/null 2>&1 || true' EXIT
m3deploy testbed up 3 --name "$NAME" --subnet "$SUBNET"
load() { echo "$1: $(cut -d' ' -f1-3 /proc/loadavg) (1/5/15-min load, $(nproc) cores)" >> "$OUT/load.txt"; }
pyinfra -y inventories/testbed.py deploy.py > "$OUT/deploy-agg.log" 2>&1
load "before aggregated bench"
m3deploy bench inventories/testbed.py --out "$OUT/agg"
load "after aggregated bench"
pyinfra -y inventories/testbed.py deploy.py "${DATA[@]}" > "$OUT/deploy-disagg.log" 2>&1
m3deploy verify inventories/testbed.py "${DATA[@]}" > "$OUT/verify-disagg.txt" 2>&1
load "before disaggregated bench"
m3deploy bench inventories/testbed.py "${DATA[@]}" --out "$OUT/disagg" --compare "$OUT/agg"
load "after disaggregated bench"
echo "$OUT"
