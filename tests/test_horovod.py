"""Horovod lane (optional): 2 ranks with ``horovodrun --gloo -np 2 -H localhost:2``.

Skipped unless ``horovod.mxnet`` imports and ``horovodrun`` is on PATH. To run it, build
Horovod against the installed MXNet (several minutes of compilation):

    HOROVOD_WITH_MXNET=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 \\
        pip install --no-build-isolation horovod==0.28.1
    python -m pytest tests/test_horovod.py -q
"""
import json
import os
import shutil
import subprocess
import sys

import pytest

pytest.importorskip("horovod.mxnet", reason="Horovod with MXNet support is not installed")
if shutil.which("horovodrun") is None:
    pytest.skip("horovodrun is not on PATH", allow_module_level=True)

from test_distributed import (ENV, SEED, TRAIN, VAL, global_sequence, recipe,  # noqa: E402
                              report, samples, single_process_val,
                              voc)  # noqa: F401  (voc is a fixture)
from gluon_data.sampling.sampler import epoch_order  # noqa: E402

TIMEOUT = 300


def horovodrun(*command):
    p = subprocess.run(["horovodrun", "--gloo", "-np", "2", "-H", "localhost:2", *command],
                       capture_output=True, text=True, timeout=TIMEOUT,
                       env=dict(os.environ, **ENV))
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    return p.stdout


UNEVEN = r"""
import json, sys
import mxnet as mx
import horovod.mxnet as hvd
from gluon_data import DistributedSampler
hvd.init()
data = mx.gluon.data.ArrayDataset(mx.nd.arange(11).reshape((11, 1)), mx.nd.arange(11))
sampler = DistributedSampler.from_horovod(11, batch_size=1, seed=0, keys=False)
loader = mx.gluon.data.DataLoader(data, batch_size=1, sampler=sampler)
net = mx.gluon.nn.Dense(1, in_units=1)
net.initialize()
params = net.collect_params()
hvd.broadcast_parameters(params, root_rank=0)
trainer = hvd.DistributedTrainer(params, "sgd", {"learning_rate": 0.01})
seen = []
for x, y in loader:                    # one allreduce per batch: 6 on each rank
    with mx.autograd.record():
        loss = ((net(x) - y) ** 2).sum()
    loss.backward()
    trainer.step(1)
    seen.append(int(y.asscalar()))
with open(sys.argv[1] + ".%d" % hvd.rank(), "w") as f:
    json.dump(seen, f)
"""


@pytest.mark.slow
def test_uneven_shards_do_not_kill_horovod(tmp_path):
    """11 samples on 2 ranks with batch 1: Gluon's .shard() gives 6 and 5 batches and the
    job dies when one rank finishes; equal padded shards run to the end."""
    script = tmp_path / "uneven.py"
    script.write_text(UNEVEN)
    out = str(tmp_path / "seen")
    horovodrun(sys.executable, str(script), out)
    seen = [json.load(open(out + ".%d" % r)) for r in range(2)]
    assert len(seen[0]) == len(seen[1]) == 6
    assert set(seen[0]) | set(seen[1]) == set(range(11))


@pytest.mark.slow
def test_horovod_recipe_exact_validation(voc, tmp_path):
    log = str(tmp_path / "hvd")
    horovodrun(*recipe(voc, "--horovod", "--epochs", "2", "--log-dir", log,
                       "--checkpoint", os.path.join(log, "ck")))
    logs = [samples(log, 0), samples(log, 1)]
    for epoch in (0, 1):
        assert global_sequence(logs, epoch) == epoch_order(TRAIN, SEED, epoch).tolist()
        assert len([r for r in logs[0] if r["epoch"] == epoch]) == \
            len([r for r in logs[1] if r["epoch"] == epoch])
    reports = [report(log, 0), report(log, 1)]
    assert reports[0]["val"] == reports[1]["val"] and reports[0]["val"]["samples"] == VAL
    assert single_process_val(voc, os.path.join(log, "ck.params")) == \
        (reports[0]["val"]["pixAcc"], reports[0]["val"]["mIoU"])
