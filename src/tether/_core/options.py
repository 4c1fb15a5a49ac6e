"""tether's own settings, and how a process came to be (which tells who judges its liveness)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .context import SyncSettings
from .watchdog import WatchdogConfig

_OPTIONS = {"heartbeat", "lost_after", "grace", "sync_timeout", "warn_after", "check_collectives"}


@dataclass(frozen=True)
class Options:
    """tether's own settings, taken from ``initialize``/``spawn`` keyword arguments."""

    watchdog: WatchdogConfig = field(default_factory=WatchdogConfig)
    sync: SyncSettings = field(default_factory=SyncSettings)

    @classmethod
    def from_kwargs(cls, kwargs: Mapping[str, Any], store_host: int) -> Options:
        unknown = set(kwargs) - _OPTIONS
        if unknown:
            raise TypeError(f"unexpected keyword argument(s): {sorted(unknown)}")
        w, s = WatchdogConfig(), SyncSettings()
        check = kwargs.get("check_collectives", s.check_collectives)
        if not isinstance(check, bool):
            raise TypeError(f"check_collectives must be a bool, got {type(check).__name__} {check!r}")
        return cls(
            WatchdogConfig(
                heartbeat=float(kwargs.get("heartbeat", w.heartbeat)),
                lost_after=float(kwargs.get("lost_after", w.lost_after)),
                grace=kwargs.get("grace", w.grace),
                store_host=store_host,
            ),
            SyncSettings(
                timeout=kwargs.get("sync_timeout", s.timeout),
                warn_after=float(kwargs.get("warn_after", s.warn_after)),
                check_collectives=check,
            ),
        )


@dataclass(frozen=True)
class Launch:
    """How this process came to be: who judges its liveness, whether tether may end it."""

    owned: bool  # a tether.spawn worker, or under torchrun/srun: an uncaught failure ends it
    judge_peers: bool  # judge the other ranks of this host (not under tether.spawn: its launcher does)
    node_beats: bool = True  # beat this node's heartbeat (under tether.spawn the launcher does)
