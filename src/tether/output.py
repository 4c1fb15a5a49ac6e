"""Printing and logging in a job of many ranks: once, or with the rank in front.

No call here communicates: each rank decides from its own rank (``get_rank()``), so a
print on rank 0 costs the other ranks nothing and can never wait.

Example::

    tether.rank_print(f"epoch {epoch}: loss {loss:.4f}")        # rank 0 only
    tether.rank_print("my shard is ready", rank=None)           # every rank, "[rank 3] ..."
    log = tether.get_logger("train")                             # rank 0 only, "[rank 0] ..."
    log.info("starting")
"""

from __future__ import annotations

import logging
import sys
from typing import Any, TextIO

from ._core.runtime import current

__all__ = ["RankFormatter", "get_logger", "rank_print"]

DEFAULT_FORMAT = "%(asctime)s [rank %(rank)s] %(name)s %(levelname)s: %(message)s"


def rank_print(*objects: Any, rank: int | None = 0, file: TextIO | None = None, **kwargs: Any) -> None:
    """``print`` on one rank (rank 0 by default); ``rank=None`` prints on every rank, prefixed.

    Args:
        objects, file, kwargs: as ``print`` (``sep``, ``end``, ``flush``; ``flush`` defaults to
            True). The line is written in one piece, so ranks sharing a terminal do not
            interleave within it.
        rank: the rank that prints, or None for every rank with ``[rank R]`` in front.

    Raises:
        TypeError: ``rank`` is neither an int nor None (on every rank alike).
    """
    if rank is not None and (not isinstance(rank, int) or isinstance(rank, bool)):
        raise TypeError(f"rank_print: rank must be an int or None, got {rank!r}")
    me = current().backend.topology.rank
    if rank is None:
        objects = (f"[rank {me}]", *objects)
    elif me != rank:
        return
    sep, end, flush = kwargs.pop("sep", " "), kwargs.pop("end", "\n"), kwargs.pop("flush", True)
    if kwargs:
        raise TypeError(f"rank_print: unexpected keyword argument(s) {sorted(kwargs)}")
    out = file if file is not None else sys.stdout
    out.write((" " if sep is None else sep).join(map(str, objects)) + ("\n" if end is None else end))  # one write
    if flush:
        out.flush()


class RankFormatter(logging.Formatter):
    """A ``logging.Formatter`` whose format may use ``%(rank)s``: the job rank of the process."""

    def format(self, record: logging.LogRecord) -> str:
        record.rank = current().backend.topology.rank
        return super().format(record)


def get_logger(
    name: str | None = "tether.user",
    level: int = logging.INFO,
    all_ranks: bool = False,
    stream: TextIO | None = None,
    format: str = DEFAULT_FORMAT,
) -> logging.Logger:
    """A logger that writes on rank 0 only (or on every rank), each line saying its rank.

    Calling it again for the same name replaces the handler it installed, so it can be
    called at the top of every function without doubling lines. On the ranks that do not
    write, records are dropped (a ``NullHandler``), as ignite's ``setup_logger`` does.

    Args:
        name: the logger's name (None: the root logger).
        level: its level.
        all_ranks: write on every rank, not only on rank 0.
        stream: where to write (default ``sys.stderr``).
        format: a ``logging`` format; ``%(rank)s`` is the job rank.
    """
    logger = logging.getLogger(name)
    logger.setLevel(level)
    for handler in [h for h in logger.handlers if getattr(h, "_tether", False)]:
        logger.removeHandler(handler)
    writer: logging.Handler
    if all_ranks or current().backend.topology.rank == 0:
        writer = logging.StreamHandler(stream)
        writer.setFormatter(RankFormatter(format))
    else:
        writer = logging.NullHandler()
    writer._tether = True  # type: ignore[attr-defined]
    logger.addHandler(writer)
    logger.propagate = False
    return logger
