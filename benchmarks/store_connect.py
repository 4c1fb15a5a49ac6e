"""How long a new store connection takes on this machine, and why some take 5 s.

Usage::

    python benchmarks/store_connect.py                 # 300 of each, ~2-4 minutes
    python benchmarks/store_connect.py --n 100 --out /tmp/connect

Results go to ``--out`` + ``.md`` (default ``benchmarks/results/store-connect``).

Found while looking for the cause of a store wait's notice of a killed peer that came
4.5 s late in one ``pytest --full`` run (``results/test-times.md``, 6eb54c7): that wait is
woken through a connection of its own, opened on a thread at the store's first wait
(``tether/_core/storewaits.py``), and the peer was killed 0.5 s after the wait began.
Three readings, against a TCPStore server (the libuv one, torch's default) in a process
of its own on loopback:

* ``getnameinfo``: Python's ``socket.getnameinfo`` of the address a dual-stack server sees
  a loopback client as (``::ffff:127.0.0.1``, which ``/etc/hosts`` does not name) and of
  ``127.0.0.1`` (named ``localhost`` there), ``--n`` times each: a reverse lookup that
  goes to the machine's resolver, and one that does not. c10d makes such a lookup of the
  peer's address on each new connection, on the client and on the server
  (``janitor.py``'s docstring: seen with ``strace``).
* ``clone``: ``--n`` new connections (``TCPStore.clone()``) one after another, each timed.
* ``open connection meanwhile``: another process making ``set`` and ``get`` round trips
  on a connection opened before, all through the clones: its slowest round trip inside
  each slow clone.
"""

from __future__ import annotations

import argparse
import datetime
import json
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

SLOW = 1.0  # seconds: a connection or lookup this long waited for the resolver
_ROUND_TRIPS = """
import datetime, json, sys, time
import torch.distributed as dist
store = dist.TCPStore("127.0.0.1", int(sys.argv[1]), 1, False, timeout=datetime.timedelta(seconds=60))
print("ready", flush=True)
trips, end = [], time.time() + float(sys.argv[2])
while time.time() < end:
    t0 = time.time(); store.set("k", "v"); store.get("k"); trips.append((t0, time.time() - t0))
print(json.dumps(trips), flush=True)
"""


def lookups(address: tuple[str, int] | tuple[str, int, int, int], n: int) -> list[float]:
    took = []
    for _ in range(n):
        t0 = time.perf_counter()
        socket.getnameinfo(address, 0)
        took.append(time.perf_counter() - t0)
    return took


def describe(took: list[float]) -> str:
    slow = [t for t in took if t >= SLOW]
    return (
        f"median {statistics.median(took) * 1e3:.2f} ms, max {max(took):.2f} s, "
        f"{len(slow)} of {len(took)} took {SLOW:g} s or more"
        + (f" ({', '.join(f'{t:.2f}' for t in slow[:8])}{' ...' if len(slow) > 8 else ''} s)" if slow else "")
    )


def main() -> None:
    import _proc

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=300, help="lookups of each address, and clones (default 300)")
    parser.add_argument("--out", type=Path, default=HERE / "results" / "store-connect", help="markdown copy")
    args = parser.parse_args()
    library = [_proc.library_state()]

    import torch.distributed as dist

    mapped = lookups(("::ffff:127.0.0.1", 1234, 0, 0), args.n)
    plain = lookups(("127.0.0.1", 1234), args.n)
    with _proc.store_server() as port:
        store = dist.TCPStore("127.0.0.1", port, 1, False, timeout=datetime.timedelta(seconds=60))
        # the other process's round trips run past the clones: --n at ~0.4 ms, and 5 s a slow one
        bound = 30.0 + args.n * 0.2
        trips_proc = subprocess.Popen(
            [sys.executable, "-c", _ROUND_TRIPS, str(port), str(bound)], stdout=subprocess.PIPE, text=True
        )
        assert trips_proc.stdout is not None
        assert trips_proc.stdout.readline().strip() == "ready"
        clones = []
        for _ in range(args.n):
            t0 = time.time()
            store.clone()  # type: ignore[attr-defined]
            clones.append((t0, time.time() - t0))
        out, _ = trips_proc.communicate(timeout=bound + 60)
        trips = json.loads(out)
    library.append(_proc.library_state())
    slow = [(t0, took) for t0, took in clones if took >= SLOW]
    meanwhile = []
    for t0, took in slow:
        inside = [d for t, d in trips if t0 <= t <= t0 + took]
        if inside:
            meanwhile.append(f"{len(inside)} round trips, slowest {max(inside) * 1e3:.1f} ms")
        else:
            meanwhile.append("none began (the other process had stopped)")
    lines = [
        f"- `getnameinfo(::ffff:127.0.0.1)`: {describe(mapped)}",
        f"- `getnameinfo(127.0.0.1)`: {describe(plain)}",
        f"- `TCPStore.clone()`: {describe([took for _, took in clones])}",
        "- round trips on a connection opened before, in another process, during each slow clone: "
        + ("; ".join(meanwhile) if meanwhile else "(no slow clone)")
        + f". All its round trips: {len(trips)}, slowest {max(d for _, d in trips) * 1e3:.1f} ms.",
    ]
    resolver = ", ".join(
        line.split()[1] for line in Path("/etc/resolv.conf").read_text().splitlines() if line.startswith("nameserver")
    )
    setup = f"one process and a TCPStore server on loopback; the resolver: {resolver or 'none listed'}."
    _proc.report(args.out, "A new store connection, and the reverse lookup in it", setup, library, ["\n".join(lines)])


if __name__ == "__main__":
    main()
