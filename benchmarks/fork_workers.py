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
copied held from its parent: before CPython 3.10.15 and 3.11.10 the child takes that lock
before it makes it anew (CPython gh-112275), so any other thread of the parent holding it
at the fork hangs the child for good. For such a worker the driver also prints the thread
states it inherited (gdb, where Python has its debug symbols): at their head, the one its
parent's holder was making. Measured here, that was a thread of gloo's entering Python
to run a callback of tether's, or after one: ``tether/_core/threadstates.py`` keeps such a
thread's state since. A hung rank waits forever for the worker's batch, and its peers
forever for the rank, in a wait no failure ends: no rank failed.

A job that ends with an error has the end of its output printed.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
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


# gdb: the thread states a stuck child copied from its parent, each with its innermost
# Python functions; a state of a thread that C++ started has none (CPython 3.11's layout)
THREAD_STATES = r"""
set $t = _PyRuntime.interpreters.head->threads.head
while $t
  printf "    state %p: native thread %lu, gilstate_counter %d\n", $t, $t->native_thread_id, $t->gilstate_counter
  set $f = $t->cframe->current_frame
  set $n = 0
  while $f && $n < 4
    printf "        %s\n", (char*)(((PyASCIIObject*)$f->f_code->co_name)+1)
    set $f = $f->previous
    set $n = $n + 1
  end
  set $t = $t->next
end
"""


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
        if "PyOS_AfterFork_Child" in bt:
            text += "\n    the thread states it copied from its parent (the holder's first):\n"
            text += _gdb(pid, THREAD_STATES)
    return text


def _gdb(pid: int, commands: str) -> str:
    with tempfile.NamedTemporaryFile("w", suffix=".gdb") as script:
        script.write(commands)
        script.flush()
        out = subprocess.run(
            ["gdb", "-p", str(pid), "-batch", "-x", script.name], capture_output=True, text=True, timeout=60
        ).stdout
    return "\n".join(line for line in out.splitlines() if line.startswith("    "))


def batch(args: argparse.Namespace, logs: Path) -> list[tuple[str, float | None, int | None, str]]:
    """Start ``args.jobs`` jobs; (tag, seconds or None if hung, exit code, what a hung one waited on
    or the end of a failed one's output)."""
    jobs = []
    for _ in range(args.jobs):
        tag = uuid.uuid4().hex
        env = {**os.environ, "FORK_WORKERS_JOB": tag, "OMP_NUM_THREADS": "1"}
        cmd = _proc.torchrun(2, JOB, str(args.rounds), args.how, launcher=("--monitor_interval", "0.1"))
        with open(logs / tag, "w") as out:
            proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
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
        if tag in ended:
            said = "" if proc.poll() == 0 else "\n".join((logs / tag).read_text().splitlines()[-15:])
        else:
            said = "\n".join(state_of(pid) for pid in tagged(tag))
        results.append((tag, ended.get(tag), proc.poll(), said))
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
    with tempfile.TemporaryDirectory(prefix="fork-workers-") as logs:
        for b in range(args.batches):
            for tag, took, code, said in batch(args, Path(logs)):
                if took is None:
                    hung += 1
                    print(f"batch {b}: job {tag[:8]} HUNG past {args.bound:g} s; its processes:\n{said}", flush=True)
                else:
                    ended += 1
                    failed += code != 0
                    print(f"batch {b}: job {tag[:8]} ended in {took:.1f} s, exit {code}", flush=True)
                    if said:
                        print(f"    the end of its output:\n{said}", flush=True)
    print(
        f"{args.how}: {ended} of {ended + hung} jobs ended ({failed} with an error), {hung} hung "
        f"({args.jobs} at a time, {args.rounds} rounds each, Python {sys.version.split()[0]})"
    )


if __name__ == "__main__":
    main()
