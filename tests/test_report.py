"""Reports: file layout and schema, atomic writes, text that leads with the answer, escaped HTML."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import msgpack
import pytest

from eroica_runtime import report, synth
from eroica_runtime.engine import diagnose

DATA = Path(__file__).parent / "data" / "engine"
EVIL_FN = "<script>alert('fn')</script>"
EVIL_HOST = "<img src=x onerror=alert(1)>"


def _job(n: int = 8) -> list[dict]:
    base = json.loads((DATA / "summary_gpu_rank0.json").read_text())
    sums = []
    for r in range(n):
        s = copy.deepcopy(base)
        s["rank"], s["host"] = r, f"gpu-a{r // 4:02d}"
        sums.append(s)
    return sums


def _evil_capture(step: int = 42):
    sums = _job()
    for s in sums:
        s["functions"][1]["name"] = EVIL_FN
        s["phases"]["comm"] += 40.0
    sums[5]["host"] = EVIL_HOST
    sums[5]["phases"]["backward"] += 40.0
    sums[5]["phases"]["comm"] -= 40.0
    sums[5]["functions"][1]["ms"] += 40.0
    return diagnose(sums, step=step, trigger="slow_<b>step</b>", world_size=8)


def test_write_capture_and_job(tmp_path: Path) -> None:
    synth.generate(tmp_path, ranks=16, fault="compute", culprit=3)
    from eroica_runtime import summary
    diags = []
    for p in sorted((tmp_path / "captures").glob("*.msgpack")):
        meta, good, errors = summary.decode_capture(p.read_bytes())
        diags.append(diagnose(good, step=meta["step"], trigger=meta["trigger"], world_size=16,
                              missing=[15] if meta["step"] == 500 else [], errors=errors))
    for d in diags:
        path = report.write_capture(tmp_path, d)
        assert path.name == f"diagnosis-{d.step}.json"
        assert json.loads(path.read_text())["step"] == d.step
    job = {"ranks": {"0": {"steps": 600, "median_ms": 101.0, "p99_ms": 140.0}}}
    doc = report.write_job(tmp_path, diagnoses=diags, world_size=16, steps=600, job=job)
    on_disk = json.loads((tmp_path / "report.json").read_text())
    assert on_disk == json.loads(json.dumps(doc))
    assert on_disk["schema"] == "eroica.report/1" and on_disk["world_size"] == 16 and on_disk["steps"] == 600
    assert on_disk["job"] == job
    assert [c["step"] for c in on_disk["captures"]] == [100, 500]
    cap = on_disk["captures"][1]
    assert {"step", "trigger", "findings", "missing", "errors"} <= set(cap) and cap["missing"] == [15]
    (f,) = on_disk["findings"]
    for key in ("rank", "host", "category", "function", "phase", "impact_ms_per_step", "victims", "evidence",
                "action"):
        assert key in f
    assert f["rank"] == 3 and f["category"] == "compute" and isinstance(f["victims"], list)
    assert not list(tmp_path.glob(".*.tmp"))          # atomic writes leave no temp files
    html = (tmp_path / "report.html").read_text()
    assert "<polyline" in html and "<script" not in html.lower() and "http" not in html


def test_html_job_and_rank_tables_show_ms_to_a_tenth_and_report_json_keeps_the_figure(tmp_path: Path) -> None:
    """An SRE reads "141.9", not "141.9001"; report.json keeps what was measured."""
    job = {"median_step_ms": 76.747, "p99_step_ms": 141.9001, "steps": 140,
           "per_rank": [{"rank": 0, "host": "vm", "steps": 140, "median_ms": 75.355, "p99_ms": 131.6567,
                         "eroica_ms": 441.76}]}
    report.write_job(tmp_path, diagnoses=[], world_size=1, steps=140, job=job)
    assert json.loads((tmp_path / "report.json").read_text())["job"]["p99_step_ms"] == 141.9001
    html = (tmp_path / "report.html").read_text()
    for shown in ("<td>76.7</td>", "<td>141.9</td>", "<td>140</td>", "<td>75.4</td>", "<td>131.7</td>",
                  "<td>441.8</td>", "<td>vm</td>"):
        assert shown in html, shown
    assert "141.9001" not in html and "131.6567" not in html


def test_html_escapes_names_and_tolerates_no_history(tmp_path: Path) -> None:
    d = _evil_capture()
    assert d.findings[0].host == EVIL_HOST and d.findings[0].function == EVIL_FN
    report.write_job(tmp_path, diagnoses=[d], world_size=8, steps=50)
    html = (tmp_path / "report.html").read_text()
    assert EVIL_FN not in html and EVIL_HOST not in html and "<b>step" not in html
    assert "&lt;script&gt;" in html and "&lt;img src=x" in html
    assert "No step history" in html
    assert "<script" not in html.lower()


def test_bad_steps_history_is_ignored(tmp_path: Path) -> None:
    (tmp_path / "steps.msgpack").write_bytes(msgpack.packb({"schema": "nope"}))
    assert report.load_steps(tmp_path) is None
    (tmp_path / "steps.msgpack").write_bytes(b"\xc1\xc1")
    assert report.load_steps(tmp_path) is None


def test_text_leads_with_the_answer() -> None:
    d = _evil_capture()
    text = report.format_capture(d)
    lines = text.splitlines()
    assert lines[0].startswith("eroica: step 42 (slow_<b>step</b>): rank 5 on")
    assert "compute" in lines[0] and "7 ranks waiting" in lines[0]
    assert lines[1].startswith("  #1 COMPUTE: rank 5 on") and "+40.0 ms/step" in lines[1]
    assert "vs peers" in text and "victims: 7 ranks" in text and "action:" in text


def test_one_victim_is_one_rank_in_the_title_and_the_victims_line() -> None:
    """A pipeline stage of two data-parallel ranks has one rank to wait on its straggler: "1 rank", as
    the 3 a.m. reader would write it (a real 2-stage x 2-replica job printed "1 ranks waiting on it")."""
    from eroica_runtime.engine.model import ranks_waiting

    assert ranks_waiting(1) == "1 rank waiting on it" and ranks_waiting(3) == "3 ranks waiting on it"
    f = dict(_evil_capture().findings[0].__dict__, victims=(4,))
    assert "     victims: 1 rank only waited on it (4)" in report.format_finding(f)


def test_healthy_is_one_line() -> None:
    d = diagnose(_job(), step=7, trigger="slow_step", world_size=8)
    text = report.format_capture(d)
    assert "\n" not in text and "healthy" in text


def test_job_text_from_report_json(tmp_path: Path) -> None:
    d = _evil_capture()
    doc = report.write_job(tmp_path, diagnoses=[d], world_size=8, steps=50)
    text = report.format_job(json.loads((tmp_path / "report.json").read_text()), tmp_path)
    assert text.splitlines()[0].startswith("eroica: job report: 1 finding")
    assert "report.html" in text and text == report.format_job(doc, tmp_path)
    assert "seen in the capture at step 42" in text, text


def test_a_finding_seen_twice_names_both_captures(tmp_path: Path) -> None:
    doc = report.write_job(tmp_path, diagnoses=[_evil_capture(), _evil_capture(step=90)], world_size=8, steps=120)
    text = report.format_job(doc, tmp_path)
    assert "seen in captures at steps 42, 90" in text, text


def test_the_named_rank_is_shown_in_detail_in_the_diagnosis_file_and_the_page(tmp_path: Path) -> None:
    """A real 4-rank capture whose rank 1 was starved of CPU: diagnosis-<step>.json and report.html
    carry rank 1's own window steps (queued 106-200 ms a step) and its functions by self time; the
    healthy baseline names nobody and shows nobody."""
    from eroica_launch.offline import run_analysis
    from eroica_runtime.engine import ingest

    (tmp_path / "captures").mkdir()
    for name in ("throttled-rank1-baseline.msgpack", "throttled-rank1.msgpack"):
        (tmp_path / "captures" / name).write_bytes((DATA / name).read_bytes())
    diagnoses, _, problems = run_analysis(tmp_path, topology=None)
    assert not problems and [d.findings[0].rank for d in diagnoses if d.findings] == [1]
    late = max(diagnoses, key=lambda d: d.step)
    raw = ingest.read_capture((DATA / "throttled-rank1.msgpack").read_bytes(), origin="t").summaries([1])[1]

    doc = json.loads((tmp_path / f"diagnosis-{late.step}.json").read_text())
    shown = doc["drill_down"]["1"]
    assert shown["host"] == raw["host"] and shown["pid"] == raw["pid"]
    assert [s["runq"] for s in shown["steps"]] == [s["runq"] for s in raw["steps"]]
    assert shown["history"]["runq"] == raw["history"]["runq"]
    selfs = [f["self"] for f in shown["functions"]]
    assert selfs == sorted(selfs, reverse=True) and len(selfs) == min(report.DRILL_FUNCTIONS, len(raw["functions"]))
    assert shown["functions_listed"] == len(raw["functions"])
    early = json.loads((tmp_path / f"diagnosis-{min(d.step for d in diagnoses)}.json").read_text())
    assert "drill_down" not in early

    page = (tmp_path / "report.html").read_text()
    assert page.count("in detail (") == 1 and "rank 1 in detail (host vm" in page
    assert shown["functions"][0]["name"] in page.split("rank 1 in detail", 1)[1]


def test_odd_values_in_a_named_ranks_summary_do_not_cost_the_diagnosis_file(tmp_path: Path) -> None:
    s = _job(1)[0]
    s["device"] = {"name": b"\xff\x00", "uuid": float("nan"), "nested": {"a": [[[[[1]]]]]}}
    s["functions"][0]["self"] = "fast"
    s["host"] = "node\x1b[31m7"
    drill = report.drill_down({0: s})
    text = json.dumps(drill, allow_nan=False)
    assert drill["0"]["device"]["name"] is None and drill["0"]["device"]["uuid"] is None
    assert "\x1b" not in text and len(drill["0"]["functions"]) == min(report.DRILL_FUNCTIONS, len(s["functions"]))
    d = diagnose(_job(), step=7, trigger="manual", world_size=8)
    assert "drill_down" in json.loads(report.write_capture(tmp_path, d, drill).read_text())


def test_html_function_bars_show_calls_when_they_differ(tmp_path: Path) -> None:
    """Real 4-rank summaries whose rank 3 ran 40 extra matmuls a step: the bars say "40 vs 0 calls"
    (more work, not slower work); a function called as often as on its peers shows no call count."""
    from eroica_runtime import summary
    real = DATA / "real-4rank"
    docs = [summary.decode((real / f"compute.rank{r}.msgpack").read_bytes(), origin=f"rank {r}") for r in range(4)]
    d = diagnose(docs, step=1, trigger="slow_step", world_size=4)
    report.write_job(tmp_path, diagnoses=[d], world_size=4, steps=10)
    html = (tmp_path / "report.html").read_text()
    fns = d.findings[0].evidence["functions"]
    grown = next(f for f in fns if f["name"] == "aten::matmul")
    assert f"{grown['rank_ms']:.1f} vs {grown['peers_ms']:.1f} ms, 40 vs 0 calls</text>" in html
    same = [f for f in fns if f["rank_calls"] == f["peers_calls"]]
    assert same and all(f"{f['rank_ms']:.1f} vs {f['peers_ms']:.1f} ms</text>" in html for f in same)


def test_a_capture_slower_than_the_baseline_with_no_culprit_is_not_called_healthy(tmp_path: Path) -> None:
    """A real 4-rank capture (step 100 of a job whose rank 2 ran 15 ms of extra matmuls a step from step
    60, captured by --capture-at-steps) whose median step was 91.0 ms against the baseline's 56.7 ms,
    and in which the engine named nobody: rank 2's forward grew 20 ms, 22% of the step, under the
    quarter of it a group of four must show, and the CPU its matmuls took slowed its peers' own work
    too. It must not say "healthy — 4/4 ranks agree": it says the step is slower and nothing was found
    to blame, names the rank that came closest as a hint, and so does the job report; the baseline
    itself is still healthy."""
    from eroica_launch.offline import run_analysis

    (tmp_path / "captures").mkdir()
    for name in ("slower-no-culprit-baseline.msgpack", "slower-no-culprit.msgpack"):
        (tmp_path / "captures" / name).write_bytes((DATA / name).read_bytes())
    diagnoses, doc, problems = run_analysis(tmp_path, topology=None)
    base, late = sorted(diagnoses, key=lambda d: d.step)
    assert not problems and not base.findings and not late.findings
    assert "unexplained_ms" not in base.step_ms and report.format_capture(base).split(":")[2].strip().startswith(
        "healthy")
    assert late.step_ms["baseline"] < late.step_ms["median"]
    assert late.step_ms["unexplained_ms"] == pytest.approx(late.step_ms["median"] - late.step_ms["baseline"])
    line = report.format_capture(late)
    assert "healthy" not in line and "slower, no culprit found — median step 91.0 ms vs 56.7 ms in the baseline" \
        in line, line
    # with nobody to blame, the log says which rank came closest and which bar it missed
    hint = next(x for x in line.splitlines()[1:] if "closest to a culprit" in x)
    assert "rank 2 on vm, forward +19.8 ms/step" in hint and "22% of the 91.0 ms step" in hint, hint
    assert "named from 25% of the step" in hint, hint
    head = report.format_job(doc, tmp_path).splitlines()[0]
    assert "healthy" not in head and "1 of them (step 100) was slower than the baseline" in head, head
    page = (tmp_path / "report.html").read_text()
    # the baseline's section; the job's findings and the step-100 section say what it was instead
    assert page.count("No findings: ranks behaved like their peers.") == 1
    assert page.count("Slower, no culprit found: median step 91.0 ms vs 56.7 ms") == 1
    assert "No findings, but the capture(s) at step(s) 100 were slower than the baseline" in page



def test_a_burst_line_with_odd_numbers_in_a_stored_report_is_left_out_not_a_crash() -> None:
    """`eroica show` on a report whose burst evidence holds a non-number or a non-finite value (a
    foreign or hand-edited report.json: json reads Infinity and NaN) prints the finding without its
    "in bursts" line; with sane numbers the line is there."""
    f = {"category": "compute", "rank": 1, "host": "h", "function": "(steps before the window)",
         "phase": "forward", "impact_ms_per_step": 30.0, "what_if_step_ms": 40.0,
         "evidence": {"excess_ms": 120.0, "average_ms": 30.0, "average_steps": 32}}
    assert any("in bursts: +120.0 ms/step" in ln and "over the 32 steps" in ln for ln in report.format_finding(f))
    for odd in (float("inf"), float("nan"), True, "32"):
        bad = copy.deepcopy(f)
        bad["evidence"]["average_steps"] = odd
        lines = report.format_finding(bad)
        assert lines[0].startswith("  #1 COMPUTE: rank 1") and not any("in bursts" in ln for ln in lines)


def test_a_regressions_spared_ranks_with_odd_counts_in_a_stored_report_are_not_a_crash() -> None:
    """`eroica show` on a regression that spared ranks says how many slowed and which did not; a count
    that is no count (a foreign or hand-edited report.json) falls back to "all ranks" and the ranks listed."""
    f = {"category": "regression", "rank": None, "host": None, "function": "aten::matmul", "phase": "forward",
         "impact_ms_per_step": 94.7, "what_if_step_ms": 107.3,
         "evidence": {"ranks_spared": [0, 2, 4, 7], "ranks_spared_count": 4, "ranks_compared": 8,
                      "own_work_ms": [132.7, 39.5]}}
    head, facts = report.format_finding(f)[:2]
    assert "REGRESSION: 4 of 8 ranks" in head and "not slower: ranks 0, 2, 4, 7" in facts, (head, facts)
    assert report.ranks_text(f) == "4 of 8"   # the HTML findings table's rank column
    for odd in ("4", True, -1, float("nan"), None):
        bad = copy.deepcopy(f)
        bad["evidence"]["ranks_spared_count"] = odd
        head, facts = report.format_finding(bad)[:2]
        assert "REGRESSION: all ranks" in head and "not slower: ranks 0, 2, 4, 7" in facts, (odd, head, facts)
        assert report.ranks_text(bad) == "all"


def test_a_lone_ranks_profile_lists_collective_kernels_as_device_work_launcher_or_not() -> None:
    """A NCCL kernel row without a launching op (none recorded for it) is still device work, and the
    host's nccl:all_reduce record is still a host op."""
    doc = _job(1)[0]
    row = {"count": 1, "self": 0.0, "mean": 4.0, "p50": 4.0, "p90": 4.0, "p99": 4.0, "max": 4.0, "std": 0.0}
    doc["functions"] = [{**row, "name": "nccl:all_reduce", "kind": "collective", "phase": "comm", "ms": 4.0,
                         "self": 4.0},
                        {**row, "name": "ncclDevKernel_AllReduce_Sum_f32_RING_LL", "kind": "collective",
                         "phase": "comm", "ms": 3.5}]
    lines = report.format_profile(doc)
    host = next(line for line in lines if "heaviest host ops" in line)
    device = next(line for line in lines if "heaviest device work" in line)
    assert "nccl:all_reduce" in host and "ncclDevKernel" not in host, lines
    assert "ncclDevKernel_AllReduce" in device and "nccl:all_reduce" not in device, lines


def test_one_rank_alone_is_never_called_healthy() -> None:
    """A one-rank job (or one trace of a single-GPU job) has no peer: no finding is "nothing looked
    wrong against nothing", so the lines say that nothing was diagnosed, not that it is healthy."""
    d = diagnose(_job(1), step=7, trigger="traces", world_size=1)
    assert not d.findings
    line = report.format_capture(d)
    assert "healthy" not in line and "one rank, no peer to compare it with — nothing diagnosed" in line, line
    job = {"world_size": 1, "steps": 20, "findings": [], "captures": [d.to_json()]}
    head = report.format_job(job).splitlines()[0]
    assert "healthy" not in head and "one rank, no peer to compare it with" in head, head
    # two ranks that agree are healthy, as before
    assert "healthy — 2/2 ranks agree" in report.format_capture(diagnose(_job(2), step=7, trigger="t", world_size=2))


def test_a_report_written_before_the_jobs_end_says_so_in_its_head(tmp_path: Path) -> None:
    """Rank 0 failing (a peer raised, gloo lost it) writes and prints what it knows: its head said
    "eroica: job report: healthy — ..." right above the launcher's "job.py FAILED", read as a verdict
    on the failure. It says the report is what was seen until then, and why it was written; a report
    of the job's end keeps its head."""
    d = diagnose(_job(4), step=13, trigger="baseline", world_size=4)
    for why in ("this rank failed", "SIGUSR2"):
        doc = report.write_job(tmp_path, diagnoses=[d], world_size=4, steps=30, job={"flushed_by": why})
        head = report.format_job(doc).splitlines()[0]
        assert head.startswith(f"eroica: job report so far, written early ({why}): healthy — no findings over 1 "
                               "capture(s), world size 4, 30 steps"), head
    doc = report.write_job(tmp_path, diagnoses=[d], world_size=4, steps=30, job={})
    assert report.format_job(doc).startswith("eroica: job report: healthy — no findings over 1 capture(s)")


def test_a_job_whose_budget_refused_captures_says_so_under_healthy(tmp_path: Path) -> None:
    """"healthy" over the captures taken is not the whole story when the budget then refused
    slowdowns: the job report (text, `eroica show`, report.html) says what was not captured, and
    rank 0's live line says when the budget has a capture again."""
    from eroica_runtime.analyst import refused_text
    from eroica_runtime.trigger import Refusal

    d = diagnose(_job(), step=7, trigger="slow_step", world_size=8)
    job = {"captures_refused": {"slowdowns": 3, "requests": 1, "first_step": 2013, "max_captures": 8,
                                "refill_steps": 1000}}
    doc = report.write_job(tmp_path, diagnoses=[d], world_size=8, steps=5000, job=job)
    text = report.format_job(doc, tmp_path)
    head, *rest = text.splitlines()
    assert "healthy" in head
    assert rest == ["  not captured: 3 slowdown(s) and 1 request(s) from step 2013 on: the capture budget of 8 "
                    "was spent at the time (one comes back every 1000 steps; --max-captures / "
                    "--capture-refill-steps)"]
    assert "Not captured: 3 slowdown(s)" in (tmp_path / "report.html").read_text()
    # a budget that never refills (--capture-refill-steps 0, or a report from before refills): raise it
    never = report.refused_summary({**job["captures_refused"], "refill_steps": 0})
    assert never.endswith("it never refills); raise it to keep watching a long job"), never
    assert report.refused_summary({"slowdowns": 1, "requests": 0}).startswith("  not captured: 1 slowdown(s):")
    # nothing refused, or a foreign value: no line
    for odd in (None, {}, {"slowdowns": 0, "requests": 0}, {"slowdowns": "3", "requests": 1}, [3]):
        assert report.refused_summary(odd) == ""
    line = refused_text(Refusal(96, "request", 1013), 8, 1000)
    assert "but the capture budget is spent" in line and line.endswith("not captured; the budget has one again at "
                                                                          "step 1013"), line
    line = refused_text(Refusal(2013, "drift", 2500), 8, 1000)
    assert line.startswith("eroica: step 2013: steps slowed (drift), but the capture budget is spent (8 captures")
    assert "one comes back at step 2500 (every 1000 steps, --capture-refill-steps)" in line, line
    assert "nothing more is captured in this job" in refused_text(Refusal(2013, "drift", None), 8, 0)


def test_a_job_eroica_stood_down_for_says_why_instead_of_no_capture(tmp_path: Path) -> None:
    """A job whose ranks never wait for each other: eroica switched itself off after its warm-up
    (runtime._check_synchronised) and took no capture. `eroica show` says that and why, not "no capture
    was taken", which reads as eroica failing, and report.html says it instead of "No findings: ranks
    behaved like their peers"; a hand-edited value falls back to the plain line."""
    why = "steps 1-10 ran no collective: the job's ranks do not wait for each other (each trains on its own)"
    doc = report.write_job(tmp_path, diagnoses=[], world_size=2, steps=11,
                           job={"partial": True, "stood_down": {"step": 10, "why": why}, "captures_taken": []})
    head = report.format_job(doc).splitlines()[0]
    assert head == f"eroica: job report: nothing diagnosed: eroica stood down at step 10: {why} — world size 2", head
    page = (tmp_path / "report.html").read_text()
    assert "Nothing diagnosed: eroica stood down at step 10: steps 1-10 ran no collective" in page
    assert "No findings" not in page
    for odd in ({"step": 10}, "yes", None):
        doc = report.write_job(tmp_path, diagnoses=[], world_size=2, steps=11, job={"stood_down": odd})
        assert "no capture was taken" in report.format_job(doc), odd


def test_a_job_whose_own_profiler_held_eroicas_captures_says_so(tmp_path: Path) -> None:
    """A job with its own torch.profiler: eroica took no capture while it was on, and a window that gave
    way to it was not taken. The job summary (rank 0's log, `eroica show`) and report.html say both,
    so "no capture was taken" is not read as eroica failing; a hand-edited value prints no line."""
    from eroica_runtime.analyst import stored_job_stats_text

    job = {"steps": 30, "world_size": 4, "ranks_reporting": 4, "median_step_ms": 160.0, "p99_step_ms": 700.0,
           "slowest": [], "job_profiler": {"first_step": 6, "last_step": 25, "steps": 12, "ranks": "ranks 0..3"},
           "captures_taken": [{"step": 15, "trigger": "baseline", "missing": [], "gave_way": "ranks 0..3"},
                              {"step": 29, "trigger": "baseline", "missing": []}]}
    doc = report.write_job(tmp_path, diagnoses=[], world_size=4, steps=30, job=job)
    text = stored_job_stats_text(doc)
    assert "captures: step 15 (baseline, given way to the job's own profiler), step 29 (baseline)" in text, text
    held = ("the job's own torch.profiler was on in 12 step(s), 6-25 (ranks 0..3): eroica took no capture then; "
            "`eroica analyze --traces DIR` reads its traces")
    assert held in text, text
    page = (tmp_path / "report.html").read_text()
    assert "step 15 (baseline, given way to the job&#x27;s own profiler)" in page
    assert "The job&#x27;s own torch.profiler was on in 12 step(s)" in page
    for odd in (None, [], {"steps": "12", "first_step": 6}, {"steps": True, "first_step": 6}):
        assert report.job_profiler_text(odd) == ""


def test_a_job_stopped_from_outside_is_told_what_eroica_had_found_by_then(tmp_path: Path) -> None:
    """The launcher's last words after scancel/^C (the ranks die without a job summary): what
    report.json held, from a real fault-bench run, else one line saying why there is nothing."""
    real = Path(__file__).parent / "data" / "faultbench" / "compute-report"
    said = report.until_stopped_text(real)
    assert said.splitlines()[0] == "eroica until the stop: 110 steps on 4 ranks, 2 capture(s), 1 finding(s):", said
    assert "#1 rank 1 on vm: compute in aten::matmul (+134.1 ms/step own work" in said and "(step 43)" in said, said
    assert f"eroica show {real}" in said, said
    assert "no report" in report.until_stopped_text(tmp_path)
    (tmp_path / "report.json").write_text(json.dumps({"schema": "eroica.diagnosis/1"}))
    said = report.until_stopped_text(tmp_path)
    assert "\n" not in said and "report.json: unreadable report (schema is 'eroica.diagnosis/1'" in said, said
    # fields of the wrong kind (a report another writer got wrong) say what there is, never raise
    (tmp_path / "report.json").write_text(json.dumps({"schema": "eroica.report/1", "steps": 9, "world_size": 2,
                                                      "findings": 7, "captures": {"13": 1}}))
    assert report.until_stopped_text(tmp_path).startswith("eroica until the stop: 9 steps on 2 ranks, 0 capture(s)")
