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
atexit.register(lambda: print(f"failed={{errorfile.failed()}} early={{errorfile.leaving_early()}}", flush=True))
{body}
"""


@pytest.mark.parametrize("body,failed,has_file", [
    ("raise ValueError('boom')", True, True),
    ("sys.exit(3)", True, False),
    ("sys.exit(0)", False, False),
    ("pass", False, False),
    ("raise KeyboardInterrupt", False, True),   # ^C: no failure, but the rank leaves early all the same
])
def test_failure_is_remembered_and_recorded(tmp_path, body: str, failed: bool, has_file: bool) -> None:
    err = tmp_path / "error.json"
    out = subprocess.run([sys.executable, "-c", SCRIPT.format(body=body)], capture_output=True, text=True,
                         timeout=60, env={"TORCHELASTIC_ERROR_FILE": str(err), "PATH": "/usr/bin"})
    assert f"failed={failed} " in out.stdout, out.stderr
    assert f"early={failed or 'KeyboardInterrupt' in body}" in out.stdout, out.stdout
    assert err.exists() == has_file
    if has_file and "KeyboardInterrupt" not in body:
        doc = json.loads(err.read_text())
        assert doc["message"]["message"] == "ValueError: boom"
        assert "Traceback" in doc["message"]["extraInfo"]["py_callstack"]


# torch.distributed's excepthook is installed after eroica's and runs first; a second SIGINT (eroica-run
# and mpiexec both pass ^C on) can raise inside it, and eroica's hook never runs
CUT_SHORT = """
def torch_like(*args):
    raise KeyboardInterrupt   # the second ^C, at the hook's first line
sys.excepthook = torch_like
raise {exc}
"""


@pytest.mark.parametrize("exc,failed,code", [("KeyboardInterrupt", False, 130), ("ValueError('boom')", True, 1)])
def test_an_excepthook_cut_short_still_tells_how_the_program_ended(tmp_path, exc: str, failed: bool,
                                                                    code: int) -> None:
    marker = tmp_path / "exiting.json"
    out = subprocess.run([sys.executable, "-c", SCRIPT.format(body=CUT_SHORT.format(exc=exc))], capture_output=True,
                         text=True, timeout=60, env={"EROICA_EXIT_MARKER": str(marker), "PATH": "/usr/bin"})
    assert "Error in sys.excepthook" in out.stderr, out.stderr
    assert f"failed={failed} early=True" in out.stdout, (out.stdout, out.stderr)
    assert json.loads(marker.read_text())["exitcode"] == code


@pytest.mark.parametrize("body,code", [
    ("pass", 0),
    ("sys.exit(0)", 0),
    ("sys.exit(3)", 3),
    ("sys.exit('bye')", 1),
    ("raise ValueError('boom')", 1),
    ("raise KeyboardInterrupt", 130),
])
def test_exit_marker_says_the_program_finished_and_its_exit_code(tmp_path, body: str, code: int) -> None:
    marker = tmp_path / "exiting.json"
    subprocess.run([sys.executable, "-c", SCRIPT.format(body=body)], capture_output=True, text=True, timeout=60,
                   env={"EROICA_EXIT_MARKER": str(marker), "PATH": "/usr/bin"})
    assert json.loads(marker.read_text())["exitcode"] == code


STUCK = """
import time
from eroica_runtime import errorfile
errorfile.install()
class Stuck:
    def __del__(self):
        time.sleep(3600)   # interpreter teardown never ends, after every atexit handler ran
stuck = Stuck()
{body}
"""


@pytest.mark.parametrize("body,code", [("pass", 0), ("import sys; sys.exit(4)", 4)])
def test_wrapper_ends_a_program_stuck_in_teardown_with_the_code_it_chose(tmp_path, body: str, code: int) -> None:
    from eroica_launch.rank import wait_with_exit_guard

    marker = tmp_path / "exiting.json"
    child = subprocess.Popen([sys.executable, "-c", STUCK.format(body=body)],
                             env={"EROICA_EXIT_MARKER": str(marker), "PATH": "/usr/bin"})
    rc, message = wait_with_exit_guard(child, marker, grace_s=1.0, poll_s=0.05)
    assert rc == code and f"finished (exit code {code}) but was still tearing down" in message
    assert child.poll() is not None


def test_wrapper_never_ends_a_program_that_has_not_finished(tmp_path) -> None:
    from eroica_launch.rank import wait_with_exit_guard

    marker = tmp_path / "exiting.json"   # never written: the program is still working, however long
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(2.5)"], env={"PATH": "/usr/bin"})
    assert wait_with_exit_guard(child, marker, grace_s=0.5, poll_s=0.05) == (0, "")


def test_a_forked_child_exiting_does_not_say_the_program_finished(tmp_path) -> None:
    """A child made with os.fork() runs the inherited atexit handlers when it exits: its exit is not
    the program's, and a marker from it would let the wrapper end a program still running."""
    marker = tmp_path / "exiting.json"
    body = ("import os, time, json\n"
            "pid = os.fork()\n"
            "if pid == 0:\n    sys.exit(0)\n"
            "os.waitpid(pid, 0)\n"
            f"print('marker after child:', os.path.exists({str(marker)!r}), flush=True)\n")
    out = subprocess.run([sys.executable, "-c", SCRIPT.format(body=body)], capture_output=True, text=True,
                         timeout=60, env={"EROICA_EXIT_MARKER": str(marker), "PATH": "/usr/bin"})
    assert "marker after child: False" in out.stdout, out.stdout + out.stderr
    assert json.loads(marker.read_text())["pid"] != 0      # the parent's own exit still writes it
