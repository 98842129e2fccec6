"""The conversion's own worker pool (:class:`gluon_data.convert.workers.EncoderPool`): tasks
run in worker processes, fed by the parent's main thread alone, results in the order asked,
a task's exception raised where its result is read, a worker that dies a
:class:`ConversionError`, and the workers' segment copies (:class:`loop._Copies`) leave the
same bytes as the parent's own copies."""
import functools
import os
import signal
import subprocess
import sys
import threading
import time
import types

import pytest

from gluon_data import convert
from gluon_data.convert import chunks, loop
from gluon_data.convert import encode
from gluon_data.convert.engines import start_encoder_pool, stop_pool
from gluon_data.convert import workerprocs
from gluon_data.convert.workers import QUEUED_MAX_BYTES, EncoderPool
from gluon_data.convert.sample import make_voc
from gluon_data.errors import ConversionError
from gluon_data.storage.perprocess import LIBRARY_THREADS_ENV
from gluon_data.stores.recwriter import RecordWriter

from conftest import pool_processes, same_output_bytes


@pytest.fixture(scope="module")
def voc40(tmp_path_factory):
    return make_voc(str(tmp_path_factory.mktemp("voc40") / "VOC2012"), num_images=40,
                    size_range=(16, 32), seed=5)


@pytest.fixture
def pool():
    p = start_encoder_pool(2)
    yield p
    stop_pool(p)


def _exit_now(code):  # a task that kills its worker
    os._exit(code)


def _start_fails(preload):  # a worker start that fails (an import error, say)
    raise ImportError("no module named %r" % preload)


def test_results_come_back_in_order_from_workers_with_no_thread_in_the_parent(pool):
    before = threading.active_count()
    tickets = [pool.submit(os.getpid) for _ in range(10)] + [pool.submit(divmod, 7, 2)]
    assert threading.active_count() == before  # fed by this thread: no handler threads
    pids = [t.get() for t in tickets[:-1]]
    assert tickets[-1].get() == (3, 1)
    assert os.getpid() not in pids and len(set(pids)) <= 2
    assert pool.results == {}  # a result read is not kept by the pool
    assert tickets[0].get() == pids[0]  # (the ticket keeps it)


def test_waiting_for_results_reuses_one_poll_object(pool, monkeypatch):
    # multiprocessing.connection.wait builds a selector at every call: waited on per chunk,
    # it was a fifth of the parent's CPU per converted item. The pool keeps one poll object.
    from gluon_data.convert import workers

    def refuse(*a, **k):
        raise AssertionError("the pool called multiprocessing.connection.wait")

    made = []
    real = workers.select.poll

    def counted():
        made.append(1)
        return real()

    monkeypatch.setattr(workers, "wait", refuse)
    monkeypatch.setattr(workers.select, "poll", counted)
    tickets = [pool.submit(divmod, k, 3) for k in range(40)]
    assert [t.get() for t in tickets] == [divmod(k, 3) for k in range(40)]
    assert all(t.ready() for t in tickets)
    assert len(made) <= 2  # at most one more per worker (its own probe), not one per wait


def test_a_task_error_is_raised_where_its_result_is_read(pool):
    bad, good = pool.submit(int, "x"), pool.submit(abs, -3)
    assert good.get() == 3
    with pytest.raises(ValueError, match="invalid literal"):
        bad.get()


def test_a_worker_that_dies_is_a_conversion_error_not_a_hang(pool):
    t0 = time.monotonic()
    dead = pool.submit(_exit_now, 7)
    with pytest.raises(ConversionError, match="exit code 7"):
        dead.get()
    assert time.monotonic() - t0 < 60


def test_close_and_join_run_what_is_queued_then_reap_every_worker():
    p = start_encoder_pool(2)
    try:
        tickets = [p.submit(abs, -i) for i in range(6)]
        p.close()
        with pytest.raises(RuntimeError, match="closed"):
            p.submit(abs, 1)
        p.join(30)
        assert [t.get() for t in tickets] == list(range(6))
        assert all(not w.is_alive() and w.exitcode == 0 for w in p.processes)
    finally:
        stop_pool(p)


@pytest.mark.parametrize("every", [5, 16])
def test_checkpoints_inside_a_workers_chunk_leave_the_same_bytes(voc40, tmp_path, every):
    """A checkpoint falls inside a chunk (5) or on its end (16): the copies reserved so far
    are made before it, and the output is the one a single process writes."""
    ref = str(tmp_path / "ref" / "voc.rec")
    convert(voc40, ref, "voc", split="trainval", workers=1)
    out = str(tmp_path / "w" / "voc.rec")
    convert(voc40, out, "voc", split="trainval", workers=2, checkpoint_every=every)
    stem = lambda p: p[:-4]  # noqa: E731
    for a, b in ((ref, out), (stem(ref) + ".idx", stem(out) + ".idx"),
                 (stem(ref) + ".meta.json", stem(out) + ".meta.json")):
        assert same_output_bytes(a, b), a
    assert not [f for f in os.listdir(os.path.dirname(out)) if ".segments" in f]


def test_the_workers_copy_the_segments_not_the_parent(voc40, tmp_path, monkeypatch):
    """With a pool, the parent reserves each chunk's place and never copies a segment of
    a ``.rec`` itself (without a checkpoint inside a chunk)."""
    copied = []
    monkeypatch.setattr(RecordWriter, "fill", lambda self, fd, runs: copied.append(runs))
    out = str(tmp_path / "voc.rec")
    rep = convert(voc40, out, "voc", split="trainval", workers=2)
    assert rep.written["trainval"] == 40 and copied == []


def test_a_worker_dead_while_idle_is_a_conversion_error_at_the_next_task(pool):
    first = pool.submit(os.getpid)
    pid = first.get()
    for w in pool.processes:
        if w.pid == pid:
            w.kill()
            w.join(30)
    with pytest.raises(ConversionError, match="exit code"):
        for _ in range(4):  # the dead worker is handed one of them (or its death is seen)
            pool.submit(abs, -1).get()


def test_a_worker_that_fails_to_start_is_a_conversion_error_whenever_it_is_seen():
    # tasks sent before the worker died lie unread in its pipe: reading back then fails
    # with a reset connection, which is the same dead worker
    pool = EncoderPool(2, _start_fails, "codec_of_the_future")
    try:
        tickets = [pool.submit(abs, -k) for k in range(6)]
        with pytest.raises(ConversionError, match="exit code 1") as e:
            for t in tickets:
                t.get()
    finally:
        stop_pool(pool)
    assert all(not w.is_alive() for w in pool.processes)
    # a worker that never answered could not start: where its error went
    assert "before it finished any task (its own error is printed above)" in str(e.value)


_UNGUARDED = """from gluon_data import convert
convert(%r, %r, "voc", split="trainval", workers=2)
print("converted")
"""


def _convert_unguarded(voc40, tmp_path, script, cwd):
    """Run the unguarded script at ``script`` from ``cwd``: it converts once, and says so
    once; returns its output."""
    out = tmp_path / "out" / "voc.rec"
    script.parent.mkdir(parents=True, exist_ok=True)
    script.write_text(_UNGUARDED % (voc40, str(out)))
    r = subprocess.run([sys.executable, str(script)], cwd=str(cwd), capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["converted"]
    return out


def test_a_script_that_converts_without_the_main_guard_converts_once(voc40, tmp_path):
    """Pasted into a script as it stands, ``convert(..., workers=2)`` converts once: the
    workers are fresh interpreters that never import the script (multiprocessing's spawn
    imports it in each, which ran the conversion again there)."""
    out = _convert_unguarded(voc40, tmp_path, tmp_path / "convert_voc.py", tmp_path)
    ref = tmp_path / "ref" / "voc.rec"
    convert(voc40, str(ref), "voc", split="trainval", workers=1)
    assert same_output_bytes(str(out), str(ref))


_UNGUARDED_SPAWNING = """import multiprocessing
from gluon_data import convert
convert(%r, %r, "voc", split="trainval", workers=1, overwrite=True)
print("converted")


def child():
    pass


if __name__ == "__main__":
    p = multiprocessing.get_context("spawn").Process(target=child)
    p.start()
    p.join()
    print("child", p.exitcode)
"""


def test_an_unguarded_script_that_spawns_processes_is_told_why_in_them(voc40, tmp_path):
    """A script that converts at import and then spawns a process of its own: spawn imports
    the script in the child, which must not convert again (here with one worker, so no pool
    is started): refused there, naming the rule; the parent's conversion stands."""
    script = tmp_path / "convert_and_spawn.py"
    script.write_text(_UNGUARDED_SPAWNING % (voc40, str(tmp_path / "out" / "voc.rec")))
    r = subprocess.run([sys.executable, str(script)], cwd=str(tmp_path), capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["converted", "child 1"]
    assert "a conversion was started while this spawned process imported the main script" \
        in r.stderr and 'if __name__ == "__main__":' in r.stderr


def test_a_module_in_the_working_directory_does_not_shadow_a_workers_imports(voc40, tmp_path):
    """``python -c`` puts the working directory first on a worker's path: a ``tempfile.py``
    there (the user's own) must not be what the worker imports while it starts (before it
    takes the parent's path)."""
    here = tmp_path / "cwd"
    here.mkdir()
    (here / "tempfile.py").write_text("raise ImportError('the user\'s tempfile.py')\n")
    _convert_unguarded(voc40, tmp_path, tmp_path / "scripts" / "convert_voc.py", here)


def test_a_task_of_the_main_script_is_refused_when_submitted(pool):
    """The workers never import the main script, so a function defined there could not be
    found in them: refused at once, saying where to put it."""
    def square(x):
        return x * x
    square.__module__ = "__main__"
    for task in (square, functools.partial(square, 3)):
        with pytest.raises(TypeError, match="defined in the main script.*define it in a module"):
            pool.submit(task, 3)
    assert pool.submit(abs, -3).get() == 3


def test_a_task_that_cannot_be_unpickled_in_a_worker_is_that_tasks_error(pool, monkeypatch):
    """A task whose arguments name a class the worker cannot import fails as that task (its
    error raised where its result is read); the worker goes on with the next task."""
    mod = types.ModuleType("only_in_the_parent")
    exec("class Thing:\n    pass\n", mod.__dict__)
    monkeypatch.setitem(sys.modules, "only_in_the_parent", mod)
    bad, good = pool.submit(id, mod.Thing()), pool.submit(abs, -4)
    with pytest.raises(ModuleNotFoundError, match="only_in_the_parent"):
        bad.get()
    assert good.get() == 4


def test_a_worker_imports_from_the_folders_the_parents_relative_path_named(tmp_path):
    """A parent whose path has ``''`` (``python -c``, a notebook) or another relative entry
    imports from the folder it was in even after it changes folder; a worker does the same,
    not from its own working directory."""
    here = tmp_path / "start"
    (here / "lib").mkdir(parents=True)
    for name in ("probe_here.py", "lib/probe_lib.py"):
        (here / name).write_text("def where():\n    return __file__\n")
    code = ("import os, sys, probe_here\n"
            "sys.path.insert(0, 'lib')\n"
            "import probe_lib\n"
            "from gluon_data.convert.engines import start_encoder_pool, stop_pool\n"
            "os.chdir(%r)\n"
            "p = start_encoder_pool(1)\n"
            "try:\n"
            "    print(p.submit(probe_here.where).get())\n"
            "    print(p.submit(probe_lib.where).get())\n"
            "finally:\n    stop_pool(p)\n" % str(tmp_path))
    r = subprocess.run([sys.executable, "-c", code], cwd=str(here), capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert [os.path.dirname(x) for x in r.stdout.split()] == [str(here), str(here / "lib")]


def test_a_program_that_exits_with_tasks_queued_prints_nothing_at_exit():
    """Tasks still queued when the program ends (a Ctrl-C, an error of the caller's) leave
    nothing for the interpreter's exit to complain of: each was once held as a view of the
    buffer it was pickled into, and closing those buffers at exit printed "Exception ignored
    in: <_io.BytesIO ...> BufferError" under a conversion's last line, once per task."""
    code = ("import sys\n"
            "from gluon_data.convert.engines import start_encoder_pool\n"
            "p = start_encoder_pool(1)\n"
            "for k in range(8):\n"  # the worker holds two: six stay queued
            "    p.submit(divmod, k, 3)\n"
            # held in a reference cycle, as the frames of a caught interrupt hold it: the
            # exit's last collection finalizes what the cycle holds, not freed in order
            "held = [p]\n"
            "held.append(held)\n"
            "del p, held\n"
            "print('queued', flush=True)\n"
            "sys.exit(130)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 130 and r.stdout == "queued\n", (r.stdout, r.stderr)
    assert r.stderr == "", r.stderr


class _TwoArgs(Exception):  # an exception that pickles but cannot be rebuilt from its args
    def __init__(self, a, b):
        super().__init__(a)


def _raise_two_args():
    raise _TwoArgs(1, 2)


def test_a_result_that_cannot_be_unpickled_is_that_tasks_error(pool):
    """What a worker sends back but this process cannot rebuild is the error of that task
    alone: the results after it still go to their own tasks."""
    bad, good, more = pool.submit(_raise_two_args), pool.submit(abs, -2), pool.submit(abs, -5)
    with pytest.raises(ConversionError, match="could not be unpickled here: TypeError"):
        bad.get()
    assert (good.get(), more.get()) == (2, 5)


def test_a_pool_refuses_no_workers_and_a_stopped_pools_tasks_say_so():
    with pytest.raises(ValueError, match="at least one worker"):
        EncoderPool(0, abs)
    p = start_encoder_pool(1)
    ticket = p.submit(time.sleep, 30)
    stop_pool(p)
    with pytest.raises(RuntimeError, match="the pool was stopped"):
        ticket.get()


def _open_fds():
    return set(os.listdir("/proc/self/fd"))


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs Linux's /proc")
def test_a_pool_that_cannot_start_leaves_no_socket_open(monkeypatch):
    """A pool whose starter process cannot be started (no more processes, say) raises
    that error and closes every socket it made for its workers."""
    def no_more_processes(*args, **kwargs):
        raise OSError("no more processes")
    before = _open_fds()
    monkeypatch.setattr(workerprocs.subprocess, "Popen", no_more_processes)
    with pytest.raises(OSError, match="no more processes"):
        start_encoder_pool(3)
    assert _open_fds() == before


def _parent_pid():
    return os.getppid()


def test_the_workers_are_forked_from_one_starter_not_from_the_caller():
    """Every worker is a child of the one starter process that loaded the encoder, not of
    the caller's process (never forked) nor a fresh interpreter of its own; the starter
    reaps them and ends with them."""
    pool = start_encoder_pool(3, encode.encode_job)
    try:
        tickets = [pool.submit(_parent_pid) for _ in range(12)]
        parents = {t.get() for t in tickets}
        pids = {w.pid for w in pool.processes}
        starter = pool._starter
        pool.close()
        pool.join(30)
    except BaseException:
        stop_pool(pool)
        raise
    assert parents == {starter.pid} and starter.pid != os.getpid()
    assert len(pids) == 3 and starter.pid not in pids
    assert [w.exitcode for w in pool.processes] == [0, 0, 0]
    assert starter._popen.returncode == 0


def test_workers_forked_where_the_user_asked_for_blas_threads_compute_and_warn_nothing():
    """A user's ``OPENBLAS_NUM_THREADS=4`` is kept, so the starter runs OpenBLAS's threads
    when it forks the workers: OpenBLAS re-initialises in each child (a matrix product
    there comes back right, in bounded time), and nothing is printed: no warning about
    forking a process that runs threads, not even under ``-W error``."""
    code = ("import numpy as np\n"
            "from gluon_data.convert import encode\n"
            "from gluon_data.convert.engines import start_encoder_pool, stop_pool\n"
            "a = np.arange(90000, dtype=np.float64).reshape(300, 300) / 1e4\n"
            "p = start_encoder_pool(2, encode.encode_job)\n"
            "try:\n"
            "    got = [p.submit(np.dot, a, a) for _ in range(6)]\n"
            "    assert all(np.allclose(t.get(), a @ a) for t in got)\n"
            "    p.close()\n"
            "    p.join(30)\n"
            "finally:\n"
            "    stop_pool(p)\n"
            "print('ok', [w.exitcode for w in p.processes])\n")
    r = subprocess.run([sys.executable, "-W", "error::DeprecationWarning", "-c", code],
                       env=dict(os.environ, OPENBLAS_NUM_THREADS="4"), capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout == "ok [0, 0]\n" and r.stderr == "", (r.stdout, r.stderr)


def _record_setup(folder):  # a worker set-up that leaves its process's mark
    open(os.path.join(folder, str(os.getpid())), "w").close()


@pytest.mark.parametrize("before_fork", [True, False])
def test_the_set_up_runs_once_in_the_starter_or_where_it_cannot_in_each_worker(
        tmp_path, monkeypatch, before_fork):
    """The workers' set-up runs once, in the starter, before it forks them; where libraries
    are not safe in a forked child (macOS), the starter forks first and each worker runs
    it: every worker, and only the workers."""
    monkeypatch.setattr(workerprocs, "SETUP_BEFORE_FORK", before_fork)
    pool = EncoderPool(2, _record_setup, str(tmp_path))
    try:
        pids = {w.pid for w in pool.processes}
        assert {pool.submit(os.getpid).get() for _ in range(8)} <= pids
        pool.close()
        pool.join(30)
    except BaseException:
        stop_pool(pool)
        raise
    ran = sorted(map(int, os.listdir(tmp_path)))
    assert ran == ([pool._starter.pid] if before_fork else sorted(pids))
    assert [w.exitcode for w in pool.processes] == [0, 0]


def _running(pid):
    """Whether ``pid`` runs (not gone, not a zombie waiting to be reaped)."""
    try:
        with open("/proc/%d/stat" % pid, "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except OSError:
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux's parent-death signal")
def test_a_starter_killed_from_outside_takes_its_workers_with_it():
    """The starter killed while its workers run long tasks: the workers end with it (none
    is left behind that the pool could no longer see or stop), a worker's end is reported
    with the starter's exit code, and the pool stops within a bounded time."""
    pool = start_encoder_pool(2)
    try:
        pids = [w.pid for w in pool.processes]
        tickets = [pool.submit(time.sleep, 60) for _ in range(2)]
        os.kill(pool._starter.pid, signal.SIGKILL)
        pool._starter._popen.wait(30)
        for _ in range(3000):  # bounded: the kernel signals them at once
            if not any(_running(pid) for pid in pids):
                break
            time.sleep(0.01)
        assert not any(_running(pid) for pid in pids)
        assert all(w.exitcode == -signal.SIGKILL for w in pool.processes)
        with pytest.raises(ConversionError, match="exit code -9"):
            tickets[0].get()
    finally:
        t0 = time.monotonic()
        stop_pool(pool)
    assert time.monotonic() - t0 < 30


def _leave_a_child_then_die(path):  # a task whose child outlives its worker
    pid = os.fork()
    if pid == 0:  # it holds the worker's socket open
        time.sleep(60)
        os._exit(0)
    with open(path, "w") as f:
        f.write(str(pid))
    os._exit(7)


def test_a_worker_that_dies_while_a_child_of_its_task_runs_on_is_seen_at_once(tmp_path):
    """A task that started a process, then its worker died: that process holds the
    worker's socket open, so the socket does not end; the starter's report of the worker's
    end is what the pool sees, at once, not when that process ends."""
    pool = start_encoder_pool(1)
    marker = tmp_path / "child"
    t0 = time.monotonic()
    try:
        with pytest.raises(ConversionError, match="exit code 7"):
            pool.submit(_leave_a_child_then_die, str(marker)).get()
        assert time.monotonic() - t0 < 30
    finally:
        stop_pool(pool)
        if marker.exists():
            os.kill(int(marker.read_text()), signal.SIGKILL)


def _ignore_sigchld(preload):  # a set-up that leaves the reaping of children to the kernel
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)


def _kill_the_first_worker_at_its_fork(preload):
    """A set-up that ignores SIGCHLD, then has the starter kill its first worker as soon as
    it is forked and wait, before it forks the next."""
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    real, forked = os.fork, []

    def fork():
        pid = real()
        forked.append(pid)
        if pid and len(forked) == 1:
            os.kill(pid, signal.SIGKILL)
            time.sleep(0.5)  # (the kernel would reap it meanwhile, were SIGCHLD ignored)
        return pid

    os.fork = fork


def test_a_worker_that_ends_while_the_others_are_forked_keeps_its_exit_code():
    pool = EncoderPool(2, _kill_the_first_worker_at_its_fork)
    try:
        pool._procs[0].join(30)
        assert pool._procs[0].exitcode == -9
        assert pool._procs[1].exitcode is None
    finally:
        stop_pool(pool)


def test_a_set_up_that_ignores_child_ends_still_gets_each_workers_exit_code():
    pool = EncoderPool(1, _ignore_sigchld)
    try:
        # the worker keeps what the set-up chose; only the starter, which reaps, resets it
        assert pool.submit(signal.getsignal, signal.SIGCHLD).get() == signal.SIG_IGN
        pid = pool.submit(os.getpid).get()
        os.kill(pid, signal.SIGKILL)
        with pytest.raises(ConversionError, match="exit code -9"):
            for _ in range(4):
                pool.submit(abs, -1).get()
    finally:
        stop_pool(pool)


def _second_fork_fails(preload):  # a start whose second fork fails (no more processes)
    real = os.fork
    calls = []

    def fork():
        calls.append(1)
        if len(calls) >= 2:
            raise BlockingIOError(11, "Resource temporarily unavailable")
        return real()
    os.fork = fork


def test_a_starter_that_cannot_fork_every_worker_is_a_conversion_error_not_a_hang():
    """The first worker forked, the second fork refused: the workers not forked are
    reported ended (exit code 1) and their sockets closed, so waiting for their results
    raises at once instead of waiting for a worker that never came."""
    pool = EncoderPool(3, _second_fork_fails)
    t0 = time.monotonic()
    try:
        with pytest.raises(ConversionError, match="exit code 1"):
            for t in [pool.submit(os.getpid) for _ in range(6)]:
                t.get()
    finally:
        stop_pool(pool)
    assert time.monotonic() - t0 < 60
    assert all(not w.is_alive() for w in pool.processes)


_SETUP_PRINTS = """import sys
sys.path[:0] = [%r]
from gluon_data.convert.workers import EncoderPool
from test_encoder_pool import _prints
p = EncoderPool(3, _prints)
p.close()
p.join(30)
"""


def _prints(preload):  # a set-up that prints (a library's notice at import, say)
    print("a notice")


def test_what_the_set_up_prints_is_printed_once_not_once_per_worker():
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    r = subprocess.run([sys.executable, "-c", _SETUP_PRINTS % os.path.dirname(__file__)],
                       env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout == "a notice\n", r.stdout


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs Linux's /proc")
def test_a_set_up_that_cannot_be_sent_leaves_no_process():
    """An ``init`` that cannot be pickled fails the pool's start with its error, and the
    starter already started is stopped and reaped, not left waiting for it."""
    with pytest.raises(Exception, match="pickle|lambda"):
        EncoderPool(2, lambda preload: None)
    assert pool_processes() == ([], [])


def _wait_for(path):  # a task that runs until the test lets it end
    for _ in range(6000):
        if os.path.exists(path):
            return True
        time.sleep(0.01)
    return False


def _touch(path, payload=b""):
    with open(path, "wb"):
        pass
    return len(payload)


def _echo(payload):
    return payload


def test_a_worker_starts_its_next_task_without_waiting_for_the_parent(tmp_path):
    """The next small task waits in the worker's pipe behind the one it runs: it starts as
    soon as the first ends, while the parent reads nothing."""
    pool = start_encoder_pool(1)
    try:
        go, second = str(tmp_path / "go"), str(tmp_path / "second")
        first = pool.submit(_wait_for, go)
        nxt = pool.submit(_touch, second)
        _touch(go)
        assert _wait_for(second)  # no get() or collect() in between
        assert first.get() is True and nxt.get() == 0
    finally:
        stop_pool(pool)


def test_a_large_task_waits_for_an_idle_worker(tmp_path):
    """A task too large to lie in the pipe's buffer is not sent behind a running one (the
    parent's send would block while the worker may be sending a large result)."""
    pool = start_encoder_pool(1)
    try:
        go = str(tmp_path / "go")
        first = pool.submit(_wait_for, go)
        big = pool.submit(_touch, str(tmp_path / "big"), b"x" * (QUEUED_MAX_BYTES + 1))
        small = pool.submit(abs, -2)
        assert [len(t) for t in pool._running.values()] == [1]  # the big one is not sent
        _touch(go)
        assert first.get() is True and big.get() == QUEUED_MAX_BYTES + 1 and small.get() == 2
    finally:
        stop_pool(pool)


def test_large_tasks_and_results_both_ways_do_not_deadlock():
    """Tasks and results of 1 MB each, more of them than workers: every send completes."""
    pool = start_encoder_pool(2)
    out = []
    try:
        t = threading.Thread(target=lambda: out.extend(
            x.get() for x in [pool.submit(_echo, bytes([k]) * (1 << 20)) for k in range(8)]),
            daemon=True)
        t.start()
        t.join(120)
        assert not t.is_alive(), "the pool deadlocked"
    finally:
        stop_pool(pool)
    assert [o[:1] for o in out] == [bytes([k]) for k in range(8)]
    assert all(len(o) == 1 << 20 for o in out)


def _threads_and_settings():  # what a worker runs with, once its task function is loaded
    loaded = "numpy" in sys.modules  # (numpy and OpenCV came with the worker's set-up)
    a = sys.modules["numpy"].ones((256, 256))
    a @ a  # OpenBLAS starts its threads at its first product, not at import
    return (len(os.listdir("/proc/self/task")), loaded,
            {name: os.environ.get(name) for name in LIBRARY_THREADS_ENV})


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="needs Linux's /proc")
@pytest.mark.parametrize("preload", [encode.encode_job, None], ids=["encoder", "shard tasks"])
def test_a_worker_runs_numerical_libraries_in_one_thread(preload, monkeypatch):
    """numpy's OpenBLAS would start a thread per core in every worker (one worker per core:
    N x N threads): a worker sets the libraries to one thread before it loads the encoder
    (or, for shard tasks, OpenCV), and keeps a setting the user made."""
    for name in LIBRARY_THREADS_ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("MKL_NUM_THREADS", "3")  # the user's: kept
    pool = start_encoder_pool(1, preload)
    try:
        threads, loaded, env = pool.submit(_threads_and_settings).get()
    finally:
        stop_pool(pool)
    assert loaded  # the encoder (and numpy) came before the first task
    assert env == {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "3"}
    assert threads == 1, "a worker runs %d threads" % threads
    assert "OPENBLAS_NUM_THREADS" not in os.environ  # the parent's environment: untouched


def test_a_failed_segment_copy_is_raised_before_a_checkpoint_counts_on_it(tmp_path):
    """A worker's copy of a segment that fails (here: the segment is gone; a full disk in
    practice) is raised when the next task is carried, never dropped as done: a checkpoint
    taken afterwards would promise bytes the output does not hold (zeros where the records
    were reserved), and ``--resume`` would publish them."""
    dest = tmp_path / "out.rec.partial"
    dest.write_bytes(b"\0" * 64)
    pool = start_encoder_pool(1)
    try:
        copies = loop._Copies(pool, 1)
        copy = [(str(tmp_path / "gone"), str(dest), [(0, 16, 0)])]
        failed = pool.submit(chunks.copy_segments, copy)
        copies.carry(failed, copy)
        for _ in range(1000):  # bounded: the worker answers in milliseconds
            if failed.ready():
                break
            time.sleep(0.01)
        assert failed.ready()
        with pytest.raises(FileNotFoundError):
            copies.carry(pool.submit(abs, -1), [])
    finally:
        stop_pool(pool)


_LOADED = "sorted(m for m in __import__('sys').modules if m.startswith('gluon_data'))"


def test_a_worker_loads_the_encoder_and_its_tasks_only():
    """What a conversion worker imports before its first item is start-up CPU on every core
    of a large host: with the encoder loaded and a task of :mod:`~gluon_data.convert.chunks`
    run, a worker has not imported the store modules, the ordered writer nor the outputs
    (about 60 of the package's modules and 0.1 s of imports more, before they moved out of
    the tasks' way)."""
    pool = start_encoder_pool(1, encode.encode_job)
    try:
        assert pool.submit(chunks.copy_segments, []).get() is None
        loaded = pool.submit(eval, _LOADED).get()
    finally:
        stop_pool(pool)
    assert "gluon_data.convert.encode" in loaded and "gluon_data.convert.chunks" in loaded
    heavy = [m for m in loaded if m.startswith("gluon_data.stores")
             or m in ("gluon_data.convert.loop", "gluon_data.convert.outputs")]
    assert not heavy, heavy
    assert len(loaded) <= 25, loaded
