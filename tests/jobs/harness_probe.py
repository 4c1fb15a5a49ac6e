"""What a job's first process sees of how it was started: ``test_harness`` runs it both forked
from the zygote and as a fresh interpreter, and compares.

``python harness_probe.py ARG...``: prints one JSON line, then raises ``ValueError`` (or
ends by the exit the first argument names: ``exit-3``, ``sigterm``).
"""

from __future__ import annotations

import faulthandler
import json
import os
import signal
import sys


def probe() -> dict[str, object]:
    return {
        "argv": sys.argv,
        "path0": sys.path[0],
        "cwd": os.getcwd(),
        "file": __file__,
        "main": sys.modules["__main__"].__file__,
        "tagged": "TETHER_TEST_JOB" in os.environ,
        "own_session": os.getsid(0) == os.getpid(),
        "faulthandler": faulthandler.is_enabled(),
        "write_through": sys.stdout.write_through,
        "stdin": os.readlink("/proc/self/fd/0"),
        "signals": {s.name: str(signal.getsignal(s)) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGPIPE)},
        "torch_imported": "torch" in sys.modules,
    }


def fail(how: str) -> None:
    print("to stderr", file=sys.stderr)
    if how == "exit-3":
        sys.exit(3)
    if how == "sigterm":
        os.kill(os.getpid(), signal.SIGTERM)
    raise ValueError(f"the probe's error 0.1 ({how})")


if __name__ == "__main__":
    print(json.dumps(probe()))
    fail(sys.argv[1])
