"""The loop every conversion runs: :func:`drive` takes a planned conversion (a source
layout, a legacy LMDB import) through workers that encode each item (:mod:`.encode`), one
ordered writer per split behind the shared writer interface (:mod:`.outputs`), checkpoints
and resume (:mod:`.resume`), a progress bar and the :class:`ConversionReport`.

One writer in the parent appends records in source order, so the output is deterministic
for the same inputs and seed whatever the number of workers. Workers write the framed
records of a ``.rec`` themselves (segments), copy them into the output at the offsets the
parent reserved for them (:class:`_Copies`), and take the output's digests at the end: the
parent only plans, orders and writes the index, so it serves many workers. Nothing appears
under the output's final name unless the whole conversion succeeded.
"""
from __future__ import annotations

import collections
import itertools
import os
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterable, Optional, cast

from ..format import codec
from .chunks import chunk_size, copy_segments, encode_chunk
from .engines import start_encoder_pool, stop_pool
from ..errors import ConversionError, EmptyOutputError
from .done import file_facts
from ..tools.progress import progress_bar
from ..tools.stats import RunningStats
from .options import ConvertOptions
from .outputs import Outputs, fail_conversion, output_lock
from .report import ConversionReport
from .resume import Checkpoint, resume_finished

__all__ = ["drive", "SplitJobs", "start_encoders"]


@dataclass
class SplitJobs:
    """One split of a planned conversion, as :func:`drive` runs it.

    ``count`` items; ``jobs(start)`` yields ``(position, item)`` from position ``start``
    on (what the work function takes); ``key(pos)`` is the record key an item carries (None:
    the next position in the output) and ``name(pos)`` the source name kept in the metadata
    (None: none kept). ``item_bytes``: the mean size of an item's source files, where the
    plan knows it (it sets how many items a worker's task carries: :func:`~.chunks.chunk_size`).

    >>> s = SplitJobs(2, lambda start: enumerate(["a", "b"][start:], start))
    >>> list(s.jobs(1))
    [(1, 'b')]
    """

    count: int
    jobs: Callable[[int], Iterable]
    key: Callable[[int], Optional[int]] = lambda pos: None
    name: Callable[[int], Optional[str]] = lambda pos: None
    item_bytes: Optional[float] = None


def start_encoders(workers: int, preload: Optional[Callable[..., Any]] = None) -> Any:
    """The pool of a conversion of ``workers`` encoders: ``workers`` worker processes, or
    None for one encoder (this process). ``preload``: the work function, loaded by each
    worker as it starts (see :func:`~.engines.worker_init`)."""
    # never forks of this process: a child forked from it inherits OpenCV's thread pool in
    # whatever state this process's threads left it and can deadlock in its first OpenCV
    # call (the workers are forked from a fresh interpreter of their own: .workerprocs)
    return start_encoder_pool(workers, preload) if workers > 1 else None


#: The bytes of an output's ``.rec`` made final before they are handed on to be hashed
#: (:meth:`_Copies.follow`): a message to the pool's starter per that many.
FOLLOW_BYTES = 8 << 20


class _Copies:
    """The segment copies of a conversion, made by its workers, not by the parent, and the
    digest of the ``.rec`` that follows them.

    The parent reserves each chunk's place in the output (``reserve_segment``) and queues
    its copy (:meth:`add`); the next chunk handed to a worker carries the queued copies
    (:meth:`take`), which it makes before encoding. :meth:`settle` sees every queued copy
    made (the rest sent to the workers as tasks of their own) before the output is synced:
    a checkpoint, the end of a split, the digests. The bytes below every place still to be
    filled are final: :meth:`follow` hands them to the pool's starter, which hashes them
    while the workers go on, so the digest at the end (:meth:`facts`) reads only the last
    few megabytes instead of the whole file."""

    def __init__(self, pool, size: int):
        self.pool, self.size = pool, size
        self.queued: list = []
        self.carried: list = []  # (the ticket of a task carrying copies, those copies)
        self.followed: Dict[str, int] = {}  # output -> its bytes handed to be hashed

    def add(self, segment: str, dest: str, runs: list) -> None:
        self.queued.append((segment, dest, runs))

    def take(self) -> list:
        taken, self.queued = self.queued, []
        return taken

    def carry(self, result, copies: list) -> None:
        """Keep ``result``, the ticket of a task carrying ``copies``, until they are made
        (:meth:`_prune`) or :meth:`settle`."""
        self._prune()
        self.carried.append((result, copies))

    def _prune(self) -> None:
        """Drop the carried tasks that are done. A copy that failed is raised here (a full
        disk, say), before any checkpoint or digest counts on its bytes: a checkpoint must
        never cover a place in the output that was reserved and not filled."""
        running = []
        for r, copies in self.carried:
            if r.ready():
                r.get()  # raises the worker's error
            else:
                running.append((r, copies))
        self.carried = running

    def settle(self) -> None:
        """Return once every copy queued so far is made (or raise the worker's error)."""
        jobs = self.take()
        step = max(1, -(-len(jobs) // self.size))
        parts = [jobs[k:k + step] for k in range(0, len(jobs), step)]
        self.carried.extend((self.pool.submit(copy_segments, part), part) for part in parts)
        for r, _ in self.carried:
            r.get()
        self.carried = []

    def follow(self, w) -> None:
        """Hand the final bytes of writer ``w``'s partial ``.rec`` (those below the first
        place reserved whose copy is not known to be made: every other write is made at
        once) to the pool's starter to hash (:meth:`~.workers.EncoderPool.follow_file`), at
        least :data:`FOLLOW_BYTES` at a time. Called between chunks; it asks the workers
        nothing (the copies known made are those :meth:`carry` saw done), so it costs the
        parent no system call but the hand-over."""
        if not hasattr(w, "reserve_segment"):
            return
        dest = w.partial_path
        done = self.followed.get(dest, 0)
        if w.bytes_written - done < FOLLOW_BYTES:
            return
        pending = [copies for _, copies in self.carried]
        final = min((at for _, d, runs in itertools.chain(self.queued, *pending) if d == dest
                     for _, _, at in runs), default=w.bytes_written)
        if final - done >= FOLLOW_BYTES:
            self.pool.follow_file(dest, final)
            self.followed[dest] = final

    def facts(self, w) -> Any:
        """The facts of writer ``w``'s partial ``.rec``, every copy made and written
        (:meth:`settle`): a ticket whose ``get`` gives them, taken by the pool's starter,
        which hashes what :meth:`follow` did not hand it yet."""
        return self.pool.file_facts(w.partial_path, w.bytes_written)


def _results(pool, fn, jobs, workers: int, count: int, segments, copies=None,
             item_bytes: Optional[float] = None):
    """``fn`` over ``jobs`` in order, in chunks ``(segment, results)`` (see
    :func:`~.chunks.encode_chunk`): in this process alone (no segments), or in the pool of
    :func:`start_encoders` (:func:`_in_order`), which writes segments where ``segments``
    (the writer's ``segment_path``) is given. Jobs are taken lazily, so an iterator
    (records read from a legacy LMDB) is read a few chunks ahead only and memory stays
    bounded."""
    if pool is None:
        return ((None, [fn(j)]) for j in jobs)
    return _in_order(pool, workers, fn, iter(jobs), chunk_size(count, workers, item_bytes),
                     segments, copies)


def _in_order(pool, size: int, fn, it, chunk: int, segments, copies=None):
    """Chunks of ``chunk`` jobs handed to the pool's ``size`` workers (two per worker in
    flight), their results yielded in job order. This process only orders and writes: it
    encodes nothing, so it is not the bottleneck of many workers. Every item is ``fn`` of
    the same job wherever it ran: the output is the same."""
    pending: collections.deque = collections.deque()  # tickets, in job order
    more, n = True, 0
    while True:
        while more and len(pending) < 2 * size:
            c = list(itertools.islice(it, chunk))
            more = len(c) == chunk
            if c:
                seg = segments(n) if segments is not None else None
                n += 1
                carried = copies.take() if copies is not None else []
                pending.append(pool.submit(encode_chunk, fn, c, seg, carried))
                if carried:
                    copies.carry(pending[-1], carried)
        if not pending:
            return
        yield pending.popleft().get()


#: Without ``checkpoint_every``, a checkpoint (an fsync of everything written, then the
#: checkpoint's own) is taken once at least CHECKPOINT_MIN_ITEMS items and either
#: CHECKPOINT_SECONDS seconds or CHECKPOINT_BYTES bytes went by since the last one (the
#: clock starts at the first item): an interrupted run loses about that much work, and a
#: fast run does not spend its time in fsync.
CHECKPOINT_MIN_ITEMS = 64
CHECKPOINT_SECONDS = 5.0
CHECKPOINT_BYTES = 256 << 20


class _Cadence:
    """When the next checkpoint is due: every ``every`` items (positions ``every - 1``,
    ``2 * every - 1``...) when given, else as :data:`CHECKPOINT_SECONDS` says."""

    def __init__(self, every: Optional[int]):
        self.every = every
        self.since: Optional[float] = None
        self.items = self.nbytes = 0

    def taken(self) -> None:
        self.since, self.items, self.nbytes = time.monotonic(), 0, 0

    def due(self, pos: int, nbytes: int) -> bool:
        if self.every:
            return (pos + 1) % self.every == 0
        if self.since is None:
            self.since = time.monotonic()
        self.items += 1
        self.nbytes += nbytes
        return self.items >= CHECKPOINT_MIN_ITEMS and (
            self.nbytes >= CHECKPOINT_BYTES
            or time.monotonic() - self.since >= CHECKPOINT_SECONDS)


def _open_writers(outputs: Outputs, output: str, splits, overwrite: bool, state,
                  report: ConversionReport) -> Dict[str, Any]:
    """The writers: new ones, or (``state``: a checkpoint) reopened where it left them."""
    if state is None:
        return outputs.open(output, list(splits), overwrite)
    report.skipped[:] = state["skipped"]
    return outputs.open(output, list(splits), True,
                        positions={s: state["splits"][s]["writer"]
                                   if s in state["splits"] else None for s in splits})


def _write_split(s: str, plan: SplitJobs, w, st: RunningStats, results, *, ckpt,
                 cadence: _Cadence, report: ConversionReport, on_error: str, bar,
                 last: bool, copies: Optional[_Copies] = None) -> None:
    """Write one split's chunks of results in order (:class:`_Appender`), checkpointing as
    ``cadence`` says; the split's end is checkpointed too unless it is the ``last`` (the
    publish that follows records that everything is on disk). ``copies``: the workers copy
    the segments into ``w`` (:class:`_Copies`), settled before each checkpoint."""
    for segment, chunk in results:
        with _Appender(w, segment, copies) as out:
            for pos, payload, info, err in chunk:
                if err is not None:
                    if on_error == "fail":
                        raise ConversionError(err[1], err[0])
                    report.skipped.append({"file": err[0], "reason": err[1]})
                else:
                    out.add(plan.key(pos), pos, payload)
                    st.add(info)
                    name = plan.name(pos)
                    if name is not None:  # gluoncv's mode='test' returns it
                        st.names.append(name)
                if cadence.due(pos, out.size(payload) if err is None else 0) \
                        and pos + 1 < plan.count:
                    out.flush()
                    out.hand_over()
                    if copies is not None:
                        copies.settle()
                    ckpt.save(s, pos + 1, w, st, report.skipped)
                    cadence.taken()
        if copies is not None:
            copies.follow(w)
        bar.update(len(chunk))
    if copies is not None:
        copies.settle()
    if not last:
        ckpt.save(s, plan.count, w, st, report.skipped)
        cadence.taken()
    report.written[s] = w.count


class _Appender:
    """One chunk's records into writer ``w``: payloads written one by one, or, from a
    ``segment`` (:func:`~.chunks.encode_chunk`), runs of framed records appended by the writer in
    one kernel copy each (:meth:`flush`: before a checkpoint, and at the end). With
    ``copies`` and a writer that reserves places (a ``.rec``), the runs are only indexed here
    and the segment is copied by a worker (:class:`_Copies`). A record without its own key
    takes the next position; when items were skipped before it, its header id is rewritten
    to that key (read back from the segment)."""

    def __init__(self, w, segment: Optional[str], copies: Optional[_Copies] = None):
        self.w, self.segment = w, segment
        self.fd = os.open(segment, os.O_RDONLY) if segment is not None else None
        self.offset = 0  # of the first record of the run not appended yet
        self.run: list = []  # (key, framed size) not appended yet
        self.nbytes = 0
        reserves = segment is not None and hasattr(w, "reserve_segment")
        self.copies = copies if reserves else None
        self.runs: list = []  # (offset, nbytes, offset in the output): reserved, not copied

    def size(self, payload) -> int:
        return payload if self.fd is not None else len(payload)

    def add(self, own: Optional[int], pos: int, payload) -> None:
        key = own if own is not None else self.w.count + len(self.run)
        if self.fd is None:
            if own is None and pos != key:  # items were skipped before it:
                payload = codec.with_id(payload, key)  # header id = the key
            self.w.write(key, payload)
        elif own is None and pos != key:
            self.flush()
            record, _ = codec.unframe(os.pread(self.fd, payload, self.offset),
                                      path=self.segment)
            self.w.write(key, codec.with_id(record, key))
            self.offset += payload
        else:
            self.run.append((key, payload))
            self.nbytes += payload

    def flush(self) -> None:
        if self.run:
            if self.copies is not None:
                self.runs.append((self.offset, self.nbytes, self.w.reserve_segment(self.run)))
            else:
                self.w.append_segment(self.fd, self.offset, self.run)
            self.offset += self.nbytes
            self.run, self.nbytes = [], 0

    def hand_over(self) -> None:
        """Before a checkpoint inside the chunk: the runs reserved so far copied here."""
        if self.runs:
            self.w.fill(self.fd, self.runs)
            self.runs = []

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        keep = False
        try:
            if exc_type is None:
                self.flush()
                if self.runs and self.copies is not None:  # a worker copies, then removes it
                    self.copies.add(cast(str, self.segment), self.w.partial_path, self.runs)
                    keep = True
        finally:
            if self.fd is not None:
                os.close(self.fd)
                if not keep:
                    os.remove(cast(str, self.segment))
        return False


def _skipped(report: ConversionReport, shown: int = 3) -> str:
    """The items skipped, as a message names them: how many, the first few and why."""
    first = "; ".join("%s: %s" % (x["file"], x["reason"]) for x in report.skipped[:shown])
    more = len(report.skipped) - shown
    return "%d skipped (%s%s)" % (len(report.skipped), first,
                                  "; and %d more" % more if more > 0 else "")


def _publish(writers: Dict[str, Any], stats: Dict[str, RunningStats], ckpt,
             report: ConversionReport, finish_meta, source: str, verb: str,
             facts: Callable[[str], Optional[dict]] = file_facts) -> None:
    """Check the splits, finish each writer with its metadata (``facts``: what the done
    record takes of each file) and publish them all."""
    if report.total_written == 0:
        raise EmptyOutputError("no item could be %s: %s"
                               % ("imported" if verb == "import" else "converted",
                                  _skipped(report)), source)
    for s, w in writers.items():
        if w.count == 0:
            raise EmptyOutputError("split %r would be empty, every item of it skipped: %s"
                                   % (s, _skipped(report)), source)
        # conversion_id: from the plan's names (equal files give equal ids wherever
        # the source was copied to), its content enters through what was written
        w.finish(finish_meta(s, w, stats[s], getattr(ckpt.digest, "names", ckpt.digest),
                             facts))
        report.bytes_written += w.bytes_written
    ckpt.mark_publishing()
    for w in writers.values():
        w.publish()
    ckpt.remove()


def _facts_by(copies: _Copies, writers: Dict[str, Any]) -> Callable[[str], Optional[dict]]:
    """:func:`~gluon_data.storage.fsutil.file_facts` of every writer's partial ``.rec`` and
    ``.idx``, taken beside this process while it makes the files durable and finishes: the
    ``.rec``'s by the pool's starter, which has hashed most of it already
    (:meth:`_Copies.follow`), the ``.idx``'s by a worker. The digests read the page cache
    while the fsync waits for the device."""
    taken: Dict[str, Any] = {}
    for w in writers.values():
        if hasattr(w, "partial_files"):
            w.flush()  # every byte in place: the files read as they will be published
            taken.update((p, copies.facts(w) if p == w.partial_path
                          else copies.pool.submit(file_facts, p)) for p in w.partial_files)
    for w in writers.values():
        if hasattr(w, "partial_files"):
            w.sync()
    return lambda path: taken[path].get() if path in taken else file_facts(path)


def drive(output: str, outputs: Outputs, splits: Dict[str, SplitJobs], fn, *,
          digest: str, root: str, options: dict, report: ConversionReport,
          finish_meta: Callable[..., dict], source: str,
          run: ConvertOptions, verb: str = "convert", t0: Optional[float] = None,
          pool=None) -> ConversionReport:
    """Run a planned conversion into ``output``: ``fn((pos, item))`` gives ``(pos, payload,
    info, error)`` for each job (in ``workers`` worker processes when more than one), the
    payloads are written in order, a checkpoint is taken every ``checkpoint_every`` items
    (None: by time and bytes, see :data:`CHECKPOINT_SECONDS`), ``finish_meta(split, writer,
    stats, digest)`` gives each split's metadata, then every split is published. ``digest``
    identifies the conversion (a checkpoint of another one is refused); with ``resume``,
    outputs already complete (same ``root`` and ``options``) are recognised. Failure: see
    :func:`~gluon_data.convert.outputs.fail_conversion`. ``pool``: the workers' pool already
    started (while the caller planned), this run's to close or stop. ``run``: the conversion's
    options (``workers``, ``overwrite``, ``on_error``, ``resume``, ``checkpoint_every``,
    ``progress`` are read)."""
    workers, overwrite, on_error = run.workers, run.overwrite, run.on_error
    resume, checkpoint_every, progress = run.resume, run.checkpoint_every, run.progress
    t0 = time.perf_counter() if t0 is None else t0
    writers: Dict[str, Any] = {}
    stats: Dict[str, RunningStats] = {}
    try:  # one writer per output at a time, from the first look at the checkpoint to publish
        lock = output_lock(output, list(splits), outputs.name)
    except BaseException:
        if pool is not None:
            stop_pool(pool)
        raise
    try:
        ckpt = Checkpoint(output, digest, outputs)
        state = ckpt.load() if resume else None
        if not resume:
            ckpt.remove()
        if resume:
            done = resume_finished(state, ckpt, report, root, options)
            if done is not None:
                done.seconds = time.perf_counter() - t0
                return done
        # started before the writers are opened: the workers import while this sets up
        if pool is None:
            pool = start_encoders(workers, fn)
        bar = None
        try:
            # the writers first: an existing output is refused (``exists_refusal``) before a
            # progress bar is drawn
            writers = _open_writers(outputs, output, splits, overwrite, state, report)
            bar = progress_bar(sum(s.count for s in splits.values()), verb, enabled=progress)
            cadence = _Cadence(checkpoint_every)
            copies = _Copies(pool, workers) if pool is not None else None
            for k, (s, plan) in enumerate(splits.items()):
                done = state["splits"].get(s) if state is not None else None
                stats[s] = st = RunningStats.from_state(done["stats"]) if done else RunningStats()
                start = done["done"] if done else 0
                bar.update(start)
                w = writers[s]
                if w.count:  # reopened at the checkpoint: what the interrupted run wrote
                    report.resumed[s] = w.count
                _write_split(s, plan, w, st,
                             _results(pool, fn, plan.jobs(start), workers, plan.count - start,
                                      w.segment_path if w.takes_segments else None, copies,
                                      plan.item_bytes),
                             ckpt=ckpt, cadence=cadence, report=report, on_error=on_error,
                             bar=bar, last=k == len(splits) - 1, copies=copies)
            facts: Callable[[str], Optional[dict]] = file_facts
            if copies is not None:  # all results are in: the digests are taken, workers exit
                facts = _facts_by(copies, writers)
                pool.close()
            _publish(writers, stats, ckpt, report, finish_meta, source, verb, facts)
            if pool is not None:
                pool.join()
                pool = None
        except BaseException as e:
            if pool is not None:  # stop the workers first: they may still read the source
                stop_pool(pool)
                pool = None
            fail_conversion(e, writers, output, ckpt)
        finally:
            if pool is not None:
                stop_pool(pool)
                pool = None
            if bar is not None:
                bar.close()
        report.seconds = time.perf_counter() - t0
        return report
    finally:
        if pool is not None:  # a finished resume, a checkpoint that could not be read
            stop_pool(pool)
        lock.release()
