"""The gluon-data command, run as a user runs it (a real subprocess)."""
import json
import os
import subprocess
import sys

import pytest


def cli(*args, check=True):
    p = subprocess.run([sys.executable, "-m", "gluon_data", *args], capture_output=True,
                       text=True, timeout=300)
    if check and p.returncode != 0:
        raise AssertionError("exit %d\n%s\n%s" % (p.returncode, p.stdout, p.stderr))
    return p


def test_convert_then_info(tmp_path, voc_root):
    out = str(tmp_path / "voc.rec")
    p = cli("convert", voc_root, out, "--layout", "voc", "--split", "train", "--workers", "2",
            "--quiet")
    assert "wrote 12 records to %s" % out in p.stdout
    info = json.loads(cli("info", out, "--json").stdout)
    assert info["task"] == "segmentation" and info["records"] == 12
    assert info["classes"][:2] == ["background", "airplane"] and info["format"] == "gluon_data v1"
    text = cli("info", out).stdout
    assert "records:" in text and "image_size:" in text


def test_info_on_stock_im2rec_file(im2rec_rec):
    info = json.loads(cli("info", im2rec_rec, "--json").stdout)
    assert info["records"] == 12 and "stock" in info["format"]


def test_errors_exit_non_zero_with_a_message_naming_the_file(tmp_path, voc_root):
    out = str(tmp_path / "voc.rec")
    cli("convert", voc_root, out, "--layout", "voc", "--quiet")
    p = cli("convert", voc_root, out, "--layout", "voc", "--quiet", check=False)
    assert p.returncode == 1 and "already exists" in p.stderr and out in p.stderr
    p = cli("info", str(tmp_path / "missing.rec"), check=False)
    assert p.returncode == 1 and "missing.rec" in p.stderr
    p = cli("convert", voc_root, out, "--layout", "nope", check=False)
    assert p.returncode == 2 and "invalid choice" in p.stderr


def test_help_shows_defaults():
    p = cli("convert", "--help")
    assert "--on-error" in p.stdout and "(default: fail)" in p.stdout


@pytest.mark.slow
def test_demo_runs_end_to_end(tmp_path):
    p = cli("demo", "--workdir", str(tmp_path), "--num-images", "24", "--epochs", "2")
    assert "OK: 18 records read 2 times through DataLoader(num_workers=2)" in p.stdout
    assert os.path.exists(tmp_path / "voc_train.rec")
