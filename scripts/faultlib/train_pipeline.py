"""Pipeline-parallel job for the fault bench: the bench's tiny LM in 2 stages x world/2 data-parallel replicas.

Why: in pipeline parallelism the ranks of different stages run different layers, so only the ranks of
one stage are alike; eroica must compare a rank with its own stage's ranks only, from the mesh the job
builds (``init_device_mesh(..., mesh_dim_names=("pp", "dp"))``), and a rank of the other stage, which
waits on a straggler in its point-to-point receives, must not be taken for one. The engine's stage
logic was only ever fed synthetic summaries before this job.

The model is :class:`train_bench.TinyLM` with 2 encoder layers, cut between them: stage 0 holds the
embedding and layer 0, stage 1 layer 1, the LM head and the loss. ``torch.distributed.pipelining`` runs
it (``PipelineStage`` + ``ScheduleGPipe``, 2 micro-batches a step, activations and gradients sent
between the stages over gloo), each stage's module sharded over its replicas with FSDP2 (``fully_shard``
on the mesh's dp dim: DDP's reducer failed an internal assert on the micro-batches here, "rebuilt
parameter indices size is not same as original model parameters size", 28 vs 14). Rank r
is stage ``r // (world / 2)``, replica ``r % (world / 2)`` (the mesh's last dim fastest). Both stages read
the same batch of their replica (stage 0 the inputs, stage 1 the targets); faults are planted as
:mod:`train_bench` plants them (``EROICA_BENCH_FAULT``, ``ctl.step(step)`` at the start of every step,
``ctl.wrap_dataset``), and ``--out DIR`` writes the same step files, so the bench scores it unchanged.

    eroica-run --nproc-per-node 4 scripts/faultlib/train_pipeline.py --steps 60
    EROICA_BENCH_FAULT=compute:rank=1:start=20:ms=50 torchrun --nproc-per-node 4 scripts/faultlib/train_pipeline.py
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # so "faultlib" imports when run as a file

import torch  # noqa: E402
from torch import nn  # noqa: E402
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402
from torch.distributed.fsdp import fully_shard  # noqa: E402
from torch.distributed.pipelining import PipelineStage, ScheduleGPipe  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402
from torch.utils.data.distributed import DistributedSampler  # noqa: E402

from faultlib.train_bench import (  # noqa: E402
    TinyLM,
    TokenDataset,
    bench_parser,
    joined_job,
    launcher_rank_world,
    report,
)

STAGES = 2
MICROBATCHES = 2


class FirstStage(nn.Module):
    """Embedding, positions and the first encoder layer (causal, as TinyLM runs it)."""

    def __init__(self, lm: TinyLM) -> None:
        super().__init__()
        self.emb, self.pos, self.layer = lm.emb, lm.pos, lm.body.layers[0]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mask = nn.Transformer.generate_square_subsequent_mask(x.shape[1])
        return self.layer(self.emb(x) + self.pos[: x.shape[1]], src_mask=mask, is_causal=True)


class LastStage(nn.Module):
    """The second encoder layer and the LM head."""

    def __init__(self, lm: TinyLM) -> None:
        super().__init__()
        self.layer, self.head = lm.body.layers[1], lm.head

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        mask = nn.Transformer.generate_square_subsequent_mask(h.shape[1])
        return self.head(self.layer(h, src_mask=mask, is_causal=True))


def main(argv: list[str] | None = None) -> int:
    args = bench_parser(__doc__.splitlines()[0]).parse_args(argv)
    if launcher_rank_world()[1] % STAGES:   # before joining: a refused job must not leave its peers waiting
        print(f"train_pipeline: the world size must be a multiple of {STAGES} stages", file=sys.stderr)
        return 2
    with joined_job(args.threads) as (rank, world, ctl):
        mesh = init_device_mesh("cpu", (STAGES, world // STAGES), mesh_dim_names=("pp", "dp"))
        stage_index, replica = mesh["pp"].get_local_rank(), mesh["dp"].get_local_rank()
        lm = TinyLM(args.vocab, args.d_model, STAGES, args.heads, args.seq)
        module = fully_shard(FirstStage(lm) if stage_index == 0 else LastStage(lm), mesh=mesh["dp"])
        stage = PipelineStage(module, stage_index, STAGES, torch.device("cpu"), group=mesh["pp"].get_group())
        loss_fn = nn.CrossEntropyLoss()
        schedule = ScheduleGPipe(stage, n_microbatches=MICROBATCHES,
                                 loss_fn=lambda out, tgt: loss_fn(out.reshape(-1, args.vocab), tgt.reshape(-1)))
        opt = torch.optim.AdamW(module.parameters(), lr=1e-3)
        replicas = world // STAGES
        ds = ctl.wrap_dataset(TokenDataset(args.batch_size * replicas * (args.steps + 1), args.seq, args.vocab),
                              batch_size=args.batch_size)
        sampler = DistributedSampler(ds, num_replicas=replicas, rank=replica, shuffle=False)
        it = iter(DataLoader(ds, batch_size=args.batch_size, sampler=sampler, num_workers=args.workers))
        step_ms: list[float] = []
        losses: list[torch.Tensor] = []
        for step in range(args.steps):
            t0 = time.perf_counter()
            ctl.step(step)
            batch = next(it)
            opt.zero_grad(set_to_none=True)
            # contiguous: torch 2.11's stage checks a micro-batch's strides against the shape it
            # inferred (a column slice of the batch failed there: "stride mismatch")
            if stage_index == 0:
                schedule.step(batch[:, :-1].contiguous())
            else:
                losses = []
                schedule.step(target=batch[:, 1:].contiguous(), losses=losses)
            opt.step()
            step_ms.append((time.perf_counter() - t0) * 1e3)
        ctl.close()
        loss = float(torch.stack(losses).mean()) if losses else 0.0
        report(rank, world, step_ms, ctl, loss, args.out)
        del schedule, stage, module, opt, it   # FSDP holds the process group: dropped before the teardown
    return 0


if __name__ == "__main__":
    sys.exit(main())
