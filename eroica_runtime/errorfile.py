"""Record a rank's uncaught exception in torchrun's error-file format.

torchrun only knows a failing rank's traceback when the script decorates its entry point with
``@record``; eroica records it for every script through ``sys.excepthook`` (chained), so the
launcher's failure summary can show the root cause's exception without any code change.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from types import TracebackType

_installed = False
_failed = False


def failed() -> bool:
    """True once an uncaught exception reached the top level, or sys.exit() got a failure status."""
    return _failed


def write(exc_type: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
    """Write TORCHELASTIC_ERROR_FILE unless something (e.g. @record) already wrote it."""
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not path or os.path.exists(path):
        return
    doc = {"message": {
        "message": f"{exc_type.__name__}: {exc}",
        "extraInfo": {"py_callstack": "".join(traceback.format_exception(exc_type, exc, tb)),
                      "timestamp": str(int(time.time()))},
    }}
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f)
    os.replace(tmp, path)


def install() -> None:
    """Chain onto sys.excepthook and sys.exit (idempotent): remember that this rank is failing."""
    global _installed
    if _installed:
        return
    _installed = True
    previous = sys.excepthook
    real_exit = sys.exit

    def exit_(status: object = None) -> None:
        global _failed
        if status not in (None, 0):
            _failed = True
        real_exit(status)

    sys.exit = exit_

    def hook(exc_type: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
        global _failed
        if not issubclass(exc_type, KeyboardInterrupt):
            _failed = True
        try:
            write(exc_type, exc, tb)
        except Exception:
            pass
        previous(exc_type, exc, tb)

    sys.excepthook = hook
