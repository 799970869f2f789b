"""How a rank ends: its uncaught exception in torchrun's error-file format, and the exit it began.

torchrun only knows a failing rank's traceback when the script decorates its entry point with
``@record``; eroica records it for every script through ``sys.excepthook`` (chained), so the
launcher's failure summary can show the root cause's exception without any code change.

It also tells the rank's wrapper when the program has finished and what exit code it chose (the
``EROICA_EXIT_MARKER`` file, written by the last atexit handler to run). What follows is interpreter
teardown, which can deadlock in a library (a gloo worker thread destroying a collective whose
thread-local state holds a Python object waits for the GIL that the main thread, joining that worker,
holds). The wrapper ends a rank still tearing down long after its marker, with the exit code the
program chose, so a job that finished training always ends.
"""

from __future__ import annotations

import atexit
import json
import os
import sys
import time
import traceback
from types import TracebackType

_installed = False
_failed = False
_interrupted = False   # a KeyboardInterrupt (^C) reached the top level
_exit_code = 0      # what the interpreter will exit with, as far as the hooks below can tell
_owner_pid = 0      # the rank's own process: a fork()ed child's exit is not the program's
MARKER_VAR = "EROICA_EXIT_MARKER"


def _settle() -> None:
    """Learn how the program ended from what Python printed, when the hook below never ran.

    Python records the uncaught exception (``sys.last_type``) before it calls ``sys.excepthook``, and
    the hook chain can be cut short: a second SIGINT (eroica-run and mpiexec both pass ^C on) raised a
    KeyboardInterrupt inside torch.distributed's excepthook, which runs before eroica's, so rank 2 of
    a CI job (2026-12-05) took its ^C for a normal end, waited at the job end for peers that waited for
    it, and the job ended only when eroica-run killed it 30 s later."""
    global _failed, _interrupted, _exit_code
    if _failed or _interrupted:
        return
    last = getattr(sys, "last_type", None)
    if isinstance(last, type) and issubclass(last, BaseException) and not issubclass(last, SystemExit):
        if issubclass(last, KeyboardInterrupt):
            _interrupted, _exit_code = True, 130
        else:
            _failed, _exit_code = True, 1


def failed() -> bool:
    """True once an uncaught exception reached the top level, or sys.exit() got a failure status."""
    _settle()
    return _failed


def interrupted() -> bool:
    """True once a KeyboardInterrupt (^C, or SIGINT from eroica-run, mpiexec or srun) reached the top
    level: the program is being stopped, not finishing (not a failure either: exit code 130)."""
    _settle()
    return _interrupted


def leaving_early() -> bool:
    """The program is ending before its end: failed, or stopped by ^C. Its peers may be blocked in a
    collective that waits for it, so its exit must wait for none of them."""
    _settle()
    return _failed or _interrupted


def exit_code() -> int:
    """The exit code the program chose: sys.exit's status, 1 after an uncaught exception, 130 after ^C."""
    _settle()
    return _exit_code


def _status_code(status: object) -> int:
    """Python's rule for sys.exit(status): None -> 0, an int as is (mod 256), anything else -> 1."""
    if status is None:
        return 0
    if isinstance(status, int) and not isinstance(status, bool):
        return status & 0xFF
    return 1


def write_exit_marker() -> None:
    """Tell the wrapper this program finished and chose ``exit_code()`` (atomic; never raises)."""
    path = os.environ.get(MARKER_VAR)
    if not path or os.getpid() != _owner_pid:
        return
    from eroica_runtime import reportdir

    try:
        reportdir.atomic_write(path, json.dumps({"exitcode": exit_code(), "pid": os.getpid(), "time": time.time()}))
    except OSError:
        pass


def write(exc_type: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
    """Write TORCHELASTIC_ERROR_FILE unless something (e.g. @record) already wrote it."""
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not path or os.path.exists(path):
        return
    _write_doc(path, f"{exc_type.__name__}: {exc}", "".join(traceback.format_exception(exc_type, exc, tb)))


def write_message(message: str) -> None:
    """Write the error file with a message of eroica's own (e.g. a hang it diagnosed and aborted on)."""
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if path and not os.path.exists(path):
        _write_doc(path, message, message)


def _write_doc(path: str, message: str, callstack: str) -> None:
    from eroica_runtime import reportdir

    doc = {"message": {"message": message,
                       "extraInfo": {"py_callstack": callstack, "timestamp": str(int(time.time()))}}}
    reportdir.atomic_write(path, json.dumps(doc))


def install() -> None:
    """Chain onto sys.excepthook and sys.exit (idempotent): remember how this rank is ending.

    Call it before anything else registers an atexit handler: its own handler (the exit marker) then
    runs last, after eroica's job-end work and the program's own handlers.
    """
    global _installed, _owner_pid
    if _installed:
        return
    _installed = True
    _owner_pid = os.getpid()
    previous = sys.excepthook
    real_exit = sys.exit
    if os.environ.get(MARKER_VAR):
        atexit.register(write_exit_marker)

    def exit_(status: object = None) -> None:
        global _failed, _exit_code
        _exit_code = _status_code(status)
        if _exit_code != 0:
            _failed = True
        real_exit(status)

    sys.exit = exit_

    def hook(exc_type: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
        global _failed, _exit_code, _interrupted
        if issubclass(exc_type, KeyboardInterrupt):
            _interrupted = True
            _exit_code = 130   # Python re-raises SIGINT on itself: 128 + 2 to a shell
        else:
            _failed = True
            _exit_code = 1
        try:
            write(exc_type, exc, tb)
        except Exception:
            pass
        previous(exc_type, exc, tb)

    sys.excepthook = hook
