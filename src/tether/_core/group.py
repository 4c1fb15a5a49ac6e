"""What names one sync: the group it runs on, and the tag that ranks' answers carry."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

MADE_KEY = "made"  # every rank, in initialize's one gate (``runtime._all_made``), apart from the job's syncs
MAKING_KEY = "mk"  # the members of a group the user makes, at its gate (``making.py``); + their ranks if not all


@dataclass(frozen=True)
class Group:
    """The members of one sync: ``key`` names its sequence of syncs on the store."""

    key: str
    members: tuple[int, ...]
    pg: Any = None  # the torch ProcessGroup for collectives; None is the default group

    @property
    def label(self) -> str:
        """How messages name the group: "" for all ranks, "node 1", "ranks [0, 2]"."""
        if self.key in ("w", MADE_KEY, MAKING_KEY):
            return ""
        if self.key.startswith("n"):
            return f"node {self.key[1:]}"
        return f"ranks {list(self.members)}"


def all_ranks(size: int) -> Group:
    """Every rank of a job of ``size``: the group of the job's syncs, and of a verdict on a call
    that waits for any rank (a raw collective on an unknown group, a wait on a store)."""
    return Group("w", tuple(range(size)), None)


def tag(group: Group, seq: int) -> str:
    """``#28`` (all ranks) or ``#28 on ranks [0, 2]``: the sync's number among its group's."""
    return f"#{seq}" + (f" on {group.label}" if group.label else "")


def named(signature: str, group: Group) -> str:
    """``barrier`` (all ranks) or ``barrier on ranks [0, 2]``."""
    return signature + (f" on {group.label}" if group.label else "")
