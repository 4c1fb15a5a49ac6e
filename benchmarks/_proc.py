"""Run one benchmark job as a new session, bounded, and make sure nothing of it survives.

Shared by ``sync.py`` and ``faults.py``: every job is a fresh interpreter (torchrun, or a
launcher calling ``tether.spawn``) started as the leader of its own session, so that a
timeout can kill the whole process tree by its session id, and so that we can prove by
scanning /proc that no process of the job is left.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


@dataclass
class Finished:
    returncode: int | None  # None: killed at the bound
    stdout: str
    stderr: str
    started: float  # time.time() just before the launcher was started
    exited: float  # time.time() when the launcher's exit was seen
    leftovers: list[int]  # processes of the session still alive after ``settle`` (then killed)


def torchrun(n: int, script: str | Path, *script_args: str, launcher: tuple[str, ...] = ()) -> list[str]:
    """``python -m torch.distributed.run`` of ``script`` on ``n`` local ranks, on loopback.

    ``launcher`` adds torchrun options of its own (``--max-restarts 1``,
    ``--monitor_interval 0.1``); everything else is torchrun's default.
    """
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        str(n),
        "--master_addr",
        "127.0.0.1",
        "--master_port",
        str(free_port()),
        *launcher,
        str(Path(script).resolve()),
        *script_args,
    ]


_STORE_SERVER = """
import datetime, time
import torch.distributed as dist
store = dist.TCPStore("127.0.0.1", 0, 1, True, timeout=datetime.timedelta(seconds=60), wait_for_workers=False)
print(store.port, flush=True)
time.sleep(300)
"""


@contextlib.contextmanager
def store_server() -> Iterator[int]:
    """A TCPStore server (the libuv one, torch's default) in a process of its own on
    loopback, for the block; yields its port (``store_ping.py``, ``beater.py``)."""
    server = subprocess.Popen([sys.executable, "-c", _STORE_SERVER], stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None
        yield int(server.stdout.readline())
    finally:
        server.kill()
        server.wait()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def session_pids(sid: int) -> list[int]:
    """Live (non-zombie) processes whose session id is ``sid``."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        if fields[0] != "Z" and int(fields[3]) == sid:
            found.append(int(entry))
    return found


def run(args: list[str], bound: float, env: dict[str, str] | None = None, settle: float = 3.0) -> Finished:
    """Run ``args`` as a new session; SIGKILL the session at ``bound`` seconds."""
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    started = time.time()
    proc = subprocess.Popen(
        args, cwd=ROOT, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        out, err = proc.communicate(timeout=bound)
        code: int | None = proc.returncode
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        code = None
    except BaseException:  # Ctrl-C, SIGTERM (see exit_on_sigterm): take the job down with us
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise
    exited = time.time()
    deadline = time.monotonic() + settle
    left = session_pids(proc.pid)
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = session_pids(proc.pid)
    if left:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    return Finished(code, out, err, started, exited, left)


@dataclass
class Quiet:
    """What ``wait_for_load`` saw: the 1-minute load average before and after waiting."""

    limit: float
    load_before: float
    load_after: float = 0.0
    waited: float = 0.0  # seconds
    met: bool = True  # the load dropped below ``limit`` (False: measured anyway after ``up_to``)
    samples: list[float] = field(default_factory=list)

    def describe(self) -> str:
        if self.limit <= 0:
            return f"load {self.load_after:.2f} at start (no wait)"
        if self.waited < 0.5:
            return f"load {self.load_after:.2f} at start (< {self.limit:g}, no wait needed)"
        verdict = (
            f"dropped below {self.limit:g}" if self.met else f"⚠ never dropped below {self.limit:g}: measured anyway"
        )
        return f"load {self.load_before:.2f} → {self.load_after:.2f} after waiting {self.waited:.0f} s ({verdict})"


def wait_for_load(limit: float = 1.5, poll: float = 20.0, up_to: float = 900.0, what: str = "") -> Quiet:
    """Wait until the 1-minute load average is below ``limit`` (polled every ``poll`` s, at most ``up_to`` s).

    ``limit <= 0`` does not wait. Progress goes to stderr.
    """
    load = os.getloadavg()[0]
    quiet = Quiet(limit, load, samples=[load])
    start = time.monotonic()
    while limit > 0 and load >= limit and time.monotonic() - start < up_to:
        sys.stderr.write(f"[waiting for load < {limit:g}{' before ' + what if what else ''}: {load:.2f}]\n")
        sys.stderr.flush()
        time.sleep(poll)
        load = os.getloadavg()[0]
        quiet.samples.append(load)
    quiet.waited = time.monotonic() - start
    quiet.load_after = load
    quiet.met = limit <= 0 or load < limit
    return quiet


def library_state() -> dict[str, object]:
    """Which tether the jobs import, and whether it is the committed one.

    Other people edit ``src/`` while benchmarks run (the install is editable): to measure
    one revision, run with ``PYTHONPATH`` at a frozen copy (``git archive HEAD src | tar -x
    -C DIR``). Returns the package's path, a digest of its files, HEAD, and whether the
    files are byte-identical to HEAD's ``src/tether``.
    """
    spec = importlib.util.find_spec("tether")
    assert spec is not None and spec.origin is not None
    pkg = Path(spec.origin).parent
    files = {
        f.relative_to(pkg).as_posix(): f.read_bytes()
        for f in sorted(pkg.rglob("*"))
        if f.is_file() and "__pycache__" not in f.parts
    }
    digest = hashlib.sha1(b"".join(k.encode() + b"\0" + v for k, v in files.items())).hexdigest()[:12]
    git = ["git", "-C", str(ROOT)]
    mine = {k: hashlib.sha1(b"blob %d\0" % len(v) + v).hexdigest() for k, v in files.items()}

    def tree(commit: str) -> dict[str, str]:
        out = subprocess.run(
            [*git, "ls-tree", "-r", commit, "src/tether/"], capture_output=True, text=True, check=True
        ).stdout
        return {
            path.removeprefix("src/tether/"): meta.split()[2]
            for meta, _, path in (line.partition("\t") for line in out.splitlines())
        }

    try:
        head = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True)
        recent = subprocess.run(
            [*git, "log", "--format=%h", "-n", "50", "--", "src/tether"], capture_output=True, text=True, check=True
        ).stdout.split()
        same = mine == tree("HEAD")
        match = head.stdout.strip() if same else next((c for c in recent if tree(c) == mine), None)
    except (OSError, subprocess.CalledProcessError):
        return {"path": str(pkg), "digest": digest, "head": None, "identical_to_head": None, "commit": None}
    # commit: the newest commit whose src/tether has exactly these files (None: none of the last 50)
    return {"path": str(pkg), "digest": digest, "head": head.stdout.strip(), "identical_to_head": same, "commit": match}


def describe_library(start: dict[str, object], end: dict[str, object]) -> str:
    """One sentence: the tether measured, and whether it changed during the run."""
    where = Path(str(start["path"]))
    with contextlib.suppress(ValueError):
        where = where.relative_to(ROOT)
    text = f"tether imported from `{where}` (files digest {start['digest']})"
    if start["identical_to_head"]:
        text += f", byte-identical to commit {start['head']} (HEAD at the start)"
    elif start.get("commit"):
        text += f", byte-identical to commit {start['commit']}'s src/tether (HEAD at the start: {start['head']})"
    elif start["identical_to_head"] is False:
        text += f", ⚠ identical to no recent commit (HEAD at the start: {start['head']}): uncommitted changes"
    if end["digest"] != start["digest"]:
        text += f"; ⚠ its files changed during the run (digest {start['digest']} → {end['digest']})"
    else:
        text += "; unchanged during the run"
    return text + "."


def exit_on_sigterm(ignore: bool = False) -> None:
    """Turn SIGTERM into SystemExit, so that ``run`` kills the job it is waiting on.

    ``ignore``: log a SIGTERM and go on instead (Ctrl-C still stops the driver). On a
    shared machine whose pid space wraps (``/proc/sys/kernel/pid_max`` 32768 here), a
    SIGTERM meant for another job's long-gone process can reach a long-running driver.
    A handler, unlike SIG_IGN, is not inherited by the jobs: they get SIGTERM as usual.
    """

    def handler(signum: int, frame: object) -> None:
        what = "ignored (--ignore-sigterm)" if ignore else "stopping"
        sys.stderr.write(f"[{time.strftime('%H:%M:%S')}: got {signal.Signals(signum).name}: {what}]\n")
        if not ignore:
            raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, handler)


def command_line() -> str:
    """This run's arguments, with ``--note``'s text left out (the result prints it above)."""
    out, skip = [], False
    for a in sys.argv[1:]:
        if skip:
            out.append('"…"')
            skip = False
            continue
        out.append(a)
        skip = a == "--note"
    return " ".join(out)


def report(out: Path, title: str, setup: str, library: list[dict[str, object]], body: list[str]) -> None:
    """Print a one-process benchmark's markdown and write it to ``out`` + ``.md``: the title,
    the command, the machine and ``setup``, the library's state at the start and end
    (``library``), then ``body``."""
    one, five, fifteen = os.getloadavg()
    text = "\n\n".join(
        [
            f"# {title}",
            f"`python benchmarks/{Path(sys.argv[0]).name} {command_line()}` — {time.strftime('%Y-%m-%d %H:%M')}, "
            f"{os.cpu_count()} cores, load average at end {one:.1f}/{five:.1f}/{fifteen:.1f}; {setup}",
            describe_library(*library),
            *body,
        ]
    )
    print(text)
    out.with_suffix(".md").write_text(text + "\n")


def add_driver_options(parser: Any, note: str = "the markdown copy", each: str = "world") -> None:
    """The options every benchmark driver takes: the load wait, SIGTERM, a note."""
    parser.add_argument(
        "--wait-load", type=float, default=1.5, help=f"wait for a 1-minute load below this before each {each} (0: no)"
    )
    parser.add_argument("--wait-max", type=float, default=900.0, help="longest wait for --wait-load (s)")
    parser.add_argument(
        "--ignore-sigterm", action="store_true", help="log a SIGTERM to the driver and go on (Ctrl-C still stops it)"
    )
    parser.add_argument("--note", default="", help=f"a paragraph to put under the title of {note}")


def rank_job(
    n: int, script: str | Path, worker_args: list[str], bound: float, env: dict[str, str] | None = None
) -> dict[str, Any]:
    """Run ``script --worker *worker_args`` on ``n`` ranks (torchrun, ``OMP_NUM_THREADS=1``
    and ``env`` in the environment), bounded.

    Returns the JSON of the last line of its output that starts with ``RESULT `` (rank 0
    prints it). A job that fails, prints none or leaves a process behind ends the driver,
    with the tail of the job's output on stderr.
    """
    done = run(torchrun(n, script, "--worker", *worker_args), bound, env={"OMP_NUM_THREADS": "1", **(env or {})})
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")]
    if done.returncode != 0 or not lines or done.leftovers:
        sys.stderr.write(done.stdout[-3000:] + done.stderr[-5000:])
        what = Path(script).stem
        raise SystemExit(f"{what} at {n} ranks failed: exit {done.returncode}, leftovers {done.leftovers}")
    result: dict[str, Any] = json.loads(lines[-1][len("RESULT ") :])
    return result


def per_world(
    args: Any,
    title: str,
    world: Callable[[int], dict[str, Any]],
    body: Callable[[list[dict[str, Any]]], list[str]],
    setup: str = "torchrun, gloo, unpinned",
) -> None:
    """The driver of a benchmark run as one job per world size: ``world(n)`` for each ``n`` of ``args.ranks``.

    Each behind ``wait_for_load`` (``add_driver_options``' ``--wait-load``, ``--wait-max``),
    SIGTERM handled as ``--ignore-sigterm`` says; then ``report`` of ``title`` to
    ``args.out``: ``setup`` and the load seen before each world size, ``--note``'s text,
    and the lines of ``body(results)``.
    """
    exit_on_sigterm(ignore=args.ignore_sigterm)
    library = [library_state()]
    results, loads = [], []
    for n in args.ranks:
        quiet = wait_for_load(args.wait_load, up_to=args.wait_max, what=f"{n} ranks")
        loads.append(f"{n} ranks: {quiet.describe()}")
        results.append(world(n))
    library.append(library_state())
    setup += ". Load (1-minute average) before each world size: " + "; ".join(loads) + "."
    text = [*([args.note] if args.note else []), "\n".join(body(results))]
    report(args.out, title, setup, library, text)


def pin_rank(local_rank: int, cores: int | None = None) -> int:
    """Pin every thread of this process to one core, ``local_rank``'s in turn (over the first
    ``cores`` cores this process may use, or all of them); returns the core.

    Unpinned, the scheduler moves a rank's threads (the main one, gloo's, tether's) between
    the 2 cores of this machine as it likes, and two ranks' main threads sometimes share a
    core: batch times then vary by tens of % from one batch to the next, whatever runs. One
    core per rank (round-robin past the core count) is the layout a multi-core host gives
    its ranks; every contender of a run has the same, so ratios stay fair.
    """
    allowed = sorted(os.sched_getaffinity(0))[:cores]
    core = allowed[local_rank % len(allowed)]
    for tid in os.listdir("/proc/self/task"):  # threads started at import (torch's) too
        with contextlib.suppress(OSError):  # a thread that ended meanwhile
            os.sched_setaffinity(int(tid), {core})
    return core


# --- ratios measured side by side --------------------------------------------------------------


def hundred_mb_tensors() -> dict[str, Any]:
    """The ~100 MB state of the save benchmarks: six 2048x2048 float32 tensors (25.2M values), one torch thread.

    The same size as the 100 MB model of ``ddp.py`` and ``checkpoint_step.py``.
    """
    import torch

    torch.set_num_threads(1)
    return {f"w{i}": torch.randn(2048, 2048) for i in range(6)}


def batches(loader: bool) -> Iterator[Any]:
    """The inputs of the 100 MB model's steps, endlessly: one fixed 8x2048 batch, or with
    ``loader`` each a fresh batch from a shuffled ``DataLoader`` (8 rows of a 32 MiB dataset,
    seeded), collated as a real loop's are: allocations between the steps."""
    import itertools

    import torch

    if not loader:
        return itertools.repeat(torch.full((8, 2048), 0.01))
    data = torch.utils.data.TensorDataset(torch.rand(4096, 2048, generator=torch.Generator().manual_seed(1)))
    shuffled = torch.utils.data.DataLoader(data, batch_size=8, shuffle=True, generator=torch.Generator().manual_seed(2))
    return (x for _ in itertools.count() for (x,) in shuffled)


class Stateful:
    """Tensors as a Checkpointer object (``state_dict``/``load_state_dict``), for the save benchmarks."""

    def __init__(self, tensors: dict[str, Any]) -> None:
        self.tensors = tensors

    def state_dict(self) -> dict[str, Any]:
        return self.tensors

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.tensors = state


def quartiles(xs: list[float]) -> tuple[float, float, float]:
    """Lower quartile, median, upper quartile (min and max for fewer than 4 values)."""
    if len(xs) >= 4:
        q1, _, q3 = statistics.quantiles(xs, n=4)
        return q1, statistics.median(xs), q3
    return min(xs), statistics.median(xs), max(xs)


def paired_ratios(xs: list[float], base: list[float]) -> tuple[float, float, float]:
    """Quartiles of the per-round ratios ``xs[i] / base[i]`` (batches of a round ran side by side)."""
    return quartiles([a / b for a, b in zip(xs, base, strict=True)])


def ratio_cells(xs: list[float], base: list[float], digits: int, is_base: bool) -> str:
    """Two table cells: ``xs``' median with its IQR in % of it, and the median per-round
    ratio to ``base`` with its quartiles ("1" for the baseline itself)."""
    q1, med, q3 = quartiles(xs)
    r1, ratio, r3 = paired_ratios(xs, base)
    shown = "1" if is_base else f"{ratio:.3f}x ({r1:.3f} to {r3:.3f})"
    return f"{med:.{digits}f} ({(q3 - q1) / med * 100:.0f}%) | {shown}"


def rounds_args(doc: str, per: int, per_help: str, out: Path) -> Any:
    """The arguments of a benchmark of rounds of batches (``--ranks``, ``--rounds``, ``--per``,
    ``--out``, the driver's options, the hidden ``--worker``), parsed."""
    import argparse

    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 4], help="world sizes (default: 2 4)")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--per", type=int, default=per, help=per_help)
    parser.add_argument("--out", type=Path, default=out)
    add_driver_options(parser)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    return parser.parse_args()


def rounds_main(
    doc: str,
    script: str | Path,
    title: str,
    per: tuple[int, str],
    out: Path,
    worker: Callable[[int, int], None],
    body: Callable[[list[dict[str, Any]], int, int], list[str]],
    bound: Callable[[int, int], float],
) -> None:
    """A benchmark of rounds of batches, one torchrun job per world size: ``worker(rounds,
    per)`` in each rank (``--worker``), else the driver (``per_world``), each job bounded by
    ``bound(rounds, per)`` seconds, its table ``body(results, rounds, per)``. ``per``: the
    default of ``--per`` and its help."""
    args = rounds_args(doc, per[0], per[1], out)
    if args.worker:
        worker(args.rounds, args.per)
        return
    argv = ["--rounds", str(args.rounds), "--per", str(args.per)]
    per_world(
        args,
        title,
        lambda n: rank_job(n, script, argv, bound(args.rounds, args.per)),
        lambda results: body(results, args.rounds, args.per),
    )


def verdict(q1: float, q3: float, limit: float) -> str:
    """*met* when the upper quartile is within ``limit``, *not met* when the IQR crosses it."""
    if q3 <= limit:
        return "met"
    if q1 <= limit:
        return "not met (its IQR crosses the target)"
    return "MISSED"
