"""m3deploy.deploy.pyinfra_speed changes what pyinfra 3.10 spends per operation, never what it computes: the
stack pyinfra orders operations by, the caller it names, the global arguments it accepts, and a host's data."""
import inspect
import typing

import pytest
from pyinfra.api import arguments, util
from pyinfra.api.host import HostData

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


def test_host_data_is_what_pyinfra_would_give():
    """The same layers in the same order (override, host, groups, all, then the @deploy defaults, some as callables
    read at lookup time), a copy of each value, AttributeError for a key no layer has: as pyinfra's own lookup."""
    pyinfra_speed.install()
    deploy_defaults = {"d": 1, "h": "deploy"}
    layers = ({"h": "override"}, lambda: {"h": "host", "lst": [1, 2]}, {"g": "group", "h": "group"},
              lambda: deploy_defaults)
    data = HostData("h1", *layers)
    data.o = "set during the run"  # HostData.__setattr__: the override layer
    own = HostData._m3_pyinfra_getattr
    for key in ("h", "g", "d", "lst", "o"):
        assert getattr(data, key) == own(data, key), key
    assert data.lst is not own(data, "lst") and data.lst is not data.lst  # a shallow copy each time, as pyinfra
    deploy_defaults["d"] = 2
    assert data.d == own(data, "d") == 2  # callables are read at lookup time
    for get in (lambda k: getattr(data, k), lambda k: own(data, k)):
        with pytest.raises(AttributeError, match="has no data `missing`"):
            get("missing")
    assert data.get("missing", "dflt") == "dflt"
