"""CPU time of the parts of a periodic save of ~100 MB, and the floor under its hash.

Usage::

    python benchmarks/save_parts.py                 # ~20 seconds, one process
    python benchmarks/save_parts.py --out /tmp/save-parts

Results go to ``--out`` + ``.md`` (default ``benchmarks/results/save-parts``).

Since commit 20c8a30 a periodic save does not copy what only the optimizers change: the
writer thread hashes those tensors and writes them to disk from their own memory
(``tether/_ckpt_tensors.py``). What that thread still spends, per save, is the hash and
the writes; this script times each on the state of the other save benchmarks (six
2048x2048 float32 tensors, ``_proc.hundred_mb_tensors``, one torch thread), as the
calling thread's CPU time (``time.thread_time``), in rounds that run each part once:

* **XXH3-64 of every byte** (``xxhash.xxh3_64``, 8 MB at a time, as the writer feeds it);
* **an int64 sum of the same bytes** (``torch.sum``): a pass that only reads memory, the
  floor under any checksum that reads every byte;
* **the O_DIRECT writes** of those bytes from the tensors' memory, 8 MB a write, into a
  new file, then ``fsync`` (the kernel pins the pages; no copy);
* **the copy into one page-aligned buffer** that saves made before 20c8a30 (reused, as
  the arena was).

Every file is deleted at once; nothing else runs in the process.
"""

from __future__ import annotations

import argparse
import ctypes
import mmap
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

RUN = 8 << 20  # bytes a hash update or a write takes at a time (the writer's _IN_PLACE_RUN)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=15, help="rounds (default 15)")
    parser.add_argument("--out", type=Path, default=HERE / "results" / "save-parts", help="OUT.md")
    parser.add_argument("--note", default="", help="a paragraph to put under the title")
    args = parser.parse_args()

    import torch
    import xxhash

    import _proc

    library = [_proc.library_state()]
    tensors = list(_proc.hundred_mb_tensors().values())
    total = sum(t.nbytes for t in tensors)
    views = [memoryview((ctypes.c_char * t.nbytes).from_address(t.data_ptr())).cast("B") for t in tensors]
    arena = mmap.mmap(-1, total)
    flat = torch.frombuffer(arena, dtype=torch.uint8)
    flat.zero_()  # its pages faulted in once, as a reused buffer's are
    where = Path(tempfile.mkdtemp(prefix="tether-save-parts-"))

    def hash_all() -> None:
        digest = xxhash.xxh3_64()
        for view in views:
            for at in range(0, len(view), RUN):
                digest.update(view[at : at + RUN])

    def sum_all() -> None:
        for t in tensors:
            t.view(torch.int64).sum()

    def write_all() -> None:
        path = where / "tensors.bin"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_DIRECT", 0), 0o644)
        try:
            offset = 0
            for t, view in zip(tensors, views, strict=True):
                head = (-t.data_ptr()) % 4096  # whole pages only, as O_DIRECT wants
                whole = (len(view) - head) // 4096 * 4096
                for at in range(head, head + whole, RUN):
                    offset += os.pwrite(fd, view[at : min(at + RUN, head + whole)], offset)
            os.fsync(fd)
        finally:
            os.close(fd)
            path.unlink()

    def copy_all() -> None:
        at = 0
        for t in tensors:
            flat[at : at + t.nbytes].view(t.dtype).copy_(t.reshape(-1))
            at += t.nbytes

    parts: dict[str, Callable[[], None]] = {
        "XXH3-64 of every byte": hash_all,
        "int64 sum of the same bytes (the read floor)": sum_all,
        "O_DIRECT writes from the tensors' memory, fsync": write_all,
        "copy into a reused page-aligned buffer (before 20c8a30)": copy_all,
    }
    times: dict[str, list[float]] = {name: [] for name in parts}
    for part in parts.values():  # warm-up
        part()
    for _ in range(args.rounds):
        for name, part in parts.items():
            start = time.thread_time()
            part()
            times[name].append(time.thread_time() - start)
    where.rmdir()
    library.append(_proc.library_state())

    rows = ["| part | CPU ms: median (IQR) |", "|---|---|"]
    for name, xs in times.items():
        q1, med, q3 = _proc.quartiles([x * 1e3 for x in xs])
        rows.append(f"| {name} | {med:.1f} ({q1:.1f} to {q3:.1f}) |")
    hashed, summed = times["XXH3-64 of every byte"], times["int64 sum of the same bytes (the read floor)"]
    ratio = statistics.median(h / s for h, s in zip(hashed, summed, strict=True))
    body = [
        *([args.note] if args.note else []),
        "\n".join(rows),
        f"XXH3-64 / int64 sum, per round: {ratio:.2f}x. {args.rounds} rounds, each part once a round, "
        f"after one warm-up round; {total / 1e6:.1f} MB; files in {tempfile.gettempdir()}.",
    ]
    setup = "one process, one torch thread; the calling thread's CPU time (see the module docstring)."
    _proc.report(args.out, "tether: CPU time of the parts of a 100 MB periodic save", setup, library, body)


if __name__ == "__main__":
    main()
