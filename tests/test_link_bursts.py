"""A slow link in bursts, which the window missed, named from the steps before it and the link probe.

Recorded captures of the fault bench's link-int case (tests/data/engine/link-bursts/README.md): the
spike window opened as the 8-step burst ended and held one slow step of three; the window alone
gives no finding (fault-bench runs 5, 10 and 11 missed the case). What is there to see: every rank's
steps just before the window (the step clock's history) ~4x the baseline's, nobody's own work grown,
and the link probe, run as the window opened, reading host h1 at a tenth of the others' bandwidth.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgpack
import pytest

from eroica_runtime import report
from eroica_runtime.engine import Diagnosis
from eroica_runtime.engine.commonmode import BURST_PROBE_BW, slow_hosts_from_probe
from eroica_runtime.pipeline import Pipeline

CAPTURES = Path(__file__).parent / "data" / "engine" / "link-bursts" / "captures"


def _doc(step: int) -> dict[str, Any]:
    return msgpack.unpackb((CAPTURES / f"{step}.msgpack").read_bytes(), raw=False, strict_map_key=False)


def _diagnose(burst: dict[str, Any]) -> Diagnosis:
    pipe = Pipeline(world_size=4)
    pipe.analyse((CAPTURES / "13.msgpack").read_bytes(), origin="baseline")
    return pipe.analyse(msgpack.packb(burst, use_bin_type=True), origin="burst").diagnosis


def test_a_slow_link_in_bursts_the_window_missed_is_named_on_its_host() -> None:
    diag = _diagnose(_doc(57))
    assert diag.findings, diag.notes
    top = diag.findings[0]
    assert (top.category, top.rank, top.function) == ("communication", None, "(comm)"), top
    assert top.host is not None and top.host.endswith("-h1"), top.host
    assert top.evidence["localized_by"].startswith("link_probe")
    assert "steps before the window" in top.evidence["seen_in"] and "steps before the window" in top.title
    now, was = top.evidence["step_ms"]
    assert now > 3 * was and top.evidence["excess_ms"] > 2 * was   # the burst's steps, not the window's
    # what it costs the job a step: 7 of the 32 steps before the window were the burst (the first one,
    # the link slowed at step 50), so about 7/32 of a slow step's excess, not all of it
    assert top.impact_ms_per_step == top.evidence["average_ms"]
    assert 0.15 < top.impact_ms_per_step / top.evidence["excess_ms"] < 0.3, top.evidence
    assert top.what_if_step_ms < 1.5 * was   # fixed, a step is the baseline's again
    assert len(diag.findings) == 1, diag.findings
    # the rank-0 log says what the probe measured, so the person at the switch knows what to look for
    hosts_line = next(ln for ln in report.format_capture(diag).splitlines() if "hosts:" in ln)
    assert "h1 0.0915 Gbps vs the hosts' 1.88" in hosts_line, hosts_line


def test_with_a_probe_that_singles_out_no_host_the_burst_is_a_note_not_a_finding() -> None:
    """A probe run after the burst (what the runtime did before: at the gather) sees a healthy network;
    a job-wide wait the window did not see then sends nobody to a switch port."""
    burst = _doc(57)
    burst["extra"]["link_probe"] = _doc(13)["extra"]["link_probe"]   # the healthy network's probe
    diag = _diagnose(burst)
    assert not diag.findings, diag.findings
    assert any("singled out no host" in n for n in diag.notes), diag.notes


@pytest.mark.parametrize("ranks", [[2], [0, 1, 2, 3]], ids=["one rank", "every rank"])
def test_own_work_that_grew_in_the_burst_is_no_slow_link(ranks: list[int]) -> None:
    """A late rank makes every other rank wait alike: if one rank's CPU time grew with the steps (a
    culprit in bursts), the others' wait is its lateness (the history rule names that rank); if
    every rank's did (half the growth each: more work everywhere), the wait is not the network's."""
    burst = _doc(57)
    summaries = [msgpack.unpackb(b, raw=False, strict_map_key=False) for b in burst["summaries"]]
    share = 0.9 if len(ranks) == 1 else 0.5
    for r in ranks:
        hist = summaries[r]["history"]
        hist["cpu"] = [c + share * (m - 60.0) if m > 150 else c for c, m in zip(hist["cpu"], hist["ms"], strict=True)]
    burst["summaries"] = [msgpack.packb(s, use_bin_type=True) for s in summaries]
    diag = _diagnose(burst)
    assert not any(f.category == "communication" for f in diag.findings), diag.findings
    if len(ranks) == 1:
        assert [(f.category, f.rank) for f in diag.findings] == [("compute", 2)], diag.findings


def test_only_a_detectors_capture_looks_before_its_window() -> None:
    """A person's capture (SIGUSR1, a trigger file) is no claim that the job was slow."""
    burst = _doc(57)
    burst["trigger"] = "manual"
    assert not _diagnose(burst).findings


def test_the_probe_names_the_host_set_apart_not_a_healthy_one_that_read_low() -> None:
    """Probes recorded as windows opened on the fault bench's fake hosts (2026-12-01, best of three
    1 MiB exchanges): healthy links spread 1.0-11 Gbps within one probe, so a healthy host can read
    a sixth of the others while the slow one reads a fiftieth; only the one below the widest gap is
    named. With the bar a burst finding uses (no window shows the slowness: a fifth of the others'
    bandwidth), none of the healthy probes names a host; the window rule's bar (half) would name the
    low pair of the first, which is why that one needs the window's own evidence as well."""
    def probe(gbps: dict[str, float]) -> dict[str, dict[str, float]]:
        return {h: {"latency_us": 50.0, "bandwidth_gbps": v} for h, v in gbps.items()}

    # link-delay (NFQUEUE 5 ms each way on h1), and link-int (100 Mbit/s on h1) in a burst
    assert slow_hosts_from_probe(probe({"h0": 7.24, "h1": 0.17, "h2": 7.34, "h3": 1.14}))[0] == ["h1"]
    assert slow_hosts_from_probe(probe({"h0": 6.66, "h1": 0.09, "h2": 5.38, "h3": 1.89}))[0] == ["h1"]
    # healthy networks (the baseline captures and a noise capture of the same runs)
    for healthy in ({"h0": 1.15, "h1": 4.84, "h2": 1.93, "h3": 5.41}, {"h0": 7.59, "h1": 3.05, "h2": 4.61, "h3": 4.61},
                    {"h0": 2.04, "h1": 7.62, "h2": 1.96, "h3": 3.45}):
        assert slow_hosts_from_probe(probe(healthy), bw_factor=BURST_PROBE_BW, latency=False)[0] == [], healthy
    # two hosts behind one bad switch, among many
    many = {f"h{i}": 1.0 + 0.1 * i for i in range(20)} | {"h7": 0.1, "h8": 0.12}
    assert sorted(slow_hosts_from_probe(probe(many))[0]) == ["h7", "h8"]


def test_a_probe_from_a_foreign_or_spoiled_capture_names_a_dead_link_and_never_raises() -> None:
    def probe(gbps: dict[str, object]) -> dict[str, dict[str, object]]:
        return {h: {"latency_us": 50.0, "bandwidth_gbps": v} for h, v in gbps.items()}

    assert slow_hosts_from_probe(probe({"h0": 5.0, "h1": 0.0, "h2": 4.0, "h3": 6.0}))[0] == ["h1"]
    for junk in ({"h0": float("nan"), "h1": -1.0, "h2": 4.0}, {"h0": "fast", "h1": None, "h2": 4.0, "h3": 3.0},
                 {"h0": 0.0, "h1": 0.0}, {"h0": float("inf"), "h1": 1.0, "h2": 1.0}):
        hosts, _ = slow_hosts_from_probe(probe(junk))
        assert set(hosts) <= set(junk)
