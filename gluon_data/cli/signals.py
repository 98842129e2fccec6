"""How the command ends: SIGTERM raised like Ctrl-C in the process that installed it only
(forked children die as by default), a closed stdout noticed, a Ctrl-C held back while the
commands load and ignored once the command has ended."""
from __future__ import annotations

import os
import signal
import sys
import threading
from contextlib import contextmanager
from typing import Optional

from ..storage.perprocess import ProcessMark


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised like Ctrl-C so that the same clean-up runs."""


#: the process whose ``main()`` installed :func:`_on_sigterm`: the only one it raises in
_handler: Optional[ProcessMark] = None


def _on_sigterm(signum, frame):
    if _handler is None or not _handler.here():  # a forked child that still has it: die as
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # by default
        signal.raise_signal(signal.SIGTERM)
        return
    raise Terminated()


def _default_sigterm_in_child() -> None:
    """Run in every forked child (DataLoader and pool workers): SIGTERM ends it at once, as by
    default. Inherited, :func:`_on_sigterm` would raise inside multiprocessing's own clean-up
    (``Pool.terminate()`` sends SIGTERM to its workers), and a worker waiting in native code
    would not run it at all (Python handlers run between bytecodes), so never die, and the
    parent's join of it would hang."""
    if signal.getsignal(signal.SIGTERM) is _on_sigterm:
        try:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
        except (ValueError, OSError):  # not the main thread: _on_sigterm's pid check acts
            pass


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_default_sigterm_in_child)


def catch_sigterm():
    """Install :func:`_on_sigterm` in this process (from its main thread only: elsewhere
    nothing happens); returns the handler it replaced, or None."""
    global _handler
    if threading.current_thread() is not threading.main_thread():
        return None
    _handler = ProcessMark()
    return signal.signal(signal.SIGTERM, _on_sigterm)


def ignore_late_interrupts() -> None:
    """The command has ended and its exit status stands: a Ctrl-C from here on, while the
    interpreter exits (Dask and multiprocessing shut down, modules are freed), is ignored.
    Python gives SIGINT back its default action as it finalizes, and a Ctrl-C then would kill
    the process by the signal, hiding the status (a conversion whose manifest is written
    would look interrupted). For the process's own command line only (:func:`gluon_data.cli.
    main` without ``argv``), from its main thread."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.SIG_IGN)


def stdout_closed() -> bool:
    """Whether the reader of our stdout has gone (``gluon-data info X | head -3``); if so,
    stdout is pointed at /dev/null, so that what is still buffered or printed is dropped
    quietly instead of failing again as the interpreter exits."""
    import select
    try:
        fd = sys.stdout.fileno()
        poll = select.poll()
        poll.register(fd, select.POLLOUT)
        closed = any(ev & (select.POLLERR | select.POLLHUP) for _, ev in poll.poll(0))
        if closed:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, fd)
            os.close(devnull)
        return closed
    except (OSError, ValueError, AttributeError):  # no real stdout (replaced, closed)
        return False


@contextmanager
def deferred_interrupt():
    """Hold a Ctrl-C (SIGINT) back while the commands' modules load and the arguments parse,
    then raise it as ``KeyboardInterrupt`` once the block is done: a ``KeyboardInterrupt``
    raised inside a C extension's import (numpy, OpenCV, lmdb) is printed by the interpreter
    as "Exception ignored ..." with a traceback, before any handler of ours could run.
    Outside the main thread it does nothing (signals are the main thread's)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    seen = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: seen.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if seen:
        raise KeyboardInterrupt()
