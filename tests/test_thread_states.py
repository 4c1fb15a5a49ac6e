"""Every gloo thread keeps its Python thread state once it ran a callback of tether's (``_core/threadstates.py``).

Real processes: ``tether.spawn``, 2 ranks on gloo (``jobs/kept_thread_states.py``). A state
made and deleted per callback takes CPython's runtime lock without the GIL each time, and a
fork at that instant (a DataLoader starting its workers) hangs the child on the CPython
releases without gh-112275's fix: ``benchmarks/fork_workers.py`` counts such jobs.
"""

from __future__ import annotations

import pytest

from _core import lc_events as events
from _core import tail
from _harness import python
from tether._core.threadstates import NEEDED


@pytest.mark.timeout(90)
def test_every_gloo_thread_keeps_its_python_thread_state() -> None:
    res = python("kept_thread_states.py", bound=60.0)
    assert res.returncode == 0, tail(res)
    states = {(e["rank"], e["at"]): e for e in events(res, "states")}
    assert len(states) == 6, tail(res)
    for rank in (0, 1):
        start = states[rank, "start"]["frameless"]
        threads = states[rank, "start"]["gloo_threads"]
        assert threads >= 1, states
        # the DDP step's and the collective's results are right: the callbacks did their work
        assert states[rank, "ddp"]["grad"] == pytest.approx(0.3, rel=1e-6), states
        assert states[rank, "keeper"]["total"] == pytest.approx(0.3, rel=1e-6), states
        # DDP settled its one bucket in a callback on a gloo thread (one or both, in two
        # steps), which kept its state
        ddp = states[rank, "ddp"]["frameless"] - start
        assert (1 <= ddp <= threads) if NEEDED else ddp == 0, states
        # 21 collectives later every gloo thread of the rank kept one: ``Keeper``'s callbacks
        assert states[rank, "keeper"]["frameless"] == start + (threads if NEEDED else 0), states
    assert res.leftovers == [], tail(res)
