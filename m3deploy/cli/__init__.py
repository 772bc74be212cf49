"""`m3deploy`: see the plan, validate it, run the testbed, preflight and verify."""
from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

import click

from m3deploy.core.errors import M3Error, ValidationError


def _parse_data(items) -> dict:
    from m3deploy.core.inventory import parse_cli_arg

    out = {}
    for item in items:
        if "=" not in item:
            raise click.BadParameter(f"{item!r}: expected KEY=VALUE", param_hint="--data")
        k, v = item.split("=", 1)
        out[k] = parse_cli_arg(v)  # as pyinfra --data
    return out


def load(inventory: str, data=(), facts: bool = True):
    """(hosts, plan): the one loader of every command. The inventory file (and --data) read once, the plan built
    by m3deploy.core.build (which names the cluster: m3_cluster, else the file's name). With `facts`, multi-host
    networking env is completed from the facts `m3deploy preflight` last saved for this cluster
    (m3deploy.controller.factcache); `plan`, `render`, `validate` and `save-images` use them, the commands that
    check or use a deployed cluster (`verify`, `bench`, `preflight`, `artifacts`) do not."""
    from m3deploy.controller import factcache
    from m3deploy.core.build import build
    from m3deploy.core.inventory import cluster_name, load_inventory

    hosts = load_inventory(inventory, override_data=_parse_data(data))
    name = cluster_name(hosts, inventory)
    cached = factcache.network_facts(name) if facts and factcache.path(name).exists() else {}
    return hosts, build(hosts, name=inventory, facts=cached)


def load_plan(inventory: str, data=(), facts: bool = True):
    """The plan of `load`."""
    return load(inventory, data, facts)[1]


def output_dir(outdir: str) -> Path:
    """OUTDIR made (with its parents) for a command to write into, or M3Error naming it, why and the fix: a path
    under a file, no permission, a read-only filesystem. Nothing is written before it exists."""
    out = Path(outdir)
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / ".m3deploy-write-test"
        probe.write_text("")
        probe.unlink()
    except OSError as e:
        raise M3Error(f"cannot write into OUTDIR {outdir}: {e.strerror or e} ({e.filename or outdir}). Fix: choose "
                      "a directory you can write, whose parents are directories") from None
    return out


def fail(e: Exception) -> None:
    if isinstance(e, ValidationError):
        click.echo(f"invalid cluster plan ({len(e.problems)} problem{'s' if len(e.problems) != 1 else ''}):", err=True)
        for p in e.problems:
            click.echo(f"  - {p}", err=True)
    else:
        click.echo(f"error: {e}", err=True)
    sys.exit(2)


class LazyGroup(click.Group):
    """Subcommands living in their own modules are imported only when used (they import pyinfra, which
    costs ~0.3 s; `m3deploy plan` must stay fast)."""

    lazy = {"testbed": "m3deploy.testbed.cli:testbed", "preflight": "m3deploy.cli.preflight:preflight",
            "verify": "m3deploy.cli.verify:verify", "save-images": "m3deploy.cli.images:save_images",
            "artifacts": "m3deploy.cli.artifacts:artifacts",
            "bench": "m3deploy.cli.bench:bench", "render": "m3deploy.cli.render:render",
            "status": "m3deploy.cli.status:status",
            "prune": "m3deploy.cli.prune:prune", "dashboards": "m3deploy.cli.status:dashboards",
            "export": "m3deploy.cli.export:export"}

    def list_commands(self, ctx):
        return sorted(set(super().list_commands(ctx)) | set(self.lazy))

    def get_command(self, ctx, name):
        if name in self.lazy and name not in self.commands:
            mod, attr = self.lazy[name].split(":")
            try:
                module = __import__(mod, fromlist=[attr])
            except ModuleNotFoundError as e:
                if e.name and mod.startswith(e.name):
                    return None
                raise
            return getattr(module, attr, None)
        return super().get_command(ctx, name)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="m3deploy")
def main():
    """Provision, launch and verify MiniMax-M3 on GPU clusters (and on a local testbed)."""


@main.command()
@click.argument("inventory", type=click.Path(dir_okay=False))
@click.option("--host", "only_host", help="Only this host.")
@click.option("--explain", is_flag=True, help="Say which recipe layer set each flag, env var and image.")
@click.option("--json", "as_json", is_flag=True, help="Print the plan as JSON.")
@click.option("--data", multiple=True, metavar="KEY=VALUE", help="Override inventory data (as pyinfra --data).")
@click.option("--no-facts", is_flag=True, help="Ignore the facts `m3deploy preflight` saved for this cluster.")
@click.option("--diff-deployed", is_flag=True, help="Show what a deploy would change against the deploy record "
              "(~/.config/m3deploy/<cluster>/deployed.json); exit 1 if anything.")
def plan(inventory, only_host, explain, as_json, data, no_facts, diff_deployed):
    """Print, per host, the services and the exact commands they will run.

    Networking env of multi-host workers (NCCL_SOCKET_IFNAME, NCCL_IB_HCA, UCX_NET_DEVICES) comes from the
    host facts `m3deploy preflight` last saved, where the recipe or the inventory does not set it."""
    try:
        p = load_plan(inventory, data, facts=not no_facts)
    except M3Error as e:
        fail(e)
    if only_host and only_host not in {h.name for h in p.hosts}:
        fail(M3Error(f"host {only_host!r} is not in {inventory}; hosts: {', '.join(h.name for h in p.hosts)}"))
    if diff_deployed:
        from m3deploy.controller import deployed

        record = deployed.load(p.name)
        cluster_wide = deployed.generation_change(p, record)  # a generation change: every host's, with its order
        lines = [x for x in deployed.diff(p, record)
                 if not only_host or x.startswith(f"{only_host}:") or x in cluster_wide]
        for name, entry in sorted((record.get("hosts") or {}).items()):
            if not only_host or name == only_host:
                click.echo(f"# {name} runs (recorded {entry.get('at', '?')}): {deployed.describe_running(entry)}")
        back = deployed.rollback_data(record)
        if back:
            click.echo("# roll back to the generation the last change replaced: "
                       + " ".join(f"--data {shlex.quote(d)}" for d in back))
        click.echo("\n".join(lines) if lines else f"{p.name}: a deploy would change nothing against the record")
        sys.exit(1 if lines else 0)
    if as_json:
        d = p.to_dict(provenance=explain)
        if only_host:
            d["hosts"] = {only_host: d["hosts"][only_host]}
        click.echo(json.dumps(d, indent=2, sort_keys=False))
        return
    click.echo(render_text(p, only_host, explain))


def render_text(p, only_host=None, explain=False) -> str:
    out = [f"# cluster {p.name}: MiniMax-M3 {p.variant} ({p.model_id}) on {p.platform}, {p.parallel}, "
           f"engine {p.engine}, serving {p.serving}",
           f"# features: {', '.join(p.features) or '-'}",
           f"# endpoint: {p.endpoint}   served model: {p.served_model_name}"]
    if p.serving == "dynamo":
        out.append(f"# etcd: {p.etcd_endpoints}   nats: {p.nats_server}   dynamo {p.dynamo_version} in {p.venv}")
    if p.model_repos:
        out.append("# model repos (staged into every GPU host's HF cache): "
                   + ", ".join(f"{r.repo} ({r.role})" for r in p.model_repos))
    from m3deploy.check.checks import worker_pools

    pools = worker_pools(p)  # m3_disagg: each worker's pool
    for w in p.workers:
        out.append(f"# worker {w.index}: {' -> '.join(w.services)} (tp {w.tensor_parallel}, dp {w.data_parallel}, "
                   f"{w.gpus_per_rank} GPU(s) per rank" + (f", {pools[w.services[0]]} pool)" if pools else ")"))
    for h in p.hosts:
        if only_host and h.name != only_host:
            continue
        gpu = f", {h.gpus} x {h.gpu_model}" if h.gpus else ""
        out.append("")
        out.append(f"## {h.name} ({h.address}) [{', '.join(h.groups)}] {h.platform}{gpu}")
        for s in h.services:
            out.append("")
            ports = ", ".join(f"{pt.name} {pt.address}:{pt.port}" for pt in s.ports)
            rd = s.readiness
            ready = ""
            if rd:
                ready = {"http": f"GET {rd.url}",
                         "process": "unit active"}.get(rd.kind, rd.kind) + f" within {rd.timeout_s}s"
            out.append(f"### {s.unit}  ({s.kind}{', rank %d/%d' % (s.rank, s.nnodes) if s.nnodes > 1 else ''})")
            if s.image:
                built = f" (built FROM {s.base_image} + ai-dynamo wheels)" if s.base_image else ""
                out.append(f"# image: {s.image}{built}")
            if ports:
                out.append(f"# ports: {ports}")
            if ready:
                out.append(f"# ready: {ready}")
            if s.after:
                out.append(f"# after: {', '.join(s.after)}")
            out += [f"export {k}={shlex.quote(v)}" for k, v in s.env]
            out += [f"export {k}=<secret:{n}>  # filled on the host from a 0600 file" for k, n in s.secret_env]
            out.append(pretty_service(s))
            if explain and s.provenance:
                out.append("# explain:")
                width = max(len(pv.key) for pv in s.provenance)
                for pv in s.provenance:
                    val = "(removed)" if pv.value is None and pv.key.startswith("env:") else (pv.value or "")
                    setting = f" from {pv.setting}" if pv.setting else ""
                    out.append(f"#   {pv.key.ljust(width)}  {val[:60]:60}  <- {pv.layer} ({pv.source}){setting}")
    return "\n".join(out)


def pretty_command(argv) -> str:
    """Shell-quoted, one flag (with its value) per line: copy-pasteable."""
    lines: list[list[str]] = [[]]
    for tok in argv:
        if tok.startswith("-") and lines[-1]:
            lines.append([])
        lines[-1].append(shlex.quote(tok))
    return " \\\n    ".join(" ".join(line) for line in lines)


def pretty_service(s) -> str:
    if not s.image:
        return pretty_command(s.argv)
    head = s.command[: len(s.command) - len(s.argv)]  # up to and including `--entrypoint argv[0]`
    return " \\\n    ".join([pretty_command(head), shlex.quote(s.image), pretty_command(s.argv[1:])])


@main.command()
@click.argument("inventory", type=click.Path(dir_okay=False))
@click.option("--data", multiple=True, metavar="KEY=VALUE", help="Override inventory data (as pyinfra --data).")
@click.option("--target", type=click.Choice(["hosts", "k8s", "slurm"]), default="hosts", show_default=True,
              help="hosts: the deploy's checks; k8s / slurm: also the export for that target, checked offline "
              "(`m3deploy export`; docs/TARGETS.md).")
def validate(inventory, data, target):
    """Check the inventory against every rule; exit 0, or print every problem and exit 2."""
    if target != "hosts":
        from m3deploy.core.export_slurm import checked as checked_recipe
        from m3deploy.core.k8s_validate import checked_export

        try:
            p = load_plan(inventory, data, facts=False)
            problems = (checked_export if target == "k8s" else checked_recipe)(p)[1]
            if problems:
                raise ValidationError([f"{inventory} ({target} export): {x}" for x in problems])
        except M3Error as e:
            fail(e)
        click.echo(f"{inventory}: valid for {target} ({len(p.workers)} workers)")
        return
    from m3deploy.controller import deployed
    from m3deploy.controller.secrets import api_key
    from m3deploy.core.connection import connection_file_problems

    try:
        hosts, p = load(inventory, data)
        problems = connection_file_problems(hosts)  # the deploy checks them before pyinfra connects: so does validate
        if problems:
            raise ValidationError(problems)
        if p.state != "absent":
            api_key(p)  # the deploy reads m3_api_key_file before any host: so does validate
        deployed.refuse_skew(p)  # the deploy refuses a version skew before any host: so does validate
    except M3Error as e:
        fail(e)
    n = sum(len(h.services) for h in p.hosts)
    click.echo(f"{inventory}: valid ({len(p.hosts)} hosts, {len(p.workers)} workers, {n} services)")
