"""Shared memory a worker makes once and the training process maps once
(gluon_data/storage/sharedmem.py), across a real process boundary, without any framework: the
descriptor crosses with the first place only, later places find the same mapping, a file its
worker names as gone and a file whose worker ended are let go, and a place this process never
mapped is a typed error."""
import multiprocessing
import pickle

import numpy as np
import pytest

from gluon_data.errors import GluonDataError
from gluon_data.storage import sharedmem
from gluon_data.storage.sharedmem import SharedFile

pytestmark = pytest.mark.skipif(not sharedmem.AVAILABLE, reason="no memfd_create here")


def _worker(queue, release, sizes):
    """Make a file per size, write each one's index into it, and send three places of each
    (the last one's first place naming the one before as gone)."""
    files = []
    for k, size in enumerate(sizes):
        f = SharedFile(size)
        np.frombuffer(f.map, np.uint8)[:] = k + 1
        gone = [files[-1].token] if files else []
        for n in range(3):
            queue.put(f.place("test", gone if n == 0 else ()))
        files.append(f)
    queue.put(None)
    release.get(timeout=120)  # (the parent maps them before this process ends)


def _places(sizes):
    ctx = multiprocessing.get_context("fork")
    to_parent, to_child = ctx.Queue(), ctx.Queue()
    child = ctx.Process(target=_worker, args=(to_parent, to_child, sizes))
    child.start()
    got = []
    while True:
        place = to_parent.get(timeout=60)
        if place is None:
            break
        got.append((place, sharedmem.mapped(place)))
    return child, to_child, got


def test_a_file_is_mapped_once_found_again_and_let_go():
    child, release, got = _places([8192, 16384])
    try:
        handed = [place[4] is not None for place, _ in got]
        assert handed == [True, False, False, True, False, False]  # a descriptor once a file
        first, second = got[0][1], got[3][1]
        assert got[1][1] is first and got[2][1] is first  # the same mapping, found again
        assert np.frombuffer(first.map, np.uint8).tolist() == [1] * 8192
        assert np.frombuffer(second.map, np.uint8).tolist() == [2] * 16384
        # the second file's first place named the first as gone: forgotten here
        assert sharedmem.mapped_count("test") == 1
        with pytest.raises(GluonDataError, match="never mapped"):
            sharedmem.mapped(got[1][0])
    finally:
        release.put(None)
        child.join(timeout=60)
    sharedmem.let_go()  # (as before a fork): its worker has ended
    assert sharedmem.mapped_count("test") == 0
    # a batch of it still on its way now (its worker was killed after sending it) says so
    with pytest.raises(GluonDataError, match=r"process %d, which ended before the batch was "
                                             r"received" % child.pid):
        sharedmem.mapped(got[5][0])


def test_a_group_let_go_forgets_its_files_only():
    child, release, got = _places([4096])
    try:
        assert sharedmem.mapped_count("test") == 1
        sharedmem.let_go("other")
        assert sharedmem.mapped_count("test") == 1
        sharedmem.let_go("test")
        assert sharedmem.mapped_count("test") == 0
    finally:
        release.put(None)
        child.join(timeout=60)


def test_a_place_pickles_without_its_descriptor_after_the_first():
    f = SharedFile(4096)
    first, later = f.place("g"), f.place("g")
    assert first[4] is not None and later[4] is None and f.handed
    assert pickle.loads(pickle.dumps(later))[1:4] == (f.token, f.owner, 4096)
    assert f.close() and f.map.closed
