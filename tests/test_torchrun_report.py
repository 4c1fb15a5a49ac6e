"""The tests' reader of torchrun's failure summary, on summaries torch's own code writes.

``ChildFailedError.format_msg`` is what torchrun prints when a job fails; the failures here
are torch's ``ProcessFailure``s read from error files as a rank's ``record`` writes them.
"""

from __future__ import annotations

import json
from pathlib import Path

from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

from _torchrun_report import blamed, other_failures, root_cause

ROOT_TRACE = 'Traceback (most recent call last):\n  File "job.py", line 4, in <module>\nRuntimeError: boom 0.1'
VICTIM = "PeerFailure: rank 1 failed: RuntimeError: boom 0.1 (in barrier #2, at job.py:3 in <module>)"


def failure(tmp_path: Path, rank: int, exitcode: int, stamp: int | None, text: str = "") -> ProcessFailure:
    """A rank's failure as torchrun reads it: from its error file, or none (a killed rank)."""
    error_file = tmp_path / f"error.{rank}.json"
    if stamp is not None:
        message = {"message": text, "extraInfo": {"py_callstack": text, "timestamp": str(stamp)}}
        error_file.write_text(json.dumps({"message": message}))
    return ProcessFailure(local_rank=rank, pid=100 + rank, exitcode=exitcode, error_file=str(error_file))


def test_entries_are_read_by_their_rank_line_not_by_the_number_torchrun_gives_them(tmp_path: Path) -> None:
    # torchrun numbers the entries in the order it collected the exits: here no entry's
    # number is its rank; the root cause, rank 1 (the earliest stamp), is printed as "[2]"
    failures = {
        2: failure(tmp_path, 2, -9, None),  # killed: no error file
        0: failure(tmp_path, 0, 3, 1_700_000_001, VICTIM),
        1: failure(tmp_path, 1, 1, 1_700_000_000, ROOT_TRACE),
    }
    summary = ChildFailedError("job.py", failures).format_msg()
    assert "[2]:\n  time      : " in summary.split("Root Cause")[1]
    output = f"[rank0]: a line of the job's own\n{summary}\n"
    root = root_cause(output)
    assert (root.rank, root.exitcode) == (1, 1), root
    assert root.traceback == ROOT_TRACE.replace("\n", "\n  "), root.traceback  # torch indents its lines
    others = other_failures(output)
    assert sorted(others) == [0, 2] and (others[0].exitcode, others[2].exitcode) == (3, -9), others
    assert others[0].traceback == VICTIM and "(SIGKILL)" in others[2].text, others
    assert (blamed(root), blamed(others[0]), blamed(others[2])) == (1, 1, 2)


def test_a_summary_of_one_failure_has_no_other_entries(tmp_path: Path) -> None:
    summary = ChildFailedError("job.py", {1: failure(tmp_path, 1, 1, 1_700_000_000, ROOT_TRACE)}).format_msg()
    assert "<NO_OTHER_FAILURES>" in summary
    assert root_cause(summary).rank == 1 and other_failures(summary) == {}
