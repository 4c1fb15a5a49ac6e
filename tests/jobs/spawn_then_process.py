"""After ``tether.spawn``, a process of the launcher's own forkserver context is as Python makes it.

    python spawn_then_process.py

tether's forkserver (one per process, kept after ``spawn`` returns, and the one any later
forkserver process comes from) runs with SIGINT and SIGTERM blocked. A process the
launcher starts from it afterwards must take them again: ``terminate()`` (SIGTERM) ends it.
"""

import multiprocessing
import os
import time

import tether


def work(local_rank: int) -> None:
    tether.barrier()


if __name__ == "__main__":
    tether.spawn("gloo", work, (), nproc_per_node=2)
    proc = multiprocessing.get_context("forkserver").Process(target=time.sleep, args=(30,))
    proc.start()
    time.sleep(0.5)
    proc.terminate()
    proc.join(10)
    os.write(1, f"TERMINATED {proc.exitcode}\n".encode())
    if proc.exitcode is None:
        proc.kill()
