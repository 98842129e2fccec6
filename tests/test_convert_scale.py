"""How often a conversion checkpoints: by time and bytes unless ``checkpoint_every`` asks for
a count, never right before its own publish, and the output the same either way; what each
item and each run costs beside the work itself (the workers' imports and exit, the listing)."""
import os
import subprocess
import sys
import time

import pytest

from gluon_data import convert
from gluon_data.convert import sources
from gluon_data.errors import ConversionError
from gluon_data.convert import encode, local, loop, resume
from gluon_data.convert.engines import start_encoder_pool, stop_pool
from gluon_data.convert.chunks import CHUNK_ITEMS, chunk_size
from gluon_data.convert.sample import make_imagefolder, make_voc

from conftest import pool_processes

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def voc150(tmp_path_factory):
    return make_voc(str(tmp_path_factory.mktemp("voc150") / "VOC2012"), num_images=150,
                    size_range=(16, 24), seed=3)


def _saves(monkeypatch):
    done = []
    real = resume.Checkpoint.save

    def save(self, split, n, *a):
        done.append(n)
        return real(self, split, n, *a)
    monkeypatch.setattr(resume.Checkpoint, "save", save)
    return done


def test_default_checkpoints_by_time_not_every_64_items(voc150, tmp_path, monkeypatch):
    ref = str(tmp_path / "ref.rec")
    convert(voc150, ref, "voc", split="trainval", checkpoint_every=8)
    done = _saves(monkeypatch)
    monkeypatch.setattr(loop, "CHECKPOINT_SECONDS", 1e9, raising=False)
    out = str(tmp_path / "out.rec")
    convert(voc150, out, "voc", split="trainval")
    assert done == []  # a run faster than the interval spends no time in checkpoints
    assert open(out, "rb").read() == open(ref, "rb").read()
    assert open(out[:-4] + ".idx").read() == open(ref[:-4] + ".idx").read()


def test_due_checkpoints_wait_for_64_items_and_skip_the_last(voc150, tmp_path, monkeypatch):
    done = _saves(monkeypatch)
    monkeypatch.setattr(loop, "CHECKPOINT_SECONDS", 0.0, raising=False)
    rep = convert(voc150, str(tmp_path / "a.rec"), "voc", split="trainval")
    n = rep.written["trainval"]
    assert n > 128
    assert done == [64, 128]  # time is always up here; the publish records the end
    del done[:]
    rep = convert(voc150, str(tmp_path / "b.rec"), "voc", split="train,val", checkpoint_every=20)
    train, val = rep.written["train"], rep.written["val"]
    # explicit: every 20 items; a split's end is checkpointed unless it is the last
    assert done == (list(range(20, train, 20)) + [train] + list(range(20, val, 20)))


def _python_ok(code: str) -> None:
    """Run ``code`` in a fresh interpreter on this checkout; it must exit 0."""
    out = subprocess.run([sys.executable, "-c", code], env=dict(os.environ, PYTHONPATH=ROOT),
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr


def test_a_worker_imports_the_encoder_not_the_writers():
    """A worker unpickles ``encode.encode_job``: that loads the encoder and what it reads with,
    not the loop, the writers, the copy and sharded drivers (their import was most of a
    worker's start-up); every name is still importable from the package."""
    code = ("import sys, gluon_data.convert.encode, gluon_data.convert.engines\n"
            "heavy = sorted(m for m in sys.modules if m.startswith('gluon_data.') and m not in "
            "('gluon_data.convert', 'gluon_data.convert.encode', 'gluon_data.format.codec', "
            "'gluon_data.errors', 'gluon_data.convert.sources', 'gluon_data.convert.engines', "
            "'gluon_data.convert.workers', 'gluon_data.convert.workerprocs', "
            "'gluon_data.convert._moments', "
            "'gluon_data._callable', 'gluon_data._moved', 'gluon_data._version', "
            "'gluon_data.format', 'gluon_data.format.headers', 'gluon_data.convert.source_files', "
            "'gluon_data.storage', 'gluon_data.storage.fileio', 'gluon_data.storage.perprocess', "
            "'gluon_data.storage.fsutil', "
            "'gluon_data.format.masks', 'gluon_data.format._maskrle', 'gluon_data.format.rawarray'))\n"
            "assert not heavy, heavy\n"
            "from gluon_data.convert import convert, convert_sharded, drive, Outputs\n"
            "import gluon_data.convert as c\n"
            "assert c.convert is convert and c.Outputs is Outputs\n"
            "assert c.resume.Checkpoint.__name__ == 'Checkpoint'\n"
            "assert set(c.__all__) <= set(dir(c))\n")
    _python_ok(code)


def test_the_cli_package_imports_without_its_commands():
    """A process spawned by multiprocessing from the ``gluon-data`` script (a local Dask
    cluster's worker) re-imports the script's module, which imports ``gluon_data.cli``: that
    must not load the parser, the
    commands and what they import (the converters, the remote stores); its names still
    resolve, and ``main`` still runs."""
    code = ("import sys, gluon_data.cli as cli\n"
            "heavy = sorted(m for m in sys.modules if m.startswith(('gluon_data.cli.parser', "
            "'gluon_data.cli.commands', 'gluon_data.convert', 'gluon_data.remote')))\n"
            "assert not heavy, heavy\n"
            "from gluon_data.cli import build_parser, storage_option_parser, describe, run_demo\n"
            "assert callable(build_parser) and cli.describe is describe\n"
            "try:\n    cli.main(['--version'])\nexcept SystemExit as e:\n"
            "    assert e.code == 0, e.code\nelse:\n    raise AssertionError('no exit')\n")
    _python_ok(code)


def test_listing_resolves_each_folder_once(voc150, monkeypatch):
    """Every listed file is checked against the root (symlinks included) with one ``lstat``,
    its folder resolved once per listing, not every path component of every file again."""
    calls = []
    real = os.lstat
    monkeypatch.setattr(os, "lstat", lambda p, *a, **k: calls.append(p) or real(p, *a, **k))
    src = sources.open_source(voc150, "voc", split="trainval")
    n = len(src.splits["trainval"])
    assert n == 150 and not src.problems
    assert len(calls) <= 2 * n + 40, len(calls)


class _TornDown:
    def __init__(self, path):
        self.path = path

    def __del__(self, _open=os.open, _close=os.close, _flags=os.O_CREAT | os.O_WRONLY):
        _close(_open(self.path, _flags))  # in the interpreter's teardown, if there is one


def _keep_until_exit(path):
    sys.modules[__name__]._kept = _TornDown(path)  # a module global: freed at teardown
    return os.getpid()


def test_pool_workers_exit_without_the_interpreter_teardown(tmp_path):
    """A pool worker, done with its tasks, exits at once (status 0) instead of tearing down
    numpy, OpenCV and Pillow first, which took longer than converting hundreds of items."""
    pool = start_encoder_pool(1)
    try:
        pid = pool.submit(_keep_until_exit, str(tmp_path / "marker")).get()
        procs = pool.processes
        pool.close()
        pool.join()
    except BaseException:
        stop_pool(pool)
        raise
    assert [p.pid for p in procs] == [pid] and [p.exitcode for p in procs] == [0]
    assert not (tmp_path / "marker").exists()


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="needs Linux's /proc")
def test_workers_start_while_the_source_is_listed_and_stop_if_it_fails(voc150, tmp_path,
                                                                     monkeypatch):
    """The pool's starter is started before the listing (its imports overlap the planning),
    and forks one worker per encoder asked for (this process orders and writes); a listing
    that fails stops it: no process is left behind."""
    seen = []
    real = local.plan_source

    def listing(*a, **k):
        # a starter just started may not show its command line in /proc yet (the kernel
        # resumes its parent before it sets the new program's arguments): look a few times
        for _ in range(100):
            starters = len(pool_processes()[0])
            if starters:
                break
            time.sleep(0.01)
        seen.append(starters)
        return real(*a, **k)
    monkeypatch.setattr(local, "plan_source", listing)
    out = str(tmp_path / "o.rec")
    forked = []
    real_results = loop._results

    def results(pool, *a, **k):
        forked.append(sorted(w.pid for w in pool.processes))
        forked.append(sorted(pool_processes()[1]))
        return real_results(pool, *a, **k)
    monkeypatch.setattr(loop, "_results", results)
    rep = convert(voc150, out, "voc", split="trainval", workers=3)
    assert seen == [1] and rep.written["trainval"] == 150
    assert len(forked[0]) == 3 and forked[0] == forked[1]
    with pytest.raises(ConversionError, match="not a VOC folder"):
        convert(str(tmp_path), str(tmp_path / "p.rec"), "voc", workers=3)
    assert seen == [1, 1] and pool_processes() == ([], [])
    assert not os.path.exists(str(tmp_path / "p.rec"))


def _where(job):
    """``(job, pid)``: where a job ran."""
    return job, os.getpid()


def test_the_parent_only_orders_the_workers_chunks(tmp_path):
    """With a pool, every job runs in a worker, none in the parent (which orders and writes
    only, so it serves many workers); the results come in job order, each chunk as
    ``(segment, results)``."""
    pool = loop.start_encoders(2)
    try:
        assert len(pool.processes) == 2
        chunks = list(loop._results(pool, _where, list(range(40)), 2, 40, None))
        pool.close()
        pool.join()
    except BaseException:
        pool.terminate()
        raise
    out = [r for seg, c in chunks for r in c]
    assert {seg for seg, _ in chunks} == {None}
    assert [j for j, _ in out] == list(range(40))
    assert os.getpid() not in {p for _, p in out}


def test_a_worker_loads_the_preloaded_encoder_as_it_starts():
    """``preload``: the worker imported the work function's module while it started, before
    any task (here a builtin, which loads nothing of ours)."""
    pool = start_encoder_pool(1, preload=encode.encode_job)
    try:
        mods = pool.submit(eval, "sorted(__import__('sys').modules)").get()
        pool.close()
        pool.join()
    except BaseException:
        stop_pool(pool)
        raise
    assert "gluon_data.convert.encode" in mods, mods


def test_a_source_of_small_files_goes_to_the_workers_in_larger_chunks(tmp_path, monkeypatch):
    """Each task costs the parent the same whatever it carries, so small items travel more
    to a task (up to about CHUNK_BYTES of source files); the output is the same bytes as a
    run in one process."""
    src = make_imagefolder(str(tmp_path / "src"), classes=("a", "b", "c"), per_class=100,
                           size_range=(16, 24))
    files = [os.path.join(dp, f) for dp, _, fs in os.walk(src) for f in fs]
    mean = sum(os.path.getsize(f) for f in files) / len(files)
    want = chunk_size(300, 2, mean)
    assert want > CHUNK_ITEMS[0] and chunk_size(300, 2) == CHUNK_ITEMS[0]
    sizes = []
    real_results = loop._results

    def results(*a, **k):
        for seg, chunk in real_results(*a, **k):
            sizes.append(len(chunk))
            yield seg, chunk
    monkeypatch.setattr(loop, "_results", results)
    convert(src, str(tmp_path / "two.rec"), "imagefolder", workers=2)
    assert sizes[0] == want and sum(sizes) == 300 and max(sizes) == want
    convert(src, str(tmp_path / "one.rec"), "imagefolder", workers=1)
    for ext in (".rec", ".idx"):
        assert open(tmp_path / ("two" + ext), "rb").read() == \
            open(tmp_path / ("one" + ext), "rb").read()
