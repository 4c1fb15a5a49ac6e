"""Living with NCCL's failure modes: aborts that hang, and torch's own error handling.

**Aborts.** ``ncclCommAbort`` is known to hang (pytorch#119797), and ``ProcessGroupNCCL::abort`` can
wait up to the group's timeout (10 minutes by default). So every abort tether makes runs
on a daemon thread of its own, and whoever asked for it waits a bounded time, or not at
all: the watchdog's ladder starts it and goes on to its exit rung on its own timer (and
the GIL-free rungs end the process even if the abort holds the GIL); a failed rank's
shutdown (``NativeBackend.shutdown``) waits up to ``ABORT_BUDGET``.

**torch's error handling.** ``ProcessGroupNCCL`` reads ``TORCH_NCCL_ASYNC_ERROR_HANDLING``
when it is constructed. torch's default, 3 ("skip clean-up"), makes torch's NCCL watchdog
end the process with SIGABRT when it sees an NCCL error or a timeout: a survivor whose
peer died would be killed before tether raises ``PeerFailure`` in it, and the report would
show a crash instead of the root cause. While tether creates an NCCL group (the default
group, ``new_group``), and only when the user has not set the variable, it is set to 2
("clean-up only"): torch aborts the communicators and the waiting work raises, which
tether's wait turns into the true story (``verdicts.explain_backend_error``). The variable
is restored as soon as the constructor returned, on the main thread, before any other
thread of tether's reads the environment. ``TORCH_NCCL_BLOCKING_WAIT`` needs nothing:
tether calls ``work.wait()`` only once ``work.is_completed()`` (``waits._wait_polled``).
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

log = logging.getLogger("tether")

ABORT_BUDGET = 2.0  # seconds a failed rank's shutdown waits for the abort before it goes on


def abort_in_background(abort: Callable[[], None], budget: float | None) -> bool:
    """Run ``abort`` on a daemon thread; wait at most ``budget`` seconds (None: not at all).

    Returns whether the abort finished within the budget.
    """
    thread = threading.Thread(target=_logged, args=(abort,), name="tether-abort", daemon=True)
    thread.start()
    if budget is not None:
        thread.join(budget)
    return not thread.is_alive()


def _logged(abort: Callable[[], None]) -> None:
    try:
        abort()
    except Exception:
        log.exception("tether: aborting the process group failed")


ERROR_HANDLING = "TORCH_NCCL_ASYNC_ERROR_HANDLING"
CLEAN_UP_ONLY = "2"


@contextmanager
def error_handling(backend: str | None) -> Iterator[None]:
    """Construct NCCL groups in this block with torch's "clean-up only" error handling (see above)."""
    if backend != "nccl" or ERROR_HANDLING in os.environ:
        yield
        return
    os.environ[ERROR_HANDLING] = CLEAN_UP_ONLY
    try:
        yield
    finally:
        os.environ.pop(ERROR_HANDLING, None)
