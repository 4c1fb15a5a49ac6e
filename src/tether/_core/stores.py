"""The stores a job runs on: the launcher's, and the failure channel's when the job's own cannot carry it.

Also ``StoreProbe``: how a rank sees, without a torch client, that a store's server closed;
and ``StorePing``: whether it still answers.
"""

from __future__ import annotations

import contextlib
import datetime
import ipaddress
import os
import socket
import struct
import time
from collections.abc import Callable

from torch._C._distributed_c10d import FileStore, PrefixStore, Store, TCPStore

from .beater import PING, connect


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
        server = serve(reachable_address(), 0, world_size, timeout)
        store.set(key, f"{reachable_address()}:{server.port}")
        return server, server
    host, _, port = store.get(key).decode().rpartition(":")
    return TCPStore(host, int(port), world_size, False, timeout=timeout), None


def serve(addr: str, port: int, world_size: int, timeout: datetime.timedelta) -> TCPStore:
    """Host a ``TCPStore`` on ``port`` (0: a free one) for clients that connect to ``addr``.

    c10d's server listens on a dual-stack IPv6 socket, so an IPv4 client reaches it as
    ``::ffff:a.b.c.d``, and the one thread that answers every request first formats each
    new client's address with a reverse lookup (``getnameinfo``), which ``/etc/hosts``
    does not answer for such an address: while the resolver takes its time, the store
    answers nobody. On this VM 5 of 300 such lookups took the resolver's 5-s timeout
    (``results/store-connect.md``), and each rank opens five connections as it starts
    (``docs/scale.md``). So where ``addr`` is an IPv4 address the server gets an IPv4
    socket of ours (``master_listen_fd``), listening on every interface as c10d's does:
    its clients arrive as IPv4 addresses, which ``/etc/hosts`` names on loopback (and
    where a cluster lists its nodes there). Under a resolver 0.2 s late, a round trip
    while clients connected took up to 0.201 s on c10d's listener and 0.002 s on this
    one (``benchmarks/slow_start.py``, ``results/slow-start.md``). A host name (its
    clients may reach it by IPv6), or a port our socket cannot bind, keeps c10d's own.
    """
    listener = _ipv4_listener(addr, port)
    if listener is None:
        return TCPStore(addr, port, world_size, True, timeout=timeout, wait_for_workers=False)
    with listener:
        # the server owns the descriptor it is given, and closes it: on success, and when
        # its host's own client fails after the server took it (a Ctrl-C in its connect:
        # closing it again here raised EBADF in place of the KeyboardInterrupt). It gets a
        # duplicate, closed here only while it is still this socket's
        given = os.dup(listener.fileno())
        try:
            return TCPStore(
                addr,
                listener.getsockname()[1],
                world_size,
                True,
                timeout=timeout,
                wait_for_workers=False,
                master_listen_fd=given,
            )
        except BaseException:
            _close_if_same(given, listener)
            raise


def _close_if_same(fd: int, sock: socket.socket) -> None:
    """Close ``fd`` if it still refers to ``sock``'s socket (not a file that took its number)."""
    with contextlib.suppress(OSError):
        mine, theirs = os.fstat(sock.fileno()), os.fstat(fd)
        if (mine.st_dev, mine.st_ino) == (theirs.st_dev, theirs.st_ino):
            os.close(fd)


def _ipv4_listener(addr: str, port: int) -> socket.socket | None:
    try:
        ipaddress.IPv4Address(addr)
    except ValueError:
        return None
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as libuv's own bind does
        sock.bind(("0.0.0.0", port))
        sock.listen(socket.SOMAXCONN)
    except OSError:
        sock.close()
        return None
    return sock


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
        if node_rank == 0:
            return serve(addr, port or 0, world, five), addr
        return TCPStore(addr, port or 0, world, False, timeout=five), addr
    shared = FileStore(shared_file, -1)
    shared.set_timeout(five)
    key = "tether/spawn/address"
    if node_rank == 0:
        store = serve(addr, 0, world, five)
        shared.set(key, f"{addr}:{store.port}")
        return store, addr
    host, _, got = shared.get(key).decode().rpartition(":")
    return TCPStore(host, int(got), world, False, timeout=five), host


CLOSE_WAIT = 2.0  # seconds a rank waits, in finalize, for the store's host to close the store


def tcp_store(store: Store) -> Store:
    """The store beneath every ``PrefixStore`` wrapping ``store`` (a ``TCPStore``, usually)."""
    while isinstance(store, PrefixStore):
        store = store.underlying_store
    return store


def server_address(store: Store) -> tuple[str, int] | None:
    """``(host, port)`` of the ``TCPStore`` server beneath ``store``; None for another store."""
    store = tcp_store(store)
    host, port = getattr(store, "host", None), getattr(store, "port", None)
    return (host, port) if isinstance(store, TCPStore) and host and port else None


class StoreProbe:
    """A bare TCP connection to a ``TCPStore``'s server, to learn when the server closes.

    Not a torch client: a torch client's read that fails logs a warning with a C++ stack.
    The server closes every connection when it shuts down; this one then reads end of
    file. A store that is not a ``TCPStore`` (``file://``) gets no probe, and no wait; a
    ``PrefixStore`` (a user's group: ``init_process_group`` wraps its store) is probed at
    the ``TCPStore`` beneath.

    ``StoreProbe(store)`` connects now, to whatever server listens on the store's port by
    then. ``StoreProbe.on(connection, port)`` takes a connection made while the group
    lived (a copy of ``StorePing``'s): surely the old store's, even after a new server
    took the port (``surely_old``; see ``oldstore.py``).
    """

    def __init__(self, store: Store | None) -> None:
        self._sock: socket.socket | None = None
        self.surely_old = False
        address = server_address(store) if store is not None else None
        self.port = address[1] if address is not None else None
        if address is not None:
            with contextlib.suppress(OSError):
                self._sock = socket.create_connection(address, timeout=1.0)

    @classmethod
    def on(cls, connection: socket.socket, port: int) -> StoreProbe:
        probe = cls(None)
        probe._sock, probe.port, probe.surely_old = connection, port, True
        return probe

    def wait_closed(self, bound: float) -> bool:
        """Whether the server closed the connection within ``bound`` seconds (True with no
        probe). The probe is closed once the server has; after a timeout it stays open."""
        sock = self._sock
        if sock is None:
            return True
        deadline = time.monotonic() + bound
        try:
            while True:  # a copy of StorePing's connection may still get a PING's answer
                sock.settimeout(max(deadline - time.monotonic(), 0.001))
                if not sock.recv(64):
                    break
        except TimeoutError:
            return False
        except OSError:
            pass
        self.close()
        return True

    def close(self) -> None:
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.close()
            self._sock = None


class StorePing:
    """A bare TCP connection that asks a ``TCPStore``'s server to answer, with a timeout of its own.

    A torch client cannot tell a frozen server: an operation on a SIGSTOPped server never
    returns, whatever the client's timeout (``liveness.StoreHostWatch``). This asks with
    TCPStore's PING, on a socket of its own whose timeout holds. The server answers from
    its own thread, without the GIL of the process that hosts it: a busy host answers, a
    stopped or unreachable one does not.

    One ping is outstanding at a time: ``silent_for`` sends one if none is, reads its
    answer for up to ``wait`` seconds, and returns how long the outstanding one has gone
    unanswered (0.0 once answered), or None when there is no connection (never made, or
    closed by the server: the store going, not a freeze, or a wrong answer: not a PING
    this server understands).

    ``answers`` turns True at the server's first right answer. The first ping is sent at
    once and waited for ``FIRST_WAIT``, not more: c10d's server makes a reverse lookup of
    each new client's address on the thread that answers, so at a job's start the answer
    can wait behind one lookup per connection every rank opens, a resolver's timeout each
    where the resolver is slow (under one 0.5 s late, 2 of 4 ranks of a torchrun job had
    no answer within the 2 s it once waited, and their store watch was off for the job).
    Until it answers, a store is not judged (``liveness.StoreAnswerWatch``).
    """

    answers = False
    port: int | None = None
    FIRST_WAIT = 0.1  # seconds the first ping is waited for in the constructor

    def __init__(self, store: Store, clock: Callable[[], float], timeout: float = 2.0) -> None:
        self._sock: socket.socket | None = None
        self._clock = clock
        self._nonce = os.getpid()  # counted up per ping (mod 2**32)
        self._since: float | None = None  # when the outstanding ping was sent
        self._reply = b""
        address = server_address(store)
        if address is None:
            return
        self.port = address[1]
        try:
            self._sock = connect(*address, timeout=timeout)
        except OSError:
            self.close()
            return
        self.silent_for(self.FIRST_WAIT)

    @property
    def connected(self) -> bool:
        """A connection that no server closed, answered or not yet."""
        return self._sock is not None

    def silent_for(self, wait: float) -> float | None:
        sock = self._sock
        if sock is None:
            return None
        try:
            if self._since is None:
                self._nonce = (self._nonce + 1) & 0xFFFFFFFF
                sock.sendall(struct.pack("=BI", PING, self._nonce))
                self._since = self._clock()
            sock.settimeout(wait)
            while len(self._reply) < 4:
                chunk = sock.recv(4 - len(self._reply))
                if not chunk:  # the server closed the connection: the store is going
                    self.close()
                    return None
                self._reply += chunk
        except TimeoutError:
            return self._clock() - self._since if self._since is not None else None
        except OSError:
            self.close()
            return None
        answer, self._reply, self._since = struct.unpack("=I", self._reply)[0], b"", None
        if answer != self._nonce:  # not a PING this server understands
            self.close()
            return None
        self.answers = True
        return 0.0

    def copy_connection(self) -> tuple[socket.socket, int] | None:
        """The connection on a second fd (``dup``: no second connection to the server), which
        outlives ``close``, with the store's port; None without a connection."""
        if self._sock is None or self.port is None:
            return None
        try:
            return self._sock.dup(), self.port
        except OSError:
            return None

    def close(self) -> None:
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.close()
            self._sock = None


def cut_connections(store: Store) -> int:
    """Shut down every socket of this process connected to ``store``'s server; how many.

    A thread blocked on a frozen server (``StorePing``) is then woken by its own socket's
    end, with the error a closed store gives, as if the server had died. Only connections
    to the server's own address and port are touched (Linux: /proc/self/fd); the store is
    useless to this process by then. Elsewhere, or for a store that is not a
    ``TCPStore``, nothing is cut.
    """
    address = server_address(store)
    if address is None:
        return 0
    host, port = address
    try:
        addresses = {info[4][0] for info in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)}
        fds = os.listdir("/proc/self/fd")
    except OSError:
        return 0
    addresses |= {f"::ffff:{a}" for a in addresses if ":" not in a}  # as a dual-stack socket names them
    cut = 0
    for name in fds:
        fd = int(name)
        try:
            if not os.readlink(f"/proc/self/fd/{fd}").startswith("socket:"):
                continue
            copy = os.dup(fd)
        except OSError:
            continue
        try:
            sock = socket.socket(fileno=copy)
        except OSError:  # a socket Python cannot wrap: not a store connection
            os.close(copy)
            continue
        with sock, contextlib.suppress(OSError):
            if sock.family not in (socket.AF_INET, socket.AF_INET6) or sock.type != socket.SOCK_STREAM:
                continue
            peer = sock.getpeername()
            if peer[1] == port and peer[0] in addresses:
                sock.shutdown(socket.SHUT_RDWR)  # the fd it was duplicated from shares the socket
                cut += 1
    return cut
