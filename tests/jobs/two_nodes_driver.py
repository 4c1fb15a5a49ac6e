"""Start both nodes of a two-node job on loopback, as two launcher processes, and wait.

    python two_nodes_driver.py {spawn,torchrun} CASE [--kill-node K] [--unshare-node K] [--bound S]

Each node is its own launcher process (``tether.spawn(nnodes=2, node_rank=K)``, or
``torchrun --nnodes 2 --node_rank K`` with the static rendezvous), both children of this
driver, so the whole job lives in the driver's session and a test can check that
nothing of it is left. With ``--kill-node K`` the driver SIGKILLs node K's launcher once
every rank is ready. With ``--unshare-node K`` node K runs in a pid namespace of its own
(``UNSHARE``), under the same host name: as containers that share their machine's name
do. Its namespace's first process is its launcher: when that ends, the kernel kills every
process left in it. It prints ``EVENT`` lines (``kill``, ``node_exit``) like the ranks,
and exits 0 only if both nodes did. This script imports no torch: it starts fast.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from lifecycle_common import free_port

JOB = Path(__file__).resolve().parent / "two_nodes_job.py"
# a user namespace too, so that no root is needed; /proc mounted anew shows the new pids
UNSHARE = ["unshare", "--user", "--map-root-user", "--pid", "--fork", "--mount-proc"]


def emit(**data: object) -> None:
    os.write(1, f"EVENT {json.dumps(data, sort_keys=True)}\n".encode())


def node_command(launcher: str, node: int, port: int, case: str, out: str) -> list[str]:
    job = [str(JOB), launcher, "--case", case, "--out", out]
    if launcher == "spawn":
        return [sys.executable, *job, "--node-rank", str(node), "--port", str(port)]
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes",
        "2",
        "--node_rank",
        str(node),
        "--nproc_per_node",
        "2",
        "--rdzv_backend",
        "static",
        "--master_addr",
        "127.0.0.1",
        "--master_port",
        str(port),
        "--monitor_interval",
        "0.1",
        *job,
    ]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("launcher", choices=["spawn", "torchrun"])
    parser.add_argument("case")
    parser.add_argument("--kill-node", type=int, default=None)
    parser.add_argument("--unshare-node", type=int, default=None)
    parser.add_argument("--bound", type=float, default=240.0)
    args = parser.parse_args()
    port = free_port()
    deadline = time.monotonic() + args.bound
    with tempfile.TemporaryDirectory(prefix="tether-two-nodes-") as out:
        commands = [node_command(args.launcher, k, port, args.case, out) for k in (0, 1)]
        if args.unshare_node is not None:
            probe = subprocess.run([*UNSHARE, "true"], capture_output=True, text=True)
            if probe.returncode != 0:  # no user or pid namespaces on this machine
                emit(event="no_unshare", why=probe.stderr.strip())
                return 77
            commands[args.unshare_node][:0] = UNSHARE
        nodes = [subprocess.Popen(command) for command in commands]
        emit(event="nodes", pids=[p.pid for p in nodes], port=port)
        if args.kill_node is not None:
            while len(list(Path(out).glob("ready.*"))) < 4:
                if time.monotonic() > deadline or any(p.poll() is not None for p in nodes):
                    emit(event="never_ready", codes=[p.poll() for p in nodes])
                    break
                time.sleep(0.02)
            else:
                time.sleep(0.3)  # the surviving node's ranks enter their barrier
                nodes[args.kill_node].send_signal(signal.SIGKILL)
                emit(event="kill", node=args.kill_node, t=time.time())
        codes = []
        for k, proc in enumerate(nodes):
            try:
                code = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                code = proc.wait()
                emit(event="node_timeout", node=k)
            codes.append(code)
            emit(event="node_exit", node=k, code=code, t=time.time())
    return 0 if codes == [0, 0] else 1


if __name__ == "__main__":
    sys.exit(main())
