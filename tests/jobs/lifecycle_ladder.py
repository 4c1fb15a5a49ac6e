"""The watchdog's last rungs need no GIL, and syncs off the main thread raise at once (issue 7).

lifecycle_ladder.py gil
    ``tether.spawn`` of 2 ranks with ``grace=1``. Rank 1 raises ValueError("bad 0.1")
    after a barrier; rank 0 is then in ONE C call that holds the GIL for far longer
    than the job's bound (``sum(range(...))``), so no Python thread of its own can run:
    the ladder's Python rung cannot end it, ``faulthandler`` dumps its stacks after
    grace + 0.5 s and SIGALRM ends it after grace + 1 s. Prints ``LC {"event":
    "launcher", ...}`` with every rank's exit code and the seconds from the failure
    to the launcher's return.
lifecycle_ladder.py thread
    ``tether.spawn`` of 2 ranks: each calls ``tether.barrier()`` and
    ``tether.all_reduce(1)`` from a second thread (expects ``RuntimeError`` at once,
    reported as ``LC {"event": "thread", ...}``), then both pass a barrier and an
    all_reduce on the main thread.
"""

from __future__ import annotations

import sys
import threading
import time

from lifecycle_common import emit

GRACE = 1.0


def gil_body(local_rank: int, stamp: str) -> None:
    import tether

    tether.barrier()
    if tether.get_rank() == 1:
        with open(stamp, "w") as fp:
            fp.write(str(time.time()))
        raise ValueError("bad 0.1")
    time.sleep(0.3)  # the failure is posted and delivered while this rank sleeps...
    sum(range(10**11))  # ...then one C call holds the GIL (minutes, far past the bound)


def thread_body(local_rank: int) -> None:
    import tether

    outcome: dict[str, str] = {}

    def off_main() -> None:
        for name, call in (("barrier", tether.barrier), ("all_reduce", lambda: tether.all_reduce(1))):
            t = time.monotonic()
            try:
                call()
                outcome[name] = "returned"
            except RuntimeError as exc:
                outcome[name] = f"{type(exc).__name__} after {time.monotonic() - t:.3f} s: {exc}"

    worker = threading.Thread(target=off_main, name="side")
    worker.start()
    worker.join(30)
    emit("thread", rank=tether.get_rank(), **outcome)
    tether.barrier()
    emit("main", rank=tether.get_rank(), sum=tether.all_reduce(1))


def main() -> None:
    import tether

    if sys.argv[1] == "thread":
        tether.spawn("gloo", thread_body, (), nproc_per_node=2)
        return
    stamp = sys.argv[2]
    codes: dict[str, object] = {}
    try:
        tether.spawn("gloo", gil_body, (stamp,), nproc_per_node=2, grace=GRACE)
    except tether.JobFailed as exc:
        codes = {str(k): v for k, v in exc.exit_codes.items()}
    with open(stamp) as fp:
        failed_at = float(fp.read())
    emit("launcher", codes=codes, after=round(time.time() - failed_at, 3))


if __name__ == "__main__":
    main()
