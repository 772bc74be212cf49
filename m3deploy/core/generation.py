"""Worker generations (issue 38): what defines one, its id, and which frontend/worker Dynamo versions may coexist.

A generation is what a worker runs that a restart with new flags does not change in place: the Dynamo version,
the engine, the engine image (`m3_image`, else the recipe's), the checkpoint and the runtime. Its id is a short
hash of those values (`g` + 8 hex), decided once here from the settings (core/build.py `_Common.generation`).

Under Dynamo each worker registers under the namespace `dynamo-<id>`: Dynamo 1.6.0 and 1.6.1 append
`DYN_NAMESPACE_WORKER_SUFFIX` to the worker's namespace (dynamo/common/utils/namespace.py get_worker_namespace,
read by dynamo.mocker/args.py and the engines' workers). A frontend with no namespace set discovers every
namespace and keeps one WorkerSet (router, KV index) per namespace, routing across them by worker count
(ai-dynamo/dynamo PR 6054): old and new workers never share one KV router, so a worker of the new generation is
not rejected by a card checksum of the old one (ai-dynamo/dynamo issue 12796).

The skew policy (catalog.yaml `version_skew`): the [frontend, worker] Dynamo version pairs that may serve together
while a change rolls (the frontends restart first, on the new version; the workers roll after them). The same
version always may. A change from the deployed version to another that the policy does not list is refused before
any host is touched (m3deploy.controller.deployed.skew_problems).
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any, Mapping

from m3deploy.core import catalog, planner

SUFFIX_ENV = "DYN_NAMESPACE_WORKER_SUFFIX"  # Dynamo 1.6.x: the worker's namespace is DYN_NAMESPACE + "-" + this


@dataclass(frozen=True)
class Generation:
    id: str  # "g" + 8 hex of the inputs below
    dynamo_version: str
    engine: str
    image: str  # m3_image, or "recipe" (the recipe's image for this Dynamo version)
    model_id: str
    runtime: str

    def describe(self) -> str:
        return (f"{self.id} (dynamo {self.dynamo_version}, {self.engine} image {self.image}, "
                f"model {self.model_id}, runtime {self.runtime})")


def of(s: Mapping[str, Any], model_id: str) -> Generation:
    """The generation the settings define (the one owner of its id)."""
    inputs = {"dynamo_version": str(s["m3_dynamo_version"]), "engine": str(s["m3_engine"]),
              "image": str(s.get("m3_image") or "recipe"), "model_id": model_id, "runtime": str(s["m3_runtime"])}
    digest = hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()[:8]
    return Generation(id=f"g{digest}", **inputs)


def skew_allowed(frontend: str, worker: str) -> bool:
    """May a frontend of Dynamo `frontend` serve workers of Dynamo `worker` (catalog.yaml `version_skew`)?"""
    if frontend == worker:
        return True
    pairs = catalog.catalog().get("version_skew") or []
    return any(str(p["frontend"]) == frontend and str(p["worker"]) == worker for p in pairs)


def change_problems(old: str, new: str, where: str) -> list[str]:
    """The skew refusals of rolling Dynamo `old` to `new`: while it rolls, new frontends serve old workers (the
    frontends restart first) and, on a roll back, old frontends serve new workers."""
    if not old or not new or old == new:
        return []
    out = []
    for frontend, worker, when in ((new, old, "during the upgrade (frontends first)"),
                                   (old, new, "during a roll back")):
        if not skew_allowed(frontend, worker):
            out.append(f"key m3_dynamo_version: {where} runs Dynamo {old}; {new} would put a frontend of Dynamo "
                       f"{frontend} in front of workers of Dynamo {worker} {when}, which catalog.yaml "
                       f"`version_skew` does not allow. Fix: go through a version the policy pairs with {old}, or "
                       f"add [{frontend}, {worker}] to version_skew once that pair has been run "
                       f"(m3deploy/core/data/catalog.yaml)")
    return out


def suffixed(s: Mapping[str, Any]) -> bool:
    """Do the workers register under their generation's namespace? Under Dynamo, except with m3_planner: the
    planner and its actuator address the workers' namespace `dynamo` (core/planner.py NAMESPACE), not yet a
    generation's."""
    return s["m3_serving"] == "dynamo" and not planner.enabled(s)
