#!/usr/bin/env bash
# The main job on the embedded default: from a fresh machine, install what is needed, bring up a local testbed
# of simulated hosts (1 control + 2 workers, real systemd + sshd), deploy etcd, NATS, the Dynamo frontend and
# two mocker workers over SSH, verify (testinfra + smoke requests), and print the endpoint and a sample request.
#   bash scripts/demo.sh [N_HOSTS]       (default 3; `m3deploy testbed down` removes it all)
set -euo pipefail
cd "$(dirname "$0")/.."
n="${1:-3}"
bash scripts/install-deps.sh
echo "== m3deploy testbed up $n"
m3deploy testbed up "$n"
echo "== m3deploy plan inventories/testbed.py"
m3deploy plan inventories/testbed.py | sed -n '1,8p'
echo "== pyinfra -y inventories/testbed.py deploy.py"
pyinfra -y inventories/testbed.py deploy.py
echo "== m3deploy verify inventories/testbed.py"
m3deploy verify inventories/testbed.py
endpoint=$(m3deploy plan inventories/testbed.py --json | python3 -c 'import json,sys; d=json.load(sys.stdin); print(d["endpoint"], d["served_model_name"])')
set -- $endpoint
cat <<TXT

MiniMax-M3 (mocker engine) is serving at $1 (model "$2"). From this machine:

  curl -s $1/chat/completions -H 'Content-Type: application/json' \\
    -d '{"model": "$2", "messages": [{"role": "user", "content": "Explain MSA sparse attention in 3 bullets."}], "max_tokens": 32}'

Re-run the deploy (changes nothing):  pyinfra -y inventories/testbed.py deploy.py
Tear the deployment down:             pyinfra -y inventories/testbed.py deploy.py --data m3_state=absent
Remove the testbed:                   m3deploy testbed down
TXT
