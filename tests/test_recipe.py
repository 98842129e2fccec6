"""The training recipe as a user runs it: the epoch lines, progress bar and validation of each
epoch, the checkpoint and best-mIoU files, a .rec, an LMDB and a bucket as the source, the
sample log of a killed run, and --help."""
import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import time

import mxnet as mx
import pytest

from gluon_data import SegmentationRecordDataset
from gluon_data import convert

RECIPE = os.path.join(os.path.dirname(__file__), "..", "scripts", "train_segmentation.py")
ENV = {"OMP_NUM_THREADS": "1", "MXNET_CPU_WORKER_NTHREADS": "1"}
SMALL = ["--base-size", "40", "--crop-size", "32", "--batch-size", "4", "--workers", "0"]


def run(*args, env=None):
    p = subprocess.run([sys.executable, RECIPE, *SMALL, *args], capture_output=True, text=True,
                       timeout=600, env=dict(os.environ, **ENV, **(env or {})))
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    return p.stdout


@pytest.fixture(scope="module")
def voc_recs(voc_root, tmp_path_factory):
    return convert(voc_root, str(tmp_path_factory.mktemp("recipe") / "v.rec"), "voc",
                   split="train,val").outputs


def recipe_module():
    spec = importlib.util.spec_from_file_location("train_segmentation", RECIPE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_recipe_epochs_bar_validation_and_best(voc_recs, tmp_path):
    save = tmp_path / "run"
    out = run("--data", voc_recs["train"], "--val-data", voc_recs["val"], "--model", "tiny",
              "--epochs", "2", "--save-dir", str(save))
    # 12 training samples, batch 4: a bar per epoch that reaches 3/3 with an elapsed<ETA
    for epoch in (0, 1):
        assert re.search(r"Epoch %d/2: 100%%\|[^|]*\| 3/3 \[\d\d:\d\d<\d\d:\d\d" % epoch, out)
        assert re.search(r"Epoch %d: 3 iterations, loss [\d.]+, pixAcc [\d.]+, mIoU [\d.]+, "
                         r"[\d.]+ samples/s \(12 samples over 1 ranks in [\d.]+ s\)" % epoch, out)
    vals = [float(m) for m in re.findall(r"Epoch \d validation on 4 samples: pixAcc [\d.]+  "
                                         r"mIoU ([\d.]+)", out)]
    assert len(vals) == 2                                   # validated after every epoch
    assert out.count("saved %s" % (save / "checkpoint.params")) == 2
    assert sorted(os.listdir(save)) == ["best.json", "best.params", "checkpoint.json",
                                        "checkpoint.params", "checkpoint.states"]
    with open(save / "best.json") as f:
        best = json.load(f)
    assert round(best["mIoU"], 4) == max(vals) and best["epoch"] == vals.index(max(vals))
    with open(save / "checkpoint.json") as f:
        assert json.load(f)["iteration"] == 6
    # best.params is the model that scored that mIoU
    module = recipe_module()
    net = module.build_model("tiny", None, 21, 40, 32)
    net.load_parameters(str(save / "best.params"))
    t = mx.gluon.data.vision.transforms
    valset = SegmentationRecordDataset(voc_recs["val"], mode="val", crop_size=32,
                                       transform=t.Compose([t.ToTensor(), t.Normalize(
                                           [.485, .456, .406], [.229, .224, .225])]))
    assert module.evaluate(net, valset, 4, 0, 21) == (best["pixAcc"], best["mIoU"])


def test_recipe_val_interval_and_iters(voc_recs):
    out = run("--data", voc_recs["train"], "--val-data", voc_recs["val"], "--model", "tiny",
              "--epochs", "3", "--val-interval", "2")
    assert re.findall(r"Epoch (\d) validation on", out) == ["1", "2"]  # every 2nd + the last
    out = run("--data", voc_recs["train"], "--model", "tiny", "--iters", "4", "--log-every", "2")
    assert re.findall(r"iter +(\d+)  loss", out) == ["2", "4"]
    assert re.search(r"Epoch 1: 1 iterations", out)      # 3 in epoch 0, the 4th in epoch 1


@pytest.mark.slow
def test_recipe_fcn_from_lmdb(voc_root, tmp_path):
    out = str(tmp_path / "v.lmdb")
    convert(voc_root, out, "voc", split="train")
    assert re.search(r"Epoch 0: 2 iterations, loss [\d.]+",
                     run("--data", out, "--split", "train", "--iters", "2"))


def _endless_recipe(data, log, args):
    """The recipe training ``data`` for ever (``args``: its size flags), logging each sample
    to ``log``, in a session of its own (killed as a group if a test fails)."""
    return subprocess.Popen([sys.executable, RECIPE, *args, "--data", data, "--model", "tiny",
                             "--epochs", "100000", "--log-dir", str(log.parent)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            env=dict(os.environ, **ENV), start_new_session=True)


def _wait_for_rows(p, log, rows: int, seconds: float = 120) -> None:
    """Until ``log`` holds ``rows`` whole lines (the recipe alive all the while)."""
    deadline = time.monotonic() + seconds
    while not (log.exists() and log.read_bytes().count(b"\n") >= rows):
        assert p.poll() is None, p.stderr.read().decode()[-3000:]
        assert time.monotonic() < deadline, "no %d samples logged in %d s" % (rows, seconds)
        time.sleep(0.02)


def test_sample_log_is_complete_after_kill_9(voc_recs, tmp_path):
    """Every batch reaches the log as it is trained: a run killed mid-way leaves whole lines,
    whole batches, iterations 1..n."""
    log = tmp_path / "log" / "samples.rank0.jsonl"
    p = _endless_recipe(voc_recs["train"], log, SMALL)
    try:
        _wait_for_rows(p, log, 12)
        p.send_signal(signal.SIGKILL)
        p.wait(30)
    finally:
        p.kill()
        p.wait(30)
        p.stderr.close()
    rows = [json.loads(line) for line in log.read_text().split("\n")[:-1]]
    assert log.read_text().endswith("\n")
    its = [r["iteration"] for r in rows]
    assert sorted(set(its)) == list(range(1, its[-1] + 1))
    # 12 samples, batch 4: every iteration has its 4 rows, every epoch its 12 samples
    assert all(its.count(i) == 4 for i in set(its))
    for epoch in {r["epoch"] for r in rows}:
        assert len({r["index"] for r in rows if r["epoch"] == epoch}) in (4, 8, 12)


def test_a_killed_loader_worker_ends_the_recipe_instead_of_hanging_it(voc_recs, tmp_path):
    """The recipe reads through gluon_data's DataLoader: its worker process killed (as by the
    out-of-memory killer) ends the run with WorkerDiedError within seconds; Gluon's own
    loader waited for it forever."""
    log = tmp_path / "log" / "samples.rank0.jsonl"
    args = [a if a != "0" or SMALL[i - 1] != "--workers" else "1" for i, a in enumerate(SMALL)]
    p = _endless_recipe(voc_recs["train"], log, args)
    try:
        _wait_for_rows(p, log, 8)
        # its workers killed, again each 0.5 s (one may have read its epoch's last batch
        # already); hung, it would run its 100000 epochs and outlast the 120 s (a ceiling
        # far above the 1-2 s it takes: two runs side by side once took 30 s and over 60 s
        # together, right after a CI run, and never again in 52 runs)
        deadline, killed = time.monotonic() + 120, 0
        while p.poll() is None and time.monotonic() < deadline:
            for pid in subprocess.run(["pgrep", "-P", str(p.pid)], capture_output=True,
                                      text=True).stdout.split():
                try:
                    os.kill(int(pid), signal.SIGKILL)
                    killed += 1
                except ProcessLookupError:
                    pass
            time.sleep(0.5)
        code = p.wait(1)
        err = p.stderr.read().decode()
        assert killed, "the loader started no worker process"
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(30)
        p.stderr.close()
    assert code != 0 and "WorkerDiedError" in err, err[-3000:]


def test_help_shows_defaults_and_the_launcher():
    p = subprocess.run([sys.executable, RECIPE, "--help"], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stderr
    text = " ".join(p.stdout.split())
    assert "--crop-size CROP_SIZE training and validation crop (default: 480)" in text
    assert "--val-interval VAL_INTERVAL validate every N epochs (and after the last one) " \
           "(default: 1)" in text
    assert "python -m gluon_data.gluon.launch" in text and "tools/launch.py" not in text
    p = subprocess.run([sys.executable, RECIPE, "--data", "x.rec", "--storage-option", "anon"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "--storage-option expects KEY=VALUE, got 'anon'" in p.stderr


@pytest.mark.slow
def test_recipe_trains_from_a_bucket_with_storage_options(voc_root, tmp_path):
    """--storage-option, --cache-dir and --cache-limit reach the remote store, as in the CLI
    (the endpoint comes only from the option)."""
    pytest.importorskip("moto.server")
    import test_remote  # its moto S3 server on 127.0.0.1
    from gluon_data.convert.to_uri import convert_to_uri
    with test_remote.moto_s3("recipe") as server:
        options = test_remote._options(server)
        uri = "s3://recipe/v.rec"
        convert_to_uri(voc_root, uri, layout="voc", split="train", storage_options=options,
                       cache_dir=str(tmp_path / "stage"))
        cache = tmp_path / "cache"
        out = run("--data", uri, "--model", "tiny", "--iters", "2",
                  "--storage-option", "endpoint_url=%s" % server.url,
                  "--storage-option", 'config_kwargs={"connect_timeout": 2}',
                  "--cache-dir", str(cache), "--cache-limit", "1GB")
        assert "Epoch 0: 2 iterations" in out
        assert server.served("/v.rec") > 0 and os.listdir(cache / "objects")


def test_the_recipe_bar_is_the_one_progress_bar_and_survives_a_0x0_terminal(monkeypatch):
    """The recipe's bar (rank 0) comes from ``progress_bar``: on a terminal that reports 0
    columns it keeps a fixed width instead of vanishing; other ranks draw none."""
    import types
    from gluon_data.tools import progress
    recipe = recipe_module()
    monkeypatch.setattr(progress.os, "get_terminal_size", lambda fd=None: os.terminal_size((0, 0)))
    bar = recipe._bar(types.SimpleNamespace(rank=0), 5, "Epoch 1")
    try:
        assert bar.ncols == progress.FALLBACK_COLUMNS
    finally:
        bar.close()
    quiet = recipe._bar(types.SimpleNamespace(rank=1), 5, "Epoch 1")
    quiet.update(1)
    quiet.close()
    assert not hasattr(quiet, "ncols")
