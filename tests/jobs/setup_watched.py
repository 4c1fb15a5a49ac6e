"""A peer lost while the process group is being created (issue 9, item 4).

    python setup_watched.py            (the driver)
    python setup_watched.py rank R P   (one rank; the driver starts them)

The driver starts ranks 0 and 1 of a 3-rank job with torchrun's variables (rank 2 never
comes, so both wait inside ``init_process_group``), and SIGKILLs rank 1 once it waits
there. tether watches the creation, so rank 0 learns that rank 1 is lost and its ladder
ends it within ``grace``; before, it waited for the store's timeout (5 minutes).

The kill waits until both ranks registered with tether's channel (the pids record on the
store): a rank killed before that never existed for tether, like rank 2. On this machine
that takes well under the 1.5 s the driver used to sleep instead; with a resolver that
never answers, c10d's reverse lookup of each new store connection (``socket.cpp``) makes
it about 10 s per connection.
"""

import datetime
import os
import signal
import socket
import subprocess
import sys
import time

from lifecycle_common import emit, free_port

GRACE = 2.0


def rank_main(rank: int, port: int) -> None:
    import tether

    emit("initializing", rank=rank, time=time.time())
    tether.initialize("gloo", grace=GRACE)
    emit("initialized", rank=rank)  # never: rank 2 does not come


def registered(port: int, within: float) -> None:
    """Wait until ranks 0 and 1 are in tether's pids record on the job's store."""
    from torch.distributed import TCPStore

    from tether._core.channel import Channel
    from tether._core.liveness import pid_namespace

    store = TCPStore("127.0.0.1", port, is_master=False, timeout=datetime.timedelta(seconds=within))
    channel = Channel(store, Channel.make_prefix(f"env-{port}-r0", 1), -1, 3)  # _env.py's job id; a reader only
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if {0, 1} <= channel.host_pids(socket.gethostname(), pid_namespace()).keys():
            return
        time.sleep(0.05)
    raise AssertionError(f"ranks 0 and 1 did not register within {within} s")


def driver() -> None:
    port = free_port()
    procs = []
    for rank in (0, 1):
        env = {
            **os.environ,
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": "3",
            "LOCAL_WORLD_SIZE": "3",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
        }
        cmd = [sys.executable, __file__, "rank", str(rank), str(port)]
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True))
    for proc in procs:  # each says it is about to initialize (torch imported)
        assert proc.stdout is not None
        line = proc.stdout.readline()
        sys.stdout.write(line)
        assert '"initializing"' in line, line
    registered(port, within=50.0)
    time.sleep(0.5)  # and both went on into init_process_group, waiting for rank 2
    procs[1].send_signal(signal.SIGKILL)
    killed = time.time()
    procs[1].wait()
    try:
        code = procs[0].wait(timeout=60)
    except subprocess.TimeoutExpired:
        procs[0].kill()
        code = None
    assert procs[0].stdout is not None
    sys.stdout.write(procs[0].stdout.read())
    emit("ended", code=code, after_kill=time.time() - killed)


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "rank":
        rank_main(int(sys.argv[2]), int(sys.argv[3]))
    else:
        driver()
