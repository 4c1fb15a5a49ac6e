"""What the store watch's ping costs: round trip, and CPU of the pinging thread per ping.

Usage::

    python benchmarks/store_ping.py                  # 2,000 pings, ~2 s
    python benchmarks/store_ping.py --pings 200 --out /tmp/ping.md

Every rank that does not host the job's store asks its server to answer once per look
of the store watch (every 0.5 s; ``tether/_core/liveness.py``: ``StoreAnswerWatch``).
This measures one such question (``StorePing.silent_for``) against a TCPStore server in
another process on loopback (the libuv server, torch's default), back to back: the
round trip's wall time, and the CPU time of the asking thread (``time.thread_time``),
as median and interquartile range over batches of 100. It prints the share of one core
that one ping per 0.5 s takes. The server's side is not measured: it answers on its own
thread, in the process that hosts the store.

Writes ``--out`` (default ``benchmarks/results/store-ping.md``).
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pings", type=int, default=2000)
    parser.add_argument("--out", type=Path, default=HERE / "results" / "store-ping.md")
    args = parser.parse_args()

    import torch
    import torch.distributed as dist

    import _proc
    import tether
    from tether._core.stores import StorePing

    with _proc.store_server() as port:
        client = dist.TCPStore("127.0.0.1", port, 1, False, timeout=datetime.timedelta(seconds=30))
        ping = StorePing(client, time.monotonic)
        assert ping.answers, "the server did not answer the first ping"
        batch = 100
        walls, cpus = [], []
        for _ in range(max(1, args.pings // batch)):
            w, c = time.perf_counter(), time.thread_time()
            for _ in range(batch):
                assert ping.silent_for(1.0) == 0.0
            walls.append((time.perf_counter() - w) / batch * 1e6)
            cpus.append((time.thread_time() - c) / batch * 1e6)
        ping.close()

    def summary(xs: list[float]) -> str:
        q = statistics.quantiles(xs, n=4)
        return f"{statistics.median(xs):.1f} µs (IQR {q[0]:.1f} to {q[2]:.1f})"

    load = os.getloadavg()
    share = statistics.median(cpus) / 0.5e6 * 100
    lines = [
        "# The store watch's ping",
        "",
        f"`python benchmarks/store_ping.py --pings {args.pings}` — "
        f"{datetime.datetime.now():%Y-%m-%d %H:%M}, {os.cpu_count()} cores, load average "
        f"{load[0]:.1f}/{load[1]:.1f}/{load[2]:.1f} (1/5/15 min, at end); torch {torch.__version__}; "
        f"tether from `{Path(tether.__file__).parent}`.",
        "",
        f"{len(walls)} batches of {batch} pings, back to back, to a TCPStore server in another process "
        "on loopback; per ping, median over batches with the interquartile range:",
        "",
        f"- round trip (wall): {summary(walls)}",
        f"- CPU of the asking thread: {summary(cpus)}",
        f"- at one ping per 0.5 s (the store watch's period): {share:.3f}% of one core",
        "",
    ]
    text = "\n".join(lines)
    args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
