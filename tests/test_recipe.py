"""The training recipe runs a few iterations from a .rec and from an LMDB."""
import os
import re
import subprocess
import sys

import pytest

from gluon_data import convert

RECIPE = os.path.join(os.path.dirname(__file__), "..", "scripts", "train_segmentation.py")


def run(*args):
    p = subprocess.run([sys.executable, RECIPE, "--base-size", "40", "--crop-size", "32",
                        "--batch-size", "4", "--iters", "3", "--log-every", "1", *args],
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    return p.stdout


@pytest.mark.slow
def test_recipe_trains_from_rec_and_validates(voc_root, tmp_path):
    outs = convert(voc_root, str(tmp_path / "v.rec"), "voc", split="train,val").outputs
    out = run("--data", outs["train"], "--val-data", outs["val"])
    iters = re.findall(r"iter +(\d+)  loss ([\d.]+)  pixAcc ([\d.]+)  mIoU ([\d.]+)", out)
    assert [int(i[0]) for i in iters] == [1, 2, 3]
    assert all(0 <= float(i[2]) <= 1 and 0 <= float(i[3]) <= 1 for i in iters)
    assert re.search(r"validation on 4 samples: pixAcc [\d.]+  mIoU [\d.]+", out)


@pytest.mark.slow
def test_recipe_trains_from_lmdb(voc_root, tmp_path):
    out = str(tmp_path / "v.lmdb")
    convert(voc_root, out, "voc", split="train")
    assert "iter    3  loss" in run("--data", out, "--split", "train")
