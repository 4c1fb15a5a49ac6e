"""Does a rank that forks DataLoader workers between collectives ever hang? Counts the jobs.

Usage::

    python benchmarks/fork_workers.py                      # tether, 3 batches of 3 jobs
    python benchmarks/fork_workers.py --how raw --batches 2

Each job is a 2-rank torchrun job (``_fork_workers_job.py``) of ``--rounds`` rounds: a
``DataLoader(num_workers=2)`` pass, which forks two workers, then one all-reduce. Jobs
run ``--jobs`` at a time (load makes the race likelier). A job that has not ended after
``--bound`` seconds is counted as hung; the state of each of its processes
(``/proc/PID/wchan``, and gdb's backtrace of each process where gdb is installed) is
printed, then the job is killed.

The hang it counts (``results/fork-workers.md``): a worker that never starts. gdb shows it
in ``PyOS_AfterFork_Child``, waiting on CPython's runtime lock (``HEAD_LOCK``) that it
copied held from its parent: on CPython 3.8-3.11 the child takes that lock before it makes
it anew (CPython gh-112275), so any other thread of the parent holding it at the fork
hangs the child for good. Which thread held it in the ranks measured here is not known:
waiting before each fork for every Python callback tether hands a future (the only thread
of tether's that enters Python without the GIL) did not stop it. The rank then waits
forever for the worker's batch, and its peers wait forever for the rank, in a wait no
failure ends: no rank failed.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import _proc  # noqa: E402

JOB = HERE / "_fork_workers_job.py"


def tagged(tag: str) -> list[int]:
    """Live processes whose environment carries ``FORK_WORKERS_JOB=<tag>`` (orphaned workers too)."""
    needle = f"FORK_WORKERS_JOB={tag}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            mine = needle in Path(f"/proc/{entry}/environ").read_bytes().split(b"\0")
            if mine and Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
                found.append(int(entry))
        except OSError:
            continue
    return found


def state_of(pid: int) -> str:
    try:
        wchan = Path(f"/proc/{pid}/wchan").read_text()
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:80]
    except OSError:
        return f"{pid}: gone"
    text = f"{pid}: wchan {wchan}, {cmd}"
    if shutil.which("gdb") and "_fork_workers_job" in cmd:
        bt = subprocess.run(
            ["gdb", "-p", str(pid), "-batch", "-ex", "bt 12"], capture_output=True, text=True, timeout=60
        ).stdout
        frames = [line for line in bt.splitlines() if line.startswith("#")]
        text += "\n    " + "\n    ".join(frames[:12])
    return text


def batch(args: argparse.Namespace) -> list[tuple[str, float | None, int | None, str]]:
    """Start ``args.jobs`` jobs; (tag, seconds or None if hung, exit code, what a hung one waited on)."""
    jobs = []
    for _ in range(args.jobs):
        tag = uuid.uuid4().hex
        env = {**os.environ, "FORK_WORKERS_JOB": tag, "OMP_NUM_THREADS": "1"}
        cmd = _proc.torchrun(2, JOB, str(args.rounds), args.how, launcher=("--monitor_interval", "0.1"))
        quiet = subprocess.DEVNULL  # the job prints nothing this counts
        proc = subprocess.Popen(cmd, env=env, stdout=quiet, stderr=quiet, start_new_session=True)
        jobs.append((tag, proc, time.monotonic()))
    ended: dict[str, float] = {}
    deadline = time.monotonic() + args.bound
    while len(ended) < len(jobs) and time.monotonic() < deadline:
        for tag, proc, start in jobs:
            if tag not in ended and proc.poll() is not None:
                ended[tag] = time.monotonic() - start
        time.sleep(0.2)
    results = []
    for tag, proc, _ in jobs:
        states = "" if tag in ended else "\n".join(state_of(pid) for pid in tagged(tag))
        results.append((tag, ended.get(tag), proc.poll(), states))
        for pid in tagged(tag):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        proc.wait()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--how", choices=["tether", "raw", "raw-callback"], default="tether")
    parser.add_argument("--jobs", type=int, default=3, help="jobs at a time")
    parser.add_argument("--batches", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--bound", type=float, default=240.0, help="seconds before a job counts as hung")
    args = parser.parse_args()
    hung = ended = failed = 0
    for b in range(args.batches):
        for tag, took, code, states in batch(args):
            if took is None:
                hung += 1
                print(f"batch {b}: job {tag[:8]} HUNG past {args.bound:g} s; its processes:\n{states}", flush=True)
            else:
                ended += 1
                failed += code != 0
                print(f"batch {b}: job {tag[:8]} ended in {took:.1f} s, exit {code}", flush=True)
    print(
        f"{args.how}: {ended} of {ended + hung} jobs ended ({failed} with an error), {hung} hung "
        f"({args.jobs} at a time, {args.rounds} rounds each, Python {sys.version.split()[0]})"
    )


if __name__ == "__main__":
    main()
