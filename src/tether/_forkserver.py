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
process group. Each worker unblocks them first thing (``_spawn_worker.run_worker``).
"""

from __future__ import annotations

import atexit
import os

import tether  # noqa: F401  (the preload itself)


def _end_server(server_pid: int) -> None:
    if os.getpid() == server_pid:
        os._exit(0)


atexit.register(_end_server, os.getpid())
