"""The tests' one way to wait: poll until something holds, or fail saying what was awaited.

(``LocalCluster.wait_for`` is the local cluster's own, for its users; tests use this one.)
"""

import time
from typing import Callable, Optional, TypeVar

T = TypeVar("T")


def wait_for(
    predicate: Callable[[], T],
    what: str,
    *,
    timeout: float = 60.0,
    interval: float = 0.2,
    still_worth_it: Optional[Callable[[], None]] = None,
    detail: Optional[Callable[[], str]] = None,
) -> T:
    """Call ``predicate`` every ``interval`` seconds until it returns something truthy, and return that.

    After ``timeout`` seconds: AssertionError "timed out after <timeout>s waiting for <what>", followed by
    what ``detail()`` says (a process's output, the last status). ``still_worth_it`` is called before each
    pause; it raises (AssertionError) when waiting longer cannot help, e.g. the process to watch has ended.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            more = detail() if detail is not None else ""
            raise AssertionError(f"timed out after {timeout}s waiting for {what}" + (f"; {more}" if more else ""))
        if still_worth_it is not None:
            still_worth_it()
        time.sleep(interval)


def wait_for_status(scheduler, app_id: str, predicate: Callable, what: str, *, timeout: float = 60.0):
    """``wait_for`` on ``scheduler.describe(app_id)``: the first description ``predicate`` accepts; on timeout,
    the failure names the last one."""
    last: list = []

    def accepted():
        last[:] = [scheduler.describe(app_id)]
        return last[0] if predicate(last[0]) else None

    return wait_for(
        accepted, what, timeout=timeout, detail=lambda: f"last status: {last[0].state} {last[0].msg!r}" if last else ""
    )
