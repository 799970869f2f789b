"""PyTorch Lightning 2.x DDP job for the fault bench: the bench's tiny LM trained by ``lightning.Trainer``.

Why: eroica must get phases and waits right whatever shape the training loop has, and Lightning's
shape is not train_bench's: with automatic optimization it runs the forward, ``zero_grad``, the
backward and DDP's gradient all-reduce *inside* ``optimizer.step(closure)``, and its data fetcher
prefetches one batch ahead. A user's Lightning job with a slow dataset on one rank was diagnosed
"healthy" because of that. This job is launched unchanged by ``eroica-run`` (or ``torchrun``), like a
user's, and plants faults exactly as :mod:`train_bench` does (``EROICA_BENCH_FAULT``,
:class:`faults.FaultController`, ``ctl.wrap_dataset``, ``ctl.step(step)`` at the start of every step,
``--steps``, ``--out DIR`` -> ``steps-rank<r>.json``), so the bench scores it unchanged.

    eroica-run --nproc-per-node 4 scripts/faultlib/train_lightning.py --steps 60
    EROICA_BENCH_FAULT=data:rank=1:start=20:ms=80 torchrun --nproc-per-node 4 scripts/faultlib/train_lightning.py

Ranks: Lightning must use the processes the launcher made, never spawn its own. ``eroica-run`` sets
torchrun's environment (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR/PORT
and TORCHELASTIC_RUN_ID), and Lightning's accelerator connector picks ``TorchElasticEnvironment``
first when ``TORCHELASTIC_RUN_ID`` is set (``torch.distributed.is_torchelastic_launched()``); that
environment ``creates_processes_externally``, so ``_SubprocessScriptLauncher`` only validates
``devices * num_nodes == WORLD_SIZE`` and runs in place. The job leaves the choice to Lightning, as a
user's would, and then refuses to train (exit 2, one line) if Lightning would spawn processes or
disagrees with the launcher about this process's rank or the world size.

The ``BENCH_STEPS`` / ``BENCH_SUMMARY`` lines and step files are :func:`train_bench.report`'s. A step's
time is the wall time from one ``on_train_batch_start`` to the next (the last one ends at its
``on_train_batch_end``): Lightning fetches the next batch between them, so a slow dataset shows in it.
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
import warnings
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # so "faultlib" imports when run as a file

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402

from faultlib.faults import FaultController  # noqa: E402
from faultlib.train_bench import (  # noqa: E402
    TinyLM,
    TokenDataset,
    _env_int,
    bench_parser,
    launcher_rank_world,
    report,
)

try:
    import lightning as L  # noqa: N812 (Lightning's own spelling)
except ImportError:  # the bench checks this before launching; a direct run gets one clear line
    L = None  # type: ignore[assignment]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = bench_parser((__doc__ or "").splitlines()[0])
    return ap.parse_args(argv)


if L is not None:

    class LitLM(L.LightningModule):
        """The bench's TinyLM as a LightningModule with automatic optimization (Lightning's default:
        the loop calls ``optimizer.step(closure)`` and the closure runs training_step and backward)."""

        def __init__(self, args: argparse.Namespace) -> None:
            super().__init__()
            self.vocab = args.vocab
            self.net = TinyLM(args.vocab, args.d_model, args.layers, args.heads, args.seq)
            self.loss_fn = nn.CrossEntropyLoss()
            self.last_loss = float("nan")

        def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
            logits = self.net(batch[:, :-1])
            loss = self.loss_fn(logits.reshape(-1, self.vocab), batch[:, 1:].reshape(-1))
            self.last_loss = float(loss.detach())
            return loss

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.AdamW(self.parameters(), lr=1e-3)

    class TokenData(L.LightningDataModule):
        """Random token sequences; the dataset is wrapped by the fault controller (a ``data`` fault slows
        this rank's ``__getitem__``). Lightning adds the DistributedSampler itself."""

        def __init__(self, args: argparse.Namespace, world: int, ctl: FaultController) -> None:
            super().__init__()
            self.args, self.world, self.ctl = args, world, ctl

        def train_dataloader(self) -> DataLoader:
            a = self.args
            # one spare step's worth, so the prefetching fetcher never runs dry before max_steps
            n_items = a.batch_size * self.world * (a.steps + 2)
            ds = self.ctl.wrap_dataset(TokenDataset(n_items, a.seq, a.vocab), batch_size=a.batch_size)
            return DataLoader(ds, batch_size=a.batch_size, shuffle=False, num_workers=a.workers,
                              persistent_workers=a.workers > 0)

    class FaultHook(L.Callback):
        """The per-step hook: switches faults on/off (and runs their per-step work) at the start of every
        step, as train_bench does before its ``next(it)``, and times the steps."""

        def __init__(self, ctl: FaultController) -> None:
            self.ctl = ctl
            self.starts: list[float] = []
            self.last_end = 0.0

        def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
            self.starts.append(time.perf_counter())
            self.ctl.step(trainer.global_step)

        def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
            self.last_end = time.perf_counter()

        def step_ms(self) -> list[float]:
            ends = [*self.starts[1:], self.last_end]
            return [(e - s) * 1e3 for s, e in zip(self.starts, ends, strict=True)]


def check_ranks(trainer: Any, rank: int, world: int) -> str | None:
    """Why Lightning's view of the job is not the launcher's, or None when it uses the existing ranks."""
    env = trainer.strategy.cluster_environment
    if env is None:
        return f"strategy {type(trainer.strategy).__name__} has no cluster environment"
    name = type(env).__name__
    if not env.creates_processes_externally and trainer.num_devices > 1:
        return f"Lightning chose {name}, which would spawn its own processes"
    if trainer.global_rank != rank or trainer.world_size != world:
        return f"Lightning ({name}) sees rank {trainer.global_rank}/{trainer.world_size}, the launcher {rank}/{world}"
    return None


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if L is None:
        print("train_lightning: the 'lightning' package is not installed (pip install 'eroica[frameworks]')",
              file=sys.stderr)
        return 2
    rank, world = launcher_rank_world()
    local_world = _env_int(("LOCAL_WORLD_SIZE",), world)
    torch.set_num_threads(args.threads)
    # Lightning's tips ("consider num_workers", "static graph", "GPU available") are noise in every rank's log
    warnings.filterwarnings("ignore", module=r"lightning(\..*)?")
    L.seed_everything(0, verbose=False)
    ctl = FaultController.from_env(rank)
    hook = FaultHook(ctl)
    model = LitLM(args)
    trainer = L.Trainer(accelerator="cpu", devices=local_world, num_nodes=max(1, world // local_world),
                        strategy="ddp", max_steps=args.steps, max_epochs=-1, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        num_sanity_val_steps=0, callbacks=[hook])
    why = check_ranks(trainer, rank, world)
    if why:
        print(f"train_lightning: {why}; refusing to train", file=sys.stderr, flush=True)
        return 2
    try:
        trainer.fit(model, datamodule=TokenData(args, world, ctl))
        ctl.close()
        # the process group Lightning made (init_process_group from the cluster environment) is still up
        report(rank, world, hook.step_ms(), ctl, model.last_loss, args.out)
        # as train_bench: drop the DDP wrapper (its reducer holds the group) and tear down together
        del trainer
        gc.collect()
        dist.barrier()
    finally:
        ctl.close()
        if dist.is_initialized():
            dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
