"""tether's demo: rank 0 fails while preparing data, and every rank hears of it at once.

Four ranks on gloo. Rank 0 prepares the data set inside ``one_rank_first`` and fails
(a full disk); the other ranks wait for it at the gate. With ignite they would wait for
the process-group timeout (30 min on gloo) whenever rank 0's process stays alive; with
tether each raises ``PeerFailure`` naming rank 0 and its error within milliseconds, and
the launcher prints the root cause once.

    python examples/demo.py            # 4 ranks
    python examples/demo.py --ranks 8

It exits 0 when the job failed as planned (rank 0's error reported, every rank ended),
and 1 otherwise.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
from pathlib import Path

import tether as idist


def prepare_data(root: Path) -> None:
    (root / "shard-0.bin").write_bytes(b"\0" * 1024)
    time.sleep(0.2)  # the slow part: downloading, decoding...
    raise OSError(28, "No space left on device", str(root / "shard-1.bin"))


def main(local_rank: int, root: str) -> None:
    rank = idist.get_rank()
    if rank == 0:
        # A logger thread that is not a daemon: with ignite it keeps rank 0's process
        # alive after the error, and the other ranks wait for it forever.
        threading.Thread(target=time.sleep, args=(3600,), daemon=False).start()
    try:
        with idist.one_rank_first(rank=0):
            if rank == 0:
                prepare_data(Path(root))
            data = sorted(Path(root).iterdir())
        print(f"[rank {rank}] got {len(data)} shards", flush=True)
    except idist.PeerFailure as exc:
        late = (time.time() - exc.record.time) * 1000
        print(
            f"[rank {rank}] stopped {late:5.1f} ms after rank {exc.rank} failed: {exc.exc_type}: {exc.message}",
            flush=True,
        )
        raise
    except OSError as exc:
        print(f"[rank {rank}] failed while preparing data: {exc!r}", flush=True)
        raise


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=4)
    args = parser.parse_args()
    print(f"tether demo: {args.ranks} ranks on gloo; rank 0 prepares the data inside one_rank_first, and fails.\n")
    with tempfile.TemporaryDirectory() as root:
        start = time.monotonic()
        try:
            idist.spawn("gloo", main, (root,), nproc_per_node=args.ranks)
        except idist.JobFailed as exc:
            assert exc.record is not None
            ended = time.time() - exc.record.time
            codes = ", ".join(f"rank {r}: {c}" for r, c in sorted(exc.exit_codes.items()))
            print(f"\nSummary: {exc}")
            print(f"  every rank had exited {ended:.2f} s after the failure (exit codes {codes});")
            print(f"  whole job, process start-up included: {time.monotonic() - start:.1f} s")
            # The demo succeeds when the job failed as planned: rank 0's error, every rank out.
            planned = exc.record.rank == 0 and exc.record.exc_type == "OSError"
            print("\nThe promise held: no rank waited for rank 0." if planned else "\nUnexpected root cause.")
            sys.exit(0 if planned else 1)
    print("the job succeeded: that was not supposed to happen")
    sys.exit(1)
