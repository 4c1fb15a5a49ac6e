"""Two ``tether.spawn`` jobs in one launcher, with the environment changed in between.

    python spawn_env.py [START_METHOD]

Each worker prints ``WORKER {json}``: the value of ``SPAWN_ENV_VALUE`` it sees, whether
its parent is the launcher, and whether torch was imported before the job's module ran
in it (``sys.modules`` when the worker's function is unpickled, i.e. before ``main`` runs).
"""

import json
import os
import sys

PRELOADED = "torch" in sys.modules  # in a worker: whether it came with torch imported (forked from the server)

import tether  # noqa: E402


def report(local_rank: int, job: int) -> None:
    line = {
        "job": job,
        "rank": tether.get_rank(),
        "value": os.environ.get("SPAWN_ENV_VALUE"),
        "parent_is_launcher": os.getppid() == int(os.environ["SPAWN_ENV_LAUNCHER"]),
        "torch_preloaded": PRELOADED,
    }
    os.write(1, f"WORKER {json.dumps(line)}\n".encode())  # one write: the two workers share the pipe


if __name__ == "__main__":
    kwargs = {"start_method": sys.argv[1]} if len(sys.argv) > 1 else {}
    os.environ["SPAWN_ENV_LAUNCHER"] = str(os.getpid())
    for job, value in enumerate(["first", "second"]):
        os.environ["SPAWN_ENV_VALUE"] = value
        tether.spawn("gloo", report, (job,), nproc_per_node=2, **kwargs)
