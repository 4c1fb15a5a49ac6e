"""A stop sent to a ``tether.spawn`` job's whole process group while its workers start.

    python spawn_stopped_early.py SIGINT|SIGTERM

0.5 s after the launcher calls ``tether.spawn``, a thread of the launcher sends the signal
to the job's process group (a Ctrl-C in the terminal, SLURM's ``scancel``, ``timeout``):
the launcher and tether's forkserver get it while the server still imports torch (about
1.5 s here), before any worker runs the function. Before: the server died of it (a Ctrl-C
printed a traceback of its import), and the launcher's start of the first worker raised
``EOFError: unexpected EOF``, a second traceback. The launcher catches what reaches it and
prints ``LAUNCHER <type>`` (no traceback of its own).
"""

import os
import signal
import sys
import threading
import time

import tether


def work(local_rank: int) -> None:
    time.sleep(60)  # never reached in time: the stop comes first


if __name__ == "__main__":
    sig = getattr(signal, sys.argv[1])
    threading.Timer(0.5, os.killpg, (os.getpgid(0), sig)).start()
    try:
        tether.spawn("gloo", work, (), nproc_per_node=2)
    except BaseException as exc:
        os.write(1, f"LAUNCHER {type(exc).__name__}\n".encode())
        code = exc.code if isinstance(exc, SystemExit) and isinstance(exc.code, int) else 1
        sys.exit(code)
