"""The stores a job runs on: the launcher's, and the failure channel's when the job's own cannot carry it.

Also ``StoreProbe``: how a rank sees, without a torch client, that a store's server closed.
"""

from __future__ import annotations

import contextlib
import datetime
import socket

from torch._C._distributed_c10d import FileStore, PrefixStore, Store, TCPStore


def channel_beside(
    store: Store, job_id: str, rank: int, world_size: int, timeout: datetime.timedelta
) -> tuple[Store, TCPStore | None]:
    """A TCPStore for the failure channel of a job whose own store has no queues (a FileStore).

    Rank 0 hosts it on a free port and publishes ``host:port`` on ``store``; the others
    read it there (a blocking ``get``, bounded by the store's timeout) and connect.
    Returns the channel's store and the server object to keep alive (rank 0).
    """
    gen = int(store.add(f"tether/{job_id}/addr-inc/{rank}", 1))
    key = f"tether/{job_id}/{gen}/channel-address"
    if rank == 0:
        server = TCPStore(reachable_address(), 0, world_size, True, timeout=timeout, wait_for_workers=False)
        store.set(key, f"{reachable_address()}:{server.port}")
        return server, server
    host, _, port = store.get(key).decode().rpartition(":")
    return TCPStore(host, int(port), world_size, False, timeout=timeout), None


def reachable_address() -> str:
    """This host's address as other hosts can reach it (loopback when it cannot be resolved)."""
    with contextlib.suppress(OSError):
        return socket.gethostbyname(socket.gethostname())
    return "127.0.0.1"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def job_store(addr: str, port: int | None, world: int, node_rank: int, shared_file: str | None) -> tuple[TCPStore, str]:
    """The job's store: node 0's launcher hosts it; with ``file://`` its address travels in the file."""
    five = datetime.timedelta(minutes=5)
    if shared_file is None:
        return TCPStore(addr, port or 0, world, node_rank == 0, timeout=five, wait_for_workers=False), addr
    shared = FileStore(shared_file, -1)
    shared.set_timeout(five)
    key = "tether/spawn/address"
    if node_rank == 0:
        store = TCPStore(addr, 0, world, True, timeout=five, wait_for_workers=False)
        shared.set(key, f"{addr}:{store.port}")
        return store, addr
    host, _, got = shared.get(key).decode().rpartition(":")
    return TCPStore(host, int(got), world, False, timeout=five), host


CLOSE_WAIT = 2.0  # seconds a rank waits, in finalize, for the store's host to close the store


class StoreProbe:
    """A bare TCP connection to a ``TCPStore``'s server, to learn when the server closes.

    Not a torch client: a torch client's read that fails logs a warning with a C++ stack.
    The server closes every connection when it shuts down; this one then reads end of
    file. A store that is not a ``TCPStore`` (``file://``) gets no probe, and no wait; a
    ``PrefixStore`` (a user's group: ``init_process_group`` wraps its store) is probed at
    the ``TCPStore`` beneath.
    """

    def __init__(self, store: Store) -> None:
        self._sock: socket.socket | None = None
        while isinstance(store, PrefixStore):
            store = store.underlying_store
        host, port = getattr(store, "host", None), getattr(store, "port", None)
        if isinstance(store, TCPStore) and host and port:
            with contextlib.suppress(OSError):
                self._sock = socket.create_connection((host, port), timeout=1.0)

    def wait_closed(self, bound: float) -> None:
        if self._sock is None:
            return
        with self._sock:
            self._sock.settimeout(bound)
            with contextlib.suppress(OSError):  # a timeout too: then go on, as before
                self._sock.recv(1)
