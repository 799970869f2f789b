"""eroica's in-rank runtime (and the pure diagnosis engine it feeds on rank 0)."""

__version__ = "0.1.0"


def mark_step() -> None:
    """Mark a training-step boundary (for loops with no torch.optim optimizer)."""
    from eroica_runtime.agent import mark_step as _mark

    _mark()
