"""What a node's beater costs: its start, its memory, and its CPU per beat.

Usage::

    python benchmarks/beater.py                  # 20 starts, then 5 s of beats; ~15 s
    python benchmarks/beater.py --starts 5 --out /tmp/beater.md

Under torchrun or SLURM with more than one node, each node's local rank 0 starts a
process that beats the node's heartbeat (``tether/_core/beater.py``), so that no GIL of
that rank can stop it. This measures, against a TCPStore server in another process on
loopback (the libuv server, torch's default):

- the time ``beater.start`` takes (the cost to ``initialize``), and the time from it to
  the first beat the store holds (``--starts`` times);
- the beater's resident memory (``VmRSS``) once it beats;
- its CPU time per beat (user + system, from ``/proc/<pid>/stat``), over ``--seconds`` of
  beats every 10 ms, and the share of one core at the default ``heartbeat`` of 2 s;
- beside it, the wall time of the same ADD from a torch client in this process (how the
  keeper thread beat before), median over batches of 100.

Writes ``--out`` (default ``benchmarks/results/beater.md``).
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for pid {pid}")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def first_beat(store: object, key: str, bound: float = 10.0) -> float:
    start = time.perf_counter()
    while store.add(key, 0) == 0:  # type: ignore[attr-defined]
        if time.perf_counter() - start > bound:
            raise RuntimeError(f"no beat within {bound} s")
        time.sleep(0.001)
    return time.perf_counter() - start


def summary(xs: list[float], unit: str, digits: int = 1) -> str:
    q = statistics.quantiles(xs, n=4) if len(xs) > 1 else [xs[0]] * 3
    return f"{statistics.median(xs):.{digits}f} {unit} (IQR {q[0]:.{digits}f} to {q[2]:.{digits}f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--starts", type=int, default=20)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--out", type=Path, default=HERE / "results" / "beater.md")
    args = parser.parse_args()

    import torch
    import torch.distributed as dist

    import _proc
    import tether
    from tether._core import beater

    with _proc.store_server() as port:
        store = dist.TCPStore("127.0.0.1", port, 1, False, timeout=datetime.timedelta(seconds=30))
        starts, launches, rss = [], [], []
        for i in range(args.starts):
            key = f"bench/start/{i}"
            t = time.perf_counter()
            proc = beater.start("127.0.0.1", port, key, 0.5)
            launches.append((time.perf_counter() - t) * 1e3)
            assert proc is not None, "the beater did not start"
            first_beat(store, key, 10.0)
            starts.append((time.perf_counter() - t) * 1e3)
            rss.append(rss_kib(proc.pid) / 1024)
            proc.kill()
            proc.wait()
        key = "bench/cpu"
        proc = beater.start("127.0.0.1", port, key, 0.01)
        assert proc is not None
        first_beat(store, key)
        beats0, cpu0 = store.add(key, 0), cpu_seconds(proc.pid)
        time.sleep(args.seconds)
        beats, cpu = store.add(key, 0) - beats0, cpu_seconds(proc.pid) - cpu0
        proc.kill()
        proc.wait()
        batch, adds = 100, []
        for _ in range(20):
            t = time.perf_counter()
            for _ in range(batch):
                store.add("bench/keeper", 1)
            adds.append((time.perf_counter() - t) / batch * 1e6)

    per_beat = cpu / beats * 1e6 if beats else float("nan")
    load = os.getloadavg()
    lines = [
        "# A node's beater",
        "",
        f"`python benchmarks/beater.py --starts {args.starts} --seconds {args.seconds:g}` — "
        f"{datetime.datetime.now():%Y-%m-%d %H:%M}, {os.cpu_count()} cores, load average "
        f"{load[0]:.1f}/{load[1]:.1f}/{load[2]:.1f} (1/5/15 min, at end); torch {torch.__version__}; "
        f"Python {sys.version.split()[0]}; tether from `{Path(tether.__file__).parent}`.",
        "",
        "Against a TCPStore server in another process on loopback:",
        "",
        f"- `beater.start`'s own time (in `initialize`, on local rank 0; this process has torch loaded): "
        f"{summary(launches, 'ms')}",
        f"- `beater.start` to the first beat in the store ({args.starts} starts): {summary(starts, 'ms')}",
        f"- its resident memory once beating: {summary(rss, 'MiB')}",
        f"- its CPU per beat ({beats} beats every 10 ms, {cpu:.2f} s of CPU; /proc's clock ticks are "
        f"10 ms): {per_beat:.0f} µs, {per_beat / 2e6 * 100:.4f}% of one core at one beat per 2 s",
        f"- the same ADD from a torch client in this process (the keeper's beat before): "
        f"{summary(adds, 'µs')} wall per call, 20 batches of {batch}",
        "",
    ]
    text = "\n".join(lines)
    args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
