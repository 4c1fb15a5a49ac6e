"""A process that has imported torch once, and forks the first process of test jobs from itself.

Run as a script by ``Zygote`` below, which ``_harness`` uses (one per pytest process).
Importing torch takes 1.8-2.4 s of CPU on this machine, and a default test run started 691
interpreters on 2 cores, most of its CPU. A job's first process (``python
tests/jobs/x.py``, or torchrun's launcher: 250 of the 691) forked from here starts with
torch imported; the processes it starts itself (``tether.spawn``'s workers, torchrun's
workers) start as before, fresh interpreters, so what the tests check of them is unchanged.

A forked job differs from ``python script.py`` only in what an interpreter fixes at start:
the harness forks only a job whose environment agrees with this process's on every
variable read then (``STARTUP_PREFIXES``), and starts any other as before. This process
runs no thread but OpenBLAS's pool (numpy's, loaded with torch), which OpenBLAS stops
before a fork and starts again when needed.

Protocol, one connection per job on the abstract Unix socket named in ``argv[1]``: the
harness sends one JSON line (``argv``, ``cwd``, ``env``) with three file descriptors (the
job's stdin, stdout and stderr); this process answers ``{"pid": N}`` once forked, then
``{"status": S}`` (``os.waitpid``'s status) when the job's process ends. It exits when its
stdin (a pipe from the harness) closes, leaving running jobs to the harness.

``TETHER_TEST_FRESH=1`` in pytest's environment starts every job as before, in a fresh
interpreter: to compare, or to rule this process out of a failure.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import locale
import multiprocessing
import os
import runpy
import select
import selectors
import socket
import subprocess
import sys
import threading
import time
import types
import uuid
from typing import Any

PRELOAD = ("torch", "torch.distributed", "torch.multiprocessing", "torch.distributed.launcher.api")

# read by the interpreter, or by a library's native code, when the process starts or the
# library loads (OpenMP sizes its pool from OMP_NUM_THREADS then): a job that sets one of
# these differently must start a fresh interpreter
STARTUP_PREFIXES = ("PYTHON", "LD_", "OMP_", "KMP_", "GOMP_", "MKL_", "OPENBLAS_", "MALLOC_", "TORCH_CPP_")


def startup_variables(env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k.startswith(STARTUP_PREFIXES)}


def serve(name: str) -> tuple[dict[str, Any], list[int]]:
    """Answer jobs until the harness's pipe closes; return in a forked job's process only."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind("\0" + name)
    listener.listen(64)
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    jobs: dict[int, tuple[int, socket.socket]] = {}  # pidfd -> (pid, the job's connection)
    while True:
        ready, _, _ = select.select([sys.stdin, listener, *jobs], [], [])
        for item in ready:
            if item is sys.stdin:
                if not os.read(sys.stdin.fileno(), 4096):
                    sys.exit(0)
            elif item is listener:
                conn, _ = listener.accept()
                try:
                    request, fds = _receive(conn)
                except (OSError, EOFError, ValueError):  # a harness that gave up mid-request
                    conn.close()
                    continue
                pid = os.fork()
                if pid == 0:
                    listener.close()
                    conn.close()
                    for pidfd, (_, other) in jobs.items():
                        os.close(pidfd)
                        other.close()
                    return request, fds
                for fd in fds:
                    os.close(fd)
                jobs[os.pidfd_open(pid)] = (pid, conn)
                _answer(conn, {"pid": pid})
            else:
                pid, conn = jobs.pop(item)
                _, status = os.waitpid(pid, 0)
                os.close(item)
                _answer(conn, {"status": status})
                conn.close()


def _receive(conn: socket.socket) -> tuple[dict[str, Any], list[int]]:
    data, fds, _, _ = socket.recv_fds(conn, 1 << 20, 3)
    while not data.endswith(b"\n"):
        more = conn.recv(1 << 20)
        if not more:
            raise EOFError("the harness closed a job's connection mid-request")
        data += more
    return json.loads(data), fds


def _answer(conn: socket.socket, message: dict[str, int]) -> None:
    with contextlib.suppress(OSError):  # the harness gave up on the job (its test ended)
        conn.sendall(json.dumps(message).encode() + b"\n")


def become(request: dict[str, Any], fds: list[int]) -> None:
    """Turn this forked process into the job's: its own session, streams, directory, environment."""
    os.setsid()
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(request["cwd"])
    # multiprocessing took the zygote's directory for the interpreter's first one at import;
    # a spawned child reads it (the attribute is not in typeshed)
    multiprocessing.process.ORIGINAL_DIR = os.getcwd()  # type: ignore[attr-defined]
    os.environ.clear()
    os.environ.update(request["env"])
    # what a fresh interpreter draws at random and a fork copies (``random`` draws again by itself)
    import numpy  # imported with torch already

    multiprocessing.current_process().authkey = os.urandom(32)
    numpy.random.seed()
    argv = request["argv"][1:]
    ours = {__file__}  # the frames an uncaught exception's traceback leaves out
    try:
        if argv[0] == "-m":  # as ``python -m``: the directory first on the path
            sys.path[0] = os.getcwd()
            sys.argv = argv[1:]
            # what ``python -m`` runs (runpy's own, private since Python 2.7), in a fresh
            # ``__main__``: its traceback shows runpy's frames, as the interpreter's does
            sys.modules["__main__"] = types.ModuleType("__main__")
            runpy._run_module_as_main(argv[1])  # type: ignore[attr-defined]
        else:  # as ``python script.py``: the script's directory first on the path
            sys.path[0] = os.path.dirname(os.path.abspath(argv[0]))
            sys.argv = argv
            ours.add("<frozen runpy>")
            runpy.run_path(argv[0], run_name="__main__")
    except (SystemExit, KeyboardInterrupt):
        raise  # the interpreter ends the process as it would have (by SIGINT, for the second)
    except BaseException as error:
        # the traceback the interpreter would print, without this file's frames
        tb = error.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename in ours:
            tb = tb.tb_next
        if tb is not None:  # the hook prints the exception's own traceback, whatever it is given
            error.with_traceback(tb)
        sys.excepthook(type(error), error, error.__traceback__)
        sys.exit(1)


class ForkedJob:
    """A job forked by the zygote, read as ``subprocess.Popen(..., text=True)`` reads one."""

    def __init__(self, args: list[str], pid: int, conn: socket.socket, out: int, err: int) -> None:
        self.args = args
        self.pid = pid
        self.returncode: int | None = None
        self._conn = conn
        self._pending = b""
        self._streams = {out: bytearray(), err: bytearray()}
        self._open = {out, err}
        self._out, self._err = out, err

    def communicate(self, timeout: float | None = None) -> tuple[str, str]:
        """Read stdout and stderr to their ends and wait for the process, as ``Popen.communicate``."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with selectors.DefaultSelector() as chosen:
            for fd in self._open:
                chosen.register(fd, selectors.EVENT_READ)
            if self.returncode is None:
                chosen.register(self._conn, selectors.EVENT_READ)
            while self._open or self.returncode is None:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
                for key, _ in chosen.select(left):
                    if key.fileobj is self._conn:
                        self._read_status()
                        if self.returncode is not None:
                            chosen.unregister(self._conn)
                        continue
                    fd = key.fd
                    data = os.read(fd, 1 << 16)
                    if data:
                        self._streams[fd] += data
                    else:
                        chosen.unregister(fd)
                        os.close(fd)
                        self._open.discard(fd)
        self._conn.close()
        return _text(self._streams[self._out]), _text(self._streams[self._err])

    def _read_status(self) -> None:
        data = self._conn.recv(4096)
        if not data:
            raise RuntimeError(f"the zygote closed job {self.pid}'s connection without its exit status")
        self._pending += data
        while b"\n" in self._pending:
            line, self._pending = self._pending.split(b"\n", 1)
            message = json.loads(line)
            if "status" in message:
                self.returncode = os.waitstatus_to_exitcode(message["status"])


def _text(data: bytes) -> str:
    """As ``Popen``'s text mode: the locale's encoding, universal newlines."""
    return data.decode(locale.getpreferredencoding(False)).replace("\r\n", "\n").replace("\r", "\n")


class Zygote:
    """The harness's side: starts the zygote on the first job it may fork, and forks jobs."""

    def __init__(self, base_env: dict[str, str]) -> None:
        self._base_env = base_env
        self._name = f"tether-test-zygote-{uuid.uuid4().hex}"
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[str] | None = None

    def start(self, args: list[str], env: dict[str, str], cwd: str) -> ForkedJob | None:
        """The job forked from the zygote, or None where it must start a fresh interpreter."""
        if os.environ.get("TETHER_TEST_FRESH") == "1" or not self._forkable(args, env):
            return None
        with self._lock:
            if self._proc is None:
                self._proc = self._launch()
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.connect("\0" + self._name)
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        try:
            request = json.dumps({"argv": args, "cwd": cwd, "env": env}).encode() + b"\n"
            socket.send_fds(conn, [request], [0, out_w, err_w])
        finally:
            os.close(out_w)
            os.close(err_w)
        answer = b""
        while not answer.endswith(b"\n"):
            more = conn.recv(4096)
            if not more:
                raise RuntimeError("the zygote closed a job's connection before it forked")
            answer += more
        job = ForkedJob(args, json.loads(answer)["pid"], conn, out_r, err_r)
        return job

    def _forkable(self, args: list[str], env: dict[str, str]) -> bool:
        if len(args) < 2 or args[0] != sys.executable:
            return False
        module = args[2] if args[1] == "-m" and len(args) > 2 else None
        if module is None and args[1].startswith("-"):  # ``-c``, ``-X``: not a plain script
            return False
        theirs, mine = startup_variables(env), startup_variables(self._base_env)
        if module == "torch.distributed.run":
            # torchrun's launcher runs no tensor op; it reads OMP_NUM_THREADS from os.environ
            # to pass it on to its workers, which are fresh interpreters
            theirs.pop("OMP_NUM_THREADS", None)
            mine.pop("OMP_NUM_THREADS", None)
        return theirs == mine

    def _launch(self) -> subprocess.Popen[str]:
        proc = subprocess.Popen(
            [sys.executable, __file__, self._name],
            cwd="/",  # not the jobs' directory, which each job takes for itself (as the tests can see)
            env=self._base_env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert proc.stdout is not None
        if proc.stdout.readline() != "ready\n":
            raise RuntimeError(f"the test zygote did not start (exit {proc.wait()})")
        atexit.register(self._close, proc)
        return proc

    @staticmethod
    def _close(proc: subprocess.Popen[str]) -> None:
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.close()
        proc.stdout.close()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


if __name__ == "__main__":
    import importlib

    for module in PRELOAD:
        importlib.import_module(module)
    become(*serve(sys.argv[1]))
