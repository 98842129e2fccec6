"""The gluon-data command, run as a user runs it (a real subprocess)."""
import importlib.util
import json
import os
import subprocess
import sys

import pytest

HAS_MXNET = importlib.util.find_spec("mxnet") is not None


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
    """With MXNet the demo reads through Gluon's DataLoader; without it, as numpy arrays
    (gluon_data.arrays) in the converter's pool of as many worker processes."""
    p = cli("demo", "--workdir", str(tmp_path), "--num-images", "24", "--epochs", "2")
    how = ("DataLoader(num_workers=2)" if HAS_MXNET else
           "gluon_data.arrays in 2 worker processes")
    assert "OK: 18 records read 2 times through %s" % how in p.stdout, p.stdout
    assert os.path.exists(tmp_path / "voc_train.rec")


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_storage_option_is_one_parent_parser_shared_by_the_commands_and_the_recipe():
    """Every command that reads or writes a URI, and the training recipe, take
    --storage-option from one declaration, the public parent parser."""
    import argparse

    from gluon_data.cli import build_parser, storage_option_parser
    from gluon_data.storage.remotefs import parse_storage_options
    a = argparse.ArgumentParser(parents=[storage_option_parser()]).parse_args(
        ["--storage-option", "anon=true", "--storage-option", "endpoint_url=http://h:1"])
    assert parse_storage_options(a.storage_option) == {"anon": True,
                                                       "endpoint_url": "http://h:1"}
    subs = next(x for x in build_parser()._actions
                if isinstance(x, argparse._SubParsersAction)).choices
    want = storage_option_parser()._option_string_actions["--storage-option"]
    for name in ("convert", "info", "stats", "show", "verify"):
        got = subs[name]._option_string_actions["--storage-option"]
        assert (got.help, got.metavar, type(got)) == (want.help, want.metavar, type(want)), name
    for rel in ("gluon_data/cli/parser.py", "scripts/train_segmentation.py"):
        with open(os.path.join(ROOT, rel), encoding="utf-8") as f:
            assert f.read().count('"--storage-option", action=') == (rel.endswith("parser.py")), rel
