"""The per-process rule (gluon_data.storage.perprocess.PerProcess) in real forked and
spawned processes, and pickled; and the stores that keep their handles by it."""
import multiprocessing as mp
import os
import pickle
import subprocess
import sys
import threading

import pytest

from gluon_data.storage.perprocess import PerProcess

fork_only = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")


@pytest.fixture(scope="module")
def voc_lmdb(voc_root, tmp_path_factory):
    from gluon_data import convert
    out = str(tmp_path_factory.mktemp("perprocess_lmdb") / "voc.lmdb")
    convert(voc_root, out, "voc", split="train,val")
    return out


def _in_fork(fn):
    """Run ``fn()`` in a child made by ``os.fork()``; return what it wrote (its repr)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 0
        try:
            os.close(r)
            os.write(w, repr(fn()).encode())
        except BaseException as e:  # noqa: BLE001 - reported to the parent
            os.write(w, ("raised %r" % e).encode())
            code = 1
        finally:
            os._exit(code)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        out = f.read().decode()
    _, status = os.waitpid(pid, 0)
    assert os.WEXITSTATUS(status) == 0, out
    return out


def test_get_makes_one_value_per_process_and_peek_never_makes_one():
    h = PerProcess()
    assert h.peek() is None and not h.mine() and h.owner is None
    made = []
    v = h.get(lambda: made.append(1) or object())
    assert h.get(lambda: made.append(2) or object()) is v and made == [1]
    assert h.peek() is v and h.mine() and h.owner == os.getpid()
    assert h.clear() is v and h.peek() is None and h.owner is None
    assert h.get(lambda: "again") == "again"


def test_a_failing_factory_leaves_the_holder_empty():
    h = PerProcess()

    def boom():
        raise ValueError("no")

    with pytest.raises(ValueError):
        h.get(boom)
    assert h.peek() is None and h.owner is None and h.get(lambda: 3) == 3


def test_threads_share_one_value_made_once():
    h, made, barrier = PerProcess(), [], threading.Barrier(8)

    def factory():
        made.append(1)
        return object()

    got = []

    def run():
        barrier.wait()
        got.append(h.get(factory))

    threads = [threading.Thread(target=run) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(made) == 1 and len({id(g) for g in got}) == 1


@fork_only
def test_a_forked_child_makes_its_own_and_releases_what_it_inherited():
    released = []
    h = PerProcess(release=released.append)
    h.get(lambda: "parent's")

    def child():
        before = (h.peek(), h.mine(), h.owner == os.getppid())
        value = h.get(lambda: "child's")
        return before, value, released, h.owner == os.getpid()

    out = _in_fork(child)
    assert out == repr(((None, False, True), "child's", ["parent's"], True))
    assert h.peek() == "parent's" and released == []  # the parent's is untouched


@fork_only
def test_a_lock_held_at_the_fork_does_not_block_the_child():
    h = PerProcess()
    h.get(lambda: 1)
    held, release = threading.Event(), threading.Event()

    def hold():
        with h.lock():
            held.set()
            release.wait(60)

    t = threading.Thread(target=hold)
    t.start()
    held.wait(60)
    try:  # the parent's lock is held by another thread as the child is forked
        out = _in_fork(lambda: (h.get(lambda: 2), h.clear(), h.get(lambda: 3)))
    finally:
        release.set()
        t.join()
    assert out == repr((2, 2, 3))


def _child_view(h, q):
    q.put((h.peek(), h.owner is not None, h.get(lambda: "child")))


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_multiprocessing_children_see_an_empty_holder(method):
    if method not in mp.get_all_start_methods():
        pytest.skip("no %s start method" % method)
    h = PerProcess()
    h.get(lambda: "parent")
    ctx = mp.get_context(method)
    q = ctx.Queue()
    p = ctx.Process(target=_child_view, args=(h, q))
    p.start()
    peeked, inherited, made = q.get(timeout=120)
    p.join(120)
    assert p.exitcode == 0
    assert peeked is None and made == "child"
    assert inherited == (method == "fork")  # a pickled (spawned) holder is empty
    assert h.peek() == "parent"


def test_a_pickled_holder_is_empty_and_keeps_its_release():
    h = PerProcess(release=os.close)
    h.get(lambda: os.open(os.devnull, os.O_RDONLY))
    copy = pickle.loads(pickle.dumps(h))
    assert copy.peek() is None and copy.owner is None and copy.release is os.close
    os.close(h.clear())


@fork_only
def test_stores_reopen_their_handles_after_a_fork(voc_rec, voc_lmdb):
    """A RecordFile's descriptor and an LMDBFile's environment opened in the parent: a forked
    child reads the same records through handles of its own, the parent's stay open."""
    from gluon_data.stores.lmdb_env import _ENVS
    from gluon_data.stores.lmdbio import LMDBFile
    from gluon_data.stores.recordio import RecordFile
    rec, lm = RecordFile(voc_rec), LMDBFile(voc_lmdb, "train")
    want = ([rec.read(i) for i in range(3)], [lm.read(i) for i in range(3)])
    fd, envs = rec._file.fd(), dict(_ENVS.peek())

    def child():
        same = ([rec.read(i) for i in range(3)], [lm.read(i) for i in range(3)]) == want
        mine = _ENVS.peek()
        return same, rec._file.fd() != fd, not set(map(id, mine.values())) & set(
            map(id, envs.values()))

    assert _in_fork(child) == repr((True, True, True))
    os.fstat(fd)  # the parent's descriptor is still open
    assert [rec.read(i) for i in range(3)] == want[0] and _ENVS.peek() == envs


@fork_only
def test_a_forked_writer_refuses_to_write_and_never_flushes_its_parents_data(tmp_path):
    """The writer of MXRecordIO belongs to the process that opened it (``owner``): a forked
    copy may not write, and closing it writes nothing of the parent's buffer."""
    from gluon_data.mx_recordio import MXRecordIO
    path = str(tmp_path / "w.rec")
    w = MXRecordIO(path, "w")
    w.write(b"parent")
    assert w.pid == os.getpid()

    def child():
        try:
            w.write(b"child")
        except RuntimeError as e:
            refused = "Forbidden operation in multiple processes" in str(e)
        w.close()
        return refused, os.path.getsize(path)

    assert _in_fork(child) == repr((True, 0))
    w.close()
    assert w.pid is None
    r = MXRecordIO(path, "r")
    assert r.read() == b"parent" and r.read() is None
    r.close()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux's parent-death signal")
def test_a_process_bound_to_end_with_its_parent_ends_at_once_if_that_one_is_gone():
    """``end_with_parent`` takes (True) for the process's real parent; named another one
    (the parent it was forked by, ended before the call), it exits at once (status 1)."""
    code = ("import os, sys\n"
            "from gluon_data.storage.perprocess import ProcessMark, end_with_parent\n"
            "print(end_with_parent(ProcessMark(os.getppid())), flush=True)\n"
            "end_with_parent(ProcessMark(os.getppid() + int(sys.argv[1])))\n"
            "print('still here')\n")
    ok = subprocess.run([sys.executable, "-c", code, "0"], capture_output=True, text=True,
                        timeout=60)
    assert (ok.returncode, ok.stdout) == (0, "True\nstill here\n"), ok.stderr
    gone = subprocess.run([sys.executable, "-c", code, "1"], capture_output=True, text=True,
                          timeout=60)
    assert (gone.returncode, gone.stdout) == (1, "True\n"), gone.stderr
