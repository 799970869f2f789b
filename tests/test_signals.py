"""eroica's signal handlers give way to the job's own (signals.py): real signals sent to this process."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from typing import Any

import pytest

from eroica_runtime.signals import Signals, describe

SIG = signal.SIGUSR1


def _deliver(sig: int = SIG) -> None:
    os.kill(os.getpid(), sig)
    time.sleep(0.01)   # the handler runs in the main thread at its next bytecode


@pytest.fixture
def eroica() -> Iterator[tuple[Signals, list[str], list[tuple[int, Any]]]]:
    original = signal.getsignal(SIG)
    got: list[str] = []
    taken: list[tuple[int, Any]] = []
    sigs = Signals({SIG: lambda signum, frame: got.append("eroica")}, before={SIG: signal.SIG_DFL},
                   on_taken=lambda signum, handler: taken.append((signum, handler)))
    sigs.install()
    try:
        yield sigs, got, taken
    finally:
        sigs.uninstall()
        signal.signal(SIG, original)


def test_eroicas_handler_answers_while_the_job_has_none_and_reads_as_the_default(eroica) -> None:
    sigs, got, taken = eroica
    _deliver()
    assert got == ["eroica"] and sigs.owns(SIG)
    assert signal.getsignal(SIG) is signal.SIG_DFL and not taken


def test_a_job_that_looks_before_it_takes_the_signal_gets_it_and_eroica_hears_once(eroica) -> None:
    sigs, got, taken = eroica
    job: list[int] = []

    def handler(signum: int, frame: Any) -> None:
        job.append(signum)

    # the convention of Lightning's _SignalConnector: take it only when nothing handles it
    assert signal.getsignal(SIG) in (None, signal.SIG_DFL)
    assert signal.signal(SIG, handler) is signal.SIG_DFL   # what it had, as far as the job knows
    _deliver()
    assert job == [SIG] and got == [] and signal.getsignal(SIG) is handler and not sigs.owns(SIG)
    signal.signal(SIG, handler)   # again: said once
    assert taken == [(SIG, handler)] and sigs.taken == {SIG}
    assert describe(handler).endswith("test_a_job_that_looks_before_it_takes_the_signal_gets_it_and_eroica_hears_once"
                                      ".<locals>.handler")
    # the job puts back what it found (Lightning at the end of fit): eroica's again
    assert signal.signal(SIG, signal.SIG_DFL) is handler
    _deliver()
    assert got == ["eroica"] and job == [SIG] and sigs.owns(SIG) and sigs.taken == set()


def test_a_job_that_ignores_the_signal_is_obeyed(eroica) -> None:
    sigs, got, taken = eroica
    signal.signal(SIG, signal.SIG_IGN)
    _deliver()
    assert got == [] and taken == [(SIG, signal.SIG_IGN)] and describe(signal.SIG_IGN) == "SIG_IGN"


def test_uninstall_leaves_the_signal_module_and_the_signal_as_they_were(eroica) -> None:
    sigs, _, _ = eroica
    sigs.uninstall()
    assert signal.signal.__module__ == "signal" and signal.getsignal.__module__ == "signal"
    assert signal.getsignal(SIG) is signal.SIG_DFL and not sigs.owns(SIG)


def test_lightnings_slurm_auto_requeue_takes_sigusr1_and_gives_it_back(eroica) -> None:
    """The real connector (lightning 2.6.6 here): with eroica's handler in place and no give-way it
    printed "SLURM auto-requeueing enabled. Setting signal handlers." and installed nothing."""
    connector = pytest.importorskip("lightning.pytorch.trainer.connectors.signal_connector")
    environments = pytest.importorskip("lightning.fabric.plugins.environments")

    class Trainer:
        class _accelerator_connector:  # noqa: N801 - the attribute Lightning reads
            cluster_environment = environments.SLURMEnvironment(auto_requeue=True)

    sigs, got, taken = eroica
    original_term = signal.getsignal(signal.SIGTERM)
    signals = connector._SignalConnector(Trainer())
    try:
        signals.register_signal_handlers()
        assert type(signal.getsignal(SIG)).__name__ == "_HandlersCompose" and not sigs.owns(SIG)
        assert [s for s, _ in taken] == [SIG]
    finally:
        signals.teardown()
        signal.signal(signal.SIGTERM, original_term)
    assert sigs.owns(SIG)
    _deliver()
    assert got == ["eroica"]
