"""The loop every conversion runs: :func:`drive` takes a planned conversion (a source
layout, a legacy LMDB import) through workers that encode each item (:mod:`.encode`), one
ordered writer per split behind the shared writer interface (:mod:`.outputs`), checkpoints
and resume (:mod:`.resume`), a progress bar and the :class:`ConversionReport`.

One writer in the parent appends records in source order, so the output is deterministic
for the same inputs and seed whatever the number of workers. Nothing appears under the
output's final name unless the whole conversion succeeded.
"""
from __future__ import annotations

import itertools
import time
from dataclasses import dataclass
from typing import Callable, Dict, Iterable, Optional

from .. import codec
from ..engines import _start_pool, _stop_pool
from ..errors import ConversionError
from ..stats import RunningStats
from .outputs import ConversionReport, Outputs, _fail, _output_lock
from .resume import _Checkpoint, _resume_finished

__all__ = ["drive", "SplitJobs"]


@dataclass
class SplitJobs:
    """One split of a planned conversion, as :func:`drive` runs it.

    ``count`` items; ``jobs(start)`` yields ``(position, item)`` from position ``start``
    on (what the work function takes); ``key(pos)`` is the record key an item carries (None:
    the next position in the output) and ``name(pos)`` the source name kept in the metadata
    (None: none kept).

    >>> s = SplitJobs(2, lambda start: enumerate(["a", "b"][start:], start))
    >>> list(s.jobs(1))
    [(1, 'b')]
    """

    count: int
    jobs: Callable[[int], Iterable]
    key: Callable[[int], Optional[int]] = lambda pos: None
    name: Callable[[int], Optional[str]] = lambda pos: None


def _results(pool, fn, jobs, workers: int):
    """``fn`` over ``jobs`` in order: in this process, or in the pool (a list is handed over
    at once; an iterator, e.g. records read from a legacy LMDB, a window at a time, so
    memory stays bounded)."""
    if pool is None:
        return map(fn, jobs)
    if isinstance(jobs, list):
        return pool.imap(fn, jobs, chunksize=4)

    def windows():
        it = iter(jobs)
        while True:
            chunk = list(itertools.islice(it, 64 * workers))
            if not chunk:
                return
            yield from pool.imap(fn, chunk, chunksize=4)
    return windows()


def drive(output: str, outputs: Outputs, splits: Dict[str, SplitJobs], fn, *,
          digest: str, root: str, options: dict, report: ConversionReport,
          finish_meta: Callable[[str, object, RunningStats, str], dict], source: str,
          workers: int = 1, overwrite: bool = False, on_error: str = "fail",
          resume: bool = False, checkpoint_every: int = 64, progress: bool = False,
          verb: str = "convert", t0: Optional[float] = None) -> ConversionReport:
    """Run a planned conversion into ``output``: ``fn((pos, item))`` gives ``(pos, payload,
    info, error)`` for each job (in ``workers`` spawned processes when more than one), the
    payloads are written in order, a checkpoint is taken every ``checkpoint_every`` items,
    ``finish_meta(split, writer, stats, digest)`` gives each split's metadata, then every
    split is published. ``digest`` identifies the conversion (a checkpoint of another one is
    refused); with ``resume``, outputs already complete (same ``root`` and ``options``) are
    recognised. Failure: see :func:`~gluon_data.convert.outputs._fail`."""
    t0 = time.perf_counter() if t0 is None else t0
    writers: Dict[str, object] = {}
    stats: Dict[str, RunningStats] = {}
    pool = None
    total = sum(s.count for s in splits.values())
    # one writer per output at a time, from the first look at the checkpoint to publish
    lock = _output_lock(output, list(splits), outputs.name)
    try:
        ckpt = _Checkpoint(output, digest, outputs)
        state = ckpt.load() if resume else None
        if not resume:
            ckpt.remove()
        if resume:
            done = _resume_finished(state, ckpt, report, root, options)
            if done is not None:
                done.seconds = time.perf_counter() - t0
                return done
        bar = None
        if progress:
            from tqdm import tqdm
            bar = tqdm(total=total, unit="img", desc=verb, dynamic_ncols=True)
        try:
            if state is None:
                writers = outputs.open(output, list(splits), overwrite)
            else:
                report.skipped[:] = state["skipped"]
                writers = outputs.open(output, list(splits), True,
                                       positions={s: state["splits"][s]["writer"]
                                                  if s in state["splits"] else None
                                                  for s in splits})
            if workers > 1:
                # spawn, not fork: a forked child inherits OpenCV's thread pool in whatever state
                # the parent's threads left it and can deadlock in its first OpenCV call.
                pool = _start_pool(workers)
            for s, plan in splits.items():
                w = writers[s]
                done = state["splits"][s] if state is not None and s in state["splits"] else None
                st = RunningStats.from_state(done["stats"]) if done else RunningStats()
                start = done["done"] if done else 0
                stats[s] = st
                if bar is not None:
                    bar.update(start)
                for pos, payload, info, err in _results(pool, fn, plan.jobs(start), workers):
                    if bar is not None:
                        bar.update(1)
                    if err is not None:
                        if on_error == "fail":
                            raise ConversionError(err[1], err[0])
                        report.skipped.append({"file": err[0], "reason": err[1]})
                    else:
                        own = plan.key(pos)
                        key = own if own is not None else w.count
                        if own is None and pos != key:  # items were skipped before it:
                            payload = codec.with_id(payload, key)  # header id = the key
                        w.write(key, payload)
                        st.add(info)
                        name = plan.name(pos)
                        if name is not None:  # gluoncv's mode='test' returns it
                            st.names.append(name)
                    if (pos + 1) % checkpoint_every == 0:
                        ckpt.save(s, pos + 1, w, st, report.skipped)
                ckpt.save(s, plan.count, w, st, report.skipped)
                report.written[s] = w.count
            if report.total_written == 0:
                raise ConversionError("no item could be %s (%d skipped)"
                                      % ("imported" if verb == "import" else "converted",
                                         len(report.skipped)), source)
            for s, w in writers.items():
                if w.count == 0:
                    raise ConversionError("split %r would be empty" % s, source)
                # conversion_id: from the plan's names (equal files give equal ids wherever
                # the source was copied to), its content enters through what was written
                w.finish(finish_meta(s, w, stats[s], getattr(ckpt.digest, "names",
                                                             ckpt.digest)))
                report.bytes_written += w.bytes_written
            ckpt.mark_publishing()
            for w in writers.values():
                w.publish()
            ckpt.remove()
            if pool is not None:  # all results are in: let the workers exit on their own
                pool.close()
                pool.join()
                pool = None
        except BaseException as e:
            if pool is not None:  # stop the workers first: they may still read the source
                _stop_pool(pool)
                pool = None
            _fail(e, writers, output, ckpt)
        finally:
            if pool is not None:
                _stop_pool(pool)
            if bar is not None:
                bar.close()
        report.seconds = time.perf_counter() - t0
        return report
    finally:
        lock.release()
