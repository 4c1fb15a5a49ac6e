"""A torchrun job whose rank 0 gets the launcher's SIGTERM while ``finalize()`` retires it after a failure.

    STOP_AT=watchdog|uninstalled torchrun --nproc_per_node 2 output_stop_in_finalize.py

Rank 1 raises in ``one_rank_first``; rank 0, waiting there, raises ``PeerFailure`` and calls
``finalize()`` in its ``finally:``, as ``Parallel`` and a plain script do. torchrun's
SIGTERM, sent once rank 1 ended, can land in that retire (seen in the fault matrix's rows
where the store's host dies, where the retire takes a while). Here rank 0 sends itself one
SIGTERM at a chosen point of it, so it lands there every time: ``watchdog``, as the retire
stops the watchdog (tether's handler still installed); ``uninstalled``, right after the
retire put the previous signal handlers back.
"""

import os
import signal

import tether as idist
from tether._core.hooks import Hooks
from tether._core.watchdog import Watchdog

sent = []


def send_once() -> None:
    if not sent:  # one SIGTERM, as a launcher sends
        sent.append(True)
        os.kill(os.getpid(), signal.SIGTERM)  # its handler runs at the next bytecode: here


def stop_watchdog(original):  # type: ignore[no-untyped-def]
    def stop(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        if self.failure is not None:
            send_once()
        return original(self, *args, **kwargs)

    return stop


def uninstall_hooks(original):  # type: ignore[no-untyped-def]
    def uninstall(self, keep_exit=False):  # type: ignore[no-untyped-def]
        original(self, keep_exit)
        if keep_exit:  # (after a failure)
            send_once()

    return uninstall


if __name__ == "__main__":
    if os.environ["RANK"] == "0":
        if os.environ["STOP_AT"] == "watchdog":
            Watchdog.stop = stop_watchdog(Watchdog.stop)
        else:
            Hooks.uninstall = uninstall_hooks(Hooks.uninstall)
    idist.initialize("gloo")
    try:
        with idist.one_rank_first(rank=1):
            if idist.get_rank() == 1:
                raise RuntimeError("download failed 0.1 on rank 1")
    finally:
        idist.finalize()
