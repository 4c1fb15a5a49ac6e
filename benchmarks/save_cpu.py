"""CPU time of one periodic checkpoint of ~100 MB, whole: format 2 (tether's) against format 1 and the page cache.

Usage::

    python benchmarks/save_cpu.py                 # ~2 minutes, one process
    python benchmarks/save_cpu.py --out /tmp/save-cpu

Results go to ``--out`` + ``.md`` (default ``benchmarks/results/save-cpu``).

A periodic save shares the cores with training, so its CPU time is the step time it
costs. The state is 25.2M float32 values (six 2048x2048 tensors, ``_proc.hundred_mb_tensors``),
one torch thread. CPU time of the process (``time.process_time``: every thread) for:

* **format 2**, tether's: one ``Checkpointer(every=1).step`` and its ``wait()``: the
  snapshot into the arena, the XXH3 hash, the ``O_DIRECT`` write of ``tensors.bin``, the
  small ``state.pt``, the manifest, the rename (``tether/_ckpt_tensors.py``);
* **format 1**, tether before it, rebuilt here: the copy into tensors kept from the last
  save, ``torch.save`` of everything (a zip whose records carry CRC-32s), ``fsync``,
  ``posix_fadvise(DONTNEED)``, and the manifest's read of the zip directory.

The two alternate, one save each per round, after one of each to warm up. Then a
resume's read of the last format-2 checkpoint, the files' pages dropped first (an
``O_DIRECT`` save leaves none): tether's ``_ckpt_files.read`` (each file read once, the
bytes checked are the bytes unpacked) against the way of commit 862261d, rebuilt here
(``read_twice``: a pass to hash ``tensors.bin``, then a second read to unpack), alternating.
Then, for
``torch.save`` alone (format 1's writer), the page cache's part: three blocks of writes
into new files, the previous ones' pages kept cached, dropped after each ``fsync``, kept
again (blocks, not alternating: the pages one way frees would serve the other's next
write). Every file stays on disk until the end of the run, as checkpoints without
``keep=`` do.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import tempfile
import time
import zipfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


def format_1(state: dict[str, Any], kept: dict[str, Any], path: Path) -> None:
    """One save the way tether wrote them before format 2 (see the module docstring)."""
    import torch

    for name, tensor in state.items():
        kept.setdefault(name, torch.empty_like(tensor)).copy_(tensor)
    path.mkdir()
    torch.save({"objects": {"model": kept}, "position": {}, "random": None}, str(path / "state.pt"))
    fd = os.open(path / "state.pt", os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    with zipfile.ZipFile(path / "state.pt") as archive:
        h = hashlib.sha256()
        for info in archive.infolist():
            h.update(f"{info.filename}\0{info.file_size}\0{info.CRC}\n".encode())
    (path / "manifest.json").write_text(h.hexdigest())


def read_twice(path: Path) -> dict[str, Any]:
    """A format-2 checkpoint read the way of commit 862261d: every file checked, then read again to load."""
    import json

    import torch
    import xxhash

    from tether import _ckpt_files, _ckpt_tensors

    found = json.loads((path / "manifest.json").read_text())
    assert _ckpt_files.digest(path / "state.pt") == found["state_sha256"]
    h, used = xxhash.xxh3_64(), found["tensors_bytes"]
    with open(path / "tensors.bin", "rb") as fp:
        left = used
        while left:  # the bytes the manifest counts, not the padding after them
            block = fp.read(min(left, 8 << 20))
            h.update(block)
            left -= len(block)
    assert h.hexdigest() == found["tensors_xxh3"]
    skeleton = torch.load(path / "state.pt", map_location="cpu", weights_only=False)
    data = torch.empty(used, dtype=torch.uint8)
    view = data.numpy().data.cast("B")
    with open(path / "tensors.bin", "rb", buffering=0) as fp:
        done = 0
        while done < used:
            done += fp.readinto(view[done:])
    return _ckpt_tensors.unpack(skeleton, data)  # type: ignore[no-any-return]


def drop_pages(directory: Path) -> None:
    for path in directory.iterdir():
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def main() -> None:
    import torch

    import _proc
    import tether
    from tether import _ckpt_files

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=8, help="saves of each kind (default 8)")
    parser.add_argument("--out", type=Path, default=HERE / "results" / "save-cpu", help="OUT.md")
    args = parser.parse_args()
    library = [_proc.library_state()]
    state = _proc.hundred_mb_tensors()
    whole: dict[str, list[float]] = {"format 2": [], "format 1": []}
    wall: dict[str, list[float]] = {"format 2": [], "format 1": []}
    cpu: dict[str, list[float]] = {"kept": [], "dropped": [], "kept again": []}
    reads: dict[str, list[float]] = {"read once": [], "read twice": []}
    read_wall: dict[str, list[float]] = {"read once": [], "read twice": []}
    with tempfile.TemporaryDirectory(prefix="tether-save-cpu-", dir=os.environ.get("TMPDIR", "/tmp")) as out:
        ckpt = tether.Checkpointer({"model": _proc.Stateful(state)}, Path(out, "format-2"), every=1, seed=None)
        kept: dict[str, Any] = {}
        for i in range(args.repeats + 1):  # the first round warms up
            for kind in ("format 2", "format 1") if i % 2 == 0 else ("format 1", "format 2"):
                t0, w0 = time.process_time(), time.perf_counter()
                if kind == "format 2":
                    with ckpt.step(0, i):
                        pass
                    ckpt.wait()
                else:
                    format_1(state, kept, Path(out, f"format-1-{i}"))
                if i >= 1:
                    whole[kind].append(time.process_time() - t0)
                    wall[kind].append(time.perf_counter() - w0)
        newest = _ckpt_files.steps(Path(out, "format-2"))[0][1]
        for i in range(args.repeats + 1):  # the first round warms up
            for kind in ("read once", "read twice") if i % 2 == 0 else ("read twice", "read once"):
                drop_pages(newest)
                t0, w0 = time.process_time(), time.perf_counter()
                got = _ckpt_files.read(newest, 1, "replicated").state if kind == "read once" else read_twice(newest)
                spent, waited = time.process_time() - t0, time.perf_counter() - w0
                assert got is not None and torch.equal(got["objects"]["model"]["w5"], state["w5"])
                if i >= 1:
                    reads[kind].append(spent)
                    read_wall[kind].append(waited)
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
    rows = ["| one periodic save, whole | CPU time, s: median (IQR) | wall time, s: median (IQR) |", "|---|---|---|"]
    for kind in whole:
        c, w = _proc.quartiles(whole[kind]), _proc.quartiles(wall[kind])
        rows.append(f"| {kind} | {c[1]:.3f} ({c[0]:.3f} to {c[2]:.3f}) | {w[1]:.3f} ({w[0]:.3f} to {w[2]:.3f}) |")
    ratios = sorted(a / b for a, b in zip(whole["format 2"], whole["format 1"], strict=True))
    q1, med, q3 = _proc.quartiles(ratios)
    rows.append(f"\nformat 2 / format 1, CPU time, per round: {med:.3f}x (IQR {q1:.3f}x to {q3:.3f}x)")
    loads = ["| a resume's read of it, pages dropped first | CPU time, s: median (IQR) | wall time, s: median (IQR) |"]
    loads.append("|---|---|---|")
    labels_read = {"read once": "each file once (tether)", "read twice": "checked, then read again (862261d)"}
    for kind, label in labels_read.items():
        c, w = _proc.quartiles(reads[kind]), _proc.quartiles(read_wall[kind])
        loads.append(f"| {label} | {c[1]:.3f} ({c[0]:.3f} to {c[2]:.3f}) | {w[1]:.3f} ({w[0]:.3f} to {w[2]:.3f}) |")
    ratios = sorted(a / b for a, b in zip(read_wall["read once"], read_wall["read twice"], strict=True))
    q1, med, q3 = _proc.quartiles(ratios)
    loads.append(f"\nonce / twice, wall time, per round: {med:.3f}x (IQR {q1:.3f}x to {q3:.3f}x)")
    cache = ["| the previous checkpoints' pages | torch.save CPU time, s: median (IQR) |", "|---|---|"]
    labels = {"kept": "kept in the page cache", "dropped": "dropped after each fsync", "kept again": "kept, again"}
    for way, label in labels.items():
        q1, med, q3 = _proc.quartiles(cpu[way])
        cache.append(f"| {label} | {med:.3f} ({q1:.3f} to {q3:.3f}) |")
    setup = f"one process, {args.repeats} saves of each kind (see the module docstring)."
    title = "tether: CPU time of a 100 MB checkpoint"
    parts = ["\n".join(rows), "\n".join(loads), "`torch.save` alone:", "\n".join(cache)]
    _proc.report(args.out, title, setup, library, parts)


if __name__ == "__main__":
    main()
