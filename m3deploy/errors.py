"""Errors users see: what is wrong, where (host, key, file), and how to fix it."""


class M3Error(Exception):
    """A user-facing error. str() is the message to print."""


class ValidationError(M3Error):
    """One or more plan validation problems; `.problems` holds each message."""

    def __init__(self, problems):
        self.problems = list(problems)
        super().__init__("\n".join(f"- {p}" for p in self.problems))


def _invalid_plan_class():
    """InvalidPlan: raised by deploy.py. pyinfra's CLI passes its own (CliError) exceptions through unwrapped and
    click exits with their exit_code; PyinfraError makes pyinfra's per-host loader and exec_file re-raise it as is."""
    import click
    from pyinfra.api.exceptions import PyinfraError
    from pyinfra_cli.exceptions import CliError

    class InvalidPlan(CliError, PyinfraError):
        exit_code = 2

        def show(self, file=None):
            click.echo(f"--> {click.style('m3deploy', 'red', bold=True)}: {self.message}", err=True)

    return InvalidPlan


def __getattr__(name):  # lazy: m3deploy.errors must not import pyinfra for `m3deploy plan`
    if name == "InvalidPlan":
        cls = _invalid_plan_class()
        globals()["InvalidPlan"] = cls
        return cls
    raise AttributeError(name)
