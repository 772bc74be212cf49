"""Render templates/*.j2 from plan objects (pure; roles ship the text with files.put).

Roles render here (not with pyinfra's files.template) so the unit tests render exactly what is
shipped, with the same filters: systemd ExecStart quoting and the two env-file dialects.
"""
from __future__ import annotations

import re
from pathlib import Path

import jinja2

from m3deploy.core.errors import M3Error
from m3deploy.core.model import Service

TEMPLATES = Path(__file__).resolve().parent.parent / "templates"

_SAFE_ARG = re.compile(r"^[A-Za-z0-9_@+=:,./-]+$")
_SAFE_ENV = re.compile(r"^[A-Za-z0-9_@+=:,./-]*$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def systemd_arg(arg: str) -> str:
    """One argv element for ExecStart=: quoted for systemd's splitter; $ and % made literal."""
    if "\n" in arg:
        raise M3Error(f"argument {arg!r} contains a newline; systemd units cannot carry it")
    if _SAFE_ARG.match(arg):
        return arg
    escaped = (arg.replace("\\", "\\\\").replace('"', '\\"')
               .replace("$", "$$").replace("%", "%%"))
    return f'"{escaped}"'


def systemd_argv(argv) -> str:
    return " ".join(systemd_arg(str(a)) for a in argv)


def env_line(name: str, value: str, dialect: str = "systemd") -> str:
    """KEY=value for systemd's EnvironmentFile= (quoted when needed) or `docker --env-file` (literal)."""
    if not _ENV_NAME.match(name):
        raise M3Error(f"bad environment variable name {name!r}")
    value = str(value)
    if "\n" in value or "\r" in value:
        raise M3Error(f"environment variable {name} contains a newline; env files cannot carry it")
    if dialect == "docker":  # docker reads everything after '=' literally (no quotes, no escapes)
        return f"{name}={value}"
    if _SAFE_ENV.match(value):
        return f"{name}={value}"
    escaped = "".join("\\" + c if c in '"\\`$' else c for c in value)
    return f'{name}="{escaped}"'


def container_name(service: Service) -> str:
    cmd = service.command
    return cmd[cmd.index("--name") + 1] if service.image and "--name" in cmd else ""


def environment() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATES)),
                             undefined=jinja2.StrictUndefined, keep_trailing_newline=True,
                             trim_blocks=True, lstrip_blocks=True, autoescape=False)
    env.filters["systemd_argv"] = systemd_argv
    env.filters["systemd_arg"] = systemd_arg
    env.globals["env_line"] = env_line
    env.globals["container_name"] = container_name
    return env


def render(template: str, **context) -> str:
    try:
        return environment().get_template(template).render(**context)
    except jinja2.TemplateError as e:
        raise M3Error(f"templates/{template}: {e}") from e


def service_env(service: Service, secrets: dict[str, str]) -> str:
    """The env file text of a service: plan env, then its secrets from the controller's store."""
    missing = [s for _, s in service.secret_env if s not in secrets]
    if missing:
        raise M3Error(f"service {service.name} on {service.host} needs secret(s) {missing} that the "
                      "controller's store does not have; run the deploy again so they are generated "
                      "(m3deploy.controller.secrets.ensure_secrets)")
    return render("service.env.j2", service=service,
                  secrets=[(k, secrets[s]) for k, s in service.secret_env],
                  dialect="docker" if service.image else "systemd")
