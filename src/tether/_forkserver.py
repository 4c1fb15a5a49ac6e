"""Preloaded by ``tether.spawn``'s forkserver (``multiprocessing.set_forkserver_preload``); never
imported anywhere else.

The server imports tether (and so torch) once, and each worker is forked with both already
imported. Importing this module also makes the server's own exit skip the interpreter's
teardown, where torch's modules take about half a second to unload: the server holds the
launcher's stdout and stderr, so a pipe from the launcher (``python train.py | tee log``)
would end that much after the launcher did. Workers forked from the server inherit the
exit function but are not the server: for them it does nothing.

The server runs with SIGINT and SIGTERM blocked, as the launcher started it
(``spawn._context``): it ends with the launcher, never of a stop sent to the whole
process group. The processes it forks inherit the mask, and a stop sent to one of them
meanwhile waits, until it runs: a worker of tether's unblocks them in ``run_worker``,
inside the handling that ends it cleanly (a Ctrl-C the launcher forwards to a worker it
has just started was lost in the server's handler before); any other process of the
launcher's forkserver context (the server is one per process, and Python 3.14's default
start method is "forkserver") unblocks them as it starts (``_unblock_stops``): with them
blocked, ``Process.terminate()`` did not end it.
"""

from __future__ import annotations

import atexit
import multiprocessing
import multiprocessing.util
import os
import signal

import tether  # noqa: F401  (the preload itself)
from tether._spawn_worker import run_worker


def _end_server(server_pid: int) -> None:
    if os.getpid() == server_pid:
        os._exit(0)


def _unblock_stops(_: object) -> None:
    """Run in each process the server forks, as it starts (``BaseProcess._bootstrap``)."""
    if getattr(multiprocessing.current_process(), "_target", None) is not run_worker:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})


atexit.register(_end_server, os.getpid())
multiprocessing.util.register_after_fork(_unblock_stops, _unblock_stops)
