"""How an :class:`~.workers.EncoderPool`'s worker processes start, run and end.

One fresh interpreter, the *starter*, runs :data:`_BOOT`: it takes the parent's
``sys.path``, sets itself up once (``init(preload)``: one thread per numerical library,
OpenCV single-threaded, signals, the task's module loaded), then forks the workers, one per
socket the parent made, and stays to reap them, reporting each worker's pid and exit code
to the parent (:class:`Starter`). Once they are forked it also takes the digests of the
conversion's output files as the parent tells it their bytes are final
(:func:`_serve_digests`), on a core the workers leave, so that they need not be read once
more at the end. The workers inherit its imports instead of importing
numpy, OpenCV and the encoder once each: a worker costs a fork (milliseconds), not an
interpreter's start (~0.17 s of CPU here, on every core at once), and its pages of those
libraries are shared. On macOS each worker runs the set-up itself, after the fork
(:data:`SETUP_BEFORE_FORK`): there the saving is the interpreter's start alone.

Forking is safe there and nowhere else: the starter is a process of our own that has run
no image operation and no thread of its own (OpenCV's thread pool starts at its first
parallel call; OpenBLAS, when a user asked for its threads, re-initialises in a forked
child by its fork handlers). The parent, a user's process with whatever threads and
libraries it runs, is never forked, and the caller's main script is never imported
(``multiprocessing``'s spawn imports it in every child, a script that converts outside
``if __name__ == "__main__":`` would convert again there). A task's function must live in
a module, not in the main script. A worker ends when its socket does (the parent gone or
done) and, on Linux, when its starter does. The processes talk through inherited sockets:
POSIX systems (Linux, macOS).
"""
from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys
import threading
import time
import traceback
from multiprocessing import process, spawn
from multiprocessing.connection import Connection
from multiprocessing.reduction import ForkingPickler
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from ..errors import ConversionError, GluonDataError
from ..storage.fsutil import GrowingDigest, file_facts
from ..storage.perprocess import ProcessMark, end_with_parent

__all__ = ["Starter", "WorkerProcess", "pickled", "send_pickled"]

#: What the starter runs (``python -c``, with its control socket and one socket per
#: worker): the parent's ``sys.path``, then :func:`_start` with the ``init`` and ``preload``
#: the parent sends, from the parent's copy of the package. The working directory that
#: ``-c`` puts first on the path is dropped before any import (a ``tempfile.py`` there would
#: otherwise be imported by ``multiprocessing.connection``), and no socket is handed on to
#: a process a task starts (the parent sees a worker's end as its socket's). Ctrl-C reaches
#: the whole process group: the starter and its workers ignore it from the first line on,
#: and the parent stops them.
_BOOT = ("import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_IGN); "
         "sys.path[:] = [p for p in sys.path if p]; "
         "from multiprocessing.connection import Connection; "
         "c = [Connection(fd) for fd in %r]; "
         "[os.set_inheritable(x.fileno(), False) for x in c]; "
         "sys.path[:] = c[0].recv(); from gluon_data.convert.workerprocs import _start; "
         "_start(c[0], c[1:], *c[0].recv())")


def _worker_path() -> List[str]:
    """The parent's ``sys.path`` for the workers, each relative entry (``''`` is the working
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


#: Whether the starter runs the workers' set-up before it forks them (they inherit it), or
#: each worker after (macOS: its system libraries are not safe to use in a child forked
#: after they were loaded, which is why ``multiprocessing`` spawns there; the starter has
#: then loaded only this module and the standard library's, no image or numerical library,
#: when it forks, as ``multiprocessing``'s forkserver does).
SETUP_BEFORE_FORK = sys.platform != "darwin"


def _start(ctl: Connection, conns: Sequence[Connection], init: Callable[[Any], None],
           preload: Any, setup_first: bool) -> None:  # pragma: no cover  (in the starter)
    """The starter's life: ``init(preload)`` (``setup_first``: the parent's
    :data:`SETUP_BEFORE_FORK`; else in each worker), a worker
    forked for each of ``conns`` (``("pid", k, pid)`` sent on ``ctl``), then each reaped
    (``("exit", k, code)``) until none is left. A start that fails is reported as exit code
    1 for every worker not forked, its traceback printed; the starter never runs the
    interpreter's teardown."""
    code, pids = 0, {}
    try:
        if setup_first:
            init(preload)
        # SIGCHLD at its default here from the first fork on (were it ignored, as a set-up
        # may leave it, the kernel would reap a worker that ends and its exit code be lost);
        # each worker gets back what the set-up chose
        chld = signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        me = ProcessMark()
        for k, conn in enumerate(conns):
            _flush()  # what the set-up printed, printed once, not again by every worker
            pid = os.fork()
            if pid == 0:
                _worker(conn, [ctl, *conns[k + 1:]],
                        None if setup_first else (init, preload), me, chld)
            conn.close()
            pids[pid] = k
            _report(ctl, ("pid", k, pid))
        _start_digests(ctl)  # (a thread only now: never one in a process that still forks)
    except BaseException:
        traceback.print_exc()
        code = 1
        for k in range(len(pids), len(conns)):  # their sockets end: the parent sees it
            conns[k].close()
            _report(ctl, ("exit", k, 1))
    while pids:
        try:
            pid, exitcode = _next_end()
        except ChildProcessError:  # (none left: never, while pids has one)
            break
        if pid in pids:
            _report(ctl, ("exit", pids.pop(pid), exitcode))
        if REPORT_BEFORE_REAPING:
            os.waitpid(pid, 0)
    _flush_and_exit(code)


#: Whether the starter reports a worker's end before it reaps it (``waitid`` with
#: ``WNOWAIT``): the parent, which signals a worker only while no end is reported, then
#: does not signal a pid the system may have given to another process (but in the
#: microseconds between its check and its signal). macOS's ``waitid`` misreports a
#: killed child's status and returns for stopped ones: there the starter reaps, then reports.
REPORT_BEFORE_REAPING = sys.platform.startswith("linux")


def _next_end() -> Tuple[int, int]:  # pragma: no cover  (in the starter)
    """``(pid, exit code)`` of the next child of this process to end (negative: the
    signal that ended it), waited for; left unreaped where :data:`REPORT_BEFORE_REAPING`."""
    if not REPORT_BEFORE_REAPING:
        pid, status = os.wait()
        return pid, os.waitstatus_to_exitcode(status)
    while True:
        info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOWAIT)
        if info is not None:  # (None only with WNOHANG)
            exited = info.si_code == os.CLD_EXITED
            return info.si_pid, info.si_status if exited else -info.si_status


def _worker(conn: Connection, others: Sequence[Connection],
            setup: Optional[Tuple[Callable[[Any], None], Any]],
            starter: ProcessMark, chld: Any) -> None:  # pragma: no cover  (in a worker)
    """A forked worker's life: the SIGCHLD disposition ``chld`` the set-up chose restored,
    bound to end with its ``starter`` (Linux), the sockets that are not its own closed, its
    ``setup`` ``(init, preload)`` run where the starter did not run it, :func:`serve`, then
    an exit without the interpreter's teardown of numpy, OpenCV and Pillow (about half a
    second per worker on a busy machine)."""
    code = 1
    try:
        if chld is not None:  # (None: a handler set outside Python, which cannot be put
            signal.signal(signal.SIGCHLD, chld)  # back from here: the default stays)
        end_with_parent(starter)  # (elsewhere it ends at its socket's end, after its task)
        for c in others:
            c.close()
        if setup is not None:
            setup[0](setup[1])
        serve(conn)
        code = 0
    except BaseException:
        traceback.print_exc()
    finally:
        _flush_and_exit(code)


def _flush() -> None:  # pragma: no cover  (in the starter, a worker)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # (a closed or broken stream: nothing more to say)
            pass


def _flush_and_exit(code: int) -> None:  # pragma: no cover  (in the starter, a worker)
    _flush()
    os._exit(code)


#: The starter's two threads both report on its control socket, one message at a time.
_SENDING = threading.Lock()


def _report(ctl: Connection, message: tuple) -> None:  # pragma: no cover  (in the starter)
    try:
        with _SENDING:
            send_pickled(ctl, message)
    except OSError:  # the parent is gone: its workers see their sockets end, and exit
        pass


def _start_digests(ctl: Connection) -> None:  # pragma: no cover  (in the starter)
    """Start the thread that takes the output's digests (:func:`_serve_digests`); where it
    cannot start (a limit on threads), or once it stops for anything but the parent's end,
    the parent is told ``("digests", -1, reason)`` and takes the digests itself."""
    try:
        threading.Thread(target=_serve_digests, args=(ctl,), daemon=True).start()
    except Exception as e:  # ("can't start new thread")
        _report(ctl, ("digests", -1, "%s: %s" % (type(e).__name__, e)))


def _serve_digests(ctl: Connection) -> None:
    """The starter's second thread, started once every worker is forked: the parent's
    requests on the control socket, until it closes it. ``("follow", path, upto)``: hash
    ``path``'s bytes up to ``upto``, which the parent knows are final
    (:class:`~gluon_data.storage.fsutil.GrowingDigest`); ``("facts", path, size)``: hash the
    rest, answered ``("facts", path, facts)``, or the reason as a string where the file
    could not be read (every later request for it is then answered so). Whatever else
    stops it is reported as ``("digests", -1, reason)``: the parent never waits on it."""
    digests: Dict[str, GrowingDigest] = {}
    try:
        _answer_digests(ctl, digests)
    except BaseException as e:
        _report(ctl, ("digests", -1, "%s: %s" % (type(e).__name__, e)))
    finally:
        for digest in digests.values():
            digest.close()


def _answer_digests(ctl: Connection, digests: Dict[str, GrowingDigest]) -> None:
    """:func:`_serve_digests`' requests, each answered or its failure kept for its file,
    until the parent closes the socket; ``digests``: each file's digest under way."""
    failed: Dict[str, str] = {}
    while True:
        try:
            kind, path, upto = ForkingPickler.loads(ctl.recv_bytes())
        except (EOFError, OSError):  # the parent closed it, or is gone
            return
        facts = None
        if path not in failed:
            try:
                digest = digests.get(path)
                if digest is None:
                    digest = digests[path] = GrowingDigest(path)
                digest.advance(upto)
                facts = digest.facts(upto) if kind == "facts" else None
            except Exception as e:  # (a file gone, unreadable, shorter than written)
                failed[path] = getattr(e, "reason", None) or str(e) or type(e).__name__
                gone = digests.pop(path, None)
                if gone is not None:
                    gone.close()
        if kind == "facts":
            done = digests.pop(path, None)
            if done is not None:
                done.close()
            _report(ctl, ("facts", path, facts if facts is not None else failed[path]))


def pickled(obj: Any) -> bytes:
    """``obj`` pickled as a message, into bytes: not the memoryview ``dumps`` gives, which,
    kept alive by an interrupted send's frame in a traceback, would pin its buffer, and the
    interpreter's exit then fails to close it ("Exception ignored in: <_io.BytesIO ...>")."""
    return bytes(ForkingPickler.dumps(obj))


def send_pickled(conn: Connection, obj: Any) -> None:
    """``conn.send(obj)``, pickled by :func:`pickled`."""
    conn.send_bytes(pickled(obj))


def serve(conn: Connection) -> None:  # pragma: no cover  (in a worker)
    """A worker's tasks ``(fn, args)`` from ``conn`` until ``None`` or the parent's end,
    each answered ``(True, result)`` or ``(False, exception)`` (a task that cannot be
    unpickled here too)."""
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


class Starter:
    """The parent's side of the starter process: started on the workers' sockets
    ``children`` (``python -c`` with the interpreter and flags ``multiprocessing``'s spawn
    uses), told ``init`` and ``preload``; then what it reports, each worker's pid and exit
    code, read as they are asked for."""

    def __init__(self, children: Sequence[Connection], init: Callable[[Any], None],
                 preload: Any):
        parent, child = multiprocessing.Pipe(duplex=True)
        fds = [child.fileno(), *(c.fileno() for c in children)]
        cmd = [spawn.get_executable(),
               *subprocess._args_from_interpreter_flags(),  # type: ignore[attr-defined]
               "-c", _BOOT % (fds,)]
        try:
            self._popen = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, pass_fds=fds)
        except BaseException:
            parent.close()
            raise
        finally:
            child.close()
        self.pid = self._popen.pid
        self._ctl: Optional[Connection] = parent
        self.pids: Dict[int, int] = {}  # worker -> its pid
        self.codes: Dict[int, int] = {}  # worker -> its exit code
        self._facts: Dict[str, Any] = {}  # path -> its facts (or why none), as answered
        self._no_digests: Optional[str] = None  # why the starter takes none (it said so)
        try:  # both lie in the socket's buffer until read
            for message in (_worker_path(), (init, preload, SETUP_BEFORE_FORK)):
                send_pickled(parent, message)
        except BaseException as e:  # (an init that cannot be pickled; Ctrl-C): no process stays
            parent.close()
            self._ctl = None
            self._popen.kill()
            self._popen.wait()
            if isinstance(e, OSError):  # it ended before it read them
                raise ConversionError("the conversion's worker starter (pid %d) ended with "
                                      "exit code %s before it started any worker"
                                      % (self.pid, self._popen.returncode)) from None
            raise

    def _read(self, timeout: Optional[float]) -> bool:
        """Take one report, waiting up to ``timeout`` seconds; False when none came (or
        the starter's reports ended: it exited)."""
        if self._ctl is None:
            return False
        try:
            if not self._ctl.poll(timeout):
                return False
            kind, k, value = self._ctl.recv()
        except (EOFError, OSError):
            self._ctl.close()
            self._ctl = None
            self._popen.wait()  # (its reports end when it exits)
            return False
        if kind == "facts":
            self._facts[k] = value
        elif kind == "digests":
            self._no_digests = value
        else:
            (self.pids if kind == "pid" else self.codes)[k] = value
        return True

    def follow(self, path: str, upto: int) -> None:
        """Have the starter hash ``path``'s bytes up to ``upto`` now: they must be final, no
        write will change them again (:func:`_serve_digests`)."""
        if self._no_digests is None:
            self._ask(("follow", path, upto))

    def ask_facts(self, path: str, size: int) -> None:
        """Have the starter finish ``path``'s digest at ``size`` bytes (:meth:`facts`)."""
        if self._no_digests is None:
            self._ask(("facts", path, size))

    def facts(self, path: str) -> dict:
        """``path``'s facts (``{"bytes", "sha256"}``) that :meth:`ask_facts` asked for,
        waited for; where the starter said it takes no digests, read here instead
        (:func:`~gluon_data.storage.fsutil.file_facts`). A file it could not read, or a
        starter gone before it answered, is a :class:`ConversionError`."""
        while path not in self._facts and self._no_digests is None:
            if not self._read(None) and self._ctl is None:
                raise ConversionError("the conversion's worker starter (pid %d) ended with "
                                      "exit code %s before it gave the digest of the output"
                                      % (self.pid, self._popen.returncode), path)
        got = self._facts.pop(path, None)
        if got is None:  # (the starter takes none)
            got = file_facts(path)
            if got is None:
                raise ConversionError("the output is gone before its digest was taken", path)
        if isinstance(got, str):
            raise ConversionError("cannot take the digest of the output: %s" % got, path)
        return got

    def _ask(self, message: tuple) -> None:
        try:
            if self._ctl is None:
                raise OSError("its control socket is closed")
            send_pickled(self._ctl, message)
        except OSError:
            raise ConversionError("the conversion's worker starter (pid %d) ended (exit code "
                                  "%s), and its workers with it; the conversion stopped"
                                  % (self.pid, self._popen.poll()), message[1]) from None

    def drain(self) -> None:
        """Take the reports that came, without waiting."""
        while self._read(0):
            pass

    @property
    def reports(self) -> Optional[Connection]:
        """The socket the starter's reports come by (None once they ended): ready to read
        when a worker started or ended."""
        return self._ctl

    def ended(self, k: int) -> bool:
        """Whether worker ``k``'s end was reported (the reports that came are taken)."""
        return self.exitcode(k) is not None

    def exitcode(self, k: int) -> Optional[int]:
        """Worker ``k``'s exit code (negative for a signal), None while it runs. A starter
        that ended without reporting worker ``k`` was killed: the worker, killed with it
        (Linux; elsewhere it ends at its socket's end), takes the starter's code."""
        self.drain()
        if k in self.codes:
            return self.codes[k]
        return None if self._ctl is not None else self._popen.returncode

    def worker_pid(self, k: int) -> int:
        """Worker ``k``'s pid, once the starter forked it (waited for: it reports it at
        once); the starter's own if it never forked it."""
        while k not in self.pids and k not in self.codes and self._read(None):
            pass
        return self.pids.get(k, self.pid)

    def join_worker(self, k: int, timeout: Optional[float]) -> None:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.exitcode(k) is None:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return
            self._read(left)

    def signal_worker(self, k: int, sig: int) -> None:
        """Send ``sig`` to worker ``k`` if it runs (to the starter, if it has not forked it
        yet: no worker is started from then on)."""
        if self.exitcode(k) is not None:
            return
        try:
            os.kill(self.pids.get(k, self.pid), sig)
        except ProcessLookupError:  # (ended since: its report comes)
            pass

    def close(self, timeout: float) -> None:
        """Wait up to ``timeout`` seconds for the starter, which exits once its workers
        did; then kill it."""
        try:
            self._popen.wait(timeout)
        except subprocess.TimeoutExpired:
            self._popen.kill()
            self._popen.wait()
        self.drain()
        if self._ctl is not None:
            self._ctl.close()
            self._ctl = None


class WorkerProcess:
    """One worker of a pool, as the parent sees it (its pid, exit code, liveness; joined,
    terminated or killed), through the :class:`Starter` that forked and reaps it."""

    def __init__(self, starter: Starter, k: int):
        self._starter, self._k = starter, k

    @property
    def pid(self) -> int:
        return self._starter.worker_pid(self._k)

    @property
    def exitcode(self) -> Optional[int]:
        """The exit code, negative for a signal (as ``multiprocessing``); None while it runs."""
        return self._starter.exitcode(self._k)

    def join(self, timeout: Optional[float] = None) -> None:
        self._starter.join_worker(self._k, timeout)

    def is_alive(self) -> bool:
        return self.exitcode is None

    def terminate(self) -> None:
        self._starter.signal_worker(self._k, signal.SIGTERM)

    def kill(self) -> None:
        self._starter.signal_worker(self._k, signal.SIGKILL)
