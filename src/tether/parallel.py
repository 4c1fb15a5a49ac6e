"""``Parallel``: ignite's launcher context manager, as a spawner or under torchrun.

* ``Parallel(backend, nproc_per_node=N)`` outside a launcher spawns N processes
  (``tether.spawn``).
* ``Parallel(backend)`` under torchrun initializes this process, honouring ``timeout``
  (ignite drops it there), and finalizes it on exit.
* ``Parallel()`` runs serially.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from types import TracebackType
from typing import Any

from . import _checks
from ._core import context
from ._core.ending import finalize
from ._core.failures import report_failure
from ._core.hooks import is_success
from ._core.runtime import current, initialize
from .backends import check_backend
from .spawn import spawn

_INIT_KEYS = ("timeout", "heartbeat", "lost_after", "grace", "sync_timeout", "warn_after", "check_collectives")


class Parallel:
    """Run a function on every rank, however the job was launched.

    Args:
        backend: "gloo", "nccl", "mpi", or None for a serial run.
        nproc_per_node: processes to spawn on this node; None under torchrun.
        nnodes, node_rank, master_addr, master_port, init_method: as ``tether.spawn``.
        spawn_kwargs: ``timeout``, ``start_method`` and tether's options.

    Raises:
        ValueError: ``backend=None`` with any other argument, ``nproc_per_node`` under a
            launcher, or a bad value; before anything starts.

    Example::

        with tether.Parallel(backend="gloo", nproc_per_node=4) as parallel:
            parallel.run(training, config)
    """

    def __init__(
        self,
        backend: str | None = None,
        nproc_per_node: int | None = None,
        nnodes: int | None = None,
        node_rank: int | None = None,
        master_addr: str | None = None,
        master_port: int | None = None,
        init_method: str | None = None,
        **spawn_kwargs: Any,
    ) -> None:
        given = {
            "nproc_per_node": nproc_per_node,
            "nnodes": nnodes,
            "node_rank": node_rank,
            "master_addr": master_addr,
            "master_port": master_port,
            "init_method": init_method,
        }
        if backend is None:
            _checks.check_serial_parallel(**{k: v for k, v in given.items() if k != "init_method"})
        else:
            check_backend(backend, "Parallel")
        launched = "RANK" in os.environ and "WORLD_SIZE" in os.environ
        if launched and nproc_per_node is not None:
            raise ValueError(
                "Parallel: nproc_per_node is given, but this process already runs under a launcher "
                "(RANK and WORLD_SIZE are set); drop nproc_per_node under torchrun"
            )
        if nproc_per_node is not None:
            _checks.check_nproc_per_node(nproc_per_node)
            nodes = _checks.check_nnodes(nnodes)
            _checks.check_node_rank(node_rank if node_rank is not None or nodes > 1 else 0, nodes)
            _checks.check_master(nodes, master_addr, master_port, init_method)
        self.backend = backend
        self._spawn_args = {k: v for k, v in given.items() if v is not None and k != "nproc_per_node"}
        self._spawn_args.update(spawn_kwargs)
        self._nproc = nproc_per_node
        self._spawns = backend is not None and nproc_per_node is not None
        self._init_kwargs = {k: v for k, v in spawn_kwargs.items() if k in _INIT_KEYS}
        if init_method is not None:
            self._init_kwargs["init_method"] = init_method
        self._initialized = False

    def run(self, func: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        """Call ``func(local_rank, *args, **kwargs)`` on every rank.

        Raises:
            JobFailed: as a spawner, a worker failed (report printed once).
            PeerFailure: under torchrun, another rank failed.
        """
        if self._spawns:
            assert self.backend is not None and self._nproc is not None
            spawn(self.backend, func, args, kwargs_dict=kwargs, nproc_per_node=self._nproc, **self._spawn_args)
            return
        try:
            func(current().backend.topology.local_rank, *args, **kwargs)
        except BaseException as exc:
            behind = report_failure(exc)
            if behind is not None:  # a launcher's SIGTERM because a peer failed: raise that failure
                raise behind from exc
            ctx = context.peek()
            if type(exc) is SystemExit and not is_success(exc) and ctx is not None and ctx.hooks is not None:
                ctx.hooks.end_uncaught(exc)  # under torchrun: ends the rank with its code, as a raise would
            raise

    def __enter__(self) -> Parallel:
        if self.backend is not None and not self._spawns and context.peek() is None:
            initialize(self.backend, **self._init_kwargs)
            self._initialized = True
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if self._initialized:
            if exc is not None:
                report_failure(exc)
            self._initialized = False
            finalize()
