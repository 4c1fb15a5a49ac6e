"""torchrun's failure summary (its ``ChildFailedError``), read: the root cause and the others.

When a job fails, torchrun prints one summary (``torch.distributed.elastic``'s template)::

    ============================================================
    job.py FAILED
    ------------------------------------------------------------
    Failures:
    [1]:
      time      : 2026-12-06_14:09:56
      host      : localhost
      rank      : 0 (local_rank: 0)
      exitcode  : 3 (pid: 5448)
      error_file: /tmp/torchelastic_.../attempt_0/0/error.json
      traceback : PeerFailure: rank 1 failed: RuntimeError: boom from rank 1 (in ...)
    ------------------------------------------------------------
    Root Cause (first observed failure):
    [0]:
      ...
      rank      : 1 (local_rank: 1)
      exitcode  : 1 (pid: 5449)
      ...
      traceback : Traceback (most recent call last):
        ...
      RuntimeError: boom from rank 1
    ============================================================

The ``[N]`` of an entry is the order in which torchrun collected the exits, not the rank: a
fresh-clone run listed rank 0's root cause as ``[1]``. Read the ``rank`` line, as these do.
A rank with no other failure leaves ``  <NO_OTHER_FAILURES>`` under ``Failures:``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

ROOT_CAUSE = "Root Cause (first observed failure):"
_ENTRY = re.compile(r"^\[\d+\]:$", re.M)
_RANK = re.compile(r"^  rank\s+: (\d+) \(local_rank: \d+\)$", re.M)
_EXITCODE = re.compile(r"^  exitcode\s+: (-?\d+) \(pid: \d+\)", re.M)
_TRACEBACK = re.compile(r"^  traceback : ", re.M)


@dataclass(frozen=True)
class Entry:
    """One rank's entry in torchrun's summary."""

    rank: int
    exitcode: int  # a signal's negative number, its name in ``text`` ("(SIGKILL)")
    traceback: str  # the entry's ``traceback`` field: its error file's traceback, or torchrun's line
    text: str  # the whole entry, as printed


def root_cause(output: str) -> Entry:
    """The entry under ``Root Cause``, asserting that torchrun printed exactly one summary."""
    lines = _summary(output)
    at = lines.index(ROOT_CAUSE)
    (entry,) = _entries(lines[at + 1 : -1])
    return entry


def blamed(entry: Entry) -> int:
    """The rank an entry puts the failure on: the culprit its ``PeerFailure`` names when the
    entry is a victim's (torchrun's first observed exit can be one: a killed rank leaves no
    error file, and torchrun stamps its exit when it sees it), else the entry's own rank."""
    found = re.search(r"rank (\d+) failed: ", entry.traceback)
    return int(found.group(1)) if found else entry.rank


def other_failures(output: str) -> dict[int, Entry]:
    """The entries under ``Failures:`` (every failed rank but the root cause's), by rank."""
    lines = _summary(output)
    start, end = lines.index("Failures:"), lines.index(ROOT_CAUSE)
    return {entry.rank: entry for entry in _entries(lines[start + 1 : end - 1])}


def _summary(output: str) -> list[str]:
    """The summary's lines, from ``Failures:`` to its closing border."""
    assert output.count(ROOT_CAUSE) == 1, f"torchrun's Root Cause printed {output.count(ROOT_CAUSE)} times:\n{output}"
    lines = output[output.rindex("Failures:", 0, output.index(ROOT_CAUSE)) :].splitlines()
    at = lines.index(ROOT_CAUSE)
    border = next(i for i in range(at, len(lines)) if len(lines[i]) >= 10 and set(lines[i]) == {"="})
    return lines[: border + 1]


def _entries(lines: list[str]) -> list[Entry]:
    text = "\n".join(lines)
    found = []
    for part in _ENTRY.split(text)[1:]:
        rank, code, trace = _RANK.search(part), _EXITCODE.search(part), _TRACEBACK.search(part)
        assert rank and code and trace, f"not an entry of torchrun's summary:\n{part}"
        found.append(Entry(int(rank.group(1)), int(code.group(1)), part[trace.end() :].strip(), part.strip("\n")))
    return found
