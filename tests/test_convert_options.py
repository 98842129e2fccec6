"""One conversion entry, one options object: ``gluon_data.convert`` decides which conversion
runs, the API and the CLI pass the same ``ConvertOptions``, nothing is silently ignored."""
import hashlib
import inspect
import os
import subprocess
import sys
import warnings

import pytest

import gluon_data
from gluon_data.convert import ConvertOptions
from gluon_data.convert.copy import import_lmdb
from gluon_data.convert.sample import make_imagefolder
from gluon_data.convert.sharded import convert_sharded
from gluon_data.convert.to_uri import convert_to_uri
from gluon_data.stores.shards import manifest_path, prefix_of


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return make_imagefolder(str(tmp_path_factory.mktemp("opts") / "data"), per_class=3)


def _digest(path):
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def test_an_options_object_and_keywords_give_the_same_bytes(folder, tmp_path):
    a, b = str(tmp_path / "a.rec"), str(tmp_path / "b.rec")
    gluon_data.convert(folder, a, "imagefolder", ConvertOptions(shuffle=True, seed=4))
    gluon_data.convert(folder, b, "imagefolder", shuffle=True, seed=4)
    assert _digest(a) == _digest(b)
    c = str(tmp_path / "c.rec")  # keywords win over the object
    gluon_data.convert(folder, c, "imagefolder", ConvertOptions(shuffle=True, seed=9), seed=4)
    assert _digest(c) == _digest(a)


def test_the_one_entry_writes_shards_when_asked(folder, tmp_path):
    out = str(tmp_path / "s.rec")
    report = gluon_data.convert(folder, out, "imagefolder", shards=2)
    assert report.outputs == {"train": manifest_path(prefix_of(out))}
    assert len(report.shards) == 2


def test_classes_and_splits_as_strings_or_lists_read_as_the_flags_do(folder, tmp_path):
    """``classes="cat,dog,fish"`` is three names, as ``--classes cat,dog,fish`` (it was split
    into its characters, and the dataset took them as 14 classes); ``split`` takes a list;
    other types are a TypeError saying what is taken, and ``workers="2"`` that it must be a
    number."""
    a, b = str(tmp_path / "a.rec"), str(tmp_path / "b.rec")
    gluon_data.convert(folder, a, "imagefolder", classes="cat,dog,fish")
    gluon_data.convert(folder, b, "imagefolder", classes=["cat", "dog", "fish"])
    assert _digest(a) == _digest(b)
    from gluon_data.arrays import ClassificationDataset
    assert ClassificationDataset(a).meta["classes"] == ["cat", "dog", "fish"]
    assert ConvertOptions(split=["train", "val"]).split == "train,val"
    for bad in (dict(classes=3), dict(classes=["cat", 1]), dict(split=5)):
        with pytest.raises(TypeError, match="must be"):
            ConvertOptions(**bad)
    with pytest.raises(ValueError, match=r"workers \(--workers\) must be a number"):
        gluon_data.convert(folder, str(tmp_path / "c.rec"), "imagefolder", workers="2")


@pytest.mark.parametrize("value, why", [
    ("a,b,a,c", "names a more than once"), (["a", "a"], "names a more than once"),
    ("a,,b", "holds an empty name"), (["a", " "], "names an empty class"),
    ("cls.txt", "cls.txt: no such file"), (os.path.join("lists", "names"), "no such file")])
def test_class_names_that_would_shift_or_merge_ids_are_refused(value, why):
    """A class's id is its position in ``--classes``: a name given twice, an empty one, or
    a file name that does not exist (it was taken as one class named "cls.txt") is refused;
    a byte-order mark in a classes file is not part of the first name."""
    with pytest.raises(ValueError, match=why):
        ConvertOptions(classes=value)


def test_a_seed_without_shuffle_is_refused_not_ignored(folder, tmp_path):
    with pytest.raises(ValueError, match=r"--seed 7 without --shuffle: the seed only orders a "
                                         r"shuffle"):
        gluon_data.convert(folder, str(tmp_path / "x.rec"), "imagefolder", seed=7)
    assert not (tmp_path / "x.rec").exists()


def test_a_classes_file_with_a_byte_order_mark(tmp_path):
    names = tmp_path / "names.txt"
    names.write_bytes("\ufeffsky\nroad\n\ncar\n".encode("utf-8"))
    assert ConvertOptions(classes=str(names)).classes == ["sky", "road", "car"]
    assert ConvertOptions(classes="sky,road,").classes == ["sky", "road"]


def test_the_cli_and_the_api_build_the_same_options(folder, tmp_path):
    """``gluon-data convert`` runs the one entry with the options of its flags: the same
    bytes as the API called with the same options."""
    api, cli = str(tmp_path / "api.rec"), str(tmp_path / "cli.rec")
    gluon_data.convert(folder, api, "imagefolder", ConvertOptions(val_ratio=0.25, seed=2,
                                                                   shuffle=True))
    out = subprocess.run([sys.executable, "-m", "gluon_data", "convert", folder, cli,
                          "--layout", "imagefolder", "--val-ratio", "0.25", "--seed", "2",
                          "--shuffle", "--quiet"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    for split in ("train", "val"):
        assert _digest(api[:-4] + "_%s.rec" % split) == _digest(cli[:-4] + "_%s.rec" % split)


def test_an_unknown_option_names_the_valid_ones(folder, tmp_path):
    with pytest.raises(TypeError, match="unknown conversion option.*shard_count.*valid:.*shards"):
        gluon_data.convert(folder, str(tmp_path / "x.rec"), "imagefolder", shard_count=2)


def test_retries_is_ambiguous_and_says_which_to_use(folder, tmp_path):
    with pytest.raises(TypeError, match="task_retries.*remote_retries"):
        gluon_data.convert(folder, str(tmp_path / "x.rec"), "imagefolder", retries=2)


@pytest.mark.parametrize("option, who", [
    (dict(engine="dask"), r"a sharded conversion \(--shards"),
    (dict(scheduler="tcp://127.0.0.1:1"), r"a sharded conversion \(--shards"),
    (dict(storage_options={"anon": True}), r"an output at a URI"),
    (dict(image_shape=(8, 8, 3)), r"the raw-lmdb and caffe-lmdb imports")])
def test_an_option_the_conversion_does_not_read_is_refused(folder, tmp_path, option, who):
    """Never silently ignored: a shard option without shards, an object-storage option for a
    local output, a legacy-import option for a source layout; the refusal says what reads
    it."""
    out = str(tmp_path / "x.rec")
    with pytest.raises(ValueError, match=r"takes no %s .*; read only by %s"
                       % (next(iter(option)), who)):
        gluon_data.convert(folder, out, "imagefolder", **option)
    assert not (tmp_path / "x.rec").exists()


def test_the_old_retries_keyword_still_works_with_a_warning(folder, tmp_path):
    out = str(tmp_path / "r.rec")
    with pytest.warns(DeprecationWarning, match="task_retries"):
        convert_sharded(folder, out, "imagefolder", shards=2, retries=1)
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        convert_sharded(folder, out, "imagefolder", ConvertOptions(shards=2, task_retries=1,
                                                                   overwrite=True))


@pytest.mark.parametrize("fn", [gluon_data.convert, convert_sharded, convert_to_uri,
                                import_lmdb])
def test_the_conversion_functions_take_few_parameters(fn):
    """Options travel as one object: no conversion function takes more than 14 parameters
    (its keywords are the object's fields)."""
    params = [p for p in inspect.signature(fn).parameters.values()
              if p.kind is not p.VAR_KEYWORD]
    assert len(params) <= 14, fn


def _convert_parser():
    from gluon_data.cli.parser import build_parser
    parser = build_parser()
    return next(a for a in parser._actions if a.dest == "command").choices["convert"]


#: ``gluon-data convert``'s option flags as users spell them, with the command's defaults
#: (None: absent, False: a switch; --quiet stores progress=True until given): generating them
#: from ConvertOptions changes none.
FLAGS = {
    "--split": None, "--val-ratio": 0.0, "--shuffle": False, "--seed": 0, "--classes": None,
    "--num-classes": None, "--ignore-label": 255, "--images-dir": "images",
    "--masks-dir": "masks", "--root": None, "--follow-symlinks": False,
    "--max-file-bytes": 256 << 20, "--max-pixels": 128 << 20, "--on-error": "fail",
    "--image-shape": None, "--mask-shape": None, "--channels-first": False, "--bgr": False,
    "--format": None, "--encoding": "passthrough", "--quality": 95, "--resize": 0,
    "--mask-encoding": "rle", "--overwrite": False, "--workers": max(1, os.cpu_count() or 1),
    "--resume": False, "--quiet": True, "--shards": None, "--shard-size": None,
    "--shard-items": None, "--engine": "local", "--scheduler": None, "--scheduler-wait": 300.0,
    "--forward-credentials": False,
}
#: the flags that are not options: the command's own
COMMAND_FLAGS = {"-h", "--help", "--storage-option", "--layout"}


def test_the_convert_flags_keep_their_spelling_and_defaults():
    sub = _convert_parser()
    found = {}
    for action in sub._actions:
        for flag in action.option_strings:
            if flag not in COMMAND_FLAGS:
                found[flag] = action.default
    assert found == FLAGS


def test_each_flag_is_made_from_its_field():
    """Each option flag stores under its field's name and shows the field's one help text
    (``--quiet`` says what it does to ``progress``); every field without a flag is one the
    command fills itself."""
    from gluon_data.convert.options import cli_fields, flag_name
    sub = _convert_parser()
    by_dest = {a.dest: a for a in sub._actions}
    for field, flag in cli_fields():
        action = by_dest[field.name]
        assert action.option_strings == [flag_name(field.name)]
        assert action.help == (flag.help if flag.negate else field.metadata["help"])
        assert field.metadata["help"] in " ".join(ConvertOptions.__doc__.split())
    flagged = {f.name for f, _ in cli_fields()}
    assert set(ConvertOptions.names()) - flagged == {
        "source_options", "checkpoint_every", "task_retries", "storage_options", "cache_dir",
        "remote_retries"}
    positional = {a.dest for a in sub._actions if not a.option_strings}
    assert {a.dest for a in sub._actions} - flagged - positional == {
        "help", "storage_option", "layout"}


def test_the_parsed_flags_are_the_options(tmp_path):
    """``convert_options`` turns the parsed flags into the object in one step: the renamed
    (``--root``), negated (``--quiet``), typed (``--image-shape``) and file-reading
    (``--classes``) flags included."""
    from gluon_data.cli.commands import convert_options
    names = tmp_path / "classes.txt"
    names.write_text("cat\ndog\n")
    sub = _convert_parser()
    a = sub.parse_args(["src", "out.rec", "--root", "/data", "--quiet", "--classes",
                        str(names), "--image-shape", "4x6x3", "--workers", "3",
                        "--shard-size", "1GB", "--on-error", "skip", "--val-ratio", "0.5"])
    opts = convert_options(a)
    assert opts == ConvertOptions(lst_root="/data", progress=False, classes=["cat", "dog"],
                                  image_shape=(4, 6, 3), workers=3, shard_size="1GB",
                                  on_error="skip", val_ratio=0.5)
    a = sub.parse_args(["src", "out.rec", "--classes", "a, b,c"])
    assert convert_options(a).classes == ["a", "b", "c"] and convert_options(a).progress
    a = sub.parse_args(["src", "out.rec", "--classes", "a, b,,c"])  # c's id would be 2 or 3
    with pytest.raises(ValueError, match="holds an empty name"):
        convert_options(a)


def test_a_bad_shape_is_a_usage_error_saying_what_was_expected(capsys):
    sub = _convert_parser()
    with pytest.raises(SystemExit) as e:
        sub.parse_args(["src", "out.rec", "--image-shape", "4,0,3"])
    assert e.value.code == 2
    assert "argument --image-shape: expected 2 or 3 positive sizes, got '4,0,3'" in \
        capsys.readouterr().err


def test_a_refused_option_is_named_by_its_flag(folder, tmp_path):
    """The refusal names the flag a command-line user would have set (``--image-shape``),
    and no flag for an option the command has none for."""
    out = str(tmp_path / "x.rec")
    with pytest.raises(ValueError, match=r"image_shape \(--image-shape, set to \(8, 8, 3\);"):
        gluon_data.convert(folder, out, "imagefolder", image_shape=(8, 8, 3))
    with pytest.raises(ValueError, match=r"storage_options \(set to \{'anon': True\};"):
        gluon_data.convert(folder, out, "imagefolder", storage_options={"anon": True})
