"""One job per row of the exit-code table (``tether.ExitCode``), under ``tether.spawn``.

    python exit_codes.py CASE

Two ranks. The launcher prints its report (every rank's exit status) and exits with its
own code; the test reads both. Cases:

    ok          both ranks return                                 ranks 0, 0; launcher 0
    raised      rank 1 raises while rank 0 waits in a barrier      ranks 3, 1; launcher 7
    timeout     rank 1 sleeps in user code past sync_timeout=1     rank 0: 4
    mismatch    rank 0 enters barrier, rank 1 all_reduce           ranks 5, 5
    watchdog    rank 1 raises while rank 0 sleeps in user code     rank 0: 6 (after grace=1)
    signal      rank 1 kills itself with SIGKILL                   rank 1: -9 (128 + 9 to a shell)
"""

import os
import signal
import sys
import time

import tether

CASE = sys.argv[1]


def fn(local_rank: int) -> None:
    rank = tether.get_rank()
    tether.barrier()
    if CASE == "ok":
        tether.barrier()
    elif CASE == "raised":
        if rank == 1:
            raise RuntimeError("raised 0.1 on rank 1")
        tether.barrier()
    elif CASE == "timeout":
        if rank == 1:
            time.sleep(30)
        tether.barrier()
    elif CASE == "mismatch":
        if rank == 0:
            tether.barrier()
        else:
            tether.all_reduce(0.1)
    elif CASE == "watchdog":
        if rank == 1:
            time.sleep(0.3)
            raise RuntimeError("raised 0.1 on rank 1")
        time.sleep(30)  # user code, outside tether: the failure goes untaken
    elif CASE == "signal":
        if rank == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        tether.barrier()


if __name__ == "__main__":
    try:
        # grace=1 where the ladder is the case; elsewhere the launcher's SIGKILL, grace + 2 s
        # after a failure, must not beat a loaded machine's victim to its exit (seen once:
        # rank 0 of "raised" killed before it had printed its one line, in a full run)
        grace = 1.0 if CASE == "watchdog" else 5.0
        tether.spawn("gloo", fn, (), nproc_per_node=2, sync_timeout=1.0, grace=grace)
    except tether.JobFailed as exc:
        os.write(1, f"CODES {sorted(exc.exit_codes.items())}\n".encode())
        raise
    os.write(1, b"CODES [(0, 0), (1, 0)]\n")
