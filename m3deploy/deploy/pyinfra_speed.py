"""Three costs pyinfra 3.10 pays on every operation call that change nothing it computes (a re-run's Python time).

- `pyinfra.api.util.get_operation_order_from_stack` orders operations by the line numbers of the call stack; it
  gets them with `inspect.stack()` and `inspect.getframeinfo(frame)`, which also read `context=1` source lines of
  every frame (`inspect.findsource` -> `inspect.getmodule`, a scan of sys.modules per frame). Only `filename` and
  `lineno` are used (util.py `get_call_location`, `get_operation_order_from_stack`): asked with `context=0` they are
  the same, without reading any source.
- `pyinfra.api.arguments.all_global_arguments()` evaluates `typing.get_type_hints(AllArguments)` on every call (each
  operation and fact); the class's hints never change, so they are evaluated once.
- `pyinfra.api.host.HostData.__getattr__` looks a key up in each data layer in turn through a generator and a
  `KeyError` per layer without it; `pop_global_arguments` asks it for every global argument of every operation and
  fact (~7000 lookups in a 3-host re-run, most in no layer: 41 ms). The same walk, the same order and the same
  copy, with `in` instead of the exceptions: 24-34 ms.

Measured on the testbed's no-change re-run: these were ~30% of the profile (benchmarks/results/rerun-*.md).
Applied only to the pyinfra minor version they were read from; any other version runs unchanged.
"""
from __future__ import annotations

import copy
import functools
import inspect

PYINFRA_MINOR = "3.10"


def install() -> bool:
    """Apply all three (idempotent). Returns whether they are applied."""
    from pyinfra.api import arguments, util
    from pyinfra.version import __version__

    if not __version__.startswith(PYINFRA_MINOR + "."):
        return False
    if getattr(util, "_m3_speed", False):
        return True
    util.stack = functools.partial(inspect.stack, 0)  # C-level: no frame of its own in the stack it returns
    util.getframeinfo = lambda frame, context=0: inspect.getframeinfo(frame, 0)
    hints = tuple(arguments.all_global_arguments())
    cached = functools.wraps(arguments.all_global_arguments)(lambda: list(hints))
    arguments.all_global_arguments = cached
    from pyinfra.api import facts

    if getattr(facts, "all_global_arguments", None) is not None:
        facts.all_global_arguments = cached
    from pyinfra.api.host import HostData

    HostData._m3_pyinfra_getattr = HostData.__getattr__  # pyinfra's own (tests/unit/test_pyinfra_speed.py)
    HostData.__getattr__ = _host_data_getattr
    util._m3_speed = True
    return True


def _host_data_getattr(self, key: str):
    """pyinfra 3.10's HostData.__getattr__ (api/host.py), without a generator and an exception per data layer."""
    for data in self.datas:
        if callable(data):
            data = data()
        if key in data:
            return copy.copy(data[key])
    raise AttributeError(f"Host `{self.host}` has no data `{key}`")
