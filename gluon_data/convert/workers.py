"""The encoders of a local conversion: worker processes fed by the parent's main
thread alone (:class:`EncoderPool`).

``multiprocessing.Pool`` runs three threads in the parent to feed its workers, and one of
them wakes whenever a result is waiting to be read: with results coming every few
milliseconds it spins, and on a 2-core machine its CPU and the GIL it takes were about half
of what the parent spent per converted item. Here each worker has its own pipe and the
parent reads results when it waits for one: no thread, no spinning.

A worker holds up to two tasks, as PyTorch's ``DataLoader`` does (``prefetch_factor=2``):
the one it runs and the next, waiting in its pipe, so it starts the next as soon as it has
sent a result instead of idling until the parent, busy writing the results before, reads it
and answers (a wait that grows with the workers one parent feeds). The pipe cannot fill
both ways: a task waits in a pipe only when it is at most
:data:`QUEUED_MAX_BYTES` pickled, so it lies in the socket's buffer and the parent's send
never blocks; a larger task goes to an idle worker only, which reads it at once.
A worker that dies (killed, out of memory) is a :class:`~gluon_data.errors.ConversionError`
naming its exit code, not a wait that never ends.

A worker is a fresh interpreter running :data:`_BOOT`, not a ``multiprocessing`` spawn:
spawn imports the caller's main script in every worker before anything else (a training
script's torch or MXNet, a benchmark's harness), which is start-up CPU on every core, and a
script that converts outside ``if __name__ == "__main__":`` would start its conversion again
there. A worker takes the parent's ``sys.path`` first (its relative entries made absolute:
:func:`_worker_path`), so it imports the same copy of ``gluon_data`` as the parent,
then loads only what its tasks need; so a task's function must live in a module, not in the
main script. The workers talk through inherited sockets: POSIX systems (Linux, macOS).
"""
from __future__ import annotations

import collections
import functools
import itertools
import multiprocessing
import os
import select
import subprocess
import sys
from multiprocessing import process, spawn
from multiprocessing.connection import Connection, wait
from multiprocessing.reduction import ForkingPickler
from typing import Any, Callable, Deque, Dict, Iterator, List, Optional, Set, Tuple

from ..errors import ConversionError

__all__ = ["EncoderPool", "Ticket", "QUEUED_MAX_BYTES"]

#: The largest pickled task that may wait in a worker's pipe behind the one it runs: far
#: below a socket's send buffer (Linux's default is 208 KiB), so sending it never blocks.
#: A conversion's chunk of 16 jobs pickles to a few KiB; jobs that carry their records
#: (a legacy LMDB's) can be larger, and wait for an idle worker.
QUEUED_MAX_BYTES = 32 << 10


#: What a worker runs (``python -c``): the parent's ``sys.path``, then :func:`_serve` with the
#: ``init`` and ``preload`` the parent sends, from the parent's copy of the package. The
#: working directory that ``-c`` puts first on the path is dropped before any import (a
#: ``tempfile.py`` there would otherwise be imported by ``multiprocessing.connection``), and
#: the socket is not handed on to any process the worker starts (the parent sees the
#: worker's end as the socket's).
_BOOT = ("import os, sys; sys.path[:] = [p for p in sys.path if p]; "
         "from multiprocessing.connection import Connection; c = Connection(%d); "
         "os.set_inheritable(c.fileno(), False); "
         "sys.path[:] = c.recv(); from gluon_data.convert.workers import _serve; "
         "_serve(c, *c.recv())")


def _worker_path() -> List[str]:
    """The parent's ``sys.path`` for a worker, each relative entry (``''`` is the working
    directory, read at each import) made absolute both ways the parent may have read it:
    from the folder it was in when ``multiprocessing`` was imported (what spawn sends) and
    from the one it is in now."""
    start = process.ORIGINAL_DIR  # type: ignore[attr-defined]  # (spawn's own; untyped)
    out: List[str] = []
    for p in sys.path:
        for q in ([p] if os.path.isabs(p) else
                  [os.path.normpath(os.path.join(d, p)) for d in (start, os.getcwd())]):
            if q not in out:
                out.append(q)
    return out


def _serve(conn, init: Callable[[Any], None], preload: Any) -> None:  # pragma: no cover
    """A worker's life (in the worker process): ``init(preload)``, then tasks
    ``(fn, args)`` from ``conn`` until ``None`` or the parent's end, each answered
    ``(True, result)`` or ``(False, exception)`` (a task that cannot be unpickled here too)."""
    init(preload)
    while True:
        try:
            data = conn.recv_bytes()
        except (EOFError, OSError):  # the parent is gone (with results unread: a reset)
            return
        try:
            task = ForkingPickler.loads(data)
            if task is None:
                return
            fn, args = task
            out: Tuple[bool, Any] = (True, fn(*args))
        except BaseException as e:  # sent back, raised in the parent
            out = (False, e)
        try:
            conn.send(out)
        except OSError:  # the parent is gone (it stopped the pool)
            return
        except Exception as e:  # an unpicklable result or exception
            try:
                conn.send((False, ConversionError(
                    "a conversion worker could not send its %s back (%s: %s): %s" % (
                        "result" if out[0] else "error", type(e).__name__, e,
                        "" if out[0] else repr(out[1])))))
            except OSError:
                return


class _Worker:
    """One worker process (:data:`_BOOT` in a fresh interpreter, with the interpreter's own
    flags), talking through ``conn``, a socket; the parent's end of it is how the parent
    sees the worker end (the end of its stream)."""

    def __init__(self, child: Connection):
        # the interpreter and flags multiprocessing's spawn starts its children with
        cmd = [spawn.get_executable(),
               *subprocess._args_from_interpreter_flags(),  # type: ignore[attr-defined]
               "-c", _BOOT % child.fileno()]
        self._popen = subprocess.Popen(cmd, stdin=subprocess.DEVNULL,
                                       pass_fds=(child.fileno(),))
        self.pid = self._popen.pid

    @property
    def exitcode(self) -> Optional[int]:
        """The exit code, negative for a signal (as ``multiprocessing``); None while it runs."""
        return self._popen.poll()

    def join(self, timeout: Optional[float] = None) -> None:
        try:
            self._popen.wait(timeout)
        except subprocess.TimeoutExpired:
            pass

    def is_alive(self) -> bool:
        return self._popen.poll() is None

    def terminate(self) -> None:
        if self.is_alive():
            self._popen.terminate()

    def kill(self) -> None:
        if self.is_alive():
            self._popen.kill()


class _Waiter:
    """``multiprocessing.connection.wait`` for the pool's pipes, with
    one ``select.poll`` object kept for the pool's life: ``wait`` builds and tears down a
    selector at every call, which was a fifth of the parent's CPU per converted item. Where
    the system has no ``poll``, ``wait`` itself."""

    def __init__(self) -> None:
        self._poll = select.poll() if hasattr(select, "poll") else None
        self._fds: Dict[int, Any] = {}  # registered: file descriptor -> its object
        self._one: Dict[int, Any] = {}  # a poll object of one descriptor each

    def wait(self, objects: List[Any], timeout: Optional[float]) -> Set[Any]:
        """The ``objects`` (connections) ready to read, waiting up to ``timeout``
        seconds (``None``: until one is)."""
        if self._poll is None:
            return set(wait(objects, timeout))
        want = {_fileno(x): x for x in objects}
        for fd in [fd for fd in self._fds if fd not in want]:
            self._poll.unregister(fd)
            del self._fds[fd]
        for fd, x in want.items():
            if fd not in self._fds:
                self._poll.register(fd, select.POLLIN)
                self._fds[fd] = x
        ms = None if timeout is None else max(0, int(timeout * 1000))
        return {self._fds[fd] for fd, _ in self._poll.poll(ms)}

    def readable(self, conn: Any) -> bool:
        """Whether ``conn`` has more to read now (a result, or its end)."""
        if self._poll is None:
            return conn.poll()
        fd = conn.fileno()
        one = self._one.get(fd)
        if one is None:
            one = self._one[fd] = select.poll()
            one.register(fd, select.POLLIN)
        return bool(one.poll(0))


def _fileno(x: Any) -> int:
    return x if isinstance(x, int) else x.fileno()


class Ticket:
    """A task given to an :class:`EncoderPool`: :meth:`get` waits for its result (or raises
    the exception the task raised), :meth:`ready` says whether it is in."""

    def __init__(self, pool: "EncoderPool", tid: int):
        self.pool, self.tid = pool, tid
        self._outcome: Optional[Tuple[bool, Any]] = None

    def ready(self) -> bool:
        if self._outcome is None and self.tid not in self.pool.results:
            self.pool.collect(0)
        return self._outcome is not None or self.tid in self.pool.results

    def get(self) -> Any:
        if self._outcome is None:  # taken from the pool: it keeps no result read
            self._outcome = self.pool.take(self.tid)
        ok, value = self._outcome
        if not ok:
            raise value
        return value


class EncoderPool:
    """``workers`` worker processes, each started by ``init(preload)`` (SIGINT ignored,
    OpenCV single-threaded: ``engines.worker_init``), running the tasks :meth:`submit`
    gives them, in the order given, each worker holding at most two.

    The parent's main thread does everything: :meth:`submit` pickles and queues (never
    blocks), and waiting for a result (:meth:`Ticket.get`) reads the results that came in and
    hands queued tasks to the workers: first to the idle ones, then one more, if small, to
    each worker that runs only one."""

    def __init__(self, workers: int, init: Callable[[Any], None], preload: Any = None):
        if workers < 1:
            raise ValueError("an encoder pool needs at least one worker, got %d" % workers)
        self._conns: List[Any] = []
        self._procs: List[_Worker] = []
        self.results: Dict[int, Tuple[bool, Any]] = {}
        self._queued: Deque[Tuple[int, bytes]] = collections.deque()  # (task, its pickle)
        self._running: Dict[int, Deque[int]] = {}  # worker -> its tasks, in the order sent
        self._ids = itertools.count()
        self._answered: Set[int] = set()  # the workers that sent a result: they started
        self._closed = False
        self._waiting = _Waiter()
        try:
            for k in range(workers):
                parent, child = multiprocessing.Pipe(duplex=True)
                try:
                    self._procs.append(_Worker(child))
                except BaseException:
                    parent.close()
                    raise
                finally:
                    child.close()
                self._conns.append(parent)
                self._running[k] = collections.deque()
                parent.send(_worker_path())  # both lie in the socket's buffer until read
                parent.send((init, preload))
        except BaseException:  # (a worker that cannot be started: those started are stopped)
            self.terminate()
            raise

    @property
    def processes(self) -> List[Any]:
        return list(self._procs)

    def submit(self, fn: Callable, *args) -> Ticket:
        """Queue ``fn(*args)`` for the next worker free to take it (pickled now). ``fn`` must
        be importable by the workers: a function of a module, not of the main script."""
        if self._closed:
            raise RuntimeError("the encoder pool is closed")
        inner = fn.func if isinstance(fn, functools.partial) else getattr(fn, "__func__", fn)
        if getattr(inner, "__module__", None) in ("__main__", "__mp_main__"):
            raise TypeError("%s is defined in the main script, which the pool's worker "
                            "processes do not import: define it in a module the script "
                            "imports" % getattr(inner, "__qualname__", inner))
        tid = next(self._ids)
        # bytes, not the memoryview dumps gives: a view kept alive by an interrupted
        # send (its frame in a traceback) would pin its BytesIO, which the interpreter's
        # exit then fails to close ("Exception ignored in: <_io.BytesIO ...>")
        self._queued.append((tid, bytes(ForkingPickler.dumps((fn, args)))))
        self._dispatch()
        return Ticket(self, tid)

    def _dispatch(self) -> None:
        for held in (0, 1):  # the idle workers first, then one waiting task each
            for k, tasks in self._running.items():
                if not self._queued:
                    return
                if len(tasks) != held:
                    continue
                tid, task = self._queued[0]
                if held and len(task) > QUEUED_MAX_BYTES:
                    return  # it waits for an idle worker
                self._queued.popleft()
                try:
                    self._conns[k].send_bytes(task)
                except OSError:  # (BrokenPipeError) it died: at its start, or killed
                    self._procs[k].join(1.0)
                    raise ConversionError(self._ended(k, "before its task")) from None
                tasks.append(tid)

    def collect(self, timeout: Optional[float]) -> None:
        """Read the results that are in (waiting up to ``timeout`` seconds for one) and
        give the idle workers queued tasks; a worker that died with a task is a
        :class:`ConversionError`."""
        busy = [k for k, t in self._running.items() if t]
        if not busy:
            return
        conns = [self._conns[k] for k in busy]
        ready = self._waiting.wait(conns, timeout)  # a worker's end is the end of its stream
        for k, conn in zip(busy, conns):
            ended = False
            while self._running[k] and (conn in ready or self._waiting.readable(conn)):
                ready.discard(conn)  # (both results of a worker may be in)
                try:
                    data = conn.recv_bytes()
                except (EOFError, OSError):  # it died (mid-send, or before: a task it
                    ended = True                 # never read resets the pipe); see its exit
                    break
                try:
                    result = ForkingPickler.loads(data)
                except Exception as e:  # (an exception class that cannot be rebuilt here)
                    result = (False, ConversionError(
                        "a task's result came back from its worker but could not be "
                        "unpickled here: %s: %s" % (type(e).__name__, e)))
                self.results[self._running[k].popleft()] = result
                self._answered.add(k)
            if not self._running[k]:
                continue
            if ended:
                self._procs[k].join(1.0)
                raise ConversionError(self._ended(k, "while converting"))
        self._dispatch()

    def _ended(self, k: int, when: str) -> str:
        """What a :class:`ConversionError` says of worker ``k``, which ended ``when``: its pid
        and exit code, and, for one that never answered a task (it could not start), where
        its own error went and the likeliest cause."""
        p = self._procs[k]
        text = "a conversion worker process (pid %s) ended with exit code %s %s" % (
            p.pid, p.exitcode, when)
        if k not in self._answered and (p.exitcode or 0) > 0:  # (a signal prints nothing)
            text += ", before it finished any task (its own error is printed above)"
        return text + "; the conversion stopped"

    def take(self, tid: int) -> Tuple[bool, Any]:
        """``(ok, value)`` of task ``tid``, waiting for it; the pool forgets it then
        (:class:`Ticket` keeps it)."""
        while tid not in self.results:
            self._check_pending(tid)
            self.collect(None)
        return self.results.pop(tid)

    def completed(self, tickets: List[Ticket]) -> Iterator[Ticket]:
        """Each of ``tickets`` once its result is in (its :meth:`Ticket.get` then returns
        at once), in the order they finish."""
        left = {t.tid: t for t in tickets}
        while left:
            done = [tid for tid in left if tid in self.results]
            for tid in done:
                yield left.pop(tid)
            if left and not done:
                self._check_pending(next(iter(left)))
                self.collect(None)

    def _check_pending(self, tid: int) -> None:
        if all(tid not in t for t in self._running.values()) \
                and all(q[0] != tid for q in self._queued):
            raise RuntimeError("task %d is not pending in this pool (its result was taken, "
                               "or the pool was stopped)" % tid)

    def close(self) -> None:
        """No more tasks: the workers exit once those queued are done (see :meth:`join`)."""
        self._closed = True

    def join(self, timeout: Optional[float] = None) -> None:
        """Run what is queued to the end, then let every worker exit and reap it."""
        self._closed = True
        while self._queued or any(self._running.values()):
            self.collect(None)
        for conn in self._conns:
            try:
                conn.send(None)
            except OSError:  # (a worker gone already: reaped below)
                pass
        for p in self._procs:
            p.join(timeout)
        for conn in self._conns:
            conn.close()

    def terminate(self, timeout: float = 5.0) -> None:
        """Stop every worker now (SIGTERM, then SIGKILL after ``timeout``) and reap it; the
        tasks not finished are dropped (asking for one is a ``RuntimeError``)."""
        self._closed = True
        self._queued.clear()
        for tasks in self._running.values():
            tasks.clear()
        for p in self._procs:
            if p.is_alive():
                p.terminate()
        for p in self._procs:
            p.join(timeout)
            if p.is_alive():
                p.kill()
                p.join(timeout)
        for conn in self._conns:
            conn.close()
