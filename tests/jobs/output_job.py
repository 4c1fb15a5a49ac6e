"""rank_print and get_logger in a 3-rank ``tether.spawn`` job (issue 11): who writes what."""

import io
import sys

import tether


def fn(local_rank: int) -> None:
    tether.rank_print("once 0.1")
    tether.rank_print("from every rank", rank=None)
    tether.rank_print("only rank 2", rank=2)
    log = tether.get_logger("job", format="[rank %(rank)s] %(levelname)s %(message)s")
    log = tether.get_logger("job", format="[rank %(rank)s] %(levelname)s %(message)s")  # again: no doubled lines
    log.info("logged on rank 0")
    everyone = tether.get_logger("job.all", all_ranks=True, stream=sys.stdout, format="[rank %(rank)s] %(message)s")
    everyone.warning("logged everywhere")
    buffer = io.StringIO()
    tether.rank_print("to a file", file=buffer, rank=tether.get_rank())
    assert buffer.getvalue() == "to a file\n"
    tether.barrier()


if __name__ == "__main__":
    tether.spawn("gloo", fn, (), nproc_per_node=3)
