"""The plainest failing job (issue 11): ``with Parallel(nproc_per_node=2) as p: p.run(fn)``, uncaught."""

import tether as idist


def fn(local_rank: int) -> None:
    if idist.get_rank() == 1:
        raise RuntimeError("boom 0.1 from rank 1")
    idist.barrier()


if __name__ == "__main__":
    with idist.Parallel(backend="gloo", nproc_per_node=2) as parallel:
        parallel.run(fn)
