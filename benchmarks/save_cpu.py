"""CPU time of one checkpoint write of ~100 MB, with and without dropping the last one from the page cache.

Usage::

    python benchmarks/save_cpu.py                 # ~1 minute, one process
    python benchmarks/save_cpu.py --out /tmp/save-cpu

Results go to ``--out`` + ``.md`` (default ``benchmarks/results/save-cpu``).

A periodic save writes a new file each time. Its pages come either from memory the page
cache never held (after the previous checkpoint's pages stay cached) or from pages just
freed (once the previous file was flushed and dropped: ``posix_fadvise(DONTNEED)``, what
``tether/_ckpt_files.py`` does after each ``fsync``). Measured: ``torch.save`` of 25.2M
float32 parameters (six 2048x2048 tensors) into a new file, CPU time of the process
(``time.process_time``) for the ``torch.save`` alone, then ``fsync``. In three blocks of
``--repeats`` writes (after one to warm up): kept, dropped, kept again (the two ways do
not alternate: the pages one way frees would serve the other's next write). Every file
stays on disk until the end of the run, as checkpoints without ``keep=`` do.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


def main() -> None:
    import torch

    import _proc

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=8, help="writes of each way (default 8)")
    parser.add_argument("--out", type=Path, default=HERE / "results" / "save-cpu", help="OUT.md")
    args = parser.parse_args()
    library = [_proc.library_state()]
    state = _proc.hundred_mb_tensors()
    cpu: dict[str, list[float]] = {"kept": [], "dropped": [], "kept again": []}
    with tempfile.TemporaryDirectory(prefix="tether-save-cpu-", dir=os.environ.get("TMPDIR", "/tmp")) as out:
        for way in cpu:  # in blocks, not alternating: pages one way frees would serve the other's next write
            for i in range(args.repeats + 1):  # the first write of a block warms up
                path = Path(out, f"{way}-{i}.pt".replace(" ", "-"))
                t0 = time.process_time()
                torch.save(state, str(path))
                spent = time.process_time() - t0
                fd = os.open(path, os.O_RDONLY)
                try:
                    os.fsync(fd)
                    if way == "dropped":
                        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                finally:
                    os.close(fd)
                if i >= 1:
                    cpu[way].append(spent)
    library.append(_proc.library_state())
    rows = ["| the previous checkpoints' pages | torch.save CPU time, s: median (IQR) |", "|---|---|"]
    labels = {"kept": "kept in the page cache", "dropped": "dropped after each fsync", "kept again": "kept, again"}
    for way, label in labels.items():
        q1, med, q3 = _proc.quartiles(cpu[way])
        rows.append(f"| {label} | {med:.3f} ({q1:.3f} to {q3:.3f}) |")
    setup = f"one process, {args.repeats} writes each (see the module docstring)."
    title = "tether: CPU time of a 100 MB checkpoint write"
    _proc.report(args.out, title, setup, library, ["\n".join(rows)])


if __name__ == "__main__":
    main()
