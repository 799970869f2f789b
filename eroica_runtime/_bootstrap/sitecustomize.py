"""eroica bootstrap: runs at start-up in every Python process that has this folder on PYTHONPATH.

eroica-run puts this folder first on PYTHONPATH (the ddtrace-run pattern), so the training script needs
no change. It must be invisible when it should be: it chains any sitecustomize it shadows, runs once,
activates only in the rank's own process (the first Python process of the rank to claim ownership —
never a DataLoader worker or another subprocess, which must never initialize MPI), and never breaks
the user's program.
"""


def _eroica_chain_shadowed() -> None:
    """Run the sitecustomize this file hides (the next one on sys.path), as Python would have."""
    import importlib.machinery
    import importlib.util
    import os
    import sys

    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or ".") != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None or not spec.origin or os.path.dirname(spec.origin) == here:
        return
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)


def _eroica_claim_owner() -> bool:
    """Exactly one process per rank owns eroica: the first to create the claim file."""
    import os

    path = os.environ.get("EROICA_OWNER_CLAIM")
    if not path:
        return False
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except OSError:
        return False
    os.write(fd, str(os.getpid()).encode())
    os.close(fd)
    return True


def _eroica_bootstrap() -> None:
    import sys

    if getattr(sys, "_eroica_bootstrapped", False):
        return
    sys._eroica_bootstrapped = True  # idempotent even if imported twice under different names
    try:
        _eroica_chain_shadowed()
    except Exception as exc:  # a broken user sitecustomize must behave as it would without us
        print(f"eroica: the shadowed sitecustomize raised {type(exc).__name__}: {exc}", file=sys.stderr)
    try:
        if not _eroica_claim_owner():
            return
        from eroica_runtime import agent

        agent.bootstrap()
    except Exception as exc:
        print(f"eroica: disabled on this rank (bootstrap failed: {type(exc).__name__}: {exc})",
              file=sys.stderr)


_eroica_bootstrap()
