"""Every rank passes the same bad argument (issue 11): the report names no culprit."""

import tether as idist


def fn(local_rank: int) -> None:
    with idist.one_rank_first(rank=5):  # a world of 2: rank 5 does not exist
        pass


if __name__ == "__main__":
    with idist.Parallel(backend="gloo", nproc_per_node=2) as parallel:
        parallel.run(fn)
