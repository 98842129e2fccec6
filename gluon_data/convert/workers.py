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

The workers are forked from one fresh interpreter that loaded what their tasks need
(:mod:`.workerprocs`): never from the caller's process, and never importing the caller's
main script.
"""
from __future__ import annotations

import collections
import functools
import itertools
import multiprocessing
import select
from multiprocessing.connection import wait
from multiprocessing.reduction import ForkingPickler
from typing import Any, Callable, Deque, Dict, Iterator, List, Optional, Set, Tuple

from ..errors import ConversionError
from .workerprocs import Starter, WorkerProcess, pickled, send_pickled

__all__ = ["EncoderPool", "Ticket", "FactsTicket", "QUEUED_MAX_BYTES"]

#: How long a worker whose stream ended is waited for, for its exit code (the starter's
#: report comes within milliseconds of its end; a busy machine can take longer).
_REPORT_WAIT = 10.0

#: The largest pickled task that may wait in a worker's pipe behind the one it runs: well
#: below a socket's send buffer (Linux's default is 208 KiB), so sending it never blocks.
#: A conversion's chunk of up to 64 jobs pickles to about 150 bytes a job plus its two
#: paths (10 KiB with 23-character roots, 20 KiB with 99); jobs that carry their records
#: (a legacy LMDB's) can be larger, and wait for an idle worker.
QUEUED_MAX_BYTES = 64 << 10


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


class FactsTicket:
    """A file's facts asked of a pool's starter (:meth:`EncoderPool.file_facts`):
    :meth:`get` waits for them (a :class:`~gluon_data.errors.ConversionError` where the
    file could not be read)."""

    def __init__(self, starter: Starter, path: str):
        self._starter, self.path = starter, path
        self._facts: Optional[dict] = None

    def get(self) -> dict:
        if self._facts is None:
            self._facts = self._starter.facts(self.path)
        return self._facts


class EncoderPool:
    """``workers`` worker processes, forked by one starter process that ran ``init(preload)``
    (SIGINT ignored, OpenCV single-threaded: ``engines.worker_init``) once for them all (on
    macOS each worker runs it after the fork: :mod:`.workerprocs`), running the tasks
    :meth:`submit` gives them, in the order given, each worker holding at most two.

    The parent's main thread does everything: :meth:`submit` pickles and queues (never
    blocks), and waiting for a result (:meth:`Ticket.get`) reads the results that came in and
    hands queued tasks to the workers: first to the idle ones, then one more, if small, to
    each worker that runs only one."""

    def __init__(self, workers: int, init: Callable[[Any], None], preload: Any = None):
        if workers < 1:
            raise ValueError("an encoder pool needs at least one worker, got %d" % workers)
        self._conns: List[Any] = []
        self.results: Dict[int, Tuple[bool, Any]] = {}
        self._queued: Deque[Tuple[int, bytes]] = collections.deque()  # (task, its pickle)
        self._running: Dict[int, Deque[int]] = {}  # worker -> its tasks, in the order sent
        self._ids = itertools.count()
        self._answered: Set[int] = set()  # the workers that sent a result: they started
        self._closed = False
        self._waiting = _Waiter()
        children = []
        try:
            for k in range(workers):
                parent, child = multiprocessing.Pipe(duplex=True)
                self._conns.append(parent)
                children.append(child)
                self._running[k] = collections.deque()
            self._starter = Starter(children, init, preload)
        except BaseException:  # (no process was started: the sockets are closed)
            for conn in self._conns:
                conn.close()
            raise
        finally:
            for child in children:
                child.close()
        self._procs = [WorkerProcess(self._starter, k) for k in range(workers)]

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
        self._queued.append((tid, pickled((fn, args))))
        self._dispatch()
        return Ticket(self, tid)

    def follow_file(self, path: str, upto: int) -> None:
        """Have the pool's starter take ``path``'s SHA-256 up to byte ``upto`` now, beside
        the workers: those bytes must be final, no write will change them again
        (:class:`~gluon_data.storage.fsutil.GrowingDigest`)."""
        self._starter.follow(path, upto)

    def file_facts(self, path: str, size: int) -> "FactsTicket":
        """:func:`~gluon_data.storage.fsutil.file_facts` of ``path``, ``size`` bytes long,
        taken by the pool's starter (what :meth:`follow_file` did not hash yet is hashed
        now): its :meth:`FactsTicket.get` waits for them."""
        self._starter.ask_facts(path, size)
        return FactsTicket(self._starter, path)

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
                    self._procs[k].join(_REPORT_WAIT)
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
        # a worker's end is the end of its stream, or (a process a task started holds the
        # stream open) the starter's report of it
        reports = self._starter.reports
        ready = self._waiting.wait(conns + ([reports] if reports is not None else []),
                                   timeout)
        reported = reports is not None and reports in ready
        if reported:  # (taken now: left unread, the next wait would not wait)
            self._starter.drain()
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
            if ended or (reported and self._starter.ended(k)):
                self._procs[k].join(_REPORT_WAIT)
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
                send_pickled(conn, None)
            except OSError:  # (a worker gone already: reaped below)
                pass
        for p in self._procs:
            p.join(timeout)
        for conn in self._conns:
            conn.close()
        self._starter.close(5.0 if timeout is None else timeout)

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
        self._starter.close(timeout)
