"""auto_model, auto_optim, auto_dataloader and DistributedProxySampler.

Serial behaviour and argument checks run in this process (no process group); the
distributed behaviour runs in one real job of 3 ranks (``jobs/auto_job.py``).
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, DistributedSampler, RandomSampler, SequentialSampler

import tether as idist
from _harness import python

# --- serial (no process group) --------------------------------------------------------


def test_serial_auto_model_returns_the_model_on_the_device() -> None:
    model = torch.nn.Linear(2, 2)
    assert idist.auto_model(model) is model
    assert idist.auto_model(model, sync_bn=True) is model  # one process: nothing to sync


def test_serial_auto_optim_returns_the_optimizer() -> None:
    optimizer = torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=0.1)
    assert idist.auto_optim(optimizer) is optimizer


def test_serial_auto_dataloader_keeps_the_arguments() -> None:
    loader = idist.auto_dataloader(list(range(10)), batch_size=4, num_workers=0, shuffle=False)
    assert isinstance(loader, DataLoader)
    assert loader.batch_size == 4 and isinstance(loader.sampler, SequentialSampler)
    assert loader.pin_memory is False
    assert [b.tolist() for b in loader] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (lambda: idist.auto_model("net"), TypeError, r"^auto_model: model must be a torch.nn.Module, got str$"),
        (lambda: idist.auto_model(torch.nn.Linear(1, 1), sync_bn=1), TypeError, r"^auto_model: sync_bn must be a bool"),
        (lambda: idist.auto_optim(torch.nn.Linear(1, 1)), TypeError, r"^auto_optim: optimizer must be a torch"),
        (
            lambda: idist.auto_optim(torch.optim.SGD(torch.nn.Linear(1, 1).parameters(), lr=1), op=1),
            TypeError,
            r"^auto_optim: unexpected keyword argument\(s\) \['op'\]",
        ),
        (lambda: idist.auto_dataloader([1], batch_size=0), ValueError, r"^auto_dataloader: batch_size must be >= 1"),
        (lambda: idist.auto_dataloader([1], batch_size=2.0), TypeError, r"^auto_dataloader: batch_size must be an int"),
        (lambda: idist.auto_dataloader([1], num_workers=-1), ValueError, r"^auto_dataloader: num_workers must be >= 0"),
    ],
)
def test_bad_arguments_are_clear_errors(call: Any, error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        call()


def test_proxy_sampler_splits_a_sampler_without_overlap() -> None:
    sampler = SequentialSampler(range(10))
    shares = [list(idist.DistributedProxySampler(sampler, num_replicas=3, rank=r)) for r in range(3)]
    assert shares == [[0, 3, 6, 9], [1, 4, 7, 0], [2, 5, 8, 1]]  # padded to a multiple of 3, as DistributedSampler


def test_proxy_sampler_gives_every_rank_the_same_random_order_and_keeps_the_rng() -> None:
    torch.manual_seed(123)
    state = torch.get_rng_state()
    samplers = [idist.DistributedProxySampler(RandomSampler(range(12)), num_replicas=3, rank=r) for r in range(3)]
    for s in samplers:
        s.set_epoch(4)
    shares = [list(s) for s in samplers]
    assert sorted(i for share in shares for i in share) == list(range(12))  # a permutation, split
    assert torch.equal(state, torch.get_rng_state())  # the global RNG was not reseeded
    for s in samplers:
        s.set_epoch(5)
    assert [list(s) for s in samplers] != shares  # a new epoch, a new order


def test_proxy_sampler_defaults_to_this_process() -> None:
    sampler = idist.DistributedProxySampler(SequentialSampler(range(4)))
    assert (sampler.num_replicas, sampler.rank, list(sampler)) == (1, 0, [0, 1, 2, 3])


class _NoLen(torch.utils.data.Sampler[int]):
    def __iter__(self) -> Any:
        return iter([0])


@pytest.mark.parametrize(
    ("args", "error", "message"),
    [
        (([0, 1],), TypeError, r"^Argument sampler should be instance of torch Sampler, but given: <class 'list'>"),
        (
            (DistributedSampler(range(4), num_replicas=2, rank=0),),
            TypeError,
            r"^Argument sampler must not be a distributed sampler already",
        ),
        ((_NoLen(),), TypeError, r"^Argument sampler should have length; _NoLen has no __len__"),
        ((SequentialSampler(range(4)), 2, 2), ValueError, r"rank"),
        ((SequentialSampler(range(4)), 0, 0), ValueError, r"^DistributedProxySampler: num_replicas must be >= 1"),
        ((SequentialSampler(range(4)), 2, "0"), TypeError, r"^DistributedProxySampler: rank must be an int"),
    ],
)
def test_proxy_sampler_rejects_bad_arguments(args: tuple[Any, ...], error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        idist.DistributedProxySampler(*args)


# --- distributed: one job of 3 ranks ---------------------------------------------------


@pytest.fixture(scope="module")
def job() -> dict[int, dict[str, Any]]:
    result = python("auto_job.py", bound=240)
    assert result.returncode == 0, result.output[-4000:]
    assert result.leftovers == []
    lines = [json.loads(ln[len("AUTO ") :]) for ln in result.stdout.splitlines() if ln.startswith("AUTO {")]
    return {d["rank"]: d for d in lines}


@pytest.mark.timeout(300)
def test_auto_model_wraps_in_ddp_with_rank_0_weights(job: dict[int, dict[str, Any]]) -> None:
    assert sorted(job) == [0, 1, 2]
    for d in job.values():
        assert d["model"] == "DistributedDataParallel"
        assert d["same_init"] and d["same_after_step"]
        assert d["optim_same"]
        assert d["sync_bn_cpu"].startswith(
            "SyncBatchNorm layers only work with GPU modules; auto_model: sync_bn=True needs CUDA, and this job runs on"
        )


@pytest.mark.timeout(300)
def test_auto_dataloader_splits_batch_workers_and_data(job: dict[int, dict[str, Any]]) -> None:
    for d in job.values():
        observed = (d["batch_size"], d["num_workers"], d["sampler"], d["pin_memory"])
        assert observed == (10, 2, "DistributedSampler", False)
        assert d["given_kept"]
    shares = [job[r]["indices"] for r in range(3)]
    assert shares == [list(range(r, 30, 3)) for r in range(3)]  # shuffle=False: every 3rd, disjoint


@pytest.mark.timeout(300)
def test_auto_dataloader_wraps_a_user_sampler(job: dict[int, dict[str, Any]]) -> None:
    orders = [job[r]["proxy"] for r in range(3)]
    assert all(job[r]["proxy_sampler"] == "DistributedProxySampler" for r in range(3))
    assert all(job[r]["rng_untouched"] for r in range(3))
    # the same random permutation on every rank, each rank its share: together one cover of 12 slots
    assert {i for o in orders for i in o} == set(range(10))
    assert all(len(o) == 4 for o in orders)
    assert all(job[r]["proxy_sampled"] == job[r]["proxy"] for r in range(3))
