"""Deterministic DDP training that a failure interrupts and torchrun restarts (issue 12).

    torchrun --max-restarts 1 ... resume_job.py OUT [--fail-step K --fail-rank R] [--every N]
    python resume_job.py OUT --spawn [...]     (tether.spawn(..., max_restarts=1), 2 ranks)

2 epochs of a shuffled data set (DistributedSampler, seed 0) with a random augmentation
(noise drawn as a sample is fetched: in the rank without workers, else in a DataLoader
worker) through a DDP model from ``auto_model``, its learning rate decayed by a scheduler
stepped after the optimizer; ``tether.Checkpointer`` saves every ``--every`` steps (default: none,
emergency only) into ``OUT/ckpt``. In the first attempt only (torchrun's restart count
0), rank R raises at step K before its forward, while the others wait in backward().
Every rank appends one line per completed step to ``OUT/trained.<rank>``: attempt,
epoch, iteration, step, and the sample indices it trained. Rank 0 saves the final
weights to ``OUT/final.pt``.

``--late-allreduce`` (first attempt only): on the other ranks, the backend hands back the
gradient all-reduce of step K-1 (the last step rank R finishes) only once the failure has
reached the rank, as on a loaded machine where the failure's notice overtakes the gloo
thread that completes the all-reduce. The all-reduce itself has completed: its result is
unchanged, only late: ``--late-by`` seconds after the notice (0.01; at 0.6 torchrun's
SIGTERM, 0.1 s after rank R exited, lands first).

``--fail-between K`` (first attempt only): rank R raises after step K, outside any step,
while the others wait for it in a barrier there, as in an evaluation between steps.
``--term-step K``: rank R SIGTERMs itself at step K, before its forward (one rank
stopped, not the job).
``--stop-in-optimizer K``: every rank SIGTERMs itself inside ``optimizer.step()`` of
step K+1, after the Checkpointer's pre-hook, where a preemption may land.
``--stop-at K``: after step K, rank 0 SIGTERMs the launcher (torchrun's agent, or
``tether.spawn``'s), which stops every rank with SIGTERM, as a scheduler's preemption; the
ranks wait for it between steps. The job is then run again by hand, as a scheduler would.
With ``--stop-group`` the SIGTERM goes to the launcher's whole process group instead (SLURM's
``scancel``, ``timeout``, systemd's stop): every process of the job gets it at once, the
DataLoader's workers too (``--loader-workers N``).

``--zero``: the optimizer is a ``ZeroRedundancyOptimizer`` (SGD with the same settings),
whose state each rank holds a part of: periodic saves gather it on rank 0, and no
emergency save is possible.

``--engine``: the same training as an ignite ``Engine`` with ``ckpt.attach(trainer)``: the
process function trains (and fails at step K), the scheduler steps and the log line is
written in ``ITERATION_COMPLETED`` handlers added after ``attach`` (inside the step, as
the Checkpointer keeps its own handler last), the sampler's epoch is set (and the
training DataLoader's generator seeded) at ``EPOCH_STARTED``, and ``--evaluate``'s pass
runs at ``EPOCH_COMPLETED``. It trains what the plain loop trains, bitwise.

``--epoch-scheduler``: the scheduler steps once an epoch, after its last step (the plain
loop: after the epoch's loop; ``--engine``: at ``EPOCH_COMPLETED``), not after each step.

``--late-register`` (first attempt only): on the other ranks, tether's guard registers
that all-reduce's future with the watchdog only once the failure has reached the rank, as
when the main thread is preempted between issuing the all-reduce and registering it.
"""

import argparse
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler

import tether


class Noisy(Dataset[tuple[int, torch.Tensor, torch.Tensor]]):
    """``(index, x + noise, y)``: the noise is drawn from torch's generator as the sample is fetched."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self.x, self.y = x, y

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[int, torch.Tensor, torch.Tensor]:
        return i, self.x[i] + 0.01 * torch.randn(self.x.shape[1]), self.y[i]


parser = argparse.ArgumentParser()
parser.add_argument("out")
parser.add_argument("--fail-step", type=int, default=-1)
parser.add_argument("--fail-rank", type=int, default=1)
parser.add_argument("--every", type=int, default=None)
parser.add_argument("--spawn", action="store_true")
parser.add_argument("--zero", action="store_true", help="a ZeroRedundancyOptimizer")
parser.add_argument("--kill-in-save", choices=["periodic", "emergency", "part"], default=None)
parser.add_argument("--late-allreduce", action="store_true")
parser.add_argument("--late-by", type=float, default=0.01, help="seconds after the notice (--late-allreduce)")
parser.add_argument("--late-register", action="store_true")
parser.add_argument("--sleep-at", type=int, default=-1, help="rank 0 sleeps 1 s in its code at this step (attempt 0)")
parser.add_argument(
    "--fail-between",
    type=int,
    default=-1,
    help="rank R raises after step K, between steps, while the others wait in a barrier there (attempt 0)",
)
parser.add_argument(
    "--stop-at",
    type=int,
    default=-1,
    help="after step K rank 0 SIGTERMs the launcher, as a scheduler's preemption; every rank waits between steps",
)
parser.add_argument("--stop-group", action="store_true", help="--stop-at SIGTERMs the launcher's process group")
parser.add_argument("--engine", action="store_true", help="the same training as an ignite Engine")
parser.add_argument(
    "--epoch-scheduler", action="store_true", help="the scheduler steps once an epoch, at its end (not each step)"
)
parser.add_argument(
    "--accumulate", type=int, default=1, help="--engine: the optimizer steps every K iterations, as ignite's trainer"
)
parser.add_argument("--loader-workers", type=int, default=0, help="the DataLoader's num_workers")
parser.add_argument(
    "--evaluate",
    action="store_true",
    help="an evaluation after each epoch (its DataLoader draws from torch's generator); the training "
    "DataLoader has a generator of its own, seeded at each epoch, as tether.checkpoint's docstring says",
)
parser.add_argument(
    "--stop-in-optimizer",
    type=int,
    default=-1,
    help="every rank SIGTERMs itself inside optimizer.step() of step K+1, as a preemption can land (attempt 0)",
)
parser.add_argument(
    "--term-step",
    type=int,
    default=-1,
    help="rank R SIGTERMs itself at step K, before its forward (attempt 0): one rank stopped, not the job",
)
parser.add_argument(
    "--slow-save",
    type=int,
    default=-1,
    help="rank 0's writer of the periodic save of step K sleeps 1.5 s after state.pt (attempt 0): still being written",
)
parser.add_argument(
    "--settle-before-fail",
    action="store_true",
    help="the failing rank waits for its part of a periodic save still being written before it raises",
)


def slow_save(step: int) -> None:
    """rank 0's periodic save of ``step`` stays on its way 1.5 s: a failure comes meanwhile (attempt 0)."""
    from tether import checkpoint

    original = checkpoint.torch.save

    def save(obj: object, f: object, *a: object, **kw: object) -> None:
        original(obj, f, *a, **kw)  # type: ignore[arg-type]
        position = obj.get("position") if isinstance(obj, dict) else None
        periodic = threading.current_thread().name == "tether-checkpoint"
        if periodic and position is not None and position["step"] == step and tether.get_rank() == 0:
            time.sleep(1.5)

    checkpoint.torch.save = save  # type: ignore[assignment]


LATE = threading.Event()  # set around the backward() whose all-reduce is handed back late
LATE_REGISTER = threading.Event()  # set around the backward() whose all-reduce is registered late


def kill_in_save(kind: str, step: int) -> None:
    """Fault injection: SIGKILL rank 0 in the middle of writing a checkpoint (first attempt only).

    Wraps the Checkpointer's writer: ``state.pt`` is written, the manifest not yet. ``part``:
    SIGKILL rank 1 as it starts its part of the periodic save of ``step`` (it writes none).
    """
    from tether import checkpoint

    if kind == "part":
        save_async = checkpoint.Checkpointer._save_async

        def part(self: checkpoint.Checkpointer, position: Any, randomness: Any, tmp: Path, parts: int) -> None:
            if position.step == step and tether.get_rank() == 1:
                # on the main thread, once rank 0's writer has begun its own part: torchrun's
                # SIGTERM comes 0.1 s after this death, and rank 0, slower under load, took it
                # before it started that writer (no periodic save to abandon: 1 run in ~12).
                # Killed in its own writer, after that wait, rank 1 trained step 9 meanwhile
                deadline = time.monotonic() + 10.0
                while not (tmp / "tensors.bin").exists() and time.monotonic() < deadline:
                    time.sleep(0.002)
                os.kill(os.getpid(), signal.SIGKILL)
            save_async(self, position, randomness, tmp, parts)

        checkpoint.Checkpointer._save_async = part  # type: ignore[method-assign]
        return
    original = checkpoint.torch.save

    def save(obj: object, f: object, *a: object, **kw: object) -> None:
        original(obj, f, *a, **kw)  # type: ignore[arg-type]
        position = obj.get("position") if isinstance(obj, dict) else None
        if position is None or tether.get_rank() != 0:
            return  # not a checkpoint (the final weights), or not the rank to kill
        periodic = threading.current_thread().name == "tether-checkpoint"
        if (kind == "periodic" and periodic and position["step"] == step) or (kind == "emergency" and not periodic):
            os.kill(os.getpid(), signal.SIGKILL)

    checkpoint.torch.save = save  # type: ignore[assignment]


def late_allreduce(args: argparse.Namespace) -> None:
    """Fault injection: an all-reduce issued while ``LATE`` is set completes on time, but its
    future is completed only after this rank's watchdog has the failure (10 ms later).

    At ``ProcessGroup.allreduce`` and ``ProcessGroupGloo.allreduce`` (Python's calls),
    below whatever tether puts between DDP's reducer and the group.
    """
    import time

    from tether._core import context

    class LateWork:
        def __init__(self, work: object) -> None:
            self.work = work

        def __getattr__(self, name: str) -> object:
            return getattr(self.work, name)

        def get_future(self) -> torch.futures.Future[object]:
            real = self.work.get_future()  # type: ignore[attr-defined]
            late: torch.futures.Future[object] = torch.futures.Future()
            ctx = context.peek()
            watchdog = ctx.watchdog if ctx is not None else None

            def hand_over() -> None:
                real.wait()  # the all-reduce itself: complete
                until = time.monotonic() + 10.0
                while watchdog is not None and watchdog.failure is None and time.monotonic() < until:
                    time.sleep(0.001)
                time.sleep(args.late_by)
                try:
                    late.set_result(real.value())
                except Exception as exc:
                    late.set_exception(exc)
                sys.stderr.write(f"resume_job: rank {tether.get_rank()}: an all-reduce handed back late\n")

            threading.Thread(target=hand_over, daemon=True).start()
            return late

    def late(original: Any) -> Any:
        def allreduce(self: object, *a: object, **kw: object) -> object:
            work = original(self, *a, **kw)
            if LATE.is_set() and tether.get_rank() != args.fail_rank:
                LATE.clear()  # one all-reduce: the bucket's
                return LateWork(work)
            return work

        return allreduce

    # Python's calls on the group or on its gloo backend, whichever tether's guard makes
    for cls in (torch.distributed.ProcessGroup, torch.distributed.ProcessGroupGloo):
        cls.allreduce = late(cls.allreduce)


def late_register(args: argparse.Namespace) -> None:
    """Fault injection: the guard's future for an all-reduce issued while ``LATE_REGISTER`` is
    set is added to the watchdog's ``Failables`` only after the failure has reached this rank."""
    import time

    from tether._core import context
    from tether._core.futures import Failables

    original = Failables.add

    def add(self: Failables, *a: Any, **kw: Any) -> None:
        ctx = context.peek()
        watchdog = ctx.watchdog if ctx is not None else None
        if LATE_REGISTER.is_set() and watchdog is not None and tether.get_rank() != args.fail_rank:
            LATE_REGISTER.clear()  # one future: the bucket's
            until = time.monotonic() + 10.0
            while watchdog.failure is None and time.monotonic() < until:
                time.sleep(0.001)
            sys.stderr.write(f"resume_job: rank {tether.get_rank()}: an all-reduce registered late\n")
        original(self, *a, **kw)

    Failables.add = add  # type: ignore[method-assign]


def train(local_rank: int, args: argparse.Namespace) -> None:
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    if args.kill_in_save and attempt == 0:
        kill_in_save(args.kill_in_save, args.fail_step)
    if args.slow_save >= 0 and attempt == 0:
        slow_save(args.slow_save)
    if args.late_allreduce and attempt == 0:
        late_allreduce(args)
    if args.late_register and attempt == 0:
        late_register(args)
    rank, world = tether.get_rank(), tether.get_world_size()
    gen = torch.Generator().manual_seed(1234)
    x = torch.randn(64, 8, generator=gen)
    y = x @ torch.randn(8, 1, generator=gen) + 0.1
    data = Noisy(x, y)
    sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=0)
    own = torch.Generator() if args.evaluate else None
    loader = DataLoader(data, batch_size=4, sampler=sampler, num_workers=args.loader_workers, generator=own)

    torch.manual_seed(0)
    model = tether.auto_model(
        torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Dropout(0.1), torch.nn.Linear(16, 1))
    )
    if args.zero:
        from torch.distributed.optim import ZeroRedundancyOptimizer

        opt: torch.optim.Optimizer = ZeroRedundancyOptimizer(
            model.parameters(), optimizer_class=torch.optim.SGD, lr=0.05, momentum=0.9
        )
    else:
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    # a learning rate that decays step by step: the scheduler steps after the optimizer
    scheduler = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 0.97**step)
    objects = {"model": model, "optimizer": opt, "scheduler": scheduler}
    ckpt = tether.Checkpointer(objects, Path(args.out, "ckpt"), every=args.every)
    if attempt == 0 and args.stop_in_optimizer >= 0:

        def stop_in_optimizer(*_: Any) -> None:  # runs after the Checkpointer's own pre-hook
            if ckpt.position.step == args.stop_in_optimizer:
                signal.raise_signal(signal.SIGTERM)

        opt.register_step_pre_hook(stop_in_optimizer)
    if args.engine:
        train_engine(args, ckpt, model, opt, scheduler, loader, own)
        return
    start = ckpt.resume()
    with open(Path(args.out, f"trained.{rank}"), "a") as log:
        for epoch in range(start.epoch, 2):
            sampler.set_epoch(epoch)
            if own is not None:
                own.manual_seed(epoch)
            for i, (idx, xb, yb) in enumerate(loader):
                if start.skips(epoch, i):
                    continue
                with ckpt.step(epoch, i):
                    if attempt == 0 and ckpt.position.step == args.fail_step and rank == args.fail_rank:
                        if args.settle_before_fail:
                            # a step here lasts milliseconds: the save two steps back may still be
                            # on its way, and a peer's failure abandons a save with a part missing
                            ckpt.wait()
                        raise RuntimeError(f"injected failure at step {args.fail_step} on rank {rank}")
                    if attempt == 0 and ckpt.position.step == args.term_step and rank == args.fail_rank:
                        signal.raise_signal(signal.SIGTERM)  # an operator's kill, a pod's eviction
                    if attempt == 0 and ckpt.position.step == args.sleep_at and rank == 0:
                        time.sleep(1.0)  # in the user's code, not a tether call, when a launcher's SIGTERM comes
                    loss = (model(xb) - yb).pow(2).mean()
                    if attempt == 0 and ckpt.position.step == args.fail_step - 1:  # rank R's last step
                        if args.late_allreduce:
                            LATE.set()  # its peers' all-reduce is handed back late
                        if args.late_register:
                            LATE_REGISTER.set()  # its peers register that all-reduce late
                    try:
                        loss.backward()
                    finally:
                        LATE.clear()
                        LATE_REGISTER.clear()
                    opt.step()
                    if not args.epoch_scheduler:
                        scheduler.step()
                    opt.zero_grad()
                    # logged inside the step: a rank killed by its own periodic save (which
                    # starts when the step ends) has logged what it trained
                    step = ckpt.position.step + 1
                    line = {"attempt": attempt, "epoch": epoch, "it": i, "step": step, "idx": idx.tolist()}
                    log.write(json.dumps(line) + "\n")
                    log.flush()
                if attempt == 0 and ckpt.position.step == args.fail_between:
                    if rank == args.fail_rank:
                        raise RuntimeError(f"injected failure after step {args.fail_between} on rank {rank}")
                    tether.barrier()  # as an evaluation's collective between steps: the failure meets it here
                if ckpt.position.step == args.stop_at:  # a restarted job resumes past it: never again
                    tether.barrier()  # every rank has logged step K (a SIGTERM in a step may cut its log)
                    if rank == 0:
                        launcher = int(os.environ.get("RESUME_JOB_LAUNCHER", os.getppid()))  # torchrun's agent
                        if args.stop_group:
                            os.killpg(os.getpgid(launcher), signal.SIGTERM)
                        else:
                            os.kill(launcher, signal.SIGTERM)  # it stops every rank with SIGTERM
                    time.sleep(60)  # between steps, where that SIGTERM finds every rank
            if args.epoch_scheduler:
                scheduler.step()
            if args.evaluate:
                with torch.no_grad():
                    for _, xv, _ in DataLoader(data, batch_size=16):  # its iterator draws a seed
                        model(xv)
    ckpt.wait()
    if rank == 0:
        torch.save(model.module.state_dict(), Path(args.out, "final.pt"))


def train_engine(
    args: argparse.Namespace,
    ckpt: tether.Checkpointer,
    model: torch.nn.Module,
    opt: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    loader: DataLoader[Any],
    own: torch.Generator | None,
) -> None:
    """``train``'s loop as an ignite Engine, its iterations the Checkpointer's steps (``--engine``)."""
    from ignite.engine import Engine, Events

    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    rank = tether.get_rank()

    def update(engine: Engine, batch: tuple[torch.Tensor, torch.Tensor, torch.Tensor]) -> list[int]:
        idx, xb, yb = batch
        if attempt == 0 and ckpt.position.step == args.fail_step and rank == args.fail_rank:
            if args.settle_before_fail:
                ckpt.wait()  # as in train()
            raise RuntimeError(f"injected failure at step {args.fail_step} on rank {rank}")
        if (engine.state.iteration - 1) % args.accumulate == 0:  # as ignite's create_supervised_trainer
            opt.zero_grad()
        loss = (model(xb) - yb).pow(2).mean() / args.accumulate
        loss.backward()
        if engine.state.iteration % args.accumulate == 0:
            opt.step()
        return idx.tolist()  # type: ignore[no-any-return]

    trainer = Engine(update)
    ckpt.attach(trainer)

    @trainer.on(Events.EPOCH_STARTED)
    def set_epoch(engine: Engine) -> None:
        loader.sampler.set_epoch(engine.state.epoch - 1)  # type: ignore[attr-defined]
        if own is not None:
            own.manual_seed(engine.state.epoch - 1)

    # added after attach: the Checkpointer's handler, which ends the step, still comes last
    if args.epoch_scheduler:
        trainer.add_event_handler(Events.EPOCH_COMPLETED, lambda engine: scheduler.step())
    else:
        trainer.add_event_handler(Events.ITERATION_COMPLETED(every=args.accumulate), lambda engine: scheduler.step())

    @trainer.on(Events.ITERATION_COMPLETED)
    def log_step(engine: Engine) -> None:
        state = engine.state
        epoch, it = state.epoch - 1, (state.iteration - 1) % state.epoch_length
        line = {"attempt": attempt, "epoch": epoch, "it": it, "step": ckpt.position.step + 1, "idx": state.output}
        with open(Path(args.out, f"trained.{rank}"), "a") as log:
            log.write(json.dumps(line) + "\n")

    if args.evaluate:

        @trainer.on(Events.EPOCH_COMPLETED)
        def evaluate(engine: Engine) -> None:
            with torch.no_grad():
                for _, xv, _ in DataLoader(loader.dataset, batch_size=16):  # its iterator draws a seed
                    model(xv)

    trainer.run(loader, max_epochs=2)
    ckpt.wait()
    if rank == 0:
        torch.save(model.module.state_dict(), Path(args.out, "final.pt"))  # type: ignore[operator]


if __name__ == "__main__":
    args = parser.parse_args()
    if args.spawn:
        os.environ["RESUME_JOB_LAUNCHER"] = str(os.getpid())  # for --stop-at: the workers' launcher
        tether.spawn("gloo", train, (args,), nproc_per_node=2, max_restarts=1)
    else:
        tether.initialize("gloo")
        train(tether.get_local_rank(), args)
        tether.finalize()
