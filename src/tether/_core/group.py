"""What names one sync: the group it runs on, and the tag that ranks' answers carry."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Group:
    """The members of one sync: ``key`` names its sequence of syncs on the store."""

    key: str
    members: tuple[int, ...]
    pg: Any = None  # the torch ProcessGroup for collectives; None is the default group


def tag(group: Group, seq: int) -> str:
    return f"[sync #{seq} on {group.key}]"
