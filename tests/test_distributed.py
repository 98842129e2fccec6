"""Distributed training for real: a dist_sync job (scheduler, server, 2 workers on
127.0.0.1 through MXNet's DMLC_* environment) running the recipe; exact distributed metrics."""
import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

import mxnet as mx
import numpy as np
import pytest

from gluon_data import DistributedSampler, SegmentationBatchify, SegmentationRecordDataset
from gluon_data import convert
from gluon_data.gluon.distributed import DistributedSegmentationMetric, allreduce_sum
from gluon_data.gluon.launch import dmlc_env, free_port, launch_local
from gluon_data.convert.sample import make_voc
from gluon_data.sampling.sampler import epoch_order

HERE = os.path.dirname(os.path.abspath(__file__))
RECIPE = os.path.join(HERE, "..", "scripts", "train_segmentation.py")
SEED, BATCH, TRAIN, VAL = 5, 2, 11, 5
STRESS = os.environ.get("GLUON_DATA_STRESS") == "1"
ENV = {"OMP_NUM_THREADS": "1", "MXNET_CPU_WORKER_NTHREADS": "1"}
JOB_TIMEOUT = 150


def recipe_module():
    spec = importlib.util.spec_from_file_location("train_segmentation", RECIPE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def voc(tmp_path_factory):
    """11 training and 5 validation samples: with 2 workers x batch 2 both need padding."""
    root = make_voc(str(tmp_path_factory.mktemp("dist") / "VOC"), num_images=TRAIN + VAL,
                    size_range=(20, 40), val_fraction=VAL / (TRAIN + VAL), seed=3)
    out = convert(root, str(tmp_path_factory.mktemp("dist_rec") / "v.rec"), "voc",
                  split="train,val", workers=1).outputs
    return out["train"], out["val"]


def recipe(voc, *args):
    return [sys.executable, RECIPE, "--data", voc[0], "--val-data", voc[1], "--model", "tiny",
            "--base-size", "24", "--crop-size", "16", "--batch-size", str(BATCH),
            "--workers", "0", "--seed", str(SEED), "--log-every", "100", *args]


def run_single(cmd):
    import subprocess
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=JOB_TIMEOUT,
                       env=dict(os.environ, **ENV))
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]


def run_dist(cmd, workers=2):
    results = launch_local(cmd, workers, 1, timeout=JOB_TIMEOUT, env=ENV)
    for r in results:
        assert r.returncode == 0, "worker %d failed:\n%s" % (r.worker, r.output[-4000:])
    return results


def samples(log_dir, rank):
    with open(os.path.join(log_dir, "samples.rank%d.jsonl" % rank)) as f:
        return [json.loads(line) for line in f]


def report(log_dir, rank):
    with open(os.path.join(log_dir, "rank%d.json" % rank)) as f:
        return json.load(f)


def single_process_val(voc, params):
    """(pixAcc, mIoU) of the recipe's tiny model with ``params`` on the whole validation
    set, in this process, with gluoncv's SegmentationMetric and a plain DataLoader."""
    module = recipe_module()
    net = module.build_model("tiny", None, 21, 24, 16)
    net.load_parameters(params)
    transform = mx.gluon.data.vision.transforms.Compose([
        mx.gluon.data.vision.transforms.ToTensor(),
        mx.gluon.data.vision.transforms.Normalize([.485, .456, .406], [.229, .224, .225])])
    valset = SegmentationRecordDataset(voc[1], mode="val", crop_size=16, transform=transform)
    return module.evaluate(net, valset, 4, 0, valset.num_class)


def global_sequence(logs, epoch):
    """Real sample indexes of ``epoch`` in global order: per iteration, rank 0's rows, then
    rank 1's, ... (the documented split of a global step)."""
    rows = [(r["iteration"], rank, pos, r) for rank, log in enumerate(logs)
            for pos, r in enumerate(log) if r["epoch"] == epoch]
    return [r["index"] for *_, r in sorted(rows, key=lambda t: t[:3]) if not r["pad"]]


@pytest.mark.slow
def test_dist_sync_recipe_two_epochs(voc, tmp_path):
    one, two = str(tmp_path / "one"), str(tmp_path / "two")
    run_single(recipe(voc, "--epochs", "2", "--log-dir", one))
    # the workers also load through a DataLoader worker process each (--workers 1)
    results = run_dist(recipe(voc, "--kvstore", "dist_sync", "--epochs", "2", "--log-dir", two,
                              "--checkpoint", os.path.join(two, "ck"), "--save-dir",
                              os.path.join(two, "run")) + ["--workers", "1"])
    # rank 0 prints the bars, the epoch lines (the throughput of both ranks: the 11 real
    # samples of an epoch) and each epoch's validation; rank 1 prints none of it
    out = results[0].output
    for epoch in (0, 1):
        assert re.search(r"Epoch %d/2: 100%%\|[^|]*\| 3/3 \[" % epoch, out), out[-3000:]
        assert re.search(r"Epoch %d: 3 iterations, .* samples/s \(11 samples over 2 ranks"
                         % epoch, out), out[-3000:]
        assert "Epoch %d validation on 5 samples" % epoch in out
    assert "Epoch" not in results[1].output and "saved" not in results[1].output
    assert sorted(os.listdir(os.path.join(two, "run"))) == ["best.json", "best.params",
                                                            "checkpoint.json",
                                                            "checkpoint.params"]
    logs = [samples(two, 0), samples(two, 1)]
    single = samples(one, 0)
    for epoch in (0, 1):
        per_rank = [[r for r in log if r["epoch"] == epoch] for log in logs]
        # equal samples and batches on both ranks; every real sample exactly once
        assert len(per_rank[0]) == len(per_rank[1]) == 6
        assert len({r["iteration"] for r in per_rank[0]}) == 3
        assert sorted(r["index"] for rows in per_rank for r in rows if not r["pad"]) == \
            list(range(TRAIN))
        assert sum(r["pad"] for rows in per_rank for r in rows) == 1
        # one world-size-independent order: both runs follow the epoch's permutation
        order = epoch_order(TRAIN, SEED, epoch).tolist()
        assert global_sequence(logs, epoch) == order
        assert [r["index"] for r in single if r["epoch"] == epoch] == order
    # identical augmentation whatever the world size: every sample of every epoch (pads
    # included) has the same crop, image and mask bits on 1 worker and on 2 ...
    reference = {(r["epoch"], r["index"]): (r["image"], r["mask"]) for r in single}
    assert len(reference) == 2 * TRAIN
    assert all(reference[r["epoch"], r["index"]] == (r["image"], r["mask"])
               for log in logs for r in log)
    # ... and it is random: a sample's two epochs differ
    assert sum(reference[0, i] != reference[1, i] for i in range(TRAIN)) >= TRAIN - 1
    # the distributed validation: the same on both ranks, each of the 5 samples once ...
    reports = [report(two, 0), report(two, 1)]
    assert reports[0]["val"] == reports[1]["val"]
    assert reports[0]["val"]["samples"] == VAL
    # ... and exactly what one process computes for the saved model on the whole set
    assert single_process_val(voc, os.path.join(two, "ck.params")) == \
        (reports[0]["val"]["pixAcc"], reports[0]["val"]["mIoU"])
    with open(os.path.join(two, "ck.json")) as f:
        assert json.load(f)["sampler"] == {"version": 1, "epoch": 1, "consumed": TRAIN,
                                           "length": TRAIN, "seed": SEED, "shuffle": True}


@pytest.mark.slow
def test_resume_across_world_sizes_1_2_1(voc, tmp_path):
    """3 batches on one process, checkpoint; 2 dist_sync workers resume for 1 global batch,
    checkpoint; one process finishes the epoch: every sample exactly once, in the epoch's
    order, and the iteration count continues."""
    a, b, c = (str(tmp_path / n) for n in "abc")
    run_single(recipe(voc, "--iters", "3", "--log-dir", a, "--checkpoint", a + "/ck"))
    with open(a + "/ck.json") as f:
        state = json.load(f)
    assert state["sampler"]["consumed"] == 3 * BATCH and state["iteration"] == 3
    assert state["optimizer_states"] is True
    run_dist(recipe(voc, "--kvstore", "dist_sync", "--iters", "4", "--resume", a + "/ck",
                    "--log-dir", b, "--checkpoint", b + "/ck"))
    with open(b + "/ck.json") as f:
        state = json.load(f)
    # one global step of 2 x 2; the servers' optimizer state is not saved (MXNet cannot)
    assert state["sampler"]["consumed"] == 10 and state["iteration"] == 4
    assert state["optimizer_states"] is False and not os.path.exists(b + "/ck.states")
    run_single(recipe(voc, "--epochs", "1", "--resume", b + "/ck", "--log-dir", c))
    order = epoch_order(TRAIN, SEED, 0).tolist()
    first = [r["index"] for r in samples(a, 0)]
    second = global_sequence([samples(b, 0), samples(b, 1)], 0)
    third = [r["index"] for r in samples(c, 0)]
    assert (first, second, third) == (order[:6], order[6:10], order[10:])
    assert [r["iteration"] for r in samples(c, 0)] == [5]


WORKER = r"""
import mxnet as mx
from gluon_data.gluon.distributed import allreduce_sum
kv = mx.kv.create("dist_sync")
big = 2 ** 40
got = allreduce_sum([big + kv.rank, 1, -3], kv).tolist()
assert got == [2 * big + 1, 2, -6], got
# a Trainer whose optimizer runs on the servers (MXNet's default for dist stores) does not
# change the sums: each rank's vector is stored as a fresh key's initial value
net = mx.gluon.nn.Dense(2, in_units=3)
net.initialize()
trainer = mx.gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.5}, kvstore=kv)
for step in range(2):
    with mx.autograd.record():
        loss = net(mx.nd.ones((2, 3))).sum()
    loss.backward()
    trainer.step(2)
    got = allreduce_sum([7 * (kv.rank + 1), step], kv).tolist()
    assert got == [21, 2 * step], got
print("DONE rank", kv.rank, trainer._update_on_kvstore)
"""


@pytest.mark.slow
def test_allreduce_sum_over_dist_sync(tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    results = launch_local([sys.executable, str(script)], 2, 1, timeout=JOB_TIMEOUT, env=ENV)
    for r in results:
        assert r.returncode == 0, r.output[-4000:]
        assert "DONE rank" in r.output and r.output.rstrip().endswith("True"), r.output


@pytest.mark.slow
def test_launch_local_stops_a_failed_job_quickly():
    """A worker that dies leaves the other waiting at a barrier: the job is stopped at once,
    not left to hang."""
    code = ("import mxnet as mx, os, time; kv = mx.kv.create('dist_sync'); "
            "print('STARTED', flush=True); os._exit(3) if kv.rank == 1 else time.sleep(120)")
    results = launch_local([sys.executable, "-c", code], 2, 1, timeout=60, env=ENV)
    # stopped by the failure, not by the 60 s timeout (that raises TimeoutError): rank 1's
    # exit status and rank 0 killed, no clock (two MXNet workers start slowly under load)
    assert sorted(r.returncode for r in results) == [-9, 3]


@pytest.mark.stress
def test_launch_local_kills_a_job_past_its_timeout():
    """A job past its timeout is killed with a TimeoutError naming what it printed. With
    GLUON_DATA_STRESS=1 the workers are real dist_sync workers ending with sys.exit, which
    waits in MXNet's exit barrier for the others (only the timeout ends such a job); the
    default run's workers just sleep, so the timeout can be short."""
    if STRESS:
        code = ("import mxnet as mx, os, sys, time; kv = mx.kv.create('dist_sync'); "
                "print('STARTED', flush=True); sys.exit(3) if kv.rank == 1 else time.sleep(120)")
        limit = 30  # two workers need over 12 s to start on a loaded 2-core machine
    else:
        code, limit = "import time; print('STARTED', flush=True); time.sleep(120)", 8
    t0 = time.monotonic()
    with pytest.raises(TimeoutError, match="did not finish in %d s" % limit) as info:
        launch_local([sys.executable, "-c", code], 2, 1, timeout=limit, env=ENV)
    assert str(info.value).count("STARTED") == 2
    assert time.monotonic() - t0 < limit + 30  # and every process is gone soon after


def test_metric_state_sums_to_the_single_process_metric(voc):
    """Two ranks' metrics (pads skipped), summed, equal one metric over the whole set:
    the arithmetic the all-reduce performs, checked without a kvstore."""
    from gluoncv.utils.metrics import SegmentationMetric
    valset = SegmentationRecordDataset(voc[1], mode="val", crop_size=16)
    nclass = valset.num_class
    rng = np.random.default_rng(0)
    scores = {i: mx.nd.array(rng.random((nclass, 16, 16))) for i in range(len(valset))}

    def forward(keys):
        return mx.nd.stack(*[scores[int(k)] for k in keys])

    whole = SegmentationMetric(nclass)
    for i in range(len(valset)):
        whole.update(valset[i][1].expand_dims(0), forward([i]))
    states = []
    for rank in range(2):
        sampler = DistributedSampler(len(valset), 2, rank, shuffle=False, batch_size=2)
        metric = DistributedSegmentationMetric(nclass)
        batches = sampler.batch_sampler()
        loader = mx.gluon.data.DataLoader(valset, batch_sampler=batches,
                                          batchify_fn=SegmentationBatchify())
        pads = 0
        for keys, (_, target) in zip(batches, loader):
            pads += sum(k.pad for k in keys)
            metric.update(target, forward(keys), keys)
        assert metric.get() == metric.metric.get()   # no kvstore: this rank only
        states.append(metric.state())
    assert pads == 1
    total = (states[0] + states[1]).astype(np.int64)
    assert total[0] == len(valset)
    assert total[1] == whole.total_correct and total[2] == whole.total_label
    assert total[3:3 + nclass].tolist() == whole.total_inter.tolist()
    assert total[3 + nclass:].tolist() == whole.total_union.tolist()


def test_allreduce_sum_single_process_and_bad_values():
    assert allreduce_sum([3, 4], mx.kv.create("local")).tolist() == [3, 4]
    assert allreduce_sum([5]).tolist() == [5]
    with pytest.raises(ValueError, match="whole numbers"):
        allreduce_sum([0.5])
    with pytest.raises(ValueError, match="whole numbers"):
        allreduce_sum([2 ** 53])
    metric = DistributedSegmentationMetric(3)
    with pytest.raises(ValueError, match="has 1 keys"):
        metric.update(mx.nd.zeros((2, 4, 4)), mx.nd.zeros((2, 3, 4, 4)), keys=[0])


STREAM_WORKER = r"""
import os, sys, time
import mxnet as mx
kv = mx.kv.create("dist_sync")
print("READY rank %d pid %d" % (kv.rank, os.getpid()))   # no flush: the launcher unbuffers
time.sleep(120)
"""


@pytest.mark.slow
def test_launcher_streams_prefixed_output_and_stops_when_a_worker_is_killed(tmp_path):
    """`python -m gluon_data.gluon.launch`: each worker's line reaches the launcher's stdout,
    prefixed with its rank, while the workers still run; a worker killed then ends the whole
    job at once, with a message naming it and a non-zero exit."""
    script = tmp_path / "worker.py"
    script.write_text(STREAM_WORKER)
    p = subprocess.Popen([sys.executable, "-m", "gluon_data.gluon.launch", "-n", "2", "-s", "1",
                          "--timeout", "300", "--", sys.executable, str(script)],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         env=dict(os.environ, **ENV))
    lines = []
    reader = threading.Thread(target=lambda: lines.extend(iter(p.stdout.readline, "")),
                              daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 90
        ready = {}
        while len(ready) < 2:
            assert p.poll() is None and time.monotonic() < deadline, "".join(lines)[-3000:]
            for line in list(lines):
                m = re.match(r"\[worker (\d)\] READY rank (\d) pid (\d+)$", line)
                if m:
                    assert m.group(1) == m.group(2)         # the prefix is the kvstore rank
                    ready[int(m.group(1))] = int(m.group(3))
            time.sleep(0.05)
        assert p.poll() is None                              # streamed, not at the end
        t0 = time.monotonic()
        os.kill(ready[1], signal.SIGKILL)
        assert p.wait(30) == 1
        assert time.monotonic() - t0 < 15
        reader.join(10)
        text = "".join(lines)
        assert "[launch] worker 1 was killed by SIGKILL: stopping the job" in text, text
        assert "[launch] failed: workers exited with [-9, -9]" in text, text
        for pid in ready.values():  # worker 0 was killed with the job
            with pytest.raises(ProcessLookupError):
                os.kill(pid, 0)
    finally:
        if p.poll() is None:
            p.terminate()   # the launcher kills its processes on SIGTERM
            p.wait(30)
        p.stdout.close()


@pytest.mark.slow
def test_hand_launched_job_with_a_killed_worker_ends_on_the_stall_timeout(voc, tmp_path):
    """Launched by hand (DMLC_* environment, no launcher), a killed worker leaves the other
    blocked in the kvstore forever (ps-lite does not abort on a dead node): the recipe's
    --stall-timeout ends it with an error."""
    root = free_port()
    logs = str(tmp_path / "logs")
    base = dict(os.environ, **ENV, PYTHONUNBUFFERED="1")
    procs, outs = [], []

    def start(role, argv):
        outs.append(open(tmp_path / ("node%d.out" % len(outs)), "w+"))
        procs.append(subprocess.Popen(argv, env=dict(base, **dmlc_env(role, 2, 1, root)),
                                      stdout=outs[-1], stderr=subprocess.STDOUT,
                                      start_new_session=True))
    try:
        start("scheduler", [sys.executable, "-c", "import mxnet"])
        start("server", [sys.executable, "-c", "import mxnet"])
        cmd = recipe(voc, "--kvstore", "dist_sync", "--epochs", "100000", "--log-dir", logs,
                     "--stall-timeout", "8")
        start("worker", cmd)
        start("worker", cmd)
        deadline = time.monotonic() + 90
        logged = [os.path.join(logs, "samples.rank%d.jsonl" % r) for r in (0, 1)]
        while not all(os.path.exists(f) and os.path.getsize(f) for f in logged):
            assert all(q.poll() is None for q in procs) and time.monotonic() < deadline
            time.sleep(0.05)
        t0 = time.monotonic()
        procs[3].kill()                 # one worker dies, the other is blocked ...
        assert procs[2].wait(60) == 1   # ... until its watchdog ends it
        assert time.monotonic() - t0 < 40
        outs[2].seek(0)
        out = outs[2].read()
        assert re.search(r"error: worker [01]: no batch finished for \d+ s \(--stall-timeout 8\)",
                         out), out[-3000:]
    finally:
        for q in procs:
            if q.poll() is None:
                os.killpg(q.pid, signal.SIGKILL)
            q.wait(10)
        for f in outs:
            f.close()
