"""one_rank_first / one_rank_only / barrier scenarios, each rank printing a RESULT line.

argv: LAUNCHER NPROC scenario=NAME [rank=W] [file=PATH] [port=P] (see core_common.py)

Scenarios:
    first-raises    rank W raises inside ``one_rank_first(rank=W)``
    first-thread    the same, with a non-daemon thread keeping rank W's process alive
    first-caught    rank W catches its own exception and then calls ``all_reduce``; with
                    ``linger=S`` the other ranks stay alive S seconds after their PeerFailure
    only-raises     ``one_rank_only(rank=W, with_barrier=True)``'s function raises
    order           ``one_rank_first(rank=W, local=LOCAL)`` happy path, logging to ``file``
    local-raises    ``one_rank_first(rank=W, local=True)`` raises on node ``node``'s working rank
    spent-keys      300 gates (barriers and ``one_rank_first`` blocks, the working rank
                    rotating); rank 0 prints ``KEYS {"before": ..., "after": ...}``: the
                    store's key count before them and once their keys are deleted (it
                    polls up to 10 s: the deletions run on the watchdog's janitor thread)
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any

from core_common import emit, launch, parse_params, result

import tether as idist


def message(rank: int) -> str:
    return f"download failed on rank {rank} (token 7f3a)"


def log(path: str, what: str, rank: int) -> None:
    with open(path, "a") as fp:
        fp.write(f"{what} {rank} {time.time():.6f}\n")
        fp.flush()


def _store() -> Any:
    from tether._core.runtime import current  # the job reaches into tether's store on purpose

    store = current().store
    assert store is not None, "the job needs tether's store"
    return store.clone()


def arrive(rank: int, working: int) -> None:
    """A rank other than the working one says it is about to wait for it."""
    if rank != working:
        _store().set(f"core/in/{rank}", "1")


def wait_for_the_others(working: int) -> None:
    """The working rank fails only once every other rank waits for it (keys, not sleeps).

    Without this, gloo's rendezvous could return on the working rank while a peer still
    finished it: the working rank's failure then ended that peer inside ``initialize``,
    a PeerFailure there, before this body could report it (seen in a fresh-clone run).
    """
    others = [f"core/in/{r}" for r in range(idist.get_world_size()) if r != working]
    if others:
        _store().wait(others)


def body(local_rank: int, params: dict[str, Any]) -> None:
    scenario = params["scenario"]
    working = int(params.get("rank", 0))
    state = params["_state"]
    rank = idist.get_rank()
    if scenario in ("first-raises", "first-thread"):
        state["phase"] = "one_rank_first"
        arrive(rank, working)
        with idist.one_rank_first(rank=working):
            state["phase"] = "block"
            if rank == working:
                wait_for_the_others(working)
                if scenario == "first-thread":
                    threading.Thread(target=time.sleep, args=(600,), name="keeps-alive", daemon=False).start()
                raise ValueError(message(rank))
        state["phase"] = "after"
    elif scenario == "first-caught":
        linger = float(params.get("linger", 0))
        state["phase"] = "one_rank_first"
        arrive(rank, working)
        try:
            with idist.one_rank_first(rank=working):
                state["phase"] = "block"
                if rank == working:
                    wait_for_the_others(working)
                    raise ValueError(message(rank))
        except ValueError:
            state["phase"], state["since"] = "all_reduce", time.time()
            idist.all_reduce(1)
        except idist.PeerFailure as exc:
            if linger:  # the survivors stay alive (a notebook, a caller that handles it)
                result(rank, exc, phase=state["phase"])
                state["reported"] = True
                time.sleep(linger)
            raise
        state["phase"] = "after"
    elif scenario == "only-raises":

        @idist.one_rank_only(rank=working, with_barrier=True)
        def save() -> None:
            wait_for_the_others(working)
            raise ValueError(message(rank))

        state["phase"] = "one_rank_only"
        arrive(rank, working)
        save()
        state["phase"] = "after"
    elif scenario == "order":
        local = bool(params.get("local", False))
        me = idist.get_local_rank() if local else rank
        state["phase"] = "one_rank_first"
        with idist.one_rank_first(rank=working, local=local):
            state["phase"] = "block"
            log(params["file"], "start", rank)
            if me == working:
                time.sleep(0.3)
            log(params["file"], "end", rank)
        state["phase"] = "barrier"
        idist.barrier()
        state["phase"] = "after"
    elif scenario == "local-raises":
        failing_node = int(params.get("node", 1))
        state["phase"] = "one_rank_first"
        with idist.one_rank_first(rank=working, local=True):
            state["phase"] = "block"
            if idist.get_local_rank() == working and idist.get_node_rank() == failing_node:
                raise ValueError(message(rank))
        state["phase"] = "barrier"
        idist.barrier()
        state["phase"] = "after"
    elif scenario == "spent-keys":
        store = _store()
        state["phase"] = "barrier"
        idist.barrier()
        before = store.num_keys()
        for i in range(150):
            idist.barrier()
            with idist.one_rank_first(rank=i % idist.get_world_size()):
                pass
        idist.barrier()
        deadline = time.monotonic() + 10
        while (after := store.num_keys()) > before + 4 and time.monotonic() < deadline:
            time.sleep(0.05)
        if rank == 0:
            emit("KEYS", {"before": before, "after": after})
        state["phase"] = "after"
    else:
        raise SystemExit(f"unknown scenario {scenario!r}")


if __name__ == "__main__":
    launcher, nproc, params = parse_params(sys.argv[1:])
    launch(launcher, nproc, params)
