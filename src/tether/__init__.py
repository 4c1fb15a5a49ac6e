"""tether: ignite.distributed's API on torch.distributed, where no rank waits forever.

``import tether as idist`` runs code written for ``ignite.distributed``. Any failure of
any rank — an exception, an exit, a kill, a freeze, a stall — reaches every other rank
within a bound, as an error naming the failing rank and its original exception.
"""

from ._core.ending import finalize as finalize
from ._core.runtime import initialize as initialize
from ._core.runtime import set_local_rank as set_local_rank
from ._core.runtime import sync as sync
from .auto import DistributedProxySampler as DistributedProxySampler
from .auto import auto_dataloader as auto_dataloader
from .auto import auto_model as auto_model
from .auto import auto_optim as auto_optim
from .bridge import patch_ignite as patch_ignite
from .checkpoint import Checkpointer as Checkpointer
from .checkpoint import Position as Position
from .collectives import all_gather as all_gather
from .collectives import all_gather_tensors_with_shapes as all_gather_tensors_with_shapes
from .collectives import all_reduce as all_reduce
from .collectives import broadcast as broadcast
from .ddp import register_comm_hook as register_comm_hook
from .errors import BackendError as BackendError
from .errors import ExitCode as ExitCode
from .errors import JobFailed as JobFailed
from .errors import PeerFailure as PeerFailure
from .errors import PeerFinished as PeerFinished
from .errors import PeerLost as PeerLost
from .errors import SyncMismatch as SyncMismatch
from .errors import SyncTimeout as SyncTimeout
from .errors import TetherError as TetherError
from .groups import new_group as new_group
from .info import available_backends as available_backends
from .info import backend as backend
from .info import device as device
from .info import get_local_rank as get_local_rank
from .info import get_nnodes as get_nnodes
from .info import get_node_rank as get_node_rank
from .info import get_nproc_per_node as get_nproc_per_node
from .info import get_rank as get_rank
from .info import get_world_size as get_world_size
from .info import has_hvd_support as has_hvd_support
from .info import has_native_dist_support as has_native_dist_support
from .info import has_xla_support as has_xla_support
from .info import hostname as hostname
from .info import model_name as model_name
from .info import registered_computation_models as registered_computation_models
from .info import show_config as show_config
from .output import RankFormatter as RankFormatter
from .output import get_logger as get_logger
from .output import rank_print as rank_print
from .parallel import Parallel as Parallel
from .spawn import spawn as spawn
from .syncs import barrier as barrier
from .syncs import one_rank_first as one_rank_first
from .syncs import one_rank_only as one_rank_only

__all__ = [
    "BackendError",
    "Checkpointer",
    "DistributedProxySampler",
    "ExitCode",
    "JobFailed",
    "Parallel",
    "PeerFailure",
    "PeerFinished",
    "PeerLost",
    "Position",
    "RankFormatter",
    "SyncMismatch",
    "SyncTimeout",
    "TetherError",
    "all_gather",
    "all_gather_tensors_with_shapes",
    "all_reduce",
    "auto_dataloader",
    "auto_model",
    "auto_optim",
    "available_backends",
    "backend",
    "barrier",
    "broadcast",
    "device",
    "finalize",
    "get_local_rank",
    "get_logger",
    "get_nnodes",
    "get_node_rank",
    "get_nproc_per_node",
    "get_rank",
    "get_world_size",
    "has_hvd_support",
    "has_native_dist_support",
    "has_xla_support",
    "hostname",
    "initialize",
    "model_name",
    "new_group",
    "one_rank_first",
    "one_rank_only",
    "patch_ignite",
    "rank_print",
    "register_comm_hook",
    "registered_computation_models",
    "set_local_rank",
    "show_config",
    "spawn",
    "sync",
]

__version__ = "0.1.0"


def _publish() -> None:
    """Show public names as ``tether.X`` in tracebacks and reprs (trio and httpx do the same)."""
    for name in __all__:
        obj = globals()[name]
        if isinstance(obj, type) or callable(obj):
            setattr(obj, "__module__", "tether")  # noqa: B010


_publish()
