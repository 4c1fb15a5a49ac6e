"""Ranks that never call ``finalize`` (issue 7): ``lifecycle_nofinalize.py ROUNDS``.

Each round starts 2 fresh rank processes that ``tether.initialize("gloo", init_method=
"tcp://...", rank=r, world_size=2)``, reduce, pass a barrier and return from ``main``
without ``finalize``. Their exit statuses and stderr are printed as ``EXIT <round> <rank>
<code>`` and ``STDERR <round> <rank>: <line>``: a teardown that aborts (SIGABRT,
"terminate called ...") or a C++ store warning shows there.
"""

from __future__ import annotations

import sys

from lifecycle_common import run_pair

RANK = """
import os, sys, tether
tether.initialize("gloo", init_method=sys.argv[1], rank=int(sys.argv[2]), world_size=2)
assert tether.all_reduce(int(sys.argv[2]) + 1) == 3
tether.barrier()
os.write(1, f"RETURNED {sys.argv[2]}\\n".encode())
"""


def main() -> None:
    for k in range(int(sys.argv[1])):
        run_pair(RANK, label=f"{k} ")


if __name__ == "__main__":
    main()
