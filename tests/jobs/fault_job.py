"""One cell of the fault matrix: ``fault_job.py CASE_JSON NPROC``.

Plays the case of ``tests/_faults.py`` on every rank under the case's launcher:

* ``spawn``: this process is the ``tether.spawn`` launcher of NPROC ranks;
* ``parallel``: a rank under torchrun, through ``tether.Parallel``;
* ``initialize``, ``initialize-rank0``: a rank under torchrun, through ``tether.initialize``
  (torchrun's agent hosts the store, or rank 0 does).

Every rank that catches an exception prints one ``RESULT {json}`` line (see
``_faults.result``) and re-raises it; the spawn launcher prints ``RESULT`` with rank -1
for its ``JobFailed``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import lifecycle_common  # noqa: F401  # now, not in result(): an import there opened a window for torchrun's SIGTERM

import tether as idist
from _faults import Case, result, run_case


def body(local_rank: int, case_json: str) -> None:
    case = Case.from_json(case_json)
    rank = idist.get_rank()
    try:
        run_case(case)
    except BaseException as exc:
        result(rank, exc)
        raise
    os.write(1, f"DONE rank {rank}\n".encode())


def main() -> None:
    case_json, nproc = sys.argv[1], int(sys.argv[2])
    case = Case.from_json(case_json)
    if case.launcher == "spawn":
        os.environ["FAULT_LAUNCHER_PID"] = str(os.getpid())  # a worker's parent may be the forkserver
        try:
            idist.spawn("gloo", body, (case_json,), nproc_per_node=nproc, **case.options)
        except idist.JobFailed as exc:
            result(-1, exc)
            sys.exit(int(exc.exit_code))
    elif case.launcher == "parallel":
        with idist.Parallel("gloo", **case.options) as parallel:
            parallel.run(body, case_json)
    else:
        idist.initialize("gloo", **case.options)
        try:
            body(idist.get_local_rank(), case_json)
        finally:
            idist.finalize()


if __name__ == "__main__":
    main()
