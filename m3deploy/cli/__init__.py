"""`m3deploy`: see the plan, validate it, deploy it (pyinfra), run the testbed, preflight and verify."""
from __future__ import annotations

import json
import os
import shlex
import sys
from pathlib import Path

import click

from m3deploy.cli.options import detail, hosts_option, inventory_command, json_option, say, unknown_hosts, verbosity
from m3deploy.core.errors import M3Error, ValidationError, plural


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
    from m3deploy.core.inventory import cluster_name, load_inventory, unmatched_group_data

    hosts = load_inventory(inventory, override_data=_parse_data(data))
    name = cluster_name(hosts, inventory)
    detail(describe_sources(inventory, hosts, name))
    for note in unmatched_group_data(inventory) if verbosity() > 0 else ():
        detail(note)
    cached = factcache.network_facts(name) if facts and factcache.path(name).exists() else {}
    try:
        return hosts, build(hosts, name=inventory, facts=cached)
    except ValidationError as e:  # a misnamed group_data file is the likely cause of a missing key: name it
        raise ValidationError(e.problems + unmatched_group_data(inventory)) from None


def describe_sources(inventory: str, hosts, name: str) -> str:
    """The -v line of every command: the hosts, the files their data came from, the cluster's name."""
    here = str(Path.cwd())
    files = sorted({os.path.relpath(f) if f.startswith(here + os.sep) else f
                    for h in hosts for f in h.sources.values()} - {"--data"})
    groups = sorted({g for h in hosts for g in h.groups})
    return (f"{inventory}: {plural(len(hosts), 'host')} (groups {', '.join(groups)}), data from "
            f"{', '.join(files) or '-'}{' and --data' if any('--data' in h.sources.values() for h in hosts) else ''}"
            f"; cluster {name}")


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
        click.echo(f"invalid cluster plan ({plural(len(e.problems), 'problem')}):", err=True)
        for p in e.problems:
            click.echo(f"  - {p}", err=True)
    else:
        click.echo(f"error: {e}", err=True)
    sys.exit(2)


class LazyGroup(click.Group):
    """Subcommands living in their own modules are imported only when used (they import pyinfra, which
    costs ~0.3 s; `m3deploy plan` must stay fast)."""

    lazy = {"deploy": "m3deploy.cli.deploy:deploy",
            "testbed": "m3deploy.testbed.cli:testbed", "preflight": "m3deploy.cli.preflight:preflight",
            "verify": "m3deploy.cli.verify:verify", "save-images": "m3deploy.cli.images:save_images",
            "artifacts": "m3deploy.cli.artifacts:artifacts",
            "bench": "m3deploy.cli.bench:bench", "render": "m3deploy.cli.render:render",
            "status": "m3deploy.cli.status:status",
            "prune": "m3deploy.cli.prune:prune", "dashboards": "m3deploy.cli.status:dashboards",
            "certs": "m3deploy.cli.certs:certs", "export": "m3deploy.cli.export:export"}

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
    """Provision, launch and verify MiniMax-M3 on GPU clusters (and on a local testbed).

    \b
    Your own cluster (docs/INVENTORY.md), e.g. inventories/mylab.py:
      m3deploy validate inventories/mylab.py  every problem at once (exit 2)
      m3deploy plan inventories/mylab.py      what runs where, exact commands
      m3deploy deploy inventories/mylab.py    = pyinfra -y INVENTORY deploy.py
      m3deploy verify inventories/mylab.py    the cluster against its plan
    \b
    Re-run after a change: the same deploy (it changes only what differs).
    Tear down:  m3deploy deploy inventories/mylab.py --data m3_state=absent
    Scale in (hosts taken out of the inventory):
      m3deploy prune inventories/mylab.py --yes

    Every command that takes an INVENTORY also takes --data KEY=VALUE (repeatable, as pyinfra's), -v and -q."""


@main.command(short_help="Print what runs on each host: services, exact commands.")
@inventory_command
@hosts_option("Only this host's services (repeatable: --host a --host b shows both).")
@click.option("--explain", is_flag=True, help="Say which recipe layer set each flag, env var and image.")
@json_option("Print the plan as JSON.")
@click.option("--no-facts", is_flag=True, help="Ignore the facts `m3deploy preflight` saved for this cluster.")
@click.option("--diff-deployed", is_flag=True, help="Show what a deploy would change against the deploy record "
              "(~/.config/m3deploy/<cluster>/deployed.json); exit 1 if anything.")
def plan(inventory, hosts, explain, as_json, data, no_facts, diff_deployed):
    """Print, per host, the services and the exact commands they will run.

    Networking env of multi-host workers (NCCL_SOCKET_IFNAME, NCCL_IB_HCA, UCX_NET_DEVICES) comes from the
    host facts `m3deploy preflight` last saved, where the recipe or the inventory does not set it."""
    try:
        p = load_plan(inventory, data, facts=not no_facts)
        bad = unknown_hosts(hosts, [h.name for h in p.hosts])
        if bad:
            raise M3Error(bad)
    except M3Error as e:
        fail(e)
    if diff_deployed:
        from m3deploy.controller import deployed

        record = deployed.load(p.name)
        cluster_wide = deployed.generation_change(p, record)  # a generation change: every host's, with its order
        lines = [x for x in deployed.diff(p, record)
                 if not hosts or any(x.startswith(f"{h}:") for h in hosts) or x in cluster_wide]
        for name, entry in sorted((record.get("hosts") or {}).items()):
            if not hosts or name in hosts:
                click.echo(f"# {name} runs (recorded {entry.get('at', '?')}): {deployed.describe_running(entry)}")
        back = deployed.rollback_data(record)
        if back:
            click.echo("# roll back to the generation the last change replaced: "
                       + " ".join(f"--data {shlex.quote(d)}" for d in back))
        click.echo("\n".join(lines) if lines else f"{p.name}: a deploy would change nothing against the record")
        sys.exit(1 if lines else 0)
    if as_json:
        d = p.to_dict(provenance=explain)
        if hosts:
            d["hosts"] = {h: v for h, v in d["hosts"].items() if h in hosts}
        click.echo(json.dumps(d, indent=2, sort_keys=False))
        return
    click.echo(render_text(p, hosts, explain))


def render_text(p, hosts=(), explain=False) -> str:
    """The plan as text: the cluster's lines, then each host's (only `hosts`, names or one name, where given)."""
    hosts = (hosts,) if isinstance(hosts, str) else hosts
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
                   f"{plural(w.gpus_per_rank, 'GPU')} per rank" + (f", {pools[w.services[0]]} pool)" if pools else ")"))
    for h in p.hosts:
        if hosts and h.name not in hosts:
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


@main.command(short_help="Check the inventory against every rule; exit 2 if invalid.")
@inventory_command
@json_option("Print {inventory, valid, problems, hosts, workers, services} as JSON (exit 2 still when invalid).")
@click.option("--target", type=click.Choice(["hosts", "k8s", "slurm"]), default="hosts", show_default=True,
              help="hosts: the deploy's checks; k8s / slurm: also the export for that target, checked offline "
              "(`m3deploy export`; docs/TARGETS.md).")
def validate(inventory, data, as_json, target):
    """Check the inventory against every rule; exit 0, or print every problem and exit 2. Changes nothing."""
    if target != "hosts":
        from m3deploy.core.export_slurm import checked as checked_recipe
        from m3deploy.core.k8s_validate import checked_export

        try:
            p = load_plan(inventory, data, facts=False)
            problems = (checked_export if target == "k8s" else checked_recipe)(p)[1]
            if problems:
                raise ValidationError([f"{inventory} ({target} export): {x}" for x in problems])
        except M3Error as e:
            if as_json:
                problems = e.problems if isinstance(e, ValidationError) else [str(e)]
                click.echo(json.dumps({"inventory": inventory, "target": target, "valid": False,
                                       "problems": problems}, indent=2))
                sys.exit(2)
            fail(e)
        if as_json:
            click.echo(json.dumps({"inventory": inventory, "target": target, "valid": True, "problems": [],
                                   "cluster": p.name, "workers": len(p.workers)}, indent=2))
            return
        say(f"{inventory}: valid for {target} ({plural(len(p.workers), 'worker')})")
        return
    from m3deploy.controller import deployed, user_tls
    from m3deploy.controller.secrets import api_key
    from m3deploy.core.connection import connection_file_problems

    try:
        hosts, p = load(inventory, data)
        problems = connection_file_problems(hosts)  # the deploy checks them before pyinfra connects: so does validate
        problems += user_tls.problems(hosts) if p.state != "absent" else []  # the user's edge certificate, key, CA
        if problems:
            raise ValidationError(problems)
        if p.state != "absent":
            try:
                api_key(p)  # the deploy reads m3_api_key_file before any host: so does validate
            except M3Error as e:  # named like every other refusal: the hosts and the file that set the key
                raise ValidationError([f"{user_tls.where_set(hosts, 'm3_api_key_file')}: {e}"]) from None
        deployed.refuse_skew(p)  # the deploy refuses a version skew before any host: so does validate
    except M3Error as e:
        if as_json:
            problems = e.problems if isinstance(e, ValidationError) else [str(e)]
            click.echo(json.dumps({"inventory": inventory, "valid": False, "problems": problems}, indent=2))
            sys.exit(2)
        fail(e)
    n = sum(len(h.services) for h in p.hosts)
    if as_json:
        click.echo(json.dumps({"inventory": inventory, "valid": True, "problems": [], "cluster": p.name,
                               "hosts": len(p.hosts), "workers": len(p.workers), "services": n}, indent=2))
        return
    say(f"{inventory}: valid ({plural(len(p.hosts), 'host')}, {plural(len(p.workers), 'worker')}, "
        f"{plural(n, 'service')})")
