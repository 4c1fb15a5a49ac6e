"""Cost of tether's guard on DDP's gradient all-reduce: a DDP training step with it vs without it.

Usage::

    python benchmarks/ddp.py                          # 2 and 4 ranks, ~12 minutes on 2 cores
    python benchmarks/ddp.py --ranks 2 --quick --out /tmp/ddp-trial
    python benchmarks/ddp.py --ranks 4 --cores 1 --quick  # every rank on one core

Results go to ``--out`` + ``.md`` (the table) and + ``.json`` (the raw samples), by
default ``benchmarks/results/ddp.md`` and ``ddp.json``.

What is compared: one training step (forward, loss, backward, ``optimizer.step()`` of
SGD, ``zero_grad()``) of ``torch.nn.parallel.DistributedDataParallel`` as torch ships it
(its built-in C++ all-reduce, no hook), against

* the same DDP guarded by tether (``tether.register_comm_hook(model)``, what
  ``tether.auto_model`` does): tether's communication hook (``tether/ddp.py``). The
  targets are about this one. On CPU it divides each bucket into a buffer whose slices
  become the large gradients, so the reducer's copy back is a no-op
  (``tether/_grad_views.py``; ``results/ddp-eb27993.md`` is from before, when it divided
  in place). (``results/ddp.md`` at 0510da5 measured here a guard that kept DDP's
  built-in all-reduce, since reverted: see ``tether/ddp.py``);
* a second plain DDP, the *control*: what two identical contenders measure apart on
  this machine, the noise floor of every ratio below;
* DDP with torch's own Python hook doing the same all-reduce
  (``default_hooks.allreduce_hook``), and the same hook behind tether's
  (``tether.register_comm_hook(model, hook=allreduce_hook)``, the path of a user's own
  hook): such a hook divides the bucket in a pass of its own, which DDP's built-in path
  folds into its copy of the gradients (``reducer.cpp``), and the reducer copies the
  result back into the gradients,
* plain DDP and the guarded one built with ``gradient_as_bucket_view=True`` (a DDP
  argument ``auto_model`` passes on): the gradients are views of the buckets, so no
  copy back out of them after the all-reduce; the guarded one still divides in a pass
  of its own. Their ratios are to plain DDP as torch ships it, and to each other,

for

* a ~1 MB model (three ``Linear`` layers, 279k float32 parameters, batch 32: a bucket or two),
* a ~100 MB model (six ``Linear(2048, 2048)``, 25.2M float32 parameters, batch 8: DDP's
  25 MB buckets, so several all-reduces per step); ``--quick`` uses ``Linear(1024, 1024)``
  (~25 MB) instead.

Targets: guarded/plain <= 1.05x for the ~1 MB model, <= 1.02x for the ~100 MB model.

How: one torchrun job per world size (gloo on CPU, one thread per rank). Each rank calls
``tether.initialize("gloo")`` and builds, for each model, seven DDP instances from the
same initial weights (deep copies, and DDP broadcasts rank 0's anyway) in the same process
over the same process group, each with its own SGD. Each rank feeds its own fixed batch
(seeded by rank), the same to every contender.

Caveat, conservative for tether: once a model is guarded, ``torch.autograd.backward``
(through which ``loss.backward()`` goes) is wrapped process wide (``tether/ddp.py``), so
the plain contenders' backward passes through that wrapper too: the wrapper's cost is
charged to all, and the ratio measures the guard itself (and the per-instance ``forward``
wrapper, which only the guarded and tether-hooked models have).

Noise: every contender is warmed up first (past DDP's bucket rebuild at its second
iteration). Then each *round* of a model starts aligned on an untimed ``dist.barrier()``
and runs ``--steps`` steps of every contender (default 200 for the ~1 MB model, 4 for the
~100 MB one; 20 rounds) in blocks of ``--block`` consecutive steps (default 5 and 1), one
block of each contender in turn, in an order shuffled from round to round (the same on
every rank) and reversed every other pass (the order of the two models swapped every other
round); a contender's cost per step in a round is its summed block time divided by the
step count, of the slowest rank. Why blocks, and why shuffled (``results/ddp-interleave.md``,
2 ranks, the ~1 MB model): interleaved step by step in an order rotated from round to
round, as this benchmark did before, a second plain DDP measured 1.045x (IQR 1.017-1.061)
of the first, a bias between identical contenders from which one ran before which, and
tether's guard 1.089x; in blocks of 5 steps in shuffled order, the control 0.997x
(0.982-1.021) and the guard 0.994x (0.945-1.008). A training loop runs one model's steps
back to back, as a block does: what a step leaves behind (freed memory, a worker thread's
late work, the likely cause of the bias) lands on its own model's next step, not on
another contender's.
The table gives each contender's median over rounds with its interquartile range (IQR, %
of the median), and the ratio to plain DDP as the median of the per-round ratios (the
batches of a round ran side by side, under the same load) with their quartiles. A target
is *met* when the upper quartile of the ratio is within it, *not met* when the IQR
crosses it, *MISSED* when the whole IQR is above it. Before each world size the driver
waits until the 1-minute load average is below ``--wait-load`` (default 1.5; polled
every 20 s, up to ``--wait-max`` s, then it measures anyway and says so); the result
gives the load at the start and at the end of each world size. It also gives rank 0's
minor page faults per step for each contender (``getrusage`` of the whole process around
each step, median of the rounds): how much memory a step touches for the first time.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import random
import resource
import statistics
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from sync import _stats  # noqa: E402  (shared with sync.py: same argv and IQR conventions)

if TYPE_CHECKING:
    import torch

TARGETS = {"small": 1.05, "large": 1.02}  # model: max ratio hook/plain
KEYS = (  # (contender, key of its samples); plain first: every ratio is to it
    ("plain DDP", "plain_ms"),
    ("plain DDP again (control)", "control_ms"),
    ("DDP guarded by tether (auto_model)", "guarded_ms"),
    ("DDP + torch's allreduce_hook", "torch_hook_ms"),
    ("DDP + tether's hook around it", "hook_ms"),
    ("plain DDP, gradient_as_bucket_view", "plain_view_ms"),
    ("DDP guarded by tether, gradient_as_bucket_view", "guarded_view_ms"),
)
WARMUP = 5  # steps per contender before timing (DDP rebuilds its buckets at the 2nd)


# --- the worker (one rank under torchrun) ----------------------------------------------------


def _models(quick: bool) -> list[tuple[str, torch.nn.Module, int, int]]:
    """(name, network, input width, batch size)."""
    import torch.nn as nn

    small = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 256), nn.ReLU(), nn.Linear(256, 64))
    width = 1024 if quick else 2048
    layers: list[nn.Module] = []
    for i in range(6):
        layers += [nn.Linear(width, width)] + ([nn.ReLU()] if i < 5 else [])
    return [("small", small, 256, 32), ("large", nn.Sequential(*layers), width, 8)]


class _Contender:
    """One DDP instance with its optimizer and this rank's fixed batch."""

    def __init__(self, ddp: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> None:
        import torch

        self.ddp = ddp
        self.x, self.y = x, y
        self.opt = torch.optim.SGD(ddp.parameters(), lr=1e-3)
        self.loss = torch.nn.functional.mse_loss

    def step(self) -> None:
        loss = self.loss(self.ddp(self.x), self.y)
        loss.backward()  # type: ignore[no-untyped-call]
        self.opt.step()
        self.opt.zero_grad()


def worker(
    rounds: int, quick: bool, steps: dict[str, int], blocks: dict[str, int], pin: bool, cores: int | None
) -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.nn.parallel import DistributedDataParallel

    import _proc
    import tether

    torch.set_num_threads(1)
    if pin:
        _proc.pin_rank(int(os.environ["LOCAL_RANK"]), cores)
    tether.initialize("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)  # same initial weights on every rank (DDP broadcasts rank 0's anyway)
    data = torch.Generator().manual_seed(1000 + rank)  # each rank its own batch
    models: list[dict[str, Any]] = []
    groups: list[list[_Contender]] = []  # per model, one contender per KEYS entry, in its order
    for name, net, width, batch in _models(quick):
        x = torch.randn(batch, width, generator=data)
        out_width = net(x[:1]).shape[1]
        y = torch.randn(batch, out_width, generator=data)
        plain = DistributedDataParallel(copy.deepcopy(net))
        control = DistributedDataParallel(copy.deepcopy(net))
        guarded = DistributedDataParallel(copy.deepcopy(net))
        tether.register_comm_hook(guarded)
        torch_hooked = DistributedDataParallel(copy.deepcopy(net))
        torch_hooked.register_comm_hook(None, default_hooks.allreduce_hook)
        plain_view = DistributedDataParallel(copy.deepcopy(net), gradient_as_bucket_view=True)
        guarded_view = DistributedDataParallel(copy.deepcopy(net), gradient_as_bucket_view=True)
        tether.register_comm_hook(guarded_view)
        hooked = DistributedDataParallel(net)
        tether.register_comm_hook(hooked, hook=default_hooks.allreduce_hook)
        contenders = (plain, control, guarded, torch_hooked, hooked, plain_view, guarded_view)
        groups.append([_Contender(m, x, y) for m in contenders])
        params = sum(p.numel() for p in net.parameters())
        nbytes = sum(p.numel() * p.element_size() for p in net.parameters())
        info = {"model": name, "params": params, "bytes": nbytes, "batch": batch}
        models.append({**info, "steps": steps[name], "block": blocks[name]})
    for group in groups:  # warm up every path (gloo's connections, DDP's bucket rebuild)
        for c in group:
            for _ in range(WARMUP):
                c.step()
    # per model, per contender (KEYS' order): ms per step, one sample per round
    samples: list[list[list[float]]] = [[[] for _ in KEYS] for _ in groups]
    faults: list[list[list[float]]] = [[[] for _ in KEYS] for _ in groups]  # this rank's minor page faults a step
    everyone = list(range(len(KEYS)))
    for r in range(rounds):
        model_order = [0, 1] if (r // 2) % 2 == 0 else [1, 0]
        for m in model_order:
            who_order = list(everyone)
            random.Random(r * 2 + m).shuffle(who_order)  # the same order on every rank: the same seed
            n, block = models[m]["steps"], models[m]["block"]
            spent = [0.0] * len(everyone)
            faulted = [0] * len(everyone)
            dist.barrier()
            # a block of steps of each contender in turn, there and back: they share the round's load
            for b in range(n // block):
                for who in who_order if b % 2 == 0 else reversed(who_order):
                    contender = groups[m][who]
                    f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
                    t0 = time.perf_counter()
                    for _ in range(block):
                        contender.step()
                    spent[who] += time.perf_counter() - t0
                    faulted[who] += resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0
            for who in everyone:
                samples[m][who].append(spent[who] / n * 1e3)
                faults[m][who].append(faulted[who] / n)
    # the floor of any comm hook: DDP's own all-reduce divides each gradient by the world size
    # while copying it into its bucket; a hook gets the bucket filled and divides it again
    floor = torch.tensor([_hook_pass_ms(torch, info["bytes"]) for info in models], dtype=torch.float64)
    dist.all_reduce(floor, op=dist.ReduceOp.MAX)
    # slowest rank per batch: gathered outside any timing
    mine = torch.tensor(samples, dtype=torch.float64)
    dist.all_reduce(mine, op=dist.ReduceOp.MAX)
    # the instances saw the same data and the same averaged gradients: their weights agree
    drift = torch.tensor(
        [
            max(
                float((a - b).abs().max())
                for other in others
                for a, b in zip(plain.ddp.parameters(), other.ddp.parameters(), strict=True)
            )
            for plain, *others in groups
        ],
        dtype=torch.float64,
    )
    dist.all_reduce(drift, op=dist.ReduceOp.MAX)
    if rank == 0:
        for m, info in enumerate(models):
            for i, (_, key) in enumerate(KEYS):
                info[key] = mine[m][i].tolist()
            info["weight_drift"] = float(drift[m])
            info["page_faults"] = {key: faults[m][i] for i, (_, key) in enumerate(KEYS)}  # rank 0's
            info["hook_pass_ms"] = float(floor[m])
        print("RESULT " + json.dumps({"world": world, "rounds": rounds, "models": models}), flush=True)
    tether.finalize()


def _hook_pass_ms(torch: Any, nbytes: int) -> float:
    """ms of one ``div_`` over as many float32 bytes as the model's gradients (median of 20)."""
    buffer = torch.ones(nbytes // 4)
    times = []
    for _ in range(20):
        t0 = time.perf_counter()
        buffer.div_(2)
        times.append((time.perf_counter() - t0) * 1e3)
        buffer.fill_(1.0)
    return float(statistics.median(times))


# --- the driver ----------------------------------------------------------------------------


def _ratios(model: dict[str, Any], key: str = "guarded_ms", base: str = "plain_ms") -> tuple[float, float, float]:
    """Quartiles of the per-round ratios ``key``/``base`` (default: tether's guard / plain DDP)."""
    import _proc

    return _proc.paired_ratios(model[key], model[base])


def _label(model: dict[str, Any]) -> str:
    mb = model["bytes"] / 1e6
    return f"{model['model']} ({model['params'] / 1e6:.2f}M params, {mb:.1f} MB, batch {model['batch']})"


def run_world(
    n: int,
    rounds: int,
    quick: bool,
    steps: dict[str, int],
    blocks: dict[str, int],
    bound: float,
    pin: bool,
    cores: int | None,
) -> dict[str, Any]:
    import _proc

    args = _proc.torchrun(
        n,
        __file__,
        "--worker",
        "--rounds",
        str(rounds),
        "--steps",
        str(steps["small"]),
        str(steps["large"]),
        "--block",
        str(blocks["small"]),
        str(blocks["large"]),
        *(["--quick"] if quick else []),
        *([] if pin else ["--no-pin"]),
        *([] if cores is None else ["--cores", str(cores)]),
        launcher=("--monitor_interval", "0.1"),
    )
    done = _proc.run(args, bound, env={"OMP_NUM_THREADS": "1"})
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")]
    if done.returncode != 0 or not lines or done.leftovers:
        sys.stderr.write(done.stdout[-3000:] + done.stderr[-5000:])
        raise SystemExit(f"ddp benchmark at {n} ranks failed: exit {done.returncode}, leftovers {done.leftovers}")
    result: dict[str, Any] = json.loads(lines[-1][len("RESULT ") :])
    return result


def table(results: list[dict[str, Any]]) -> str:
    """One markdown table: a row per (model, contender), a column pair per world size."""
    worlds = [r["world"] for r in results]
    head = "| model | contender | " + " | ".join(f"{w} ranks ms/step (IQR %) | ratio (IQR)" for w in worlds) + " |"
    lines = [head, "|" + "---|" * (2 + 2 * len(worlds))]
    for m, first in enumerate(results[0]["models"]):
        for who, key in KEYS:
            cells = []
            for res in results:
                model = res["models"][m]
                med, iqr = _stats(model[key])
                if key == "plain_ms":
                    ratio = "1"
                else:
                    q1, r, q3 = _ratios(model, key)
                    ratio = f"{r:.3f}x ({q1:.3f} to {q3:.3f})"
                cells.append(f"{med:,.1f} ({iqr:.0f}%) | {ratio}")
            lines.append(f"| {_label(first)} | {who} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def verdicts(results: list[dict[str, Any]]) -> list[str]:
    import _proc

    out = []
    for res in results:
        for model in res["models"]:
            limit = TARGETS[model["model"]]
            q1, ratio, q3 = _ratios(model)
            verdict = _proc.verdict(q1, q3, limit)
            mb = model["bytes"] / 1e6
            c1, control, c3 = _ratios(model, "control_ms")
            t1, vs_torch, t3 = _ratios(model, "hook_ms", "torch_hook_ms")
            floor = ""
            if "hook_pass_ms" in model:
                share = model["hook_pass_ms"] / _stats(model["plain_ms"])[0]
                floor = (
                    f"; any hook's own pass over the gradients (the division DDP does while copying into its "
                    f"buckets): {model['hook_pass_ms']:.2f} ms = {1 + share:.3f}x of plain DDP's step"
                )
            v1, view, v3 = _ratios(model, "guarded_view_ms")
            s1, same, s3 = _ratios(model, "guarded_view_ms", "plain_view_ms")
            floor += (
                f"; with gradient_as_bucket_view=True: guarded/plain (torch's default) = {view:.3f}x "
                f"(IQR {v1:.3f}x to {v3:.3f}x), guarded/plain (both with it) = {same:.3f}x (IQR {s1:.3f}x to {s3:.3f}x)"
            )
            out.append(
                f"{res['world']} ranks: {model['model']} model ({mb:.0f} MB): guarded/plain = {ratio:.3f}x "
                f"(IQR {q1:.3f}x to {q3:.3f}x; target <= {limit}x) {verdict}; the control (plain/plain) "
                f"{control:.3f}x (IQR {c1:.3f}x to {c3:.3f}x); "
                f"tether's hook / torch's allreduce_hook = {vs_torch:.3f}x (IQR {t1:.3f}x to {t3:.3f}x){floor}"
            )
    return out


def page_faults(results: list[dict[str, Any]]) -> list[str]:
    """Rank 0's minor page faults per step, per contender: where the memory a step touches is new."""
    out = []
    for res in results:
        for model in res["models"]:
            if "page_faults" not in model:
                continue
            cells = ", ".join(f"{who} {statistics.median(model['page_faults'][key]):,.0f}" for who, key in KEYS)
            out.append(
                f"{res['world']} ranks, {model['model']} model: minor page faults per step on rank 0 "
                f"(median of the rounds): {cells}"
            )
    return out


def _paths(out: Path) -> tuple[Path, Path]:
    """``--out`` without (or with) ``.md``/``.json``: the markdown and the json file."""
    base = out.with_suffix("") if out.suffix in {".md", ".json"} else out
    return base.parent / (base.name + ".md"), base.parent / (base.name + ".json")


def main() -> None:
    import _proc

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 4], help="world sizes (default: 2 4)")
    parser.add_argument("--rounds", type=int, default=None, help="interleaved rounds (default 20, 5 with --quick)")
    parser.add_argument(
        "--steps",
        type=int,
        nargs=2,
        default=None,
        metavar=("SMALL", "LARGE"),
        help="steps of each contender per round, ~1 MB and ~100 MB model (default 200 4; 50 2 with --quick)",
    )
    parser.add_argument(
        "--block",
        type=int,
        nargs=2,
        default=(5, 1),
        metavar=("SMALL", "LARGE"),
        help="consecutive steps of one contender, ~1 MB and ~100 MB model (default 5 1; divides --steps)",
    )
    parser.add_argument("--quick", action="store_true", help="fewer rounds and steps, a ~25 MB 'large' model")
    parser.add_argument(
        "--no-pin", dest="pin", action="store_false", help="leave each rank's threads unpinned (default: one core each)"
    )
    parser.add_argument(
        "--cores",
        type=int,
        default=None,
        help="pin the ranks round-robin over this many cores only (default: every core); 1: all ranks on one core",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=HERE / "results" / "ddp",
        help="write OUT.md (the table) and OUT.json (raw samples); default benchmarks/results/ddp",
    )
    _proc.add_driver_options(parser)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    rounds = args.rounds or (5 if args.quick else 20)
    small_steps, large_steps = args.steps or ((50, 2) if args.quick else (200, 4))
    steps = {"small": small_steps, "large": large_steps}
    blocks = {"small": args.block[0], "large": args.block[1]}
    if any(b < 1 or steps[name] % b for name, b in blocks.items()):
        parser.error(f"--block {args.block[0]} {args.block[1]} must divide --steps {small_steps} {large_steps}")
    if args.cores is not None and args.cores < 1:
        parser.error(f"--cores {args.cores}: at least one core")
    if args.worker:
        worker(rounds, args.quick, steps, blocks, args.pin, args.cores)
        return

    _proc.exit_on_sigterm(ignore=args.ignore_sigterm)
    library = [_proc.library_state()]
    results = []
    loads = {}
    for n in args.ranks:
        quiet = _proc.wait_for_load(args.wait_load, up_to=args.wait_max, what=f"{n} ranks")
        print(f"[{n} ranks: {quiet.describe()}]", flush=True)
        t0 = time.monotonic()
        # a hang guard, not an estimate: a large-model step took ~0.55 s at 4 ranks on 2 cores
        # (a small-model one ~1/50 of that); this allows 0.5 s per rank per step, ~4x that
        bound = 300 + 0.5 * n * (len(KEYS) * rounds * (steps["large"] + steps["small"] / 20) + 2 * WARMUP)
        results.append(run_world(n, rounds, args.quick, steps, blocks, bound, args.pin, args.cores))
        end = os.getloadavg()[0]
        elapsed = time.monotonic() - t0
        loads[n] = (quiet, end)
        results[-1]["load"] = {**vars(quiet), "load_end": end, "seconds": elapsed}
        print(f"[{n} ranks: {elapsed:.0f} s, load {end:.2f} at end]", flush=True)
    library.append(_proc.library_state())
    one, five, fifteen = os.getloadavg()
    drift = max(m["weight_drift"] for res in results for m in res["models"])
    text = "\n".join(
        [
            "# tether's guard on DDP's gradient all-reduce: benchmark",
            "",
            *([args.note, ""] if args.note else []),
            f"`python benchmarks/ddp.py {_proc.command_line()}` — {time.strftime('%Y-%m-%d %H:%M')}, "
            f"{os.cpu_count()} cores, load average at end {one:.1f}/{five:.1f}/{fifteen:.1f} (1/5/15 min); "
            "torchrun, gloo on CPU, one thread per rank"
            + (
                ", each rank's threads pinned to one core (round-robin"
                + ("" if args.cores is None else f" over {args.cores} core(s) only: `--cores`")
                + "; `_proc.pin_rank`)."
                if args.pin
                else ", unpinned."
            ),
            "",
            _proc.describe_library(*library),
            "",
            "Load (1-minute average) at the start of each world size, after waiting for it to drop below "
            f"{args.wait_load:g}, and at its end: "
            + "; ".join(f"{n} ranks: {q.describe()}, {end:.2f} at end" for n, (q, end) in loads.items())
            + ".",
            "",
            f"ms per training step (forward, MSE loss, backward, SGD step, zero_grad), median of {rounds} "
            f"interleaved rounds of {steps['small']} (small) / {steps['large']} (large) steps of each contender, "
            f"in blocks of {blocks['small']} / {blocks['large']} consecutive steps, the contenders' order shuffled "
            "from round to round; slowest rank per round; IQR = interquartile range in % of the median; "
            "ratio = median of the per-round ratios vs plain DDP, with their quartiles in parentheses. "
            "Every contender runs in the same processes, and each passes through tether's process-wide "
            "`torch.autograd.backward` wrapper (see the module docstring).",
            "",
            table(results),
            "",
            *verdicts(results),
            "",
            *page_faults(results),
            "",
            f"Weights of the {len(KEYS)} instances after the run: max |plain - other| = {drift:.2g} (same data, "
            "same averaged gradients).",
        ]
    )
    print()
    print(text)
    md, raw = _paths(args.out)
    md.parent.mkdir(parents=True, exist_ok=True)
    md.write_text(text + "\n")
    raw.write_text(json.dumps(results, indent=1))
    print(f"\n[wrote {md} and {raw}]")


if __name__ == "__main__":
    main()
