"""The storage layer's per-process descriptor (the import rules are in tests/test_structure.py)."""
import multiprocessing as mp
import os

import pytest

from gluon_data.storage.fileio import ProcessDescriptor

def test_process_descriptor_is_per_process_and_closed_when_its_check_fails(tmp_path):
    """One descriptor per process: a forked child opens its own and closing it leaves the
    parent's open; a failing ``on_open`` check closes the descriptor it was given."""
    path = tmp_path / "f.bin"
    path.write_bytes(b"0123456789")
    d = ProcessDescriptor(str(path), lambda fd: os.fstat(fd).st_size)
    fd, size = d.get()
    assert size == 10 and d.fd() == fd and os.pread(fd, 3, 2) == b"234"

    def child(q):
        cfd, _ = d.get()
        d.close()
        q.put(cfd != fd)

    ctx = mp.get_context("fork")
    q = ctx.Queue()
    p = ctx.Process(target=child, args=(q,))
    p.start()
    assert q.get(timeout=60) is True
    p.join(60)
    assert os.pread(d.fd(), 2, 0) == b"01"  # the child's close left ours alone
    d.close()
    with pytest.raises(OSError):
        os.fstat(fd)

    def refuse(fd):
        refuse.fd = fd
        raise ValueError("replaced")

    bad = ProcessDescriptor(str(path), refuse)
    with pytest.raises(ValueError, match="replaced"):
        bad.get()
    with pytest.raises(OSError):
        os.fstat(refuse.fd)
