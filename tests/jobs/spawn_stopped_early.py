"""A stop sent to a ``tether.spawn`` job's whole process group while its workers start.

    python spawn_stopped_early.py SIGINT|SIGTERM

0.1 s after the launcher's main thread began to start and supervise its workers
(``_Supervisor.run``), a thread of the launcher sends the signal to the job's process
group (a Ctrl-C in the terminal, SLURM's ``scancel``, ``timeout``): the launcher and
tether's forkserver get it while the server still imports torch (about 1.5 s here),
before any worker runs the function. (It was 0.5 s after the call to ``tether.spawn``:
under a slow resolver the launcher was still connecting to the job's store then, before
any worker, where a stop is a plain ``KeyboardInterrupt`` or SIGTERM's default.) Before: the server died of it (a Ctrl-C
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


def supervising(main: int) -> bool:
    """Whether the thread ``main`` is inside tether's ``_Supervisor.run``."""
    frame = sys._current_frames().get(main)
    while frame is not None:
        if frame.f_code.co_name == "run" and frame.f_code.co_filename.endswith("spawn.py"):
            return True
        frame = frame.f_back
    return False


def stop_once_workers_start(sig: signal.Signals, main: int) -> None:
    deadline = time.monotonic() + 60.0
    while not supervising(main) and time.monotonic() < deadline:
        time.sleep(0.005)
    time.sleep(0.1)
    os.killpg(os.getpgid(0), sig)


if __name__ == "__main__":
    sig = getattr(signal, sys.argv[1])
    threading.Thread(target=stop_once_workers_start, args=(sig, threading.get_ident()), daemon=True).start()
    try:
        tether.spawn("gloo", work, (), nproc_per_node=2)
    except BaseException as exc:
        os.write(1, f"LAUNCHER {type(exc).__name__}\n".encode())
        code = exc.code if isinstance(exc, SystemExit) and isinstance(exc.code, int) else 1
        sys.exit(code)
