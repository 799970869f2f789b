"""Pipeline-parallel job for the fault bench: the bench's tiny LM in S stages x replicas x tensor-parallel ranks.

Why: in pipeline parallelism the ranks of different stages run different layers, so only the ranks of
one stage are alike; eroica must compare a rank with its own stage's ranks only, from the mesh the job
builds (``init_device_mesh(..., mesh_dim_names=("pp", "dp", "tp"))``), and a rank of another stage,
which waits on a straggler in its point-to-point receives, must not be taken for one. With as many stages as
ranks (``--stages 4`` on 4 ranks) no rank has a peer at all: each can only be compared with itself in
the baseline capture (engine/ownbaseline.py).

The model is :class:`train_bench.TinyLM` with S x V encoder layers, one a stage: S pipeline ranks
(``--stages``, env ``EROICA_BENCH_STAGES``, default 2) holding V stages each (``--virtual``); the first
stage also holds the embedding, the last the LM head and the loss. ``torch.distributed.pipelining``
runs it (``PipelineStage`` and ``--schedule``, env ``EROICA_BENCH_SCHEDULE``: ``gpipe`` (default) and
``1f1b`` with one stage a rank, ``interleaved-1f1b`` and ``zero-bubble`` with V = 2 by default, stage
i on pp rank i mod S, the placement Megatron's interleaving uses; the zero-bubble schedules run a
stage's backward as two passes, input gradients first and weight gradients later; ``zbv`` and
``dualpipev`` with V = 2 in a V: pp rank r holds stages r and 2S-1-r, so pp rank 0 holds the first and
the last stage and feeds both the inputs and the targets; 2 micro-batches a step (2S for
``dualpipev``, which needs one a stage), activations and gradients sent between the stages over gloo), each stage's feed-forward split
over ``--tp`` tensor-parallel ranks (env ``EROICA_BENCH_TP``, default 1: ``ColwiseParallel`` and
``RowwiseParallel`` on its two linears, an all-reduce in every forward and backward, as Megatron
splits an MLP) and its module sharded over its replicas with FSDP2 (``fully_shard`` on the mesh's dp
dim: DDP's reducer failed an internal assert on the micro-batches here, "rebuilt parameter indices size is
not same as original model parameters size", 28 vs 14). Rank r is pp rank ``r // (world / S)``,
then replica, then tp rank (the mesh's dims ``("pp", "dp", "tp")``, the last fastest). Every stage
reads the same batch of its replica (the first stage feeds the inputs, the last the targets); faults
are planted as :mod:`train_bench` plants them (``EROICA_BENCH_FAULT``, ``ctl.step(step)`` at the
start of every step, ``ctl.wrap_dataset``), and ``--out DIR`` writes the same step files, so the
bench scores it unchanged.

    eroica-run --nproc-per-node 4 scripts/faultlib/train_pipeline.py --steps 60
    eroica-run --nproc-per-node 4 scripts/faultlib/train_pipeline.py --stages 4 --steps 60
    eroica-run --nproc-per-node 4 scripts/faultlib/train_pipeline.py --schedule interleaved-1f1b --steps 60
    eroica-run --nproc-per-node 4 scripts/faultlib/train_pipeline.py --schedule zbv --steps 60
    eroica-run --nproc-per-node 4 scripts/faultlib/train_pipeline.py --tp 2 --steps 60
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
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh  # noqa: E402
from torch.distributed.fsdp import fully_shard  # noqa: E402
from torch.distributed.pipelining import (  # noqa: E402
    PipelineStage,
    Schedule1F1B,
    ScheduleDualPipeV,
    ScheduleGPipe,
    ScheduleInterleaved1F1B,
    ScheduleInterleavedZeroBubble,
    ScheduleZBVZeroBubble,
)
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module  # noqa: E402
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
# schedule name -> class; the MULTI_STAGE ones take a list of stages (several a rank)
SCHEDULES = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B, "interleaved-1f1b": ScheduleInterleaved1F1B,
             "zero-bubble": ScheduleInterleavedZeroBubble, "zbv": ScheduleZBVZeroBubble,
             "dualpipev": ScheduleDualPipeV}
MULTI_STAGE = frozenset({"interleaved-1f1b", "zero-bubble", "zbv", "dualpipev"})
# V placement: pp rank r holds stages r and 2S-1-r, so the first and the last stage share pp rank 0
V_SHAPED = frozenset({"zbv", "dualpipev"})


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


def _parallel(stage: Stage, mesh: DeviceMesh) -> nn.Module:
    """Tensor parallel over the mesh's tp dim (the feed-forward's two linears), then FSDP2 over dp."""
    if mesh["tp"].size() > 1:
        parallelize_module(stage.layer, mesh["tp"], {"linear1": ColwiseParallel(), "linear2": RowwiseParallel()})
    return fully_shard(stage, mesh=mesh["dp"])


def main(argv: list[str] | None = None) -> int:
    ap = bench_parser(__doc__.splitlines()[0])
    # a string default goes through type=int too: a bad EROICA_BENCH_STAGES is argparse's one-line error
    ap.add_argument("--stages", type=int, default=os.environ.get("EROICA_BENCH_STAGES", "2"),
                    help="pipeline ranks (the mesh's pp dim); the world size must be a multiple of it")
    ap.add_argument("--schedule", choices=sorted(SCHEDULES), default=os.environ.get("EROICA_BENCH_SCHEDULE", "gpipe"),
                    help="torch.distributed.pipelining schedule; the interleaved ones hold --virtual stages a rank")
    ap.add_argument("--virtual", type=int, default=None,
                    help="stages a rank holds (looped: stage i on pp rank i %% stages); default 2 for the "
                         "interleaved schedules, 1 for the others")
    ap.add_argument("--tp", type=int, default=os.environ.get("EROICA_BENCH_TP", "1"),
                    help="tensor-parallel ranks a stage (the mesh's tp dim, fastest): each stage's feed-forward "
                         "split column-/row-wise over them, an all-reduce in every forward and backward")
    args = ap.parse_args(argv)
    stages, tp = args.stages, args.tp
    multi = args.schedule in MULTI_STAGE
    virtual = args.virtual if args.virtual is not None else (2 if multi else 1)
    world_size = launcher_rank_world()[1]
    # before joining: a refused job must not leave its peers waiting
    v_shaped = args.schedule in V_SHAPED
    layers = stages * virtual
    microbatches = layers if args.schedule == "dualpipev" else MICROBATCHES
    if stages < 2 or tp < 1 or world_size % (stages * tp) or virtual < 1 or (virtual > 1 and not multi) \
            or (v_shaped and virtual != 2) or args.batch_size % microbatches:
        print(f"train_pipeline: --stages {stages} --virtual {virtual} --schedule {args.schedule} --batch-size "
              f"{args.batch_size}: need 2 or more stages, a world size ({world_size}) that is a multiple of them, "
              f"--virtual 1 unless the schedule is one of {', '.join(sorted(MULTI_STAGE))} (2 for "
              f"{', '.join(sorted(V_SHAPED))}), and a batch that splits into {microbatches} micro-batches",
              file=sys.stderr)
        return 2
    with joined_job(args.threads) as (rank, world, ctl):
        replicas = world // (stages * tp)
        mesh = init_device_mesh("cpu", (stages, replicas, tp), mesh_dim_names=("pp", "dp", "tp"))
        pp_rank, replica = mesh["pp"].get_local_rank(), mesh["dp"].get_local_rank()
        lm = TinyLM(args.vocab, args.d_model, layers, args.heads, args.seq)
        # looped placement, as the interleaved schedules expect; a V for zbv and dualpipev
        mine = [pp_rank, layers - 1 - pp_rank] if v_shaped else list(range(pp_rank, layers, stages))
        feeds_inputs, feeds_targets = 0 in mine, layers - 1 in mine
        modules = [_parallel(Stage(lm, i, layers), mesh) for i in mine]
        pstages = [PipelineStage(m, i, layers, torch.device("cpu"), group=mesh["pp"].get_group())
                   for m, i in zip(modules, mine, strict=True)]
        loss_fn = nn.CrossEntropyLoss()
        schedule = SCHEDULES[args.schedule](
            pstages if multi else pstages[0], n_microbatches=microbatches,
            loss_fn=lambda out, tgt: loss_fn(out.reshape(-1, args.vocab), tgt.reshape(-1)))
        opt = torch.optim.AdamW([p for m in modules for p in m.parameters()], lr=1e-3)
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
            inputs = (batch[:, :-1].contiguous(),) if feeds_inputs else ()
            if feeds_targets:
                losses = []
                schedule.step(*inputs, target=batch[:, 1:].contiguous(), losses=losses)
            else:
                schedule.step(*inputs)
            opt.step()
            step_ms.append((time.perf_counter() - t0) * 1e3)
        ctl.close()
        loss = float(torch.stack(losses).detach().mean()) if losses else 0.0
        report(rank, world, step_ms, ctl, loss, args.out)
        del schedule, pstages, modules, opt, it   # FSDP holds the process group: dropped before the teardown
    return 0


if __name__ == "__main__":
    sys.exit(main())
