"""Two behaviours of ``tether.Checkpointer`` in real jobs (issue 12).

    python checkpoint_cases.py random first|resume OUT   (2 ranks, tether.spawn)
    python checkpoint_cases.py lowest OUT                (4 ranks, tether.spawn)
    python checkpoint_cases.py last OUT                  (2 ranks, tether.spawn)
    torchrun --nproc-per-node 2 checkpoint_cases.py last OUT
    python checkpoint_cases.py deferred quiet|meddle OUT  (2 ranks, tether.spawn)
    python checkpoint_cases.py unshared OUT              (2 ranks, tether.spawn)
    torchrun ... checkpoint_cases.py stopped OUT         (2 ranks, torchrun)

* ``random``: every rank starts from its own seeds and uses ``seed=None`` (no per-step
  seeding), so only the random states a periodic checkpoint saved can carry randomness
  over. ``first`` runs 3 steps (a save after step 2) and records the draws that follow
  that save; ``resume``, a fresh job seeded otherwise, resumes and records its first
  draws. They must be the same, rank by rank.
* ``lowest``: rank 0 raises in step 1; rank 1 reaches that step 0.1 s after ranks 2 and 3
  (which learn of the failure at once). The lowest survivor, rank 1, must write the
  emergency checkpoint.
* ``last``: the ~100 MB model of ``benchmarks/resume.py --big``; the loop's last step is a
  periodic save, and the function (the script, under torchrun) ends at once, with no
  ``ckpt.wait()``. The save must be complete on disk when the job has ended.
* ``deferred``: ~50 MB of parameters and as much SGD momentum, a save after every step,
  and each step's ``optimizer.step()`` is the first thing after the previous step's save:
  it must wait until the writer is done reading what it changes (written, or copied in a
  hurry). Rank 0 records its state at the
  end of each step and, after the last, compares every checkpoint with it (``checked``).
  ``meddle``: right after step 2's save began, a parameter is changed in place outside
  ``optimizer.step()``: that save must never hold the change: dropped, unless the writer
  wrote it before the change came.
* ``unshared``: a save after every step of 3, split across the 2 ranks; rank 1's part of
  step 1 vanishes once written (as on a directory that is not one for both ranks). Rank 0
  must drop that save, say why, and write the later ones alone.
* ``stopped``: rank 1's part of the save of step 1 is never posted (its writer returns
  without a word); rank 1 then waits in a barrier. Rank 0, its writer waiting for that
  part, gets a SIGTERM in its own code (a stop no peer's failure explains). Its process
  must end at once, not when its writer's wait runs out (``_ckpt_parts.WITHIN``): Python
  joins that thread before anything would post the stop.
"""

import os
import random
import sys
import time
from pathlib import Path

import numpy
import torch
from lifecycle_common import emit, raised

import tether

CASE = sys.argv[1]


def draws() -> list[float]:
    return [float(torch.rand(1).item()), random.random(), float(numpy.random.rand())]


def random_case(local_rank: int, phase: str, out: str) -> None:
    rank = tether.get_rank()
    base = 100 if phase == "first" else 900
    torch.manual_seed(base + rank)
    random.seed(base + 10 + rank)
    numpy.random.seed(base + 20 + rank)
    model = torch.nn.Linear(4, 1)
    ckpt = tether.Checkpointer({"model": model}, Path(out, "ckpt"), every=2, seed=None)
    if phase == "resume":
        start = ckpt.resume()
        emit("draws", rank=rank, phase=phase, step=start.step, values=draws())
        return
    for i in range(3):
        with ckpt.step(0, i), torch.no_grad():
            model.weight.add_(torch.rand(1, 4))  # the step draws too
        if i == 1:  # the save of step 2 was just taken
            emit("draws", rank=rank, phase=phase, step=2, values=draws())
    ckpt.wait()


def lowest_case(local_rank: int, out: str) -> None:
    rank = tether.get_rank()
    torch.manual_seed(0)
    model = tether.auto_model(torch.nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ckpt = tether.Checkpointer({"model": model, "optimizer": opt}, Path(out, "ckpt"))
    try:
        for i in range(3):
            with ckpt.step(0, i):
                if i == 1 and rank == 0:
                    raise RuntimeError("rank 0 broke at step 1")
                if i == 1 and rank == 1:
                    time.sleep(0.1)  # ranks 2 and 3 learn of the failure first
                model(torch.ones(2, 4)).sum().backward()
                opt.step()
                opt.zero_grad()
    except BaseException as exc:
        raised(rank, exc)
        raise


def last_case(local_rank: int, out: str) -> None:
    torch.manual_seed(0)
    model = tether.auto_model(torch.nn.Sequential(*[torch.nn.Linear(2048, 2048) for _ in range(6)]))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    ckpt = tether.Checkpointer({"model": model, "optimizer": opt}, Path(out, "ckpt"), every=2)
    for i in range(2):
        with ckpt.step(0, i):
            model(torch.ones(2, 2048)).sum().backward()
            opt.step()
            opt.zero_grad()
    emit("trained", rank=tether.get_rank(), step=ckpt.position.step)


def deferred_case(local_rank: int, mode: str, out: str) -> None:
    from tether import _ckpt_files

    rank = tether.get_rank()
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(2048, 2048) for _ in range(3)])
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    ckpt = tether.Checkpointer({"model": model, "optimizer": opt}, Path(out, "ckpt"), every=1)
    model(torch.full((1, 2048), 0.1)).sum().backward()  # gradients once, kept: every step moves every tensor
    recorded = {}
    for i in range(4):
        with ckpt.step(0, i):
            opt.step()  # at once after the previous step's save: its write may not be done
            if rank == 0:
                recorded[i + 1] = _clones(model, opt)
        if mode == "meddle" and i == 1:
            with torch.no_grad():
                model[0].weight.add_(0.1)  # outside optimizer.step(), while step 2's save is being written
    ckpt.wait()
    if rank != 0:
        return
    for step, path in sorted(_ckpt_files.steps(Path(out, "ckpt"))):
        got = _ckpt_files.read(path, 2, "replicated")
        assert got.state is not None, got.why
        state = got.state["objects"]
        saved = {
            **state["model"],
            **{f"momentum.{k}": v["momentum_buffer"] for k, v in state["optimizer"]["state"].items()},
        }
        same = sorted(saved) == sorted(recorded[step]) and all(torch.equal(saved[k], recorded[step][k]) for k in saved)
        emit("checked", step=step, same=same)


def unshared_case(local_rank: int, out: str) -> None:
    from tether import _ckpt_parts

    post = _ckpt_parts.post

    def vanishing(channel: object, client: object, step: int, part: int, written: object) -> None:
        if step == 1:
            (written_file,) = Path(out, "ckpt").glob(".tmp-step-00000001-*/tensors-1.bin")
            written_file.unlink()
        post(channel, client, step, part, written)  # type: ignore[arg-type]

    _ckpt_parts.post = vanishing  # type: ignore[assignment]
    torch.manual_seed(0)
    model = torch.nn.Linear(256, 256)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    ckpt = tether.Checkpointer({"model": model, "optimizer": opt}, Path(out, "ckpt"), every=1)
    model(torch.full((1, 256), 0.1)).sum().backward()
    for i in range(3):
        with ckpt.step(0, i):
            opt.step()
        ckpt.wait()
    emit("trained", rank=tether.get_rank(), step=ckpt.position.step)


def stopped_case(local_rank: int, out: str) -> None:
    import signal

    from tether import checkpoint

    rank = tether.get_rank()
    if rank == 1:
        checkpoint.Checkpointer._write_part = lambda self, save, released: released()  # type: ignore[method-assign]
    torch.manual_seed(0)
    model = torch.nn.Linear(256, 256)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    ckpt = tether.Checkpointer({"model": model, "optimizer": opt}, Path(out, "ckpt"), every=1, emergency=False)
    model(torch.full((1, 256), 0.1)).sum().backward()
    with ckpt.step(0, 0):
        opt.step()
    if rank == 1:
        tether.barrier()
        return
    time.sleep(0.5)  # rank 0's writer waits for rank 1's part meanwhile
    emit("stopping", rank=rank, at=time.time())
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(30)  # in its own code when the stop comes


def _clones(model: torch.nn.Module, opt: torch.optim.Optimizer) -> dict[str, torch.Tensor]:
    state = {k: v.clone() for k, v in model.state_dict().items()}
    for k, v in opt.state_dict()["state"].items():
        state[f"momentum.{k}"] = v["momentum_buffer"].clone()
    return state


if __name__ == "__main__":
    if CASE == "last" and "RANK" in os.environ:  # under torchrun: the script is the rank
        tether.initialize("gloo")
        last_case(tether.get_local_rank(), sys.argv[2])
        sys.exit(0)
    if CASE == "stopped":  # under torchrun
        tether.initialize("gloo")
        stopped_case(tether.get_local_rank(), sys.argv[2])
        sys.exit(0)
    try:
        if CASE == "last":
            tether.spawn("gloo", last_case, (sys.argv[2],), nproc_per_node=2)
        elif CASE == "deferred":
            tether.spawn("gloo", deferred_case, (sys.argv[2], sys.argv[3]), nproc_per_node=2)
        elif CASE == "unshared":
            tether.spawn("gloo", unshared_case, (sys.argv[2],), nproc_per_node=2)
        elif CASE == "random":
            tether.spawn("gloo", random_case, (sys.argv[2], sys.argv[3]), nproc_per_node=2)
        else:
            tether.spawn("gloo", lowest_case, (sys.argv[2],), nproc_per_node=4)
    except tether.JobFailed as exc:
        emit("launcher", exit_codes={str(k): v for k, v in exc.exit_codes.items()})
        raise
