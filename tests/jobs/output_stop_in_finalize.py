"""A torchrun job whose rank 0 gets the launcher's SIGTERM while ``finalize()`` retires it after a failure.

    torchrun --nproc_per_node 2 output_stop_in_finalize.py

Rank 1 raises in ``one_rank_first``; rank 0, waiting there, raises ``PeerFailure`` and calls
``finalize()`` in its ``finally:``, as ``Parallel`` and a plain script do. Where the store's
host is gone (the fault matrix's store-host rows) that retire can take a while, and
torchrun's SIGTERM landed in it now and then; here rank 0 sends itself the SIGTERM as the
retire stops its watchdog (``Watchdog.stop`` wrapped: after the context is uninstalled,
before the signal handlers are), so it lands there every time.
"""

import os
import signal

import tether as idist
from tether._core.watchdog import Watchdog

original = Watchdog.stop
stopped = []


def stop_after_a_sigterm(self, *args, **kwargs):  # type: ignore[no-untyped-def]
    if self.failure is not None and not stopped:  # one SIGTERM, as a launcher sends
        stopped.append(True)
        os.kill(os.getpid(), signal.SIGTERM)  # its handler runs at the next bytecode: here
    return original(self, *args, **kwargs)


if __name__ == "__main__":
    if os.environ["RANK"] == "0":
        Watchdog.stop = stop_after_a_sigterm
    idist.initialize("gloo")
    try:
        with idist.one_rank_first(rank=1):
            if idist.get_rank() == 1:
                raise RuntimeError("download failed 0.1 on rank 1")
    finally:
        idist.finalize()
