"""Hugging Face ``transformers.Trainer`` DDP job for the fault bench: a tiny GPT-2 built from a config.

Why: the Trainer's loop is a third shape eroica must read right. It prefetches all of a step's
micro-batches before the step's first forward (``get_batch_samples``), then all-gathers their token
counts across ranks (``average_tokens_across_devices``, a collective *inside* the data fetch); with
gradient accumulation (2 here) the first micro-batch's backward runs under DDP's ``no_sync`` and only
the last one all-reduces; accelerate wraps the optimizer, the DataLoader (sharded per rank) and the
model (DDP, ``find_unused_parameters`` as the Trainer picks it). The job runs unchanged under
``eroica-run`` or ``torchrun``, like a user's, and plants faults exactly as :mod:`train_bench` does
(``EROICA_BENCH_FAULT``, :class:`faults.FaultController`, ``ctl.wrap_dataset``, ``ctl.step(step)`` at
the start of every optimizer step, ``--steps``, ``--out DIR`` -> ``steps-rank<r>.json``), so the bench
scores it unchanged.

    eroica-run --nproc-per-node 4 scripts/faultlib/train_hf.py --steps 60
    EROICA_BENCH_FAULT=compute:rank=1:start=20:ms=150 torchrun --nproc-per-node 4 scripts/faultlib/train_hf.py

Nothing is downloaded (``HF_HUB_OFFLINE=1``; the model comes from ``GPT2Config``, the data is random
tokens). Ranks: ``TrainingArguments(use_cpu=True, ddp_backend="gloo")`` makes accelerate's
``PartialState`` see a multi-CPU job from WORLD_SIZE/LOCAL_RANK (torchrun's environment, which eroica-run
sets) and ``init_process_group("gloo")`` from MASTER_ADDR/PORT; it never spawns. The job refuses to
train (exit 2, one line) if the Trainer's rank or world size is not the launcher's.

A step is one optimizer step (``--grad-accum`` micro-batches): its time runs from one
``on_step_begin`` to the next (the last one ends at its ``on_step_end``), which includes fetching the
next step's batches. A ``data`` fault adds its ``ms`` per optimizer step (spread over the
``batch * grad_accum`` items fetched for it), as it adds ``ms`` per step to train_bench.
"""

from __future__ import annotations

import argparse
import gc
import logging
import os
import shutil
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # so "faultlib" imports when run as a file

# no network: the model is built from a config and nothing may be fetched (set before transformers loads)
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from faultlib.faults import FaultController  # noqa: E402
from faultlib.train_bench import TokenDataset, bench_parser, launcher_rank_world, report  # noqa: E402

try:
    import transformers
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments
except ImportError:  # the bench checks this before launching; a direct run gets one clear line
    transformers = None  # type: ignore[assignment]
    TrainerCallback = object  # type: ignore[assignment,misc]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = bench_parser((__doc__ or "").splitlines()[0], d_model=64, heads=2)
    ap.add_argument("--grad-accum", type=int, default=2, help="micro-batches per optimizer step")
    return ap.parse_args(argv)


class LMItems:
    """TokenDataset's sequences as the dicts a causal-LM Trainer eats (labels = inputs; the model shifts)."""

    def __init__(self, base: TokenDataset) -> None:
        self.base = base

    def __len__(self) -> int:
        return len(self.base)

    def __getitem__(self, idx: int) -> dict[str, torch.Tensor]:
        ids = self.base[idx][:-1]
        return {"input_ids": ids, "labels": ids}


class FaultHook(TrainerCallback):  # type: ignore[misc,valid-type]
    """The per-step hook: switches faults on/off (and runs their per-step work) at the start of every
    optimizer step, as train_bench does before its ``next(it)``, and times the steps."""

    def __init__(self, ctl: FaultController) -> None:
        self.ctl = ctl
        self.starts: list[float] = []
        self.last_end = 0.0

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.starts.append(time.perf_counter())
        self.ctl.step(state.global_step)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.last_end = time.perf_counter()

    def step_ms(self) -> list[float]:
        ends = [*self.starts[1:], self.last_end]
        return [(e - s) * 1e3 for s, e in zip(self.starts, ends, strict=True)]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if transformers is None:
        print("train_hf: the 'transformers' package is not installed (pip install 'eroica[frameworks]')",
              file=sys.stderr)
        return 2
    rank, world = launcher_rank_world()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    transformers.logging.set_verbosity_error()  # one line per rank per tip is noise in a 4-rank log
    logging.getLogger("accelerate").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", module=r"(transformers|accelerate)(\..*)?")
    if world == 1:  # a plain `python train_hf.py` (a smoke test): accelerate makes no group, report() needs one
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29500")
        dist.init_process_group("gloo", init_method="env://", rank=0, world_size=1)
    ctl = FaultController.from_env(rank)
    hook = FaultHook(ctl)
    # the Trainer wants an output_dir even when it saves nothing: a scratch one, removed at the end
    scratch = tempfile.mkdtemp(prefix=f"eroica-hf-rank{rank}-")
    targs = TrainingArguments(
        output_dir=scratch,
        max_steps=args.steps, per_device_train_batch_size=args.batch_size,
        gradient_accumulation_steps=args.grad_accum, learning_rate=1e-3, use_cpu=True,
        # only for a multi-rank job: accelerate 1.15, given a backend with no launcher environment,
        # asks torch.distributed for the world size of a group that does not exist
        ddp_backend="gloo" if world > 1 else None,
        report_to=[], save_strategy="no", logging_strategy="no",
        dataloader_num_workers=args.workers, dataloader_pin_memory=False, disable_tqdm=True, seed=0)
    if targs.process_index != rank or targs.world_size != world:
        print(f"train_hf: the Trainer sees rank {targs.process_index}/{targs.world_size}, the launcher "
              f"{rank}/{world}; refusing to train", file=sys.stderr, flush=True)
        shutil.rmtree(scratch, ignore_errors=True)
        return 2
    cfg = GPT2Config(n_layer=args.layers, n_embd=args.d_model, n_head=args.heads, vocab_size=args.vocab,
                     n_positions=args.seq, bos_token_id=0, eos_token_id=0)
    model = GPT2LMHeadModel(cfg)
    # the sampler shards by rank and the Trainer may take a spare batch: room for every step and one more
    n_items = args.batch_size * args.grad_accum * world * (args.steps + 2)
    ds = ctl.wrap_dataset(LMItems(TokenDataset(n_items, args.seq, args.vocab)),
                          batch_size=args.batch_size * args.grad_accum)
    trainer = Trainer(model=model, args=targs, train_dataset=ds, callbacks=[hook])
    try:
        out = trainer.train()
        ctl.close()
        if not dist.is_initialized() or dist.get_world_size() != world:
            print(f"train_hf: no {world}-rank process group after training", file=sys.stderr, flush=True)
            return 2
        report(rank, world, hook.step_ms(), ctl, float(out.training_loss), args.out)
        # as train_bench: drop the DDP wrapper (its reducer holds the group) and tear down together
        trainer.accelerator.free_memory()
        del trainer, model
        gc.collect()
        dist.barrier()
    finally:
        ctl.close()
        shutil.rmtree(scratch, ignore_errors=True)
        if dist.is_initialized():
            dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
