"""A failure costs no progress: periodic checkpoints, an emergency one from a survivor, exact resume.

In data-parallel training every rank holds a full replica of the model and optimizer,
and tether knows the moment a peer fails, at a point where a survivor's replica is
consistent (DDP: ``backward()`` raised, so ``optimizer.step()`` has not run). One
survivor can therefore save the last completed step before it exits, and the restarted
job (torchrun ``--max-restarts``) continues from it::

    ckpt = tether.Checkpointer({"model": model, "optimizer": optimizer}, "ckpts", every=100)
    start = ckpt.resume()                      # Position(epoch=0, iteration=0) on a fresh start
    for epoch in range(start.epoch, epochs):
        sampler.set_epoch(epoch)
        for i, batch in enumerate(loader):
            if start.skips(epoch, i):          # trained before the restart: not again
                continue
            with ckpt.step(epoch, i):
                loss = model(batch).mean()
                loss.backward()
                optimizer.step()
                optimizer.zero_grad()

With an ignite ``Engine``, ``ckpt.attach(trainer)`` instead: each iteration is a step and
the first ``trainer.run(...)`` resumes, skipping what was trained (``_ckpt_engine``).

**The step.** ``ckpt.step(epoch, i)`` brackets one optimizer step. Before it, the
Checkpointer seeds torch, Python's ``random`` and NumPy (when imported) from ``(seed,
step, rank)``: any rank's random state at any step is a function of the position, so a
resumed run draws what the uninterrupted one drew, although no survivor can save the
random state of a rank that died (``seed=None`` turns this off). After a step that
completed, it seeds them again, from a stream of their own, for what runs before the
next step: the fetch of the next batch, whose augmentations a DataLoader without workers
draws in this process, and an epoch's new iterator, which draws the seeds of the
DataLoader's workers. ``resume`` seeds them as they were when the resumed epoch's
iterator started (``resume()`` on a fresh start: as before the first step), and a
resumed ``Position.skips`` that skips a batch seeds them as they were after the last
step trained, so the first batch fetched for training again draws what it drew before
(without this a resumed run with random augmentations trained on other samples' noise:
``tests/test_resume.py``). Code that draws between an epoch's last step and the next
epoch's iterator (an evaluation: a DataLoader's iterator draws from torch's generator as
it starts) moves that iterator's draw; give the training DataLoader a ``generator`` of
its own, seeded at each epoch, and its workers' seeds no longer depend on it. Workers kept
from epoch to epoch (``persistent_workers=True``) keep their generators too, which a
resume in a later epoch cannot replay. Nor do BatchNorm's running statistics resume
bitwise under DDP's ``broadcast_buffers``: each rank adds its own batch to rank 0's, and
an emergency save from another rank holds its own (the parameters resume bitwise).

After a step, every ``every`` steps, the ranks all-gather their random states (torch's,
CUDA's where in use, Python's, NumPy's) and save a periodic checkpoint: the state is
copied in memory, then written by a background thread (the step goes on; the process
waits for it before it exits, so the save of a run's last step is not lost). What only the optimizers in
``objects`` change (the parameters they step, their state) is the same on every replica,
so the save is split: those tensors are dealt across the ranks, and each rank's thread
writes its share (``_ckpt_tensors.Split``); rank 0's writes the rest too, and publishes
the checkpoint once every part is on disk (``_ckpt_parts``: a rank that fails meanwhile
ends that save, not training). Those tensors are not copied at all: the thread
hashes them and writes them to disk from their own memory while the next step's
forward and backward run, and that step's ``optimizer.step()`` first waits until it is
done with them (a step pre-hook). A step that comes sooner has the thread copy what it
has not written yet, and waits for that copy only (``_ckpt_tensors.Arena.write``). The
rest (buffers, which a forward can change; the scheduler's, a sampler's state) is copied
on the training thread. A tensor left to the thread that changed in place meanwhile (its
version moved: code outside ``optimizer.step()`` changed a parameter before the next step
did) drops that save, with a warning, and later saves copy everything on the training
thread. A change through ``.data`` moves no version and goes unseen: between a saving
step's end and the next ``optimizer.step()``, leave the parameters to the optimizer.
A thread, not a process:
``torch.save`` leaves the GIL to the training thread while it writes, and a writer
process, tried, did not change the step time
(``benchmarks/results/checkpoint-writer-process.md``). A resume from a periodic
checkpoint gives every rank its own random states back, so code that draws between
steps continues exactly too.

**The emergency checkpoint.** When ``PeerFailure``, ``PeerLost``, ``SyncTimeout`` or
``SyncMismatch`` leaves the step (or a backend error out of a raw collective, such as
FSDP's, that a peer's failure explains, or a launcher's SIGTERM, come while the user's
code ran: one that a peer's death explains, or the job's own stop, as a scheduler's
preemption SIGTERMs every rank), the replica is consistent if the optimizer's
step had not begun (the state is the last completed step's, and the save's position is
this step's own: what ran before the step, an epoch's end code before a new epoch's first
step, is not run again by the resume) or had finished (it is this step's); the
Checkpointer knows which from hooks on the optimizer. A SIGTERM or SIGINT
that comes once an optimizer began its step is put off to the block's end, so what the
block updates after it (a scheduler's step, a GradScaler's update) is in the save too;
a collective of the block between the optimizer's step and those (a loss's all-reduce for
a log line) would meet a peer's failure before them: put it after them. The consistent
survivors offer to write it; after ``CLAIM_WINDOW`` (0.25 s) the lowest of them claims it
on the job's store and writes it with SIGTERM deferred (torchrun SIGTERMs survivors 0.1 s
after a worker died and SIGKILLs them 30 s later; tether's launcher waits
``emergency_budget``), prints one line saying which step it saved and where, and the
exception goes on. A survivor whose failure came in the middle of ``optimizer.step()``
writes nothing, and says why; so does one whose last step completed left gradients to a
later one (a backward and no optimizer step: micro-batches of gradient accumulation, each
a step, as ignite's ``gradient_accumulation_steps`` under ``attach``), since a checkpoint
holds no gradients and a resume from there would step on part of them (a periodic save
that falls on such a step waits for the next step that steps the optimizers); so does
every survivor of sharded training or of a ``ZeroRedundancyOptimizer``; each still lets
a periodic save on its way reach the disk before it ends (the newest one to resume), as
the failing rank does once its failure is posted (``_finish_writing``). The same
failures met between steps (the evaluation's collective; a preemption's SIGTERM in the
data loader) find the replica at the last completed step: once the rank's failure is
posted (``Context.on_failure``), that step is saved the same way.

**On disk.** A checkpoint is a directory ``step-<N>`` holding ``tensors.bin`` (the bytes
of every tensor of the objects' state dicts, back to back; of a split save, rank 0's part,
and ``tensors-<r>.bin`` rank r's), ``state.pt`` (the rest, with the position and the
random states, ``torch.save``) and ``manifest.json`` (format version, step, epoch,
iteration, world size, an XXH3-64 of each file of tensors and a SHA-256 of ``state.pt``,
and whether it was an emergency save; ``_ckpt_tensors`` says why this layout). It is
written as ``.tmp-step-<N>-<pid>`` (rank 0's pid; ``-emergency`` added for an emergency
save), flushed, and renamed: a process killed mid-save leaves a ``.tmp-`` directory that
``resume`` never takes. ``resume`` refuses, with a warning naming why, a directory whose
manifest is missing, unreadable, of another format or world size, or whose checksums do
not match, and falls back to the next newest. Nothing is ever deleted unless ``keep=``
asks to rotate.

**Sharded state (FSDP, tensor parallelism).** A model whose parameters are sharded
(``fully_shard``'s or ``parallelize_module``'s DTensor parameters, FSDP's wrapper) is
saved with ``torch.distributed.checkpoint``: at every periodic save each rank writes its
shards (``dcp.save``, synchronous: a collective), rank 0 adds ``state.pt`` (position,
random states) and a manifest whose checksum covers every file, and ``resume`` loads every
rank's shards with ``dcp.load`` (``tether/_sharded.py``).
No emergency checkpoint exists for such state: the failed rank's shard is gone with it,
and on a stop (a preemption) the ranks would have to agree on one step to save; the job
resumes from the last periodic save.

**ZeroRedundancyOptimizer.** Each rank holds a part of its state: a periodic save gathers
it on rank 0 first (``consolidate_state_dict(to=0)``, a collective on every rank), and rank
0 alone writes that save; ``resume`` loads the whole state on every rank, and ZeRO keeps
each rank's part. No emergency save: a failed rank's part is gone with it.

Why not DCP for replicated state too: its save is a collective over the process group,
and an emergency save runs when a peer of that group is gone. The periodic save takes
DCP's idea (each replicated tensor written once, by one rank) without its collective: the
parts meet on the store, and rank 0's wait for them ends at a peer's failure. The
emergency save is one rank's alone, and needs nobody else.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import functools
import logging
import os
import shutil
import signal
import sys
import threading
import weakref
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import torch

from . import _ckpt_files as _files
from . import _ckpt_parts as _parts
from . import _ckpt_tensors as _tensors
from . import _randomness, _sharded, collectives, syncs
from ._core.channel import Channel
from ._core.failures import report_failure
from ._core.hooks import Deferred, Hooks, Terminated, holding
from ._core.runtime import current
from ._core.verdicts import failure_behind_raw, failure_behind_stop
from .errors import PeerFailure, SyncMismatch, SyncTimeout, TetherError

log = logging.getLogger("tether")

__all__ = ["Checkpointer", "Position"]

# what a survivor of these may vouch for (its own exceptions are not a peer's failure)
_PEER_FAILURES = (PeerFailure, SyncTimeout, SyncMismatch)


def _a_stop(exc: BaseException) -> bool:
    """Whether ``exc`` is the job's stop (a SIGTERM: this rank's, or a peer's posted first), no rank's failure."""
    return isinstance(exc, Terminated) or (isinstance(exc, PeerFailure) and exc.record.exc_type == Terminated.__name__)


class _TorchSeed:
    """``Checkpointer``'s default ``seed``: ``torch.initial_seed()`` when it is made."""

    def __repr__(self) -> str:
        return "torch.initial_seed()"


_TORCH_SEED = _TorchSeed()


@dataclasses.dataclass(frozen=True)
class Position:
    """Where training stands: ``step`` optimizer steps done; the next is ``(epoch, iteration)``."""

    epoch: int = 0
    iteration: int = 0
    step: int = 0
    # a resumed Checkpointer's: seeds the generators as after the last step trained
    _after_skip: Callable[[], None] | None = dataclasses.field(default=None, compare=False, repr=False)

    def skips(self, epoch: int, iteration: int) -> bool:
        """True for a step trained before this position (skip it when resuming).

        From a ``resume`` that loaded a checkpoint (with a ``seed``), a skip seeds the
        generators as they were after the last step trained: the batch fetched next, the
        first one trained again, draws what it drew before the restart.
        """
        skipped = (epoch, iteration) < (self.epoch, self.iteration)
        if skipped and self._after_skip is not None:
            self._after_skip()
        return skipped


class Checkpointer:
    """Periodic and emergency checkpoints of replicated training state, and exact resume.

    Args:
        objects: name -> object with ``state_dict()``/``load_state_dict()`` (model,
            optimizer, scheduler, a sampler that has them): replicas, the same on every
            rank where the optimizers step them (as DDP keeps them), since a periodic
            save takes each such tensor from one rank, and every rank resumes all of it.
        dirname: the checkpoint directory, one that every rank sees (across nodes, a shared
            file system): every rank writes its part of a periodic save there, and reads
            it at ``resume``. Created where missing.
        every: save a periodic checkpoint every ``every`` steps (None: emergency only).
        keep: keep the newest ``keep`` checkpoints and delete older ones (None: keep all).
        seed: the base of each step's seed (see the module docstring); by default the seed
            torch's generator was given when the Checkpointer is made
            (``torch.initial_seed()``: your ``torch.manual_seed(...)``, so that runs you
            seed apart draw apart, and the same command restarted draws alike). None
            seeds nothing, and only the random states saved by periodic checkpoints
            carry randomness over.
        emergency: write an emergency checkpoint when a peer fails (default True).
        emergency_budget: seconds tether's launcher lets the emergency save take.

    Raises:
        TypeError, ValueError: bad arguments, on every rank alike, before any communication.
        ValueError (from ``resume``): every checkpoint there comes from a job of another
            world size (no re-shard: the state saved is one replica's).
    """

    def __init__(
        self,
        objects: Mapping[str, Any],
        dirname: str | os.PathLike[str],
        every: int | None = None,
        keep: int | None = None,
        seed: int | None | _TorchSeed = _TORCH_SEED,
        emergency: bool = True,
        emergency_budget: float = 30.0,
    ) -> None:
        if not isinstance(objects, Mapping) or not objects:
            raise TypeError("Checkpointer: objects must be a non-empty mapping of name -> object")
        for name, obj in objects.items():
            if not (hasattr(obj, "state_dict") and hasattr(obj, "load_state_dict")):
                raise TypeError(f"Checkpointer: {name!r} has no state_dict()/load_state_dict()")
        if isinstance(seed, _TorchSeed):
            # (before, 0: every run drew alike in its steps whatever seed the user gave torch)
            seed = torch.initial_seed()
        if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool)):
            raise TypeError(f"Checkpointer: seed must be an int or None, got {seed!r}")
        for what, value in (("every", every), ("keep", keep)):
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
                raise ValueError(f"Checkpointer: {what} must be a positive int or None, got {value!r}")
        self.objects = dict(objects)
        self.dirname = Path(dirname)
        self.every = every
        self.keep = keep
        self.seed = seed
        self.emergency = emergency
        self.emergency_budget = float(emergency_budget)
        self.position = Position()  # the next step to run, and how many are done
        self._began_at: dict[int, int] = {}  # epoch -> how many steps were done as it began (the last two)
        self._optimizers = [o for o in self.objects.values() if isinstance(o, torch.optim.Optimizer)]
        self._in_optimizer_step = False
        self._stepped = False  # the optimizer's step finished within the current step
        # gradients accumulate over steps: the last step completed ran a backward but no
        # optimizer step (``_accumulating``); a checkpoint holds no gradients
        self._pending = False
        self._overdue = False  # a periodic save put off until the optimizers step
        self._trained = False  # a step completed in this process
        self._in_step = False  # inside ``step``'s block
        self._deferred = Deferred()  # SIGINT/SIGTERM put off from an optimizer's step to the block's end
        self._ended = False  # a failure ended training here: its emergency save was decided
        self._writer: threading.Thread | None = None
        self._joined_at_exit = False  # ``_finish_writing`` registered
        self._released = threading.Event()  # the writer is done reading what the optimizers change
        self._released.set()
        self._hurry = threading.Event()  # an optimizer step waits for that: copy the rest, write it from the copy
        self._eager = False  # a tensor left to the writer changed: copy everything at once from now on
        self._arena = _tensors.Arena()  # the snapshot's tensors, one buffer reused save after save
        self._foreign: list[str] = []
        self._split = True  # periodic saves are split across the ranks (rank 0 turns it off: ``_parts``)
        self._abandon = threading.Event()  # the periodic save's wait for the other parts: give up
        self._sharded = _sharded_name(self.objects)  # a sharded module's name: saves go through DCP
        self._zero = [name for name, obj in self.objects.items() if _is_zero(obj)]  # optimizers split by rank
        for opt in self._optimizers:
            opt.register_step_pre_hook(self._before_optimizer_step)
            opt.register_step_post_hook(self._after_optimizer_step)

    # --- the training loop's side ---------------------------------------------------------

    def resume(self) -> Position:
        """Load the newest complete checkpoint on every rank; returns where to start.

        Every rank checks the directory itself; one all-gather then makes sure all of them
        chose the same step (else ``RuntimeError`` on every rank). A fresh start returns
        ``Position()``.
        """
        ctx = current()
        world = ctx.backend.topology.world_size
        found = self._newest(world)
        if found is None and self._foreign:  # the same directory on every rank: raised alike
            raise ValueError(
                f"Checkpointer: every checkpoint in {self.dirname} was saved by a job of another size "
                f"({', '.join(self._foreign)}); this one has {world} ranks. Restart with that many ranks, "
                "or point dirname elsewhere (no re-shard: the saved state is one replica's)"
            )
        steps = collectives.all_gather(found[0] if found else -1)
        chosen = steps if isinstance(steps, list) else [steps]
        if len(set(chosen)) != 1:
            raise RuntimeError(f"Checkpointer: ranks found different checkpoints in {self.dirname}: steps {chosen}")
        rank = ctx.backend.topology.rank
        if found is None:
            self._seed_after(0, rank)  # what runs before the first step, as in a resumed run
            return self.position
        step, path, manifest, state = found
        if self._sharded is not None:
            _sharded.load(self.objects, self._sharded, path)  # every rank its shards (a collective)
        else:
            for name, obj in self.objects.items():
                obj.load_state_dict(state["objects"][name])
        randomness = state.get("random")
        epoch, iteration = int(manifest["epoch"]), int(manifest["iteration"])
        # (saves before it: one step an iteration)
        self._began_at = {epoch: int(state.get("epoch_began", step - iteration))}
        after_skip = None
        if self.seed is not None:
            # as when the resumed epoch's iterator started; each skip then as after step ``step``
            self._seed_after(self._began_at[epoch], rank)
            after_skip = functools.partial(_randomness.seed_between, self.seed, step, rank)
        elif isinstance(randomness, list) and len(randomness) == world:
            _randomness.restore(randomness[rank])
        elif rank == 0:  # (every rank loaded the same: one line says it)
            log.warning(
                "tether: the checkpoint of step %d carries no random states (an emergency save cannot hold a "
                "failed rank's), and seed=None: randomness after the resume differs from an uninterrupted run",
                step,
            )
        self.position = Position(epoch, iteration, int(manifest["step"]), _after_skip=after_skip)
        if rank == 0:
            kind = "emergency" if manifest.get("emergency") else "periodic"
            log.warning("tether: resumed from the %s checkpoint of step %d (%s)", kind, step, path)
        return self.position

    @contextlib.contextmanager
    def step(self, epoch: int, iteration: int) -> Iterator[None]:
        """One optimizer step at ``(epoch, iteration)``; see the module docstring.

        Raises:
            ValueError: ``(epoch, iteration)`` comes before the step after the last one
                completed (the same position twice: an iteration counter not passed on):
                a resume would skip by positions that do not say what was trained.
        """
        self._begin(epoch, iteration)
        try:
            yield
        except BaseException as exc:
            self._leave(epoch, iteration, exc)  # raises it, or the peer's failure behind it
            raise
        self._leave(epoch, iteration, None)

    def attach(self, engine: Any) -> None:
        """Make each iteration of an ignite ``Engine`` a step, and resume it exactly.

        Each iteration, from its ``ITERATION_STARTED`` to the end of its
        ``ITERATION_COMPLETED`` handlers, is ``step(epoch - 1, iteration in the epoch)``;
        as the run starts, ``resume()`` loads the newest checkpoint and the engine goes on
        from it, its resumed epoch fetching and skipping the batches trained before (as
        ``Position.skips`` does), where ignite's own resume trains the epoch's first
        batches again. Call it before ``engine.run`` and do not call ``resume()``
        yourself; see ``tether/_ckpt_engine.py``.

        Raises:
            ImportError: ignite is not installed.
            TypeError: not an ignite ``Engine``, or a ``DeterministicEngine`` (it resumes by
                seeds of its own, which the Checkpointer's would fight).
            ValueError (as the run starts, on every rank alike, before any communication):
                the engine's epoch is not one pass over its data (an ``epoch_length``
                other than ``len(data)``, or data without ``len()``).
        """
        from . import _ckpt_engine  # (imports ignite)

        _ckpt_engine.attach(self, engine)

    def _begin(self, epoch: int, iteration: int) -> None:
        """The step at ``(epoch, iteration)`` begins (``step``'s block is entered)."""
        if (epoch, iteration) < (self.position.epoch, self.position.iteration):
            last = f"ckpt.step({self.position.epoch}, {self.position.iteration - 1})"
            raise ValueError(
                f"Checkpointer: ckpt.step({epoch}, {iteration}) after {last} completed: the positions of "
                "steps must increase (a resume skips what came before the position saved)"
            )
        ctx = current()
        if self._at_failure not in ctx.on_failure:  # a failure between steps ends the rank there
            ctx.on_failure.append(self._at_failure)
        if epoch not in self._began_at:
            self._began_at = {e: n for e, n in self._began_at.items() if e == self.position.epoch}
            self._began_at[epoch] = self.position.step
        self._seed(self.position.step, ctx.backend.topology.rank)
        self._stepped = self._in_optimizer_step = False  # (an optimizer step that raised left it set)
        self._in_step = True

    def _leave(self, epoch: int, iteration: int, exc: BaseException | None) -> None:
        """The block of the step at ``(epoch, iteration)`` ended: completed (``exc`` None:
        the periodic save), or left by ``exc``, which this raises, or the peer's failure
        behind it, after the emergency save."""
        rank = current().backend.topology.rank
        done = self.position.step + 1
        saving = exc is None and self.every is not None and (done % self.every == 0 or self._overdue)
        if exc is None:
            self._pending = self._accumulating()
            self._overdue = saving and self._pending  # a save now would lose them: at the first step that uses them
            saving = saving and not self._pending
        try:
            self._in_step = False
            self._deferred.end()  # a stop put off since an optimizer stepped comes now
            if exc is not None:
                raise exc
            # every rank's random states, at this point, and whether it can write a part
            offers = collectives.all_gather((_randomness.state(), self._can_split(), os.getpid())) if saving else []
            for name in self._zero if saving else ():  # each rank's part of its state, to rank 0 (a collective)
                self.objects[name].consolidate_state_dict(to=0)
        except _PEER_FAILURES as failure:
            self._stopped(failure, epoch, iteration)
            raise
        except Terminated as stop:
            # a launcher's SIGTERM in the user's code (inside a tether wait it is a peer's
            # failure already): torchrun's, 0.1 s after a worker died, can come before this
            # rank learns of that death (a SIGKILLed peer posts nothing). With no peer's
            # failure behind it, the job itself is being stopped (a preemption: the
            # scheduler's SIGTERM to every rank), and this replica is as consistent
            behind = failure_behind_stop(current())
            if not isinstance(behind, _PEER_FAILURES):
                # its own stop: posted first, so that no peer waits for this rank while it
                # saves (a peer then offers too, and the lowest consistent rank saves)
                self._ended = True  # the post's Context.on_failure must not save it as between steps
                report_failure(stop)
            self._stopped(behind if isinstance(behind, _PEER_FAILURES) else stop, epoch, iteration)
            raise
        except RuntimeError as error:
            # a backend error out of a raw collective (FSDP's, the user's): a victim if a peer's failure is behind it
            behind = None if isinstance(error, TetherError) else failure_behind_raw(current(), error, "a training step")
            if not isinstance(behind, _PEER_FAILURES):
                raise
            self._stopped(behind, epoch, iteration)
            raise behind from error
        self.position = _next(epoch, iteration, done)
        self._trained = True
        if saving:
            self._save(offers, rank)
        self._seed_after(done, rank)

    def _accumulating(self) -> bool:
        """Whether the step that just completed left gradients for a later one: it ran no
        optimizer step, and a parameter of the optimizers has a gradient (a backward ran
        since their last ``zero_grad``). A resume from here would lose them: ignite's
        ``gradient_accumulation_steps``, micro-batches each in a step of their own. Known
        only from the optimizers in ``objects``; a step that stepped them costs nothing."""
        if self._stepped or not self._optimizers:
            return False
        return any(p.grad is not None for opt in self._optimizers for g in opt.param_groups for p in g["params"])

    def _left_unfinished(self) -> None:
        """A step's block that will not end (an engine terminated between its events): no step done."""
        self._in_step = False
        self._deferred.end()

    def _save(self, offers: list[tuple[Any, bool, int]], rank: int) -> None:
        """The periodic save of ``self.position``, from every rank's (random states, can
        split, pid), decided alike on every rank."""
        randomness = [random for random, _, _ in offers]
        split = len(offers) > 1 and all(can for _, can, _ in offers)
        if self._sharded is not None:
            self._save_sharded(self.position, randomness)  # every rank writes its shards
        elif split or rank == 0:
            tmp = self.dirname / f".tmp-step-{self.position.step:08d}-{offers[0][2]}"  # rank 0's pid: one for all
            self._save_async(self.position, randomness, tmp, len(offers) if split else 1)

    def _can_split(self) -> bool:
        """Whether this rank can write its part of a periodic save (``_write_part``)."""
        return self._split and self._sharded is None and not self._zero and current().channel is not None

    def _at_failure(self, failure: BaseException) -> None:
        """This rank ends on ``failure``, posted (``Context.on_failure``). One that left a step
        went through ``step``; one that came between steps (a peer's failure met in the
        evaluation's collective, a preemption's SIGTERM in the data loader) finds this
        replica at the last completed step, as consistent: the same emergency save."""
        if not self._ended and self._trained and isinstance(failure, (*_PEER_FAILURES, Terminated)):
            self._stopped(failure, None, None)

    def _stopped(self, exc: BaseException, epoch: int | None, iteration: int | None) -> None:
        """A peer's failure, or the job's stop, left the step (``epoch``, ``iteration``; None:
        it came between steps): the emergency save, SIGTERM held meanwhile."""
        self._ended = True
        if self.emergency:
            # at once: torchrun's SIGTERM comes 0.1 s after a worker died. One that came is
            # not sent again: it asked this rank to stop, and the peer's failure that goes on
            # from here does stop it (a launcher that still wants it gone SIGKILLs it, as
            # torchrun does after 30 s)
            with holding([signal.SIGTERM]):  # and so a DataLoader's dying workers (``hooks.stopping``)
                self._emergency(exc, epoch, iteration)

    def wait(self) -> None:
        """Wait for a periodic save still being written (the next save waits too)."""
        if self._writer is not None:
            self._writer.join()
            self._writer = None

    # --- saving ---------------------------------------------------------------------------

    def _before_optimizer_step(self, *_: Any) -> None:
        if not self._released.is_set():  # a periodic save still reads what this step changes
            self._hurry.set()
            self._released.wait()  # the copy of what is left: milliseconds
        self._in_optimizer_step = True
        if self._in_step:
            # a preemption's SIGTERM (or Ctrl-C) in the middle of the update would leave this
            # replica unsaveable, and one just after it a replica saved as this step's with
            # what the block updates next not updated yet (a scheduler's step, a GradScaler's
            # update, a second optimizer's step: the next job's learning rate was one step
            # behind): it comes at the block's end (``step``)
            self._deferred.start()

    def _after_optimizer_step(self, *_: Any) -> None:
        self._in_optimizer_step = False
        self._stepped = True

    def _emergency(self, exc: BaseException, epoch: int | None, iteration: int | None) -> None:
        ctx = current()
        rank = ctx.backend.topology.rank
        why_not = None
        if self._sharded is not None:
            stop = "its save would need every rank's shard at one step: the last periodic save is the one to resume"
            why_not = f"{self._sharded!r} is sharded (FSDP or tensor parallelism), and " + (
                stop if _a_stop(exc) else "a failed rank's shard is gone with it"
            )
        elif self._zero:
            why_not = f"{self._zero[0]!r} is a ZeroRedundancyOptimizer, whose state each rank holds a part of, and " + (
                "its save would need every rank's part at one step: the last periodic save is the one to resume"
                if _a_stop(exc)
                else "a failed rank's part is gone with it: the last periodic save is the one to resume"
            )
        elif self._in_optimizer_step:
            why_not = (
                "the failure came in the middle of optimizer.step(), so its replica is neither the last step's "
                "nor this one's"
            )
        elif self._pending and not (self._stepped and epoch is not None):
            why_not = (
                f"gradients were accumulating (step {self.position.step} ran a backward but no optimizer step), "
                "and a checkpoint holds no gradients: the last periodic save is the one to resume"
            )
        if why_not is not None:
            sys.stderr.write(f"tether: rank {rank} saved no emergency checkpoint: {why_not}\n")
            if ctx.channel is not None:  # the report's line (a consistent survivor's save, if any, says it later)
                with contextlib.suppress(Exception):
                    ctx.channel.announce_emergency(f"rank {rank}: {why_not}", 0.0)
            # a periodic save still being written is then the newest to resume: the process
            # must not end before it is on disk (it ended it: a ZeRO job whose save of step 4
            # was on its way when the peer failed resumed from step 2, tests/test_resume.py).
            # A split save whose parts a failed peer owed ends at once (``_ckpt_parts``)
            self.wait()
            return
        position = self.position  # between steps: after the last step completed
        if epoch is not None and iteration is not None:
            # in a step: all that came before it ran (an epoch's end code, before a new
            # epoch's first step), so a resume starts at this step, not after the last one
            # (where a loop runs that epoch's end again: a scheduler stepped per epoch
            # stepped twice), or after it, if it stepped the optimizers
            position = _next(epoch, iteration, self.position.step + 1) if self._stepped else self._at(epoch, iteration)
        if ctx.channel is None or not ctx.channel.claim_emergency(rank, CLAIM_WINDOW):
            return  # a lower survivor saves it: replicas are identical
        self._abandon.set()  # a split periodic save may wait for a part that the failure stopped
        self.wait()
        try:
            ctx.channel.announce_emergency("saving", self.emergency_budget)
            world = ctx.backend.topology.world_size
            # training has stopped: what the optimizers change is written from its own memory, uncopied
            self._hurry.clear()
            tmp = self.dirname / f".tmp-step-{position.step:08d}-{os.getpid()}-emergency"
            path = self._write(self._snapshot(position, later=True), position, world, tmp, emergency=True)
            line = f"rank {rank} saved an emergency checkpoint of step {position.step} to {path}"
            ctx.channel.announce_emergency(f"saved: {line}", 0.0)
            sys.stderr.write(f"tether: {line} ({type(exc).__name__} stopped training)\n")
        except Exception as err:
            ctx.channel.announce_emergency(f"failed: {err}", 0.0)
            sys.stderr.write(f"tether: rank {rank} could not save an emergency checkpoint: {err}\n")

    def _snapshot(
        self, position: Position, randomness: Any = None, later: bool = False, parts: int = 1
    ) -> dict[str, Any]:
        """A copy of every object's state, taken on the training thread (call after ``wait``).

        Its tensors are copied into the arena (``_ckpt_tensors``), which the writer has
        finished with before the next snapshot (``wait``); with ``later``, those only the
        optimizers change are left to the writer, which writes them from their own memory
        (``Arena.write``). With ``parts`` > 1, those are dealt across the ranks, and the
        arena packs this rank's part only (``_ckpt_tensors.Split``).
        """
        objects = {name: obj.state_dict() for name, obj in self.objects.items()}
        began = self._began(position)
        state = {"objects": objects, "position": _fields(position), "random": randomness, "epoch_began": began}
        stepped = self._stepped_by_optimizers() if later or parts > 1 else set()
        split = _tensors.Split(current().backend.topology.rank, parts, stepped) if parts > 1 else None
        return self._arena.pack(state, stepped if later and not self._eager else None, split)  # type: ignore[no-any-return]

    def _stepped_by_optimizers(self) -> set[int]:
        """Where the tensors only the optimizers change live: their parameters and state."""
        found: set[int] = set()
        for opt in self._optimizers:
            for group in opt.param_groups:
                found.update(p.data_ptr() for p in group["params"])
            for per_param in opt.state.values():  # (a resumed ZeroRedundancyOptimizer's held None entries)
                if isinstance(per_param, Mapping):
                    found.update(v.data_ptr() for v in per_param.values() if isinstance(v, torch.Tensor))
        return found

    def _save_async(self, position: Position, randomness: Any, tmp: Path, parts: int) -> None:
        """Start the periodic save's thread: rank 0's, or with ``parts`` > 1 every rank's (its part)."""
        self.wait()
        state = self._snapshot(position, randomness, later=True, parts=parts)  # this very step's state
        if self._arena.pending:
            self._hurry.clear()
            self._released.clear()
        self._abandon.clear()
        ctx = current()
        rank, world = ctx.backend.topology.rank, ctx.backend.topology.world_size
        save = _Save(position, world, tmp, parts, rank if parts > 1 else 0, ctx.channel, ctx.hooks)
        # not a daemon: a script that ends right after a save (its last step) must not lose
        # it. Python joins such a thread before it exits, as tether.spawn's worker does; a
        # daemon was stopped mid-write, leaving a .tmp- directory (tests/test_resume.py)
        self._writer = threading.Thread(target=self._write_behind, args=(state, save), name="tether-checkpoint")
        self._writer.start()
        if not self._joined_at_exit:
            # a rank that fails on its own exception ends from tether's excepthook, which runs
            # the exit functions and then os._exit: no join of non-daemon threads. Its save
            # on its way was lost there (ZeRO, rank 0 failing while it wrote step 4's save: the
            # restart resumed from step 2). This runs after the failure was posted
            atexit.register(_finish_writing, weakref.ref(self))
            self._joined_at_exit = True

    def _write_behind(self, state: dict[str, Any], save: _Save) -> None:
        """The periodic save's thread: it reads what the optimizers change at once (the next
        ``optimizer.step()`` waits for it, so no lower priority), the rest yields the CPU to
        training (Linux: a thread has its own nice)."""

        def released() -> None:
            self._released.set()
            with contextlib.suppress(AttributeError, OSError):
                os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)

        position = save.position
        try:
            if save.part == 0:
                self._write(state, position, save.world, save.tmp, emergency=False, released=released, save=save)
            else:
                self._write_part(save, released)
        except _parts.PeerGone as exc:
            log.warning("tether: the periodic checkpoint of step %d was abandoned: %s", position.step, exc)
        except _parts.NotShared as exc:
            self._split = False
            log.warning(
                "tether: the periodic checkpoint of step %d failed: %s; is %s one directory that every rank sees? "
                "Later periodic saves are written by rank 0 alone",
                position.step,
                exc,
                self.dirname,
            )
        except _tensors.Moved:
            self._eager = True
            log.warning(
                "tether: the periodic checkpoint of step %d was dropped: a parameter or optimizer state changed in "
                "place outside optimizer.step() before it was written; later saves copy everything on the training "
                "thread",
                position.step,
            )
        except Exception as exc:  # a full disk must not kill training: the next save tries again
            log.warning("tether: the periodic checkpoint of step %d failed: %s", position.step, exc)
        finally:
            self._released.set()  # (the write sets it once it is done with the tensors; a failure before, here)

    def _save_sharded(self, position: Position, randomness: Any) -> None:
        """A periodic save of sharded state: every rank writes its shards with DCP, synchronously.

        Rank 0 empties the temporary directory first (a barrier orders it), writes the
        position and random states beside DCP's files, then the manifest, and renames.
        """
        ctx = current()
        rank, world = ctx.backend.topology.rank, ctx.backend.topology.world_size
        assert self._sharded is not None
        final = self.dirname / f"step-{position.step:08d}"
        tmp = self.dirname / f".tmp-step-{position.step:08d}-dcp"
        if rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)  # a save killed before, at the same step
            tmp.mkdir(parents=True)
        syncs.barrier()
        _sharded.save(self.objects, self._sharded, tmp)  # returns once every rank's shards are written
        if rank != 0:
            return
        state = {"position": _fields(position), "random": randomness, "epoch_began": self._began(position)}
        torch.save(state, str(tmp / "state.pt"))
        for path in sorted(tmp.iterdir()):
            _files.fsync(path)
        found = _files.manifest(position.step, position.epoch, position.iteration, world, emergency=False)
        _files.write_manifest(tmp, {**found, "layout": "dcp", "sha256": _files.digest_files(tmp)})
        self._publish(tmp, final)

    def _write(
        self,
        state: dict[str, Any],
        position: Position,
        world: int,
        tmp: Path,
        emergency: bool,
        released: Callable[[], None] | None = None,
        save: _Save | None = None,
    ) -> Path:
        """The checkpoint of ``position``, written in ``tmp`` then renamed; ``released`` once
        the tensors ``pack`` left are read. With ``save`` of several parts, the other
        ranks write theirs meanwhile, and this waits for them (``_ckpt_parts.gather``)."""
        final = self.dirname / f"step-{position.step:08d}"
        split = save is not None and save.parts > 1
        tmp.mkdir(parents=True, exist_ok=True)
        try:
            tensors = self._arena.write(tmp / "tensors.bin", self._hurry, released or self._released.set)
        except _tensors.Moved:
            if not split:  # (a split one's directory holds the other ranks' parts, being written)
                shutil.rmtree(tmp, ignore_errors=True)  # its own, half of it of no step
            raise
        found = _files.manifest(position.step, position.epoch, position.iteration, world, emergency)
        if split:
            assert save is not None and save.channel is not None
            client = save.channel.connection  # see ``_write_part``
            others = _parts.gather(save.channel, client, position.step, save.parts, tmp, lambda: self._giving_up(save))
            state = _tensors.resolve(state, _parts.placed(others))
            found = {**found, "format": _files.SPLIT, "parts": _parts.described(others)}
        torch.save(state, str(tmp / "state.pt"))  # the rest: small
        _files.fsync(tmp / "state.pt")
        _files.write_manifest(tmp, {**found, **tensors, "state_sha256": _files.digest(tmp / "state.pt")})
        return self._publish(tmp, final)

    def _write_part(self, save: _Save, released: Callable[[], None]) -> None:
        """A rank's part of a split periodic save: its file, then a word to rank 0 (``_ckpt_parts``)."""
        assert save.channel is not None
        # The channel's connection, open since the job began, shared with the posts and
        # queries on it (a TCPStore client serialises calls; the parts' are round trips of
        # their own, never a blocking wait). Until 89a76c0 the writer had one of its own,
        # opened on the main thread at the first split save: a new connection waits for
        # c10d's reverse lookups (5.0 s in 12 of 300 on this VM:
        # ``benchmarks/results/store-connect.md``), and one opened by the writer itself,
        # kept from the CPU, began its connect after the store's host was killed, where
        # c10d retries until the connection's timeout (a year) and Python's join of the
        # writer held the exit (tests/test_resume.py).
        client = save.channel.connection
        try:
            save.tmp.mkdir(parents=True, exist_ok=True)
            tensors = self._arena.write(save.tmp / _files.part_name(save.part), self._hurry, released)
        except BaseException as exc:
            with contextlib.suppress(Exception):  # (its own error goes on)
                _parts.post(save.channel, client, save.position.step, save.part, exc)
            raise
        _parts.post(save.channel, client, save.position.step, save.part, {**tensors, "placed": self._arena.placed})

    def _giving_up(self, save: _Save) -> bool:
        """Whether rank 0's wait for the other parts should end (besides a posted failure).

        Yes once training stopped here (``_abandon``: the emergency save waits for this
        thread), or once the process is ending on a SIGTERM or SIGINT: Python joins this
        thread before the exit hooks that would post the stop, and the other ranks, stopped
        too, may never post their parts.
        """
        if self._abandon.is_set():
            return True
        return save.hooks is not None and save.hooks.signalled is not None and not threading.main_thread().is_alive()

    def _publish(self, tmp: Path, final: Path) -> Path:
        """Rename a complete ``.tmp-`` directory to its final name, then rotate."""
        if final.exists():  # the same step saved before (a periodic save, then an emergency one)
            shutil.rmtree(tmp)
            return final
        os.rename(tmp, final)
        _files.fsync_dir(self.dirname)
        self._rotate()
        return final

    def _rotate(self) -> None:
        if self.keep is None:
            return
        for _, path in _files.steps(self.dirname)[self.keep :]:
            shutil.rmtree(path, ignore_errors=True)

    # --- finding ----------------------------------------------------------------------------

    def _newest(self, world: int) -> tuple[int, Path, dict[str, Any], dict[str, Any]] | None:
        """The newest checkpoint that passes every check, loaded; the others are refused with a warning."""
        self._foreign = []  # "step-8: 4 ranks", for resume's error
        layout = "dcp" if self._sharded is not None else "replicated"
        for step, path in _files.steps(self.dirname):
            got = _files.read(path, world, layout)
            if got.state is not None:
                return step, path, got.manifest, got.state
            log.warning("tether: checkpoint %s refused: %s", path, got.why)
            if got.manifest.get("world_size") not in (None, world):
                self._foreign.append(f"{path.name}: {got.manifest['world_size']} ranks")
        return None

    def _seed(self, step: int, rank: int) -> None:
        if self.seed is not None:
            _randomness.seed_step(self.seed, step, rank)

    def _seed_after(self, done: int, rank: int) -> None:
        if self.seed is not None:
            _randomness.seed_between(self.seed, done, rank)

    def _epoch_begins(self, epoch: int) -> None:
        """``epoch`` begins (an engine's ``EPOCH_STARTED``): the end code of the one before ran,
        so a failure from here saves this epoch's start, which a resume does not run again."""
        if epoch > self.position.epoch:
            self.position = self._at(epoch, 0)

    def _at(self, epoch: int, iteration: int) -> Position:
        """The step at ``(epoch, iteration)``, before it ran."""
        return Position(epoch, iteration, self.position.step)

    def _began(self, position: Position) -> int:
        """For a save: how many steps were done as the epoch of its position began (``resume``)."""
        return self._began_at.get(position.epoch, position.step - position.iteration)


@dataclasses.dataclass(frozen=True)
class _Save:
    """A periodic save in progress: of ``position``, into ``tmp``, in ``parts`` parts."""

    position: Position
    world: int
    tmp: Path
    parts: int
    part: int  # this rank's: its rank (split), or 0 (rank 0 writes it all)
    channel: Channel | None  # where the parts meet (``_ckpt_parts``)
    hooks: Hooks | None  # this rank's signal hooks (``Checkpointer._giving_up``)


CLAIM_WINDOW = 0.25  # seconds survivors offer to write the emergency save before the lowest claims it


def _finish_writing(checkpointer: weakref.ref[Checkpointer]) -> None:
    """At the exit: wait for a periodic save still being written, a launcher's stop held
    meanwhile (torchrun SIGKILLs 30 s after its SIGTERM). A split save that waits for a
    part ends at once, the job's failure being posted (``_ckpt_parts``)."""
    ckpt = checkpointer()
    if ckpt is None or ckpt._writer is None or threading.current_thread() is not threading.main_thread():
        return
    with holding([signal.SIGTERM, signal.SIGINT]):
        ckpt.wait()


def _is_zero(obj: object) -> bool:
    """A ``ZeroRedundancyOptimizer``: each rank holds its own part of the optimizer's state.

    A periodic save first gathers it on rank 0 (``consolidate_state_dict(to=0)`` on every
    rank), which alone writes the save; a resume gives every rank the whole state, and
    ZeRO's ``load_state_dict`` keeps each rank's part. Before, the first save raised
    torch's "Optimizer state has not been consolidated" on every rank. No emergency save:
    a failed rank's part is gone. Only an instance counts, once its module was imported.
    """
    zero = sys.modules.get("torch.distributed.optim.zero_redundancy_optimizer")
    return zero is not None and isinstance(obj, zero.ZeroRedundancyOptimizer)


def _sharded_name(objects: Mapping[str, Any]) -> str | None:
    """The name of the object whose state is sharded across ranks (FSDP), if any."""
    return next((name for name, obj in objects.items() if _sharded.is_sharded(obj)), None)


def _next(epoch: int, iteration: int, done: int) -> Position:
    return Position(epoch, iteration + 1, done)


def _fields(position: Position) -> dict[str, int]:
    """What a checkpoint keeps of ``position``."""
    return {"epoch": position.epoch, "iteration": position.iteration, "step": position.step}
