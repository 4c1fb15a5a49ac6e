"""What tether's wrapper of ``Store.get`` and ``Store.wait`` costs a call that does not wait.

Usage::

    python benchmarks/store_waits.py                 # writes benchmarks/results/store-waits.md
    python benchmarks/store_waits.py --rounds 5 --per 2000

One process: ``tether.initialize("gloo")`` of a 1-rank job (tcp:// on loopback), so a
context watches it as in a rank, and a ``TCPStore`` of the user's, hosted in the same
process, holding the key ``k``. While tether watches, ``Store.get`` and ``Store.wait``
are tether's wrappers (``tether/_core/storewaits.py``): a call on the main thread, on a
store that is not tether's own, registers its wait with the watchdog (a waker, a
deadline, the whereabouts) and calls torch's method. Contenders, each making ``--per``
calls in a row per round:

* ``torch``: torch's own method (``storewaits._originals``), as without tether;
* ``tether``: the wrapper.

for ``get("k")`` and ``wait(["k"])``, whose key is there: the call's store round trip
on loopback, and the wrapper's cost on top of it, without a wait the wrapper could
shorten. Each round runs the four batches in a shuffled order; the ratio tether/torch
is the median of the per-round ratios (same call, same round) with their quartiles.
"""

from __future__ import annotations

import argparse
import datetime
import os
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
CALLS = ("get", "wait")
CONTENDERS = ("torch", "tether")


def quartiles(values: list[float]) -> tuple[float, float, float]:
    q = statistics.quantiles(values, n=4, method="inclusive")
    return q[0], statistics.median(values), q[2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--per", type=int, default=5000)
    parser.add_argument("--out", default=str(HERE / "results" / "store-waits.md"))
    args = parser.parse_args()

    import socket

    import torch
    import torch.distributed as dist

    import tether
    from tether._core import storewaits

    torch.set_num_threads(1)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    tether.initialize("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    store = dist.TCPStore("127.0.0.1", 0, 1, True, timeout=datetime.timedelta(seconds=30))
    store.set("k", "v")
    calls: dict[tuple[str, str], Callable[[], object]] = {
        ("get", "torch"): lambda: storewaits._originals["get"](store, "k"),
        ("get", "tether"): lambda: store.get("k"),
        ("wait", "torch"): lambda: storewaits._originals["wait"](store, ["k"]),
        ("wait", "tether"): lambda: store.wait(["k"]),
    }
    assert store.get.__name__ == "get" and type(store).get is not storewaits._originals["get"]  # wrapped
    for fn in calls.values():  # warm-up
        for _ in range(200):
            fn()
    per_call: dict[tuple[str, str], list[float]] = {key: [] for key in calls}
    ratios: dict[str, list[float]] = {call: [] for call in CALLS}
    load_start = os.getloadavg()[0]
    for _ in range(args.rounds):
        order = list(calls)
        random.shuffle(order)
        took: dict[tuple[str, str], float] = {}
        for key in order:
            fn = calls[key]
            t = time.perf_counter()
            for _ in range(args.per):
                fn()
            took[key] = (time.perf_counter() - t) / args.per * 1e6
            per_call[key].append(took[key])
        for call in CALLS:
            ratios[call].append(took[(call, "tether")] / took[(call, "torch")])
    load_end = os.getloadavg()[0]
    tether.finalize()

    when = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
    lines = [
        "# Store.get / Store.wait on a user's store, key present: tether's wrapper vs torch's method",
        "",
        f"`python benchmarks/store_waits.py --rounds {args.rounds} --per {args.per}`, {when}, torch "
        f"{torch.__version__}, {os.cpu_count()} cores, load average {load_start:.2f} at the start, "
        f"{load_end:.2f} at the end. One process, a 1-rank tether job; the user's TCPStore on loopback "
        "in the same process. µs per call: median over rounds (IQR); ratio: median of per-round ratios (IQR).",
        "",
        "| call | torch, µs | tether, µs | tether / torch |",
        "|---|---|---|---|",
    ]
    for call in CALLS:
        lo_t, med_t, hi_t = quartiles(per_call[(call, "torch")])
        lo_w, med_w, hi_w = quartiles(per_call[(call, "tether")])
        lo_r, med_r, hi_r = quartiles(ratios[call])
        lines.append(
            f"| `{call}` | {med_t:.1f} ({lo_t:.1f}-{hi_t:.1f}) | {med_w:.1f} ({lo_w:.1f}-{hi_w:.1f}) "
            f"| {med_r:.3f}x ({lo_r:.3f}-{hi_r:.3f}x) |"
        )
    text = "\n".join(lines) + "\n"
    Path(args.out).write_text(text)
    sys.stdout.write(text)


if __name__ == "__main__":
    main()
