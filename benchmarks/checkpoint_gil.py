"""How fast the training thread runs Python while a periodic save of ~100 MB is written.

Usage::

    python benchmarks/checkpoint_gil.py                 # ~1 minute, one process
    python benchmarks/checkpoint_gil.py --out /tmp/gil

Results go to ``--out`` + ``.md`` (default ``benchmarks/results/checkpoint-gil``).

A training loop is not all C++: data loading in the main process, ignite's event
handlers, metrics and logging run Python on the training thread, and the Checkpointer's
writer is a thread of the same process. Were ``torch.save`` to hold the GIL while it
writes, that Python would crawl during every save. Measured: one process (a job of one
rank), a ``tether.Checkpointer(every=1, keep=2)`` over 25.2M float32 parameters (six
2048x2048 tensors), one thread for torch. Each trial counts the iterations of a
pure-Python loop over ``--window`` seconds with no save going on, ends a step (its
snapshot, on the training thread, is not timed), then counts the same loop over the next
``--window`` seconds while the writer thread writes. The figure is the median over
trials of loop speed during the save / without, with its quartiles; the first two
trials warm up. A control row shows what the measurement reads when the other thread
does hold the GIL: a thread running a pure-Python loop over the same window.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


def _spin(seconds: float) -> int:
    n, end = 0, time.perf_counter() + seconds
    while time.perf_counter() < end:
        n += 1
    return n


def main() -> None:
    import _proc
    import tether

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=8, help="trials (default 8)")
    parser.add_argument("--window", type=float, default=0.15, help="seconds of loop after each save (default 0.15)")
    parser.add_argument("--out", type=Path, default=HERE / "results" / "checkpoint-gil", help="OUT.md")
    args = parser.parse_args()
    library = [_proc.library_state()]
    tensors = _proc.hundred_mb_tensors()
    with tempfile.TemporaryDirectory(prefix="tether-gil-") as out:
        ckpt = tether.Checkpointer({"s": _proc.Stateful(tensors)}, Path(out, "ckpt"), every=1, keep=2)
        speeds: list[float] = []
        for i in range(args.trials + 2):
            ckpt.wait()
            idle = _spin(args.window)
            with ckpt.step(0, ckpt.position.iteration):
                pass
            busy = _spin(args.window)
            ckpt.wait()
            if i >= 2:
                speeds.append(busy / idle)
        control = []
        for _ in range(args.trials):
            idle = _spin(args.window)
            hog = threading.Thread(target=_spin, args=(args.window,))
            hog.start()
            busy = _spin(args.window)
            hog.join()
            control.append(busy / idle)
    library.append(_proc.library_state())
    q1, med, q3 = _proc.quartiles(speeds)
    c1, cmed, c3 = _proc.quartiles(control)
    rows = [
        "| writer | Python loop speed during a save / without (IQR) |",
        "|---|---|",
        f"| thread (the Checkpointer's) | {med:.2f} ({q1:.2f} to {q3:.2f}) |",
        f"| control: a thread running a pure-Python loop | {cmed:.2f} ({c1:.2f} to {c3:.2f}) |",
    ]
    setup = (
        f"one process, {args.trials} trials, a {args.window:g} s loop after each save's snapshot (see the module "
        "docstring)."
    )
    title = "tether: Python on the training thread while a periodic save is written"
    _proc.report(args.out, title, setup, library, ["\n".join(rows)])


if __name__ == "__main__":
    main()
