"""Where shard tasks run: a local process pool, or a Dask cluster (``dask.distributed``).

A task is a picklable top-level function applied to one picklable job; it writes one output
and returns a small summary. The engine only schedules: locally the converter's own pool
(:class:`~gluon_data.convert.workers.EncoderPool`, whose workers are forked from one fresh
interpreter that never imports the caller's script); on Dask, Dask retries a failed task
and reschedules the tasks of a worker that died. Dask is imported here only, and only for
``engine='dask'``.
"""
from __future__ import annotations

import atexit
import contextlib
import linecache
import multiprocessing
import os
import signal
import socket
import sys
import threading
import time
from multiprocessing import resource_tracker
from multiprocessing.reduction import ForkingPickler
from typing import Any, Callable, Iterator, Optional, Sequence, Tuple

from .. import _version
from ..errors import ConversionError, WorkerPathError
from ..storage.perprocess import one_thread_per_library, reuse_freed_memory
from .workers import EncoderPool

__all__ = ["ENGINES", "run_tasks", "import_dask", "sigint_blocked", "SHARED_PATH_RULE",
           "stop_pool", "worker_init", "preloaded", "start_encoder_pool", "worker_pool",
           "refuse_in_bootstrap", "MAIN_GUARD_RULE"]

#: Why a process spawned by ``multiprocessing`` (a Dask ``LocalCluster``'s worker, or one the
#: script starts itself) may stop as it starts: spawn imports the caller's main script in it
#: first, and a script that converts at import would start its conversion again in there.
MAIN_GUARD_RULE = ("a process spawned by multiprocessing (each worker of a local Dask cluster, "
                   "or one the script starts itself) imports the main script first, so such a "
                   "script must start a conversion under `if __name__ == \"__main__\":`, and "
                   "be a file (not read from stdin)")

#: What a path given to a cluster conversion must be (the README's cluster checklist).
SHARED_PATH_RULE = ("with --engine dask every local path must name the same files on every "
                    "worker (a shared filesystem mounted at the same path) or be a URI "
                    "(s3://...)")

ENGINES = ("local", "dask")


@contextlib.contextmanager
def sigint_blocked():
    """SIGINT blocked in this (main) thread meanwhile: the processes and threads started
    inside inherit the block (it stays across thread creation, fork and exec), so a Ctrl-C,
    which a terminal sends to the whole process group, reaches this process only, and here
    waits until the block ends, then is raised as usual. Elsewhere than the main thread, or
    without ``pthread_sigmask``, nothing is blocked."""
    block = hasattr(signal, "pthread_sigmask") and \
        threading.current_thread() is threading.main_thread()
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT}) if block else None
    try:
        yield
    finally:
        if block:
            signal.pthread_sigmask(signal.SIG_SETMASK, old)


def import_dask():
    """The ``dask.distributed`` module, or an ImportError naming the extra to install."""
    try:
        import dask.distributed as dd
    except ImportError as e:
        raise ImportError("--engine dask needs Dask: pip install gluon-data[dask] (%s)" % e) \
            from None
    return dd


def _dask_worker_init() -> str:
    import cv2
    cv2.setNumThreads(1)  # one single-threaded worker process per core, as the local pool
    return _running_version()


def _running_version() -> str:
    """The version of the gluon_data this process runs."""
    return _version.__version__  # read at each call: the one definition


def _check_versions(versions: dict) -> None:
    """Every worker must run this client's gluon_data (the tasks are its code)."""
    other = {w: v for w, v in versions.items() if v != _running_version()}
    if other:
        w, v = sorted(other.items())[0]
        raise ConversionError("gluon_data %s on this client, but %s on %d worker(s), e.g. %s: "
                              "install the same version on the client, the scheduler and "
                              "every worker" % (_running_version(), v, len(other), w))


class _OnSharedPaths:
    """``fn``, run only where every path of ``paths`` (``(what, absolute path)`` pairs: the
    source root, the output folder) exists: a worker without the client's filesystem raises
    :class:`WorkerPathError` naming its host, the path and the rule, instead of a missing
    item, or a shard written into a folder the client never sees."""

    def __init__(self, fn: Callable, paths: Sequence[Tuple[str, str]]):
        self.fn, self.paths = fn, tuple(paths)

    def __call__(self, job):
        for what, path in self.paths:
            if not os.path.exists(path):
                raise WorkerPathError("the %s is not on worker host %s (cwd %s): %s"
                                      % (what, socket.gethostname(), os.getcwd(),
                                         SHARED_PATH_RULE), path)
        return self.fn(job)


def run_tasks(fn: Callable, jobs: Sequence, *, engine: str = "local", workers: int = 1,
              scheduler: Optional[str] = None, scheduler_wait: float = 300.0,
              retries: int = 2, keys: Optional[Sequence[str]] = None,
              shared_paths: Sequence[Tuple[str, str]] = ()) -> Iterator:
    """Run ``fn(job)`` for every job; yield ``(i, result)`` as each finishes (any order).

    Parameters
    ----------
    fn : callable
        A function of a module (workers import it by name; not one of the main script, which
        the local workers do not import).
    jobs : sequence
        Picklable arguments, one task each.
    engine : {'local', 'dask'}
        ``local``: a pool of ``workers`` worker processes (in this process when
        ``workers <= 1``). ``dask``: ``dask.distributed.Client(scheduler)``, or a
        ``LocalCluster`` of ``workers`` single-threaded worker processes when no
        ``scheduler`` is given.
    scheduler : str, optional
        Address of a running Dask scheduler, e.g. ``tcp://10.0.0.5:8786``.
    scheduler_wait : float
        Seconds a ``scheduler`` with no worker is given for one to join (0: no limit).
    retries : int
        Dask: times a task that raised is retried (a task whose worker died is rescheduled
        by Dask regardless, up to its ``allowed-failures``).
    keys : sequence of str, optional
        Dask task keys (stable names show up in the dashboard).
    shared_paths : sequence of (str, str)
        Dask: ``(what, absolute path)`` pairs every task checks first on its worker
        (:class:`~gluon_data.errors.WorkerPathError` when one is missing there).

    Raises
    ------
    Exception
        The first task error, re-raised here; the remaining tasks are cancelled.

    Examples
    --------
    >>> sorted(r for _, r in run_tasks(abs, [-1, -2], engine="local", workers=1))
    [1, 2]
    """
    if engine not in ENGINES:
        raise ValueError("unknown engine %r; valid: %s" % (engine, ", ".join(ENGINES)))
    if scheduler and engine != "dask":
        raise ValueError("--scheduler applies to --engine dask")
    if engine == "dask":
        for _, path in shared_paths:
            if not os.path.isabs(path):
                raise ValueError("shared path %r must be absolute (resolved on the client)"
                                 % path)
        if shared_paths:
            fn = _OnSharedPaths(fn, shared_paths)
        yield from _run_dask(fn, jobs, workers, (scheduler, scheduler_wait), retries, keys)
        return
    if workers <= 1 or len(jobs) <= 1:
        for i, job in enumerate(jobs):
            yield i, fn(job)
        return
    # the converter's own pool: workers ignore Ctrl-C, bounded teardown
    with worker_pool(min(workers, len(jobs)), preload=fn) as pool:
        tickets = [pool.submit(fn, job) for job in jobs]
        index = {t.tid: i for i, t in enumerate(tickets)}
        for t in pool.completed(tickets):
            yield index[t.tid], t.get()


def worker_init(preload: Optional[bytes] = None) -> None:
    """A pool worker's start. ``preload``: an object pickled by :func:`preloaded`, e.g. the
    task function, loaded here (its module and what that imports), so those imports are done
    while the parent still plans, not when the first task comes; and loaded only once the
    numerical libraries it brings are limited to one thread
    (:func:`~gluon_data.storage.perprocess.one_thread_per_library`): this process is one
    worker per core already."""
    one_thread_per_library()  # before numpy is imported: below (OpenCV), or by the preload
    import cv2  # in the worker only (as _dask_worker_init)
    cv2.setNumThreads(1)  # one process per core already; safe in a fresh process
    reuse_freed_memory()  # decoded images' pages reused, not faulted in per item
    # Ctrl-C reaches the whole process group: only the parent acts on it (it stops the pool,
    # and says so once, not once per worker with each one's traceback).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # stop_pool ends a worker by SIGTERM: the default action, never a handler that raises
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if preload is not None:  # (an import that fails here ends the worker with its error)
        ForkingPickler.loads(preload)
    # A worker's exit (after its tasks, when it has written and closed all it wrote)
    # skips the interpreter's teardown of numpy,
    # OpenCV and Pillow (about half a second per worker on a busy machine).
    atexit.register(os._exit, 0)


def preloaded(obj: Any) -> Optional[bytes]:
    """``obj`` pickled for :func:`worker_init` to load in each worker (None stays None): a
    pickled function arrives as bytes, so the worker imports its module only when
    :func:`worker_init` loads it, after the set-up that must come first."""
    return None if obj is None else bytes(ForkingPickler.dumps(obj))


def refuse_in_bootstrap() -> None:
    """Raise :class:`ConversionError` in a spawned process still importing its parent's main
    script (a local Dask cluster's worker, or a process the script starts itself): a
    conversion started there is the script's own, run again at import because it is not under
    ``if __name__ == "__main__":``, and would write the output once more in every such
    process; this says why where the user reads it."""
    # multiprocessing's own test (spawn._check_not_importing_main) reads this flag
    if getattr(multiprocessing.current_process(), "_inheriting", False):
        raise ConversionError("a conversion was started while this spawned process imported "
                              "the main script: %s" % MAIN_GUARD_RULE)


def start_encoder_pool(workers: int,
                       preload: Optional[Callable[..., Any]] = None) -> EncoderPool:
    """The converter's :class:`~gluon_data.convert.workers.EncoderPool` of ``workers``
    processes, each started by :func:`worker_init` (``preload``: a picklable object, the
    task function, that each worker loads as it starts) and never seeing SIGINT, not even
    while it starts: the signal is blocked while they are created (a blocked signal stays
    blocked across fork and exec), so an interrupt during start-up waits in the parent and
    is raised there right after."""
    with sigint_blocked():
        return EncoderPool(workers, worker_init, preloaded(preload))


@contextlib.contextmanager
def worker_pool(workers: int, preload: Optional[Callable[..., Any]] = None):
    """:func:`start_encoder_pool` for a block: what was submitted is run to the end and the
    workers reaped when the block ends; stopped within a bounded time (:func:`stop_pool`)
    when it raises or is abandoned (Ctrl-C, a generator not run out)."""
    pool = start_encoder_pool(workers, preload)
    try:
        yield pool
    except BaseException:
        stop_pool(pool)
        raise
    pool.close()
    pool.join()


def stop_pool(pool: Any, timeout: float = 5.0) -> None:
    """Terminate a pool whatever state it is in, reaping every worker: the converter's
    :class:`~gluon_data.convert.workers.EncoderPool` (SIGTERM, then SIGKILL, within
    ``timeout`` seconds), or a ``multiprocessing.Pool`` (a Gluon ``DataLoader``'s), whose
    ``Pool.terminate`` runs in a helper thread. A worker killed from outside may have died
    holding one of the pool's queue locks, which ``Pool.terminate`` takes and would wait
    for forever: if it has not returned in ``timeout`` seconds, the workers are killed, and
    a lock that a thread of this process waits for while only a dead worker can hold it is
    let go (:func:`_free_dead_locks`), so that it returns and leaves no thread of the pool
    behind (within :data:`STUCK_STOP_SECONDS` more; a pool still stuck then is left)."""
    if isinstance(pool, EncoderPool):
        pool.terminate(timeout)
        return
    started = list(getattr(pool, "_pool", []))
    t = threading.Thread(target=pool.terminate, name="gluon-data-pool-stop", daemon=True)
    t.start()  # (it marks the pool terminating first: no worker is replaced from then on)
    t.join(timeout)
    deadline = time.monotonic() + STUCK_STOP_SECONDS
    while t.is_alive() and time.monotonic() < deadline:
        workers = started + list(getattr(pool, "_pool", []))
        for p in workers:
            with contextlib.suppress(OSError, AttributeError, ValueError):
                p.kill()
        for p in workers:
            with contextlib.suppress(OSError, AssertionError, ValueError):
                p.join(0.1)
        if all(p.exitcode is not None for p in workers):
            _free_dead_locks(pool)
        t.join(0.1)
    for p in started + list(getattr(pool, "_pool", [])):
        with contextlib.suppress(OSError, AssertionError, ValueError):
            p.join(timeout)


#: How long :func:`stop_pool` goes on killing a stuck ``multiprocessing.Pool``'s workers and
#: letting go of its dead workers' locks once ``Pool.terminate`` overran its time.
STUCK_STOP_SECONDS = 5.0


def _free_dead_locks(pool: Any) -> None:
    """Let go of a ``multiprocessing.Pool``'s queue lock that a thread of this process waits
    for, called once every worker of the pool has ended. Workers take the task queue's
    reading lock and the result queue's writing lock; in this process only
    ``Pool.terminate`` takes the first (once, for good) and ``SimpleQueue.put`` the second
    (the pool's task thread and ``Pool.terminate``, each once). So a lock held while a thread
    of ours waits at the line that takes it, and none of ours is past that line, is held by
    a dead worker. Each is looked at twice, 20 ms apart, so that a thread that has just
    taken a free lock is seen past that line."""
    queues = (("_help_stuff_finish", "inqueue", getattr(pool, "_inqueue", None), "_rlock"),
              ("put", "self", getattr(pool, "_outqueue", None), "_wlock"))
    for function, name, queue, attr in queues:
        lock = getattr(queue, attr, None)
        if lock is None or not _held_by_none_of_ours(lock, function, name, queue, attr):
            continue
        time.sleep(0.02)
        if _held_by_none_of_ours(lock, function, name, queue, attr):
            with contextlib.suppress(ValueError):  # (released meanwhile)
                lock.release()


def _held_by_none_of_ours(lock: Any, function: str, name: str, queue: Any, attr: str) -> bool:
    """Whether ``lock`` is held, a thread of this process waits at the line of ``function``
    (whose local ``name`` is ``queue``) that takes it, and no thread of ours is past it."""
    if lock.acquire(False):  # free
        lock.release()
        return False
    waiting = False
    for frame in sys._current_frames().values():
        f: Any = frame
        while f is not None:
            if f.f_code.co_name == function and f.f_locals.get(name) is queue:
                if "." + attr not in linecache.getline(f.f_code.co_filename, f.f_lineno):
                    return False  # past it: this thread holds the lock
                waiting = True
            f = f.f_back
    return waiting


def _wait_for_a_worker(client: Any, scheduler: str, seconds: float) -> None:
    """Return once a worker of the scheduler at ``scheduler`` has run a task, waiting up to
    ``seconds`` (0: no limit); none by then is a :class:`ConversionError` saying how to start
    one. The probe is a task, not a look at the worker list: an adaptive cluster (dask-
    jobqueue, dask-gateway, Kubernetes) starts its workers only for tasks waiting."""
    probe = client.submit(os.getpid, pure=False)
    try:
        probe.result(timeout=seconds or None)
    except TimeoutError:  # (Dask's own is this one)
        raise ConversionError(
            "the Dask scheduler at %s (--scheduler) has no worker: none joined in %g s; "
            "start its workers (`dask worker %s`), give them longer (--scheduler-wait), or "
            "leave --scheduler out to run a local cluster" % (scheduler, seconds, scheduler)) \
            from None
    finally:
        probe.cancel()


def _run_dask(fn, jobs, workers, where: Tuple[Optional[str], float], retries,
              keys) -> Iterator:
    """:func:`run_tasks` on Dask: ``where`` is ``(scheduler, scheduler_wait)``."""
    scheduler, wait = where
    dd = import_dask()
    cluster = client = None
    futures = []
    try:
        if scheduler:
            try:
                client = dd.Client(scheduler)
            except (OSError, ValueError) as e:  # (Dask's connect timeout is an OSError)
                raise ConversionError("cannot reach the Dask scheduler at %s (--scheduler): "
                                      "%s" % (scheduler, e)) from None
            _wait_for_a_worker(client, scheduler, wait)
        else:
            # our own cluster's processes never see Ctrl-C (each would print its own
            # KeyboardInterrupt traceback): this process closes them; one while they start
            # is raised once both are assigned, so the finally below closes them
            refuse_in_bootstrap()  # its worker processes are spawned by multiprocessing
            # multiprocessing's resource tracker, started first: starting it unblocks
            # SIGINT in the calling thread
            resource_tracker.ensure_running()
            with sigint_blocked():
                try:
                    cluster = dd.LocalCluster(n_workers=max(1, workers), threads_per_worker=1,
                                              processes=True, dashboard_address=None)
                except RuntimeError as e:  # ("Nanny failed to start.")
                    raise ConversionError(
                        "the local Dask cluster could not start: %s; its workers' own errors "
                        "are printed above (where they say the main script could not be "
                        "imported, or that a conversion was started while importing it: %s)"
                        % (e, MAIN_GUARD_RULE)) from e
                client = dd.Client(cluster)
        _check_versions(client.run(_dask_worker_init))
        futures = client.map(fn, list(jobs), key=list(keys) if keys else None, pure=False,
                             retries=retries)
        index = {f.key: i for i, f in enumerate(futures)}
        # results gathered by as_completed on the client's own loop: this thread only waits
        # on a condition, so a Ctrl-C lands there and never inside Client.sync, whose cancel
        # callback logs a NameError traceback when interrupted before its future exists
        for fut, result in dd.as_completed(futures, with_results=True):
            yield index[fut.key], result
    finally:
        with sigint_blocked():  # a second Ctrl-C waits until the cluster is closed
            if client is not None:
                if futures:
                    client.cancel(futures)
                client.close()
            if cluster is not None:
                cluster.close()
