"""Run a command under a DNS resolver that never answers: how a CI host's slow resolver looks.

    python tests/slow_resolver.py .venv/bin/python -m pytest -rf

c10d formats a socket's address with ``getnameinfo`` and no ``NI_NUMERICHOST`` (torch's
``socket.cpp``: for each new store connection, and in its timeout warnings): a reverse
lookup of ``::ffff:127.0.0.1``, which ``/etc/hosts`` does not list, so it goes to the
resolver. Here it answers in about a millisecond; a CI host once took long enough to fail a
test (``test_lifecycle.py``'s teardown test, 2026-12-04). Under this script each lookup
takes 10 s (``timeout:5 attempts:2``) and ends in ``EAI_AGAIN``, and c10d prints "The
hostname of the client socket cannot be retrieved. err=-3".

How: a UDP and a TCP socket bound to 127.0.0.53:53 that read nothing and answer nothing,
and the command run in a mount namespace of its own (``unshare -m``) whose
``/etc/resolv.conf`` names only that server. Needs root (the mount namespace and port 53);
the host's own resolver is left alone. Measured with it (2026-12-04, 2 cores): the default
suite took 1612 s and failed 2 tests, both since made independent of the connection time;
after that (at commit cb2031c) it passed whole: 348 passed, 89 skipped in 1627 s.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import tempfile

ADDRESS = ("127.0.0.53", 53)
RESOLV_CONF = f"nameserver {ADDRESS[0]}\noptions timeout:5 attempts:2\n"


def main(command: list[str]) -> int:
    if not command:
        raise SystemExit(__doc__)
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    with udp, tcp, tempfile.NamedTemporaryFile("w", suffix=".resolv.conf") as conf:
        udp.bind(ADDRESS)  # queries queue up unread: no answer, ever
        tcp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        tcp.bind(ADDRESS)
        tcp.listen(64)  # connections are accepted by the kernel and never served
        conf.write(RESOLV_CONF)
        conf.flush()
        inner = 'mount --bind "$0" /etc/resolv.conf && exec "$@"'
        return subprocess.call(["unshare", "-m", "sh", "-c", inner, conf.name, *command])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
