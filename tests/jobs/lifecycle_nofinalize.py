"""Ranks that never call ``finalize`` (issue 7): ``lifecycle_nofinalize.py ROUNDS``.

Each round starts 2 fresh rank processes that ``tether.initialize("gloo", init_method=
"tcp://...", rank=r, world_size=2)``, reduce, pass a barrier and return from ``main``
without ``finalize``. Their exit statuses and stderr are printed as ``EXIT <round> <rank>
<code>`` and ``STDERR <round> <rank>: <line>``: a teardown that aborts (SIGABRT,
"terminate called ...") or a C++ store warning shows there.
"""

from __future__ import annotations

import subprocess
import sys

from lifecycle_common import free_port

RANK = """
import sys, tether
tether.initialize("gloo", init_method=sys.argv[1], rank=int(sys.argv[2]), world_size=2)
assert tether.all_reduce(int(sys.argv[2]) + 1) == 3
tether.barrier()
print("RETURNED", sys.argv[2], flush=True)
"""


def main() -> None:
    for k in range(int(sys.argv[1])):
        method = f"tcp://127.0.0.1:{free_port()}"
        procs = [
            subprocess.Popen([sys.executable, "-c", RANK, method, str(r)], stderr=subprocess.PIPE, text=True)
            for r in range(2)
        ]
        for r, proc in enumerate(procs):
            _, err = proc.communicate(timeout=60)
            print(f"EXIT {k} {r} {proc.returncode}", flush=True)
            for line in err.splitlines():
                print(f"STDERR {k} {r}: {line}", flush=True)


if __name__ == "__main__":
    main()
