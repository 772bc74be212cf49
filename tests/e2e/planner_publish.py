"""Publish one scaling decision the way Dynamo's planner does in `environment: virtual`, for the planner drill
(tests/e2e/test_drills_planner.py): run on the control host by the Dynamo venv, with the actuator's 0600 env file
(etcd credentials), through the runtime's own `VirtualConnectorCoordinator` (the object
dynamo/planner/connectors/virtual.py `VirtualConnector._update_scaling_decision` calls; rust/planner.rs).

    python planner_publish.py ENV_FILE NAMESPACE   < one NUM_DECODE_WORKERS per line  ->  one JSON line each

It stays up, as the planner does: the coordinator's keys hang on this process's etcd lease (they were gone at once
when a one-shot publisher exited, on the testbed), so a decision lives as long as its publisher.

Why not the planner: it runs too (M3_PLANNER_POLICY=dynamo, docs/PLANNER.md), but a policy cannot be made to
publish on cue what the drill also checks: a decision above max, a decision just before the actuator restarts.
"""
import asyncio
import json
import os
import sys


async def main(env_file: str, namespace: str) -> None:
    with open(env_file) as f:
        for line in f:
            k, sep, v = line.rstrip("\n").partition("=")
            if sep and not k.startswith("#"):
                os.environ[k] = v
    from dynamo._core import DistributedRuntime, VirtualConnectorCoordinator

    rt = DistributedRuntime(asyncio.get_running_loop(), "etcd", "tcp")
    # check interval 1 s, max wait 0 s: publish even when the previous decision is not acknowledged yet
    coord = VirtualConnectorCoordinator(rt, namespace, 1, 0, 1)
    await coord.async_init()
    print(json.dumps({"ready": True}), flush=True)
    loop = asyncio.get_running_loop()
    while True:
        line = await loop.run_in_executor(None, sys.stdin.readline)
        if not line.strip():
            break
        await coord.update_scaling_decision(None, int(line))
        s = coord.read_state()
        print(json.dumps({"decision_id": s.decision_id, "num_decode_workers": s.num_decode_workers}), flush=True)
    rt.shutdown()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
