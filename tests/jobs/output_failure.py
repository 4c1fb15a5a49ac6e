"""A failing job whose output the tests count (issue 11), under any launcher.

    python output_failure.py spawn N | torchrun ... output_failure.py torchrun

Rank 1 raises inside ``one_rank_first(rank=1)``, called from ``main`` through
``prepare``: the report's traceback must start at the user's ``main``. Every other rank
waits for it there and stops with one line. With ``OUTPUT_SLOW_ATEXIT=S`` every other
rank's ``atexit`` takes S seconds (a logger's flush), so torchrun's SIGTERM, sent 0.1 s
after rank 1 exits, lands while the victim is ending; it prints ``SLOW_ATEXIT <time>``
as it starts.
"""

import atexit
import os
import sys
import time

import tether as idist


def prepare() -> None:
    with idist.one_rank_first(rank=1):
        if idist.get_rank() == 1:
            raise RuntimeError("download failed 0.1 on rank 1")


def slow_atexit(seconds: float) -> None:
    os.write(1, f"SLOW_ATEXIT {time.time()}\n".encode())
    time.sleep(seconds)


def main(local_rank: int = 0) -> None:
    prepare()
    idist.barrier()


if __name__ == "__main__":
    if sys.argv[1] == "spawn":
        with idist.Parallel(backend="gloo", nproc_per_node=int(sys.argv[2])) as parallel:
            parallel.run(main)
    else:
        if os.environ.get("OUTPUT_SLOW_ATEXIT") and os.environ["RANK"] != "1":
            atexit.register(slow_atexit, float(os.environ["OUTPUT_SLOW_ATEXIT"]))  # runs after tether's
        idist.initialize("gloo")
        main()
        idist.finalize()
