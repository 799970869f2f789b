"""A rank's failure is recorded in torchrun's error-file format and remembered for the exit path."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

SCRIPT = """
import atexit, sys
from eroica_runtime import errorfile
errorfile.install()
atexit.register(lambda: print("failed=" + str(errorfile.failed()), flush=True))
{body}
"""


@pytest.mark.parametrize("body,failed,has_file", [
    ("raise ValueError('boom')", True, True),
    ("sys.exit(3)", True, False),
    ("sys.exit(0)", False, False),
    ("pass", False, False),
])
def test_failure_is_remembered_and_recorded(tmp_path, body: str, failed: bool, has_file: bool) -> None:
    err = tmp_path / "error.json"
    out = subprocess.run([sys.executable, "-c", SCRIPT.format(body=body)], capture_output=True, text=True,
                         timeout=60, env={"TORCHELASTIC_ERROR_FILE": str(err), "PATH": "/usr/bin"})
    assert f"failed={failed}" in out.stdout, out.stderr
    assert err.exists() == has_file
    if has_file:
        doc = json.loads(err.read_text())
        assert doc["message"]["message"] == "ValueError: boom"
        assert "Traceback" in doc["message"]["extraInfo"]["py_callstack"]
