"""torchelastic's error file: what torchrun's "Root Cause" section shows for a worker.

Written here rather than with torch's ``ErrorHandler.record_exception``, which stamps the
current time and the caller's own exception: torchrun picks the failure with the smallest
timestamp (whole seconds, ties to the lowest rank), so a victim must write the root
cause's time + 1 and the root cause's story, and a judge must be able to write a frozen
rank's file for it (``of_process``) before it kills the rank -- neither of which that API
can express. The format is torchelastic's: ``{"message": {"message": ..., "extraInfo":
{"timestamp": ..., "py_callstack": ...}}}``.
"""

from __future__ import annotations

import contextlib
import json
import os


def write(path: str, message: str, stamp: int, traceback: str = "") -> None:
    """Write the file whole, or not at all: torchrun may read it as soon as it exists, and
    two judges may write a frozen rank's at once (``write_for``)."""
    extra = {"timestamp": str(stamp)}
    if traceback:
        extra["py_callstack"] = traceback  # without it, torchrun's summary shows the message
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        with open(tmp, "w") as fp:
            json.dump({"message": {"message": message, "extraInfo": extra}}, fp)
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)


def of_process(pid: int) -> str | None:
    """The error file torchrun gave process ``pid`` (same host, from its environment), if any."""
    with contextlib.suppress(OSError), open(f"/proc/{pid}/environ", "rb") as fp:
        for item in fp.read().split(b"\0"):
            if item.startswith(b"TORCHELASTIC_ERROR_FILE="):
                return item.split(b"=", 1)[1].decode() or None
    return None


def write_for(pid: int, message: str, stamp: int) -> None:
    """Write process ``pid``'s error file on its behalf, unless it wrote one itself."""
    path = of_process(pid)
    if path is not None and not os.path.exists(path):
        with contextlib.suppress(OSError):
            write(path, message, stamp)
