"""m3deploy.deploy.pyinfra_speed changes what pyinfra 3.10 spends per operation, never what it computes: the
stack pyinfra orders operations by, the caller it names, and the global arguments it accepts."""
import inspect
import typing

from pyinfra.api import arguments, util

from m3deploy.deploy import pyinfra_speed


def _where(frames):
    return [(f.filename, f.lineno, f.function) for f in frames]


def test_the_stack_pyinfra_reads_is_the_same_frames_and_lines():
    assert pyinfra_speed.install() and pyinfra_speed.install()  # idempotent

    def deploy_code():  # a role calling an operation: one more frame, as in deploy.py
        return util.stack(), inspect.stack()

    fast, full = deploy_code()
    assert _where(fast) == _where(full)
    frame = inspect.currentframe()
    assert _where([util.getframeinfo(frame)]) == _where([inspect.getframeinfo(frame)])

    def operation():  # pyinfra names the line that called the operation
        return util.get_call_location()
    line, loc = inspect.currentframe().f_lineno, operation()
    assert loc.startswith(f"line {line} in ") and loc.endswith("test_pyinfra_speed.py"), loc


def test_global_arguments_are_pyinfras():
    pyinfra_speed.install()
    assert arguments.all_global_arguments() == list(typing.get_type_hints(arguments.AllArguments).items())
    arguments.all_global_arguments().clear()  # a caller's list is its own
    assert arguments.all_global_arguments()
