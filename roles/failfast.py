"""Stop the whole deploy at the first host that cannot be reached or fails (private to deploy.py).

pyinfra 3.10 connects to every host before it loads deploy.py and drops those it could not reach
(`state.failed_hosts`); with no fail percent it then deploys the others, and a host that fails an operation is
dropped while the rest go on. Both leave a cluster half-changed (mixed settings, a rollout running ahead). A
deploy file cannot set FAIL_PERCENT: pyinfra resets config changes made while loading it. So:

- at prepare time, an unreachable host stops the run before any operation, naming the host;
- at run time, a state callback stops the run after the first operation on which any host failed: the other hosts
  are as the completed operations left them, and a re-run converges (hosts already right report no change).
"""
from __future__ import annotations

from pyinfra import state
from pyinfra.api.state import BaseStateCallback

from m3deploy.deploy.context import HostsFailed

FIX = 'see docs/OPERATIONS.md "Unreachable hosts"'


def _names(hosts) -> str:
    return ", ".join(sorted(h.name for h in hosts))


class _StopOnFailure(BaseStateCallback):
    @staticmethod
    def operation_end(st, op_hash):
        if st.failed_hosts:
            op = next(iter(st.get_op_meta(op_hash).names), op_hash)
            raise HostsFailed(f"{_names(st.failed_hosts)} failed at {op!r} (its error is above); the deploy stops "
                              "here, "
                              "the other hosts are as the completed operations left them. Fix: correct the cause "
                              f"and run the deploy again (hosts already right report no change); {FIX}")


def stop_on_unreachable_or_failed_hosts() -> None:
    if state.failed_hosts:
        raise HostsFailed(f"cannot reach {_names(state.failed_hosts)}, nothing was changed on any host. Fix: bring "
                          "the host(s) back (ssh to them), or deploy the others only with `--limit` (never a part "
                          f"of a multi-host worker); {FIX}")
    if not any(isinstance(h, _StopOnFailure) for h in state.callback_handlers):
        state.add_callback_handler(_StopOnFailure())
