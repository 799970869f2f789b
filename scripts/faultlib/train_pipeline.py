"""Pipeline-parallel job for the fault bench: the bench's tiny LM in S stages x world/S data-parallel replicas.

Why: in pipeline parallelism the ranks of different stages run different layers, so only the ranks of
one stage are alike; eroica must compare a rank with its own stage's ranks only, from the mesh the job
builds (``init_device_mesh(..., mesh_dim_names=("pp", "dp"))``), and a rank of another stage, which
waits on a straggler in its point-to-point receives, must not be taken for one. With as many stages as
ranks (``--stages 4`` on 4 ranks) no rank has a peer at all: each can only be compared with itself in
the baseline capture (engine/ownbaseline.py).

The model is :class:`train_bench.TinyLM` with S encoder layers (``--stages``, env
``EROICA_BENCH_STAGES``, default 2), one a stage: the first stage also holds the embedding, the last
the LM head and the loss. ``torch.distributed.pipelining`` runs it (``PipelineStage`` +
``ScheduleGPipe``, 2 micro-batches a step, activations and gradients sent between the stages over
gloo), each stage's module sharded over its replicas with FSDP2 (``fully_shard`` on the mesh's dp dim:
DDP's reducer failed an internal assert on the micro-batches here, "rebuilt parameter indices size is
not same as original model parameters size", 28 vs 14). Rank r is stage ``r // (world / S)``, replica
``r % (world / S)`` (the mesh's last dim fastest). Every stage reads the same batch of its replica (the
first stage feeds the inputs, the last the targets); faults are planted as :mod:`train_bench` plants
them (``EROICA_BENCH_FAULT``, ``ctl.step(step)`` at the start of every step, ``ctl.wrap_dataset``), and
``--out DIR`` writes the same step files, so the bench scores it unchanged.

    eroica-run --nproc-per-node 4 scripts/faultlib/train_pipeline.py --steps 60
    eroica-run --nproc-per-node 4 scripts/faultlib/train_pipeline.py --stages 4 --steps 60
    EROICA_BENCH_FAULT=compute:rank=1:start=20:ms=50 torchrun --nproc-per-node 4 scripts/faultlib/train_pipeline.py
"""

from __future__ import annotations

import os
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

MICROBATCHES = 2


class Stage(nn.Module):
    """Encoder layer ``index`` of the LM; the first stage also embeds the tokens (and adds positions),
    the last also applies the LM head. Causal, as TinyLM runs its layers."""

    def __init__(self, lm: TinyLM, index: int, stages: int) -> None:
        super().__init__()
        self.first, self.last = index == 0, index == stages - 1
        self.layer = lm.body.layers[index]
        if self.first:
            self.emb, self.pos = lm.emb, lm.pos
        if self.last:
            self.head = lm.head

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        if self.first:
            h = self.emb(h) + self.pos[: h.shape[1]]
        mask = nn.Transformer.generate_square_subsequent_mask(h.shape[1])
        h = self.layer(h, src_mask=mask, is_causal=True)
        return self.head(h) if self.last else h


def main(argv: list[str] | None = None) -> int:
    ap = bench_parser(__doc__.splitlines()[0])
    # a string default goes through type=int too: a bad EROICA_BENCH_STAGES is argparse's one-line error
    ap.add_argument("--stages", type=int, default=os.environ.get("EROICA_BENCH_STAGES", "2"),
                    help="pipeline stages (one encoder layer each); the world size must be a multiple of it")
    args = ap.parse_args(argv)
    stages = args.stages
    world_size = launcher_rank_world()[1]
    if stages < 2 or world_size % stages:   # before joining: a refused job must not leave its peers waiting
        print(f"train_pipeline: --stages {stages}: need 2 or more stages and a world size ({world_size}) "
              "that is a multiple of them", file=sys.stderr)
        return 2
    with joined_job(args.threads) as (rank, world, ctl):
        mesh = init_device_mesh("cpu", (stages, world // stages), mesh_dim_names=("pp", "dp"))
        stage_index, replica = mesh["pp"].get_local_rank(), mesh["dp"].get_local_rank()
        lm = TinyLM(args.vocab, args.d_model, stages, args.heads, args.seq)
        module = fully_shard(Stage(lm, stage_index, stages), mesh=mesh["dp"])
        stage = PipelineStage(module, stage_index, stages, torch.device("cpu"), group=mesh["pp"].get_group())
        loss_fn = nn.CrossEntropyLoss()
        schedule = ScheduleGPipe(stage, n_microbatches=MICROBATCHES,
                                 loss_fn=lambda out, tgt: loss_fn(out.reshape(-1, args.vocab), tgt.reshape(-1)))
        opt = torch.optim.AdamW(module.parameters(), lr=1e-3)
        replicas = world // stages
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
            elif stage_index == stages - 1:
                losses = []
                schedule.step(target=batch[:, 1:].contiguous(), losses=losses)
            else:
                schedule.step()
            opt.step()
            step_ms.append((time.perf_counter() - t0) * 1e3)
        ctl.close()
        loss = float(torch.stack(losses).mean()) if losses else 0.0
        report(rank, world, step_ms, ctl, loss, args.out)
        del schedule, stage, module, opt, it   # FSDP holds the process group: dropped before the teardown
    return 0


if __name__ == "__main__":
    sys.exit(main())
