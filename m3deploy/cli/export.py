"""`m3deploy export k8s|slurm INVENTORY OUTDIR`: the plan the deploy would carry out, as a Kubernetes
DynamoGraphDeployment (Dynamo's operator) or an srt-slurm recipe (srtctl), checked offline before it is written
(m3deploy.core.k8s_validate, m3deploy.core.export_slurm). Contacts no host, reads no secret. docs/TARGETS.md."""
from __future__ import annotations

import click
import yaml

from m3deploy.cli import fail, load_plan, output_dir
from m3deploy.cli.options import inventory_command, say
from m3deploy.core.errors import M3Error, ValidationError


def checked(target: str, plan):
    """(the export, its problems) for `target` (k8s | slurm)."""
    if target == "k8s":
        from m3deploy.core.k8s_validate import checked_export

        return checked_export(plan)
    from m3deploy.core.export_slurm import checked as checked_recipe

    return checked_recipe(plan)


def _dump(doc) -> str:
    return yaml.safe_dump(doc, sort_keys=False, width=1000)


def _k8s_header(plan, out) -> str:
    from m3deploy.core import export_k8s
    from m3deploy.core.k8s_validate import SCHEMA_FILE

    lines = [f"# m3deploy export k8s: cluster {plan.name} (engine {plan.engine}, {plan.variant}, {plan.parallel}), "
             f"Dynamo {plan.dynamo_version}",
             f"# checked offline against {SCHEMA_FILE.name} (Dynamo's DGD CRD, v1beta1; source and commit in it): "
             "OpenAPI schema, CEL rules, the webhook rules m3deploy implements, and the plan's own rules",
             "# create before applying (names only; m3deploy never writes a secret's value):",
             *(f"#   Secret {s}" for s in out["secrets"]),
             f"#   PersistentVolumeClaim {export_k8s.dns_name(plan.name)}-hf-cache (the HF cache, mounted at "
             f"{export_k8s.HF_MOUNT}), holding {', '.join(r.repo for r in plan.model_repos) or plan.model_id}",
             "#   the images below in a registry the nodes can pull from (m3deploy save-images makes archives)",
             "# left out, and why:",
             *(f"#   {k}: {v}" for k, v in out["left_out"].items()),
             "# how each container differs from its bare-metal unit (everything else is the same, token for token):",
             *(f"#   {d.name}: {d.what}" for d in export_k8s.DIFFERENCES)]
    return "\n".join(lines) + "\n"


@click.group("export", short_help="Export the plan for Kubernetes (a DGD) or Slurm (srtctl).")
def export():
    """Write the cluster's plan for another target: Kubernetes (Dynamo's operator) or Slurm (srt-slurm)."""


def _run(target, inventory, outdir, data):
    try:
        plan = load_plan(inventory, data, facts=False)
        doc, problems = checked(target, plan)
        if problems:
            raise ValidationError([f"{inventory} ({target} export): {p}" for p in problems])
        out = output_dir(outdir)
        name = doc["dgd"]["metadata"]["name"] if target == "k8s" else doc["name"]
        if target == "k8s":
            path = out / f"{name}.dgd.yaml"
            path.write_text(_k8s_header(plan, doc) + _dump(doc["dgd"]))
            written = [path]
            if doc["configmaps"]:
                cm = out / f"{name}.configmaps.yaml"
                cm.write_text("".join("---\n" + _dump(m) for m in doc["configmaps"]))
                written.append(cm)
        else:
            path = out / f"{name}.srtctl.yaml"
            path.write_text(f"# m3deploy export slurm: cluster {plan.name}; an srtctl recipe (NVIDIA/srt-slurm), "
                            "checked offline against srtctl's schema\n" + _dump(doc))
            written = [path]
    except M3Error as e:
        fail(e)
    say(f"{inventory}: {target} export valid, written: {', '.join(map(str, written))}")


@export.command("k8s")
@inventory_command
@click.argument("outdir", type=click.Path(file_okay=False))
def k8s(inventory, outdir, data):
    """A DynamoGraphDeployment (nvidia.com/v1beta1) of the cluster, validated offline, into OUTDIR."""
    _run("k8s", inventory, outdir, data)


@export.command("slurm")
@inventory_command
@click.argument("outdir", type=click.Path(file_okay=False))
def slurm(inventory, outdir, data):
    """An srt-slurm (srtctl) recipe of the cluster, validated offline, into OUTDIR."""
    _run("slurm", inventory, outdir, data)
