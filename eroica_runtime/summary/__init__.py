"""Behaviour summaries: one rank's profiled window boiled down to a small msgpack document.

One job per module: ``schema`` (the format, validation, encoding of summaries and capture files),
``events`` (reading and classifying profiler events), ``rawevents`` (a window's raw events kept as
data and read back, for fixtures), ``resumable (work run in time-budgeted slices), ``chrome`` (chrome-trace events read into the
same records, for ``eroica analyze --traces``), ``intervals`` (interval arithmetic), ``launchers`` (which
host op launched each piece of device work) and ``build`` (events -> summary). Everything callers use is
re-exported here.
"""

from eroica_runtime.summary.build import MAX_FUNCTIONS, NAME_LIMIT, OTHER, SIZE_BUDGET, build, build_steps
from eroica_runtime.summary.events import RECORDS, Records
from eroica_runtime.summary.resumable import Resumable
from eroica_runtime.summary.schema import (
    CAPTURE_SCHEMA,
    FUNCTION_PHASES,
    KINDS,
    MAX_SUMMARY_BYTES,
    OWN_WORK_PHASES,
    PHASES,
    SCHEMA,
    SummaryError,
    decode,
    decode_capture,
    encode,
    encode_capture,
    own_work_ms,
    validate,
)

__all__ = ["CAPTURE_SCHEMA", "FUNCTION_PHASES", "KINDS", "MAX_FUNCTIONS", "MAX_SUMMARY_BYTES", "NAME_LIMIT",
           "OTHER", "OWN_WORK_PHASES", "PHASES", "RECORDS", "Records", "SCHEMA", "SIZE_BUDGET", "Resumable", "SummaryError", "build",
           "build_steps", "decode", "decode_capture", "encode", "encode_capture", "own_work_ms", "validate"]
