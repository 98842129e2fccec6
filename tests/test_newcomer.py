"""What a newcomer runs into first: ``--classes`` on an image folder, the CLI's parsers, the
input kinds every command recognises alike."""
import json
import os
import subprocess
import sys

import pytest

from gluon_data import convert
from gluon_data.errors import SourceError
from gluon_data.format import codec
from gluon_data.stores.recordio import RecordFile


def _labels(rec):
    f = RecordFile(rec)
    return [codec.unpack(f.read(i)).label for i in range(len(f))]


def _cli(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "gluon_data.cli", *args], capture_output=True,
                          text=True, cwd=cwd, timeout=120)


def test_classes_are_matched_to_folders_by_name(folder_root, tmp_path):
    out = str(tmp_path / "named.rec")
    convert(folder_root, out, "imagefolder", classes=["dog", "fish", "cat"])
    # the folders are cat/, dog/, fish/ (4 images each, read in that order): cat is named 3rd
    assert _labels(out) == [2.0] * 4 + [0.0] * 4 + [1.0] * 4
    meta = json.load(open(out[:-4] + ".meta.json"))
    assert meta["classes"] == ["dog", "fish", "cat"]


@pytest.mark.parametrize("names, said", [
    (["dog", "fish"], "cat/ not named"),
    (["dog", "fish", "cow"], "no folder is named cow"),
    (["dog", "fish", "cat", "cow"], "no folder is named cow"),
    (["dog", "dog", "fish", "cat"], "dog more than once"),
])
def test_classes_that_do_not_name_exactly_the_folders_are_refused(folder_root, tmp_path,
                                                                   names, said):
    out = tmp_path / "bad.rec"
    with pytest.raises(SourceError, match=said) as e:
        convert(folder_root, str(out), "imagefolder", classes=names)
    assert e.value.path == folder_root and "cat, dog, fish" in str(e.value)
    assert not out.exists()


def test_classes_on_the_command_line_name_the_folders(folder_root, tmp_path):
    r = _cli("convert", folder_root, str(tmp_path / "x.rec"), "--layout", "imagefolder",
             "--classes", "dog,fish", "--quiet")
    assert r.returncode != 0 and "cat/ not named" in r.stderr, r.stderr
