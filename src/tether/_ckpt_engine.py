"""``Checkpointer.attach(engine)``: an ignite ``Engine``'s iterations as the Checkpointer's steps.

**The step.** An iteration is ``ITERATION_STARTED``'s handlers, the process function
(forward, backward, ``optimizer.step()``), then ``ITERATION_COMPLETED``'s handlers: a
scheduler stepped there, or a metric, belongs to the step as much as the optimizer's
update does. So the step opens in an ``ITERATION_STARTED`` handler and closes in an
``ITERATION_COMPLETED`` handler kept the last of its event's (one added later is moved
behind it as the next iteration starts): a save holds what every handler of the step
did. The fetch of the next batch (``GET_BATCH_*``) falls between steps, as in a plain
loop. The step's position is ``(engine.state.epoch - 1, iteration within the epoch)``.

**A failure in the step.** ignite reports an exception only to ``EXCEPTION_RAISED``
handlers, and having one changes what the engine does (with none it re-raises; with one
it goes on as if handled), so none is added: ``engine.run`` is wrapped on the instance,
and an exception that leaves it while a step is open leaves that step, as it would
leave ``with ckpt.step(...)``: the emergency save, and the peer's failure behind a
backend error raised instead. A run that returns with a step open (``terminate()``
called in an ``ITERATION_STARTED`` handler: the process function never ran) ends it
as no step; one that an ``interrupt()`` paused keeps it open for the next ``run``.

**Resume.** ``Engine.load_state_dict`` resumes an epoch by counting its iterations from
the saved one over a new iterator of the data: the epoch's first batches are trained
again and its last ones never (by hand, ignite 0.5.5). Here, as the first run starts
(``STARTED``), ``Checkpointer.resume()`` loads the newest checkpoint, the engine's epoch
and iteration are set to its position, and the resumed epoch's data is wrapped for one
iterator: it fetches the batches trained before the restart and drops them, each
``Position.skips`` reseeding as it does in a plain loop, so that the first batch trained
again draws the noise it drew before. An epoch must therefore be one pass over the data
(``epoch_length == len(data)``, or no data): with an ``epoch_length`` of its own, ignite
goes on with one iterator across epochs, and which batch comes next would depend on the
whole history.

**An epoch's end.** A checkpoint of an epoch's last step (a periodic save at that step,
or an emergency one from a failure after it and before the next epoch began) comes before
the epoch's ``EPOCH_COMPLETED`` handlers ran, or all of them: the resume fires them (a
scheduler stepped per epoch, an evaluation), as a loop of one's own runs an epoch's end
again after skipping its batches, then goes on with the next epoch. ``EPOCH_STARTED``
moves the Checkpointer's position to the new epoch's start (``_epoch_begins``): a failure
from there on is saved there, and its resume runs the last epoch's end no more.

**Not ignite's DeterministicEngine.** It resumes by seeds of its own and a batch sampler
that skips without fetching, and draws an epoch's order at its first fetch. Beside the
Checkpointer's seeds, the first batch after a mid-epoch resume drew other noise (by hand,
a dataset drawing as it fetches), and reseeding before that fetch changed the order
instead. ``attach`` refuses it; a plain ``Engine`` with a shuffling sampler resumes
exactly (the order is the sampler's draw, from the seeds between steps).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

from ignite.engine import DeterministicEngine, Engine, Events, State

if TYPE_CHECKING:
    from .checkpoint import Checkpointer, Position


def attach(ckpt: Checkpointer, engine: Engine) -> None:
    """Make ``engine``'s iterations ``ckpt``'s steps (``Checkpointer.attach``)."""
    if not isinstance(engine, Engine):
        raise TypeError(f"Checkpointer.attach: expected an ignite Engine, got {type(engine).__name__}")
    if isinstance(engine, DeterministicEngine):
        raise TypeError(
            "Checkpointer.attach: a DeterministicEngine resumes by its own seeds and batch sampler, which the "
            "Checkpointer's seeds per step would fight; attach a plain Engine, which it resumes exactly"
        )
    glue = _Glue(ckpt, engine.run)
    engine.add_event_handler(Events.STARTED, glue.started)
    engine.add_event_handler(Events.EPOCH_STARTED, glue.epoch_started)
    engine.add_event_handler(Events.ITERATION_STARTED, glue.opened)
    engine.add_event_handler(Events.ITERATION_COMPLETED, glue.closed)
    engine.add_event_handler(Events.INTERRUPT, glue.interrupted)
    engine.run = glue.run  # type: ignore[method-assign]


class _Glue:
    """One engine's steps in one Checkpointer."""

    def __init__(self, ckpt: Checkpointer, run: Callable[..., State]) -> None:
        self.ckpt = ckpt
        self.original_run = run
        self.resumed = False  # the first run's STARTED resumed
        self.length = 0  # the engine's epoch_length, checked as its first run started
        self.open: tuple[int, int] | None = None  # the position of the step whose block is open
        self.paused = False  # an interrupt() paused the run inside the open step

    def run(self, *args: Any, **kwargs: Any) -> State:
        self.paused = False
        try:
            state = self.original_run(*args, **kwargs)
        except BaseException as exc:
            if self.open is None:
                raise
            epoch, iteration = self.open
            self.open = None
            self.ckpt._leave(epoch, iteration, exc)  # raises exc, or the peer's failure behind it
            raise
        if self.open is not None and not self.paused:
            self.open = None
            self.ckpt._left_unfinished()
        return state

    def started(self, engine: Engine) -> None:
        if self.resumed:  # a later run() of the same engine goes on from its own state
            return
        state = engine.state
        length, data = state.epoch_length, state.dataloader
        if length is None or (data is not None and _length(data) != length):
            raise ValueError(
                f"Checkpointer.attach: an epoch of the engine must be one pass over its data, to resume "
                f"exactly: epoch_length is {length}, len(data) is {_length(data) if data is not None else None}"
            )
        self.length = length
        self.resumed = True
        start = self.ckpt.resume()
        if start.step == 0:
            return
        epoch, skip = start.epoch, start.iteration
        if skip < length:
            state.epoch = epoch  # epochs done; the engine's next is epoch + 1 (1-based)
            state.iteration = epoch * length + skip
            if skip and data is not None:
                state.dataloader = _Skipping(data, engine, start, skip)
            return
        # the epoch's last step was saved, its end not run: a periodic save at that step, or
        # an emergency one from a failure after it (one in the next epoch's first step saves
        # that step, its end done). A loop of one's own runs the epoch's end again (it skips
        # every batch); so does this, as after the step: its handlers (a scheduler stepped
        # per epoch, an evaluation), then the next epoch
        state.epoch, state.iteration = epoch + 1, (epoch + 1) * length
        if start._after_skip is not None:
            start._after_skip()
        engine.fire_event(Events.EPOCH_COMPLETED)

    def epoch_started(self, engine: Engine) -> None:
        self.ckpt._epoch_begins(engine.state.epoch - 1)

    def opened(self, engine: Engine) -> None:
        completed = engine._event_handlers[Events.ITERATION_COMPLETED]
        if completed[-1][0] != self.closed:  # a handler added after ``attach``: the step ends after it
            index = next(i for i, (handler, _, _) in enumerate(completed) if handler == self.closed)
            completed.append(completed.pop(index))
        state = engine.state
        position = (state.epoch - 1, (state.iteration - 1) % self.length)
        self.ckpt._begin(*position)
        self.open = position

    def closed(self, engine: Engine) -> None:
        if self.open is None:
            return
        epoch, iteration = self.open
        self.open = None
        self.ckpt._leave(epoch, iteration, None)

    def interrupted(self, engine: Engine) -> None:
        self.paused = True


class _Skipping:
    """The resumed epoch's data: its one iterator drops the first ``skip`` batches it fetches.

    Made the engine's ``state.dataloader`` at ``STARTED``; the engine takes its iterator
    after ``EPOCH_STARTED``, and later epochs iterate the data itself again.
    """

    def __init__(self, data: Iterable[Any], engine: Engine, start: Position, skip: int) -> None:
        self.data = data
        self.engine = engine
        self.start = start
        self.skip = skip

    def __iter__(self) -> Iterator[Any]:
        self.engine.state.dataloader = self.data
        batches = iter(self.data)
        for i in range(self.skip):
            next(batches)
            self.start.skips(self.start.epoch, i)  # seeds as after the last step trained
        return batches

    def __len__(self) -> int:
        return _length(self.data) or 0

    def __getattr__(self, name: str) -> Any:  # ``sampler``, ``batch_size``: the data's
        return getattr(self.data, name)


def _length(data: Iterable[Any]) -> int | None:
    try:
        return len(data)  # type: ignore[arg-type]
    except TypeError:  # no __len__, or an IterableDataset's DataLoader
        return None
