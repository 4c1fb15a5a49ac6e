"""Shared by the ``core_*`` job scripts: launching a body four ways, and RESULT lines.

A job script defines ``body(local_rank, params)`` at module level and calls
``launch(launcher, nproc, params)``. Every rank reports how its body ended with one
machine-readable line on stdout (written in one ``os.write``, so lines of different processes never interleave)::

    RESULT {"rank": 1, "exc": "PeerFailure", "failing_rank": 0, "orig_type": "ValueError", ...}

and the launching process of ``tether.spawn``/``Parallel``-as-spawner reports ``LAUNCHER
{...}`` when it raised. ``tests/_core.py`` parses both.

Launchers:
    spawn           tether.spawn(...) in this process
    parallel-spawn  tether.Parallel(backend, nproc_per_node=N) in this process
    spawn-2nodes    two tether.spawn launchers (nnodes=2): this process is node 0 and
                    starts node 1 as a child process (params: ``port``)
    parallel        tether.Parallel(backend) under torchrun
    init            tether.initialize(backend) / tether.finalize() under torchrun
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import Any

import tether as idist

MAX_MSG = 400


def emit(tag: str, data: dict[str, Any]) -> None:
    line = f"{tag} {json.dumps(data, sort_keys=True)}\n".encode()
    os.write(1, line)


def describe(exc: BaseException | None) -> dict[str, Any]:
    """What a RESULT line says about an exception (None: the body returned)."""
    if exc is None:
        return {"exc": None}
    data: dict[str, Any] = {
        "exc": type(exc).__name__,
        "msg": str(exc)[:MAX_MSG],
        "tether_error": isinstance(exc, idist.TetherError),
        "peer_failure": isinstance(exc, idist.PeerFailure),
    }
    if isinstance(exc, idist.PeerFailure):
        data.update(failing_rank=exc.rank, orig_type=exc.exc_type, orig_msg=exc.message[:MAX_MSG])
    return data


def result(rank: int, exc: BaseException | None, **extra: Any) -> None:
    emit("RESULT", {"rank": rank, "time": time.time(), "pid": os.getpid(), **describe(exc), **extra})


def run(local_rank: int, params: dict[str, Any]) -> Any:
    """Run the job script's ``body`` (``__main__.body``); its rank prints one RESULT line.

    Module level, so that ``tether.spawn`` can pickle it by name; ``params["_state"]``
    lets the body say how far it got (``phase``, and ``since``: when the wait that counts
    began) or that it printed its RESULT line itself (``reported``). The exception is
    re-raised.
    """
    body = sys.modules["__main__"].body
    state: dict[str, Any] = {"phase": "start"}
    try:
        out = body(local_rank, {**params, "_state": state})
    except BaseException as exc:
        if not state.get("reported"):
            result(idist.get_rank(), exc, phase=state["phase"], waited=_waited(state))
        raise
    if not state.get("reported"):
        result(idist.get_rank(), None, phase=state["phase"], waited=_waited(state))
    return out


def _waited(state: dict[str, Any]) -> float | None:
    """Seconds since the body set ``state["since"]`` (when it entered the wait that counts)."""
    return None if "since" not in state else round(time.time() - state["since"], 3)


def parse_params(argv: list[str]) -> tuple[str, int, dict[str, Any]]:
    """argv: LAUNCHER NPROC [key=value ...]; values are JSON when they parse, else str."""
    launcher, nproc = argv[0], int(argv[1])
    params: dict[str, Any] = {}
    for item in argv[2:]:
        key, _, value = item.partition("=")
        try:
            params[key] = json.loads(value)
        except ValueError:
            params[key] = value
    return launcher, nproc, params


def launch(launcher: str, nproc: int, params: dict[str, Any], **kw: Any) -> None:
    """Run ``__main__.body`` on every rank through ``launcher``; exits 1 when the launcher raised."""
    body = run
    if launcher == "spawn":
        try:
            idist.spawn("gloo", body, (params,), nproc_per_node=nproc, **kw)
        except BaseException as exc:
            _launcher_failed(exc)
    elif launcher == "parallel-spawn":
        try:
            with idist.Parallel("gloo", nproc_per_node=nproc, **kw) as parallel:
                parallel.run(body, params)
        except BaseException as exc:
            _launcher_failed(exc)
    elif launcher in ("spawn-2nodes", "spawn-node1"):
        node = 0 if launcher == "spawn-2nodes" else 1
        kw.update(nnodes=2, node_rank=node, master_port=int(params["port"]))
        other = None
        if node == 0:
            script = os.path.abspath(sys.modules["__main__"].__file__ or "")
            other = subprocess.Popen([sys.executable, script, "spawn-node1", *sys.argv[2:]])
        try:
            idist.spawn("gloo", body, (params,), nproc_per_node=nproc, **kw)
        except BaseException as exc:
            if other is not None:
                other.wait(timeout=120)
            _launcher_failed(exc)
        if other is not None and other.wait(timeout=120):
            emit("LAUNCHER", {"exc": "node1", "msg": f"node 1 launcher exited with {other.returncode}"})
            sys.exit(1)
    elif launcher == "parallel":
        with idist.Parallel("gloo", **kw) as parallel:
            parallel.run(body, params)
    elif launcher == "init":
        idist.initialize("gloo", **kw)
        try:
            body(idist.get_local_rank(), params)
        finally:
            idist.finalize()
    else:
        raise SystemExit(f"unknown launcher {launcher!r}")
    emit("LAUNCHER", {"exc": None, "pid": os.getpid()})


def _launcher_failed(exc: BaseException) -> None:
    data = {**describe(exc), "pid": os.getpid()}
    if isinstance(exc, idist.JobFailed):
        rec = exc.record
        data.update(
            exit_codes={str(k): v for k, v in exc.exit_codes.items()},
            root_rank=rec.rank if rec else None,
            root_type=rec.exc_type if rec else None,
            root_msg=rec.message if rec else None,
        )
    emit("LAUNCHER", data)
    sys.exit(1)
