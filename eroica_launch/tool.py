"""``eroica``: the offline tool (doctor, analyze, show, synth)."""

from __future__ import annotations

import click


@click.group()
@click.version_option(package_name="eroica")
def cli() -> None:
    """eroica: online performance troubleshooting for distributed PyTorch training."""


@cli.command()
def doctor() -> None:
    """Print what eroica would use here (MPI, launcher, torch, CUDA, NVML, CPU quota, Slurm, injection) and what to fix."""
    from eroica_launch.doctor import render, run_checks

    text, code = render(run_checks())
    click.echo(text)
    raise SystemExit(code)


from eroica_launch.offline import analyze_cmd, show_cmd, synth_cmd  # noqa: E402  (beside the engine)

cli.add_command(analyze_cmd, "analyze")
cli.add_command(show_cmd, "show")
cli.add_command(synth_cmd, "synth")
