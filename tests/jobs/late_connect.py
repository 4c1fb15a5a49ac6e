"""A connection to the job's store opened after the store's host died: ``late_connect.py``.

This process starts a store host (a plain Python process serving a ``TCPStore``), opens a
tether ``Channel`` on it with ``connect_within=2`` s, SIGKILLs the host, reaps it, and then
asks the channel for a new connection (``Channel.client``), as a thread that began late
would. c10d's clone retries its connect until the timeout of the connection it clones;
before the channel cloned its template, that was a year (``channel.FOREVER``), and the
call did not return (the test's bound ended it).

Prints ``PORT <port>``, then ``RAISED <type> <seconds> <first line of the message>`` or
``CONNECTED <seconds>``.
"""

from __future__ import annotations

import datetime
import os
import signal
import subprocess
import sys
import time

from lifecycle_common import free_port

CONNECT_WITHIN = 2.0

HOST = """
import datetime, sys
from torch.distributed import TCPStore
store = TCPStore("127.0.0.1", int(sys.argv[1]), 1, True, timeout=datetime.timedelta(seconds=30), wait_for_workers=False)
print("SERVING", flush=True)
sys.stdin.read()  # until its parent closes the pipe, or kills it
"""


def main() -> None:
    from torch.distributed import TCPStore

    from tether._core.channel import Channel

    port = free_port()
    host = subprocess.Popen([sys.executable, "-c", HOST, str(port)], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert host.stdout is not None and host.stdout.readline().strip() == b"SERVING"
        store = TCPStore("127.0.0.1", port, is_master=False, timeout=datetime.timedelta(seconds=30))
        channel = Channel(store, Channel.make_prefix("late-connect", 1), -1, 2, connect_within=CONNECT_WITHIN)
        channel.client()  # a connect while the host serves: at once
        os.write(1, f"PORT {port}\n".encode())
    finally:
        host.send_signal(signal.SIGKILL)
        host.wait()
    began = time.monotonic()
    try:
        channel.client()
    except Exception as exc:
        first = str(exc).splitlines()[0] if str(exc) else ""
        os.write(1, f"RAISED {type(exc).__name__} {time.monotonic() - began:.2f} {first}\n".encode())
    else:
        os.write(1, f"CONNECTED {time.monotonic() - began:.2f}\n".encode())


if __name__ == "__main__":
    main()
