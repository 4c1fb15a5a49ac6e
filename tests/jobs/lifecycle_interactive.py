"""Run as ``python -i lifecycle_interactive.py PORT`` with commands on stdin (issue 7).

A one-rank job on ``tcp://127.0.0.1:PORT``, then an uncaught exception: the interpreter
must print it and go on reading commands (``print("still alive")``, ``exit()``), never
``os._exit`` (tether did not launch this process, and no torchrun or SLURM runs it).
"""

from __future__ import annotations

import sys

import tether

tether.initialize("gloo", init_method=f"tcp://127.0.0.1:{int(sys.argv[1])}", rank=0, world_size=1)
print(f"INITIALIZED world={tether.get_world_size()} sum={tether.all_reduce(5)}", flush=True)
raise RuntimeError("uncaught in an interactive session (1nt3r)")
