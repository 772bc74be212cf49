"""Worker generations (issue 38): what defines one, its id, and which frontend/worker Dynamo versions may coexist.

A generation is what a worker runs that a restart with new flags does not change in place: the Dynamo version,
the engine, the engine image (`m3_image`, else the recipe's), the checkpoint and the runtime; and what the worker
publishes in its model card, which Dynamo compares a new worker against (catalog.yaml `model_card`: the context
length, the served name, the KV block size, ...). Its id is a short hash of those values (`g` + 8 hex), decided
once here from the settings (core/build.py `_Common.generation`). The card's settings count only when set, so
a cluster that sets none keeps the id it had before they counted.

Under Dynamo each worker registers under the namespace `dynamo-<id>`: Dynamo 1.6.0 and 1.6.1 append
`DYN_NAMESPACE_WORKER_SUFFIX` to the worker's namespace (dynamo/common/utils/namespace.py get_worker_namespace,
read by dynamo.mocker/args.py and the engines' workers). A frontend with no namespace set discovers every
namespace and keeps one WorkerSet (router, KV index) per namespace, routing across them by worker count
(ai-dynamo/dynamo PR 6054): old and new workers never share one KV router, so a worker of the new generation is
not rejected by a card checksum of the old one (ai-dynamo/dynamo issue 12796). Seen with a real engine: a rolling
change of m3_max_model_len alone, in one namespace, left the restarted vLLM worker listed by the frontend and never
sent a request ("Rejected incompatible workers" in the frontend's journal); hence the card's settings here.

The skew policy (catalog.yaml `version_skew`): the [frontend, worker] Dynamo version pairs that may serve together
while a change rolls (the frontends restart first, on the new version; the workers roll after them). The same
version always may. A change from the deployed version to another that the policy does not list is refused before
any host is touched (m3deploy.controller.deployed.skew_problems).
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any, Mapping

from m3deploy.core import catalog, planner, recipes

WHAT_A_WORKER_IS = ("m3_dynamo_version", "m3_engine", "m3_image", "m3_model_id", "m3_runtime")  # of() reads them
SUFFIX_ENV = "DYN_NAMESPACE_WORKER_SUFFIX"  # Dynamo 1.6.x: the worker's namespace is DYN_NAMESPACE + "-" + this


@dataclass(frozen=True)
class Generation:
    id: str  # "g" + 8 hex of the inputs below
    dynamo_version: str
    engine: str
    image: str  # m3_image, or "recipe" (the recipe's image for this Dynamo version)
    model_id: str
    runtime: str
    card: Mapping[str, str] = field(default_factory=dict)  # card(): the model card's settings that are set
    namespace: str = ""  # where its workers register: dynamo-<id>, or planner.NAMESPACE (suffixed() false)

    def sources(self) -> tuple[str, ...]:
        """The settings its id comes from: what a worker is, then the model card's that are set."""
        return (*WHAT_A_WORKER_IS, *sorted(self.card))

    @property
    def suffix(self) -> str:
        """The workers' DYN_NAMESPACE_WORKER_SUFFIX: the id, or "" where they stay in planner.NAMESPACE."""
        return self.id if self.namespace != planner.NAMESPACE else ""

    def describe(self) -> str:
        card = "".join(f", {k} {v}" for k, v in sorted(self.card.items()))
        return (f"{self.id} (dynamo {self.dynamo_version}, {self.engine} image {self.image}, "
                f"model {self.model_id}, runtime {self.runtime}{card})")


CARD_ARGS = ("m3_extra_args", "m3_unset_args")  # count only when they hold one of the card's flags


def card_flags() -> set[str]:
    """The engine flags the model card carries: catalog.yaml `model_card` flags and each engine's context-length
    flag under Dynamo (engines.yaml `max_model_len`)."""
    listed = (catalog.catalog().get("model_card") or {}).get("flags") or ()
    context = (str(catalog.by_serving(e["max_model_len"], "dynamo")) for e in catalog.engines().values()
               if isinstance(e, dict) and e.get("max_model_len"))
    return {*listed, *context}


def card(s: Mapping[str, Any]) -> dict[str, str]:
    """{key: its value as JSON} of the model card's settings (catalog.yaml `model_card`) that are set, and of
    m3_extra_args and m3_unset_args when they hold one of the card's flags (whole: what a roll back sets again;
    without one they roll in place)."""
    out = {k: json.dumps(s[k], sort_keys=True)
           for k in (catalog.catalog().get("model_card") or {}).get("settings") or {} if s.get(k)}
    flags = card_flags()
    named = (("m3_extra_args", {f for f, _ in recipes.parse_arg_list(s.get("m3_extra_args") or [])}),
             ("m3_unset_args", {str(f) for f in s.get("m3_unset_args") or ()}))
    out.update((key, json.dumps(s[key], sort_keys=True)) for key, given in named if flags & given)
    return out


def card_keys() -> tuple[str, ...]:
    """Every setting that may be part of a generation's card."""
    return (*((catalog.catalog().get("model_card") or {}).get("settings") or {}), *CARD_ARGS)


def of(s: Mapping[str, Any], model_id: str) -> Generation:
    """The generation the settings define (the one owner of its id)."""
    inputs: dict[str, Any] = {
        "dynamo_version": str(s["m3_dynamo_version"]), "engine": str(s["m3_engine"]),
        "image": str(s.get("m3_image") or "recipe"), "model_id": model_id, "runtime": str(s["m3_runtime"])}
    card_values = card(s)
    hashed = {**inputs, "card": card_values} if card_values else inputs  # none set: the id from before they counted
    digest = hashlib.sha256(json.dumps(hashed, sort_keys=True).encode()).hexdigest()[:8]
    gid = f"g{digest}"
    return Generation(id=gid, **inputs, card=card_values,
                      namespace=f"{planner.NAMESPACE}-{gid}" if suffixed(s) else planner.NAMESPACE)


def card_change_problems(old_card: Mapping[str, str], new: Generation, where: str) -> list[str]:
    """The refusal of a change of the model card where the workers cannot change namespace (m3_planner: they
    stay in `dynamo`): rolled in place, Dynamo's frontend would reject every restarted worker while an old one
    serves (the deploy would stop at the first, after its readiness wait)."""
    if new.suffix or dict(old_card) == dict(new.card):
        return []
    keys = sorted(k for k in {*old_card, *new.card} if old_card.get(k) != new.card.get(k))
    return [f"key {k}: {where} runs {old_card.get(k, 'unset')}, the plan {new.card.get(k, 'unset')}: it is in the "
            "model card Dynamo's frontend compares a new worker against (catalog.yaml model_card), and with "
            f"m3_planner the workers stay in the namespace {planner.NAMESPACE}, so each rolled worker would be "
            "rejected while an old one serves. Fix: keep the deployed value, or make the change in a deploy without "
            "m3_planner (and its standby group), where the workers roll into their generation's own namespace"
            for k in keys]


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
