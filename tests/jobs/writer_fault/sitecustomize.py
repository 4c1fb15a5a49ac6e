"""Fault injection for ``resume_job.py --kill-in-save periodic``: a checkpoint writer killed mid-save.

Python imports this at the start of every process whose path holds this folder; the job
puts it on the path of rank 0's children only, that is its checkpoint writer process
(``tether/_ckpt_writer.py``). Once that process has written ``state.pt`` of step
``TETHER_TEST_KILL_IN_PERIODIC_SAVE`` (the manifest not yet), it SIGKILLs rank 0, and dies
with it.
"""

import os
import signal
import time

_STEP = os.environ.get("TETHER_TEST_KILL_IN_PERIODIC_SAVE")

if _STEP is not None:
    import torch

    _original = torch.save

    def _save(obj: object, f: object, *args: object, **kwargs: object) -> None:
        _original(obj, f, *args, **kwargs)  # type: ignore[arg-type]
        position = obj.get("position") if isinstance(obj, dict) else None
        if isinstance(position, dict) and str(position.get("step")) == _STEP:
            os.kill(os.getppid(), signal.SIGKILL)
            time.sleep(30)  # killed with its parent (PR_SET_PDEATHSIG)

    torch.save = _save  # type: ignore[assignment]
