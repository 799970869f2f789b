"""eroica's signals in a rank (SIGUSR1: capture now, SIGUSR2: flush the report, SIGCONT: count a
stop), which give way to the job's own.

Frameworks look before they take a signal. Lightning's SLURM auto-requeue installs its SIGUSR1
handler only when SIGUSR1 has none (``_SignalConnector._has_already_handler``: anything but
SIG_DFL counts as taken). With eroica's handler in place it printed "SLURM auto-requeueing enabled.
Setting signal handlers." and installed nothing (lightning 2.6.6, 2026-12-05; under torchrun its
handler is in): the job's ``#SBATCH --signal=SIGUSR1@90`` would have started an eroica capture
instead of saving a checkpoint and requeueing, and the job would have run into its time limit. So
eroica's handlers act as the signals' default in a rank:

- ``signal.getsignal`` answers, while eroica's handler is in, what the signal had before eroica
  (SIG_DFL as a rule), so a framework that looks first takes it;
- a handler the job installs (or SIG_IGN) replaces eroica's, and rank 0 says once that the signal
  is the job's now and what to use instead (``on_taken``);
- the job setting it back to what it was (Lightning does at the end of ``fit``) puts eroica's back.

Why the ``signal`` module's two functions are wrapped rather than eroica's handlers made to chain:
a chained handler still reads as taken to a framework that looks first, and it would run eroica's
action on a signal the job meant for itself. Only this module calls ``signal.signal`` for eroica's
handlers (agent.bootstrap ignores SIGUSR1/SIGUSR2 before it, while the runtime starts, and passes
what they had before as ``before``).
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from typing import Any

Handler = Callable[[int, Any], None]


class Signals:
    """eroica's handlers for some signals, the job's first (``install``/``uninstall``).

    ``handlers``: signal -> eroica's handler. ``before``: what each signal had before eroica touched it
    (agent.bootstrap ignores SIGUSR1/SIGUSR2 until the runtime is up; that placeholder is not the
    job's); missing: read at ``install``. ``on_taken(signum, handler)``: the job installed ``handler``
    for an eroica signal (called once a signal, on the thread that installed it, never in a handler).
    """

    def __init__(self, handlers: dict[int, Handler], before: dict[int, Any] | None = None,
                 on_taken: Callable[[int, Any], None] | None = None) -> None:
        self.handlers = dict(handlers)
        self.before = dict(before or {})
        self.on_taken = on_taken
        self.taken: set[int] = set()        # signals the job took (once said, said no more)
        self._said: set[int] = set()
        self._signal: Callable[..., Any] | None = None
        self._getsignal: Callable[[int], Any] | None = None
        # the functions put in the signal module (a bound method is a new object at every access:
        # uninstall compares with these)
        self._as_signal, self._as_getsignal = self._set, self._get

    def install(self) -> None:
        """Put eroica's handlers in and the ``signal`` module's ``signal``/``getsignal`` behind them (main thread)."""
        if self._signal is not None:
            return
        self._signal, self._getsignal = signal.signal, signal.getsignal
        for signum, handler in self.handlers.items():
            self.before.setdefault(signum, signal.getsignal(signum))
            self._put(signum, handler)
        signal.signal, signal.getsignal = self._as_signal, self._as_getsignal   # type: ignore[assignment]

    def uninstall(self) -> None:
        """The ``signal`` module as it was, and each signal still eroica's back to what it had before."""
        if self._signal is None or self._getsignal is None:
            return
        original, get = self._signal, self._getsignal
        if signal.signal is self._as_signal:        # type: ignore[comparison-overlap]
            signal.signal = original                 # type: ignore[assignment]
        if signal.getsignal is self._as_getsignal:  # type: ignore[comparison-overlap]
            signal.getsignal = get                   # type: ignore[assignment]
        for signum, handler in self.handlers.items():
            try:
                if get(signum) is handler:
                    original(signum, self.before.get(signum, signal.SIG_DFL))
            except (ValueError, OSError):   # not the main thread: the handler stays, harmless
                pass
        self._signal = self._getsignal = None

    def owns(self, signum: int) -> bool:
        """Whether eroica's handler is the one in place for ``signum``."""
        get = self._getsignal or signal.getsignal
        return signum in self.handlers and get(signum) is self.handlers[signum]

    # ---- the signal module's functions, as the job sees them ------------------------------------------
    def _get(self, signum: int) -> Any:
        assert self._getsignal is not None
        current = self._getsignal(signum)
        if signum in self.handlers and current is self.handlers[signum]:
            return self.before.get(signum, signal.SIG_DFL)
        return current

    def _set(self, signum: int, handler: Any) -> Any:
        assert self._signal is not None
        mine = self.handlers.get(_number(signum))
        if mine is None:
            return self._signal(signum, handler)
        signum = _number(signum)
        if handler is mine or _same(handler, self.before.get(signum, signal.SIG_DFL)):
            previous = self._put(signum, mine)     # back to the default: eroica's
            self.taken.discard(signum)
        else:
            previous = self._signal(signum, handler)
            self.taken.add(signum)
            if signum not in self._said:
                self._said.add(signum)
                if self.on_taken is not None:
                    try:
                        self.on_taken(signum, handler)
                    except Exception:
                        pass
        return self.before.get(signum, signal.SIG_DFL) if previous is mine else previous

    def _put(self, signum: int, handler: Handler) -> Any:
        assert self._signal is not None
        previous = self._signal(signum, handler)
        # signal.signal() makes the signal interrupt system calls in every thread; restart them
        # instead (SA_RESTART), so the training's and MPI's blocking calls never see EINTR because
        # eroica listens
        signal.siginterrupt(signum, False)
        return previous


def _number(signum: Any) -> Any:
    try:
        return int(signum)
    except (TypeError, ValueError):
        return signum


def _same(a: Any, b: Any) -> bool:
    """SIG_DFL given as the enum or as its number alike."""
    try:
        return a is b or (not callable(a) and not callable(b) and int(a) == int(b))
    except (TypeError, ValueError):
        return False


def describe(handler: Any) -> str:
    """'SIG_IGN', 'lightning.pytorch...._HandlersCompose' or 'module.function': the job's handler, for a line."""
    if isinstance(handler, signal.Handlers):
        return handler.name
    target = handler if hasattr(handler, "__qualname__") else type(handler)
    return f"{getattr(target, '__module__', '?')}.{getattr(target, '__qualname__', '?')}"
