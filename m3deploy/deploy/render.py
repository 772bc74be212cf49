"""Render templates/*.j2 from plan objects (pure: no pyinfra, no host).

Everything the deploy writes is rendered here (not with pyinfra's files.template), through
m3deploy.deploy.hostfiles, so the roles, `m3deploy render` and the unit tests produce exactly the same text,
with the same filters: systemd ExecStart quoting and the two env-file dialects. The templates live in the
pyinfra project's templates/ (beside roles/ and deploy.py), read from the checkout.

Every `{{ }}` field of a unit (`*.service.j2`) has its `%` doubled: systemd expands specifiers (`%h`, `%i`, ...)
in nearly every unit setting (systemd.unit(5) "Specifiers"; `%%` is a literal `%`), so a field says what its
value says. The systemd_arg(v) filters escape their own output (and mark it so).
"""
from __future__ import annotations

import functools
import re
from pathlib import Path

import jinja2

from m3deploy.core.errors import M3Error
from m3deploy.core.inputs import ENV_LINE_MAX, ENV_NAME, MAX_ARG_STRLEN, UNIT_LINE_MAX, control_chars, url_host
from m3deploy.core.model import Service

TEMPLATES = Path(__file__).resolve().parents[2] / "templates"

_SAFE_ARG = re.compile(r"^[A-Za-z0-9_@+=:,./-]+$")
_SAFE_ENV = re.compile(r"^[A-Za-z0-9_@+=:,./-]*$")


class SystemdText(str):
    """Text already escaped for a unit file (systemd_arg's output): finalize leaves its `%%` as they are."""


@jinja2.pass_context
def _one_line(context, value):
    """Jinja's finalize: every `{{ }}` field of a unit, env file or nats.conf is one line (systemd 252 ends a
    line at \\n and at \\r, its env-file parser stops at NUL); anything else is refused, not rendered. In a
    unit, `%` is doubled (a specifier otherwise)."""
    what = control_chars(value) if isinstance(value, str) else ""
    if what:
        raise M3Error(f"refusing to render {value!r} into a host file: it holds {what}. Fix the inventory value "
                      "it came from (m3deploy validate names it)")
    if str(context.name).endswith(".service.j2") and not isinstance(value, SystemdText):
        return str(value).replace("%", "%%")
    return value


def systemd_arg(arg: str) -> str:
    """One argv element for ExecStart=: quoted for systemd's splitter; $ and % made literal."""
    if control_chars(arg):
        raise M3Error(f"argument {arg!r} holds {control_chars(arg)}; systemd units cannot carry it")
    if len(arg.encode()) >= MAX_ARG_STRLEN:
        raise M3Error(f"argument {arg[:40]!r}... is {len(arg.encode())} bytes: execve takes at most "
                      f"{MAX_ARG_STRLEN - 1} a string (MAX_ARG_STRLEN)")
    if _SAFE_ARG.match(arg):
        return SystemdText(arg)
    escaped = (arg.replace("\\", "\\\\").replace('"', '\\"')
               .replace("$", "$$").replace("%", "%%"))
    return SystemdText(f'"{escaped}"')


def systemd_argv(argv) -> str:
    return SystemdText(" ".join(systemd_arg(str(a)) for a in argv))


def env_line(name: str, value: str, dialect: str = "systemd") -> str:
    """KEY=value for systemd's EnvironmentFile= (quoted when needed) or `docker --env-file` (literal)."""
    if not ENV_NAME.fullmatch(name):
        raise M3Error(f"bad environment variable name {name!r}")
    value = str(value)
    if control_chars(value):
        raise M3Error(f"environment variable {name} holds {control_chars(value)}; env files cannot carry it")
    size = len(f"{name}={value}".encode())
    if size > (ENV_LINE_MAX if dialect == "docker" else MAX_ARG_STRLEN - 1):
        raise M3Error(f"environment variable {name} is {size} bytes as NAME=value: past docker's --env-file line "
                      "(64 KiB) or execve's MAX_ARG_STRLEN (128 KiB)")
    if dialect == "docker":  # docker reads everything after '=' literally (no quotes, no escapes)
        return f"{name}={value}"
    if _SAFE_ENV.match(value):
        return f"{name}={value}"
    escaped = "".join("\\" + c if c in '"\\`$' else c for c in value)
    return f'{name}="{escaped}"'


def nats_hostport(address: str, port: int) -> str:
    """host:port for nats.conf; an IPv6 address bracketed and quoted (an unquoted `[` starts a NATS list)."""
    hp = f"{url_host(address)}:{int(port)}"
    return f'"{hp}"' if hp.startswith("[") else hp


def container_name(service: Service) -> str:
    return service.container if service.image else ""


@functools.cache
def environment() -> jinja2.Environment:
    """One environment per process: it keeps each compiled template (and recompiles one whose file changed), so a
    deploy compiles a template once, not once per host and file; and jinja's own bytecode cache (a 0700 directory of
    the user's in the temp dir, keyed by each template's source) keeps the compiled code between runs, so a re-run
    compiles none."""
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATES)),
                             bytecode_cache=jinja2.FileSystemBytecodeCache(),
                             undefined=jinja2.StrictUndefined, keep_trailing_newline=True,
                             trim_blocks=True, lstrip_blocks=True, autoescape=False, finalize=_one_line)
    env.filters["systemd_argv"] = systemd_argv
    env.filters["systemd_arg"] = systemd_arg
    env.globals["env_line"] = env_line
    env.globals["container_name"] = container_name
    env.filters["nats_hostport"] = nats_hostport
    env.filters["url_host"] = url_host
    return env


def render(template: str, **context) -> str:
    try:
        text = environment().get_template(template).render(**context)
    except jinja2.TemplateError as e:
        raise M3Error(f"templates/{template}: {e}") from e
    long = max((len(line.encode()) for line in text.splitlines()), default=0)
    if template.endswith(".service.j2") and long >= UNIT_LINE_MAX:
        raise M3Error(f"templates/{template}: a line of {long} bytes; systemd refuses unit-file lines of 1 MiB "
                      "(LONG_LINE_MAX). Fix: shorten m3_extra_args")
    return text


def secret_names(ref: str) -> list[str]:
    """A secret_env value names one secret, or is a text with `{secret-name}` fields (a NATS route URL)."""
    return re.findall(r"\{([a-z0-9-]+)\}", ref) or [ref]


def secret_value(ref: str, secrets: dict[str, str]) -> str:
    return re.sub(r"\{([a-z0-9-]+)\}", lambda m: secrets[m.group(1)], ref) if "{" in ref else secrets[ref]


def service_env(service: Service, secrets: dict[str, str] | None) -> str:
    """The env file text of a service: plan env, then its secrets from the controller's store.
    secrets=None: each secret line is `KEY=<secret: NAME>` (what `m3deploy render` writes; never a value)."""
    dialect = "docker" if service.image else "systemd"
    if secrets is None:
        text = render("service.env.j2", service=service, secrets=[], dialect=dialect)
        return text + "".join(f"{k}=<secret: {s}>\n" for k, s in service.secret_env)
    missing = [n for _, ref in service.secret_env for n in secret_names(ref) if n not in secrets]
    if missing:
        raise M3Error(f"service {service.name} on {service.host} needs secret(s) {missing} that the "
                      "controller's store does not have; run the deploy again so they are generated "
                      "(m3deploy.controller.secrets.ensure_secrets)")
    return render("service.env.j2", service=service,
                  secrets=[(k, secret_value(ref, secrets)) for k, ref in service.secret_env], dialect=dialect)
