"""Fed to ``python -`` (or ``python -c``) by the tests (issue 7): spawn of a function defined there.

There is no file behind ``__main__``, as in a notebook. ``tether.spawn`` must either run
``fn`` on both ranks, or say in one line what to do -- never one pickling or
``FileNotFoundError: '<stdin>'`` traceback per child.
"""

import tether


def fn(local_rank, token):
    import os

    os.write(1, f"rank {tether.get_rank()} ran fn with {token}\n".encode())  # one write: forked ranks share the pipe
    tether.barrier()


if __name__ == "__main__":
    tether.spawn("gloo", fn, ("t0k3n",), nproc_per_node=2)
    import os

    os.write(1, b"LAUNCHER returned\n")
