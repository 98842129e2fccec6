"""One conversion entry, one options object: ``gluon_data.convert`` decides which conversion
runs, the API and the CLI pass the same ``ConvertOptions``, nothing is silently ignored."""
import hashlib
import inspect
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


@pytest.mark.parametrize("option", [dict(engine="dask"), dict(scheduler="tcp://127.0.0.1:1"),
                                    dict(storage_options={"anon": True}),
                                    dict(image_shape=(8, 8, 3))])
def test_an_option_the_conversion_does_not_read_is_refused(folder, tmp_path, option):
    """Never silently ignored: a shard option without shards, an object-storage option for a
    local output, a legacy-import option for a source layout."""
    out = str(tmp_path / "x.rec")
    with pytest.raises(ValueError, match="takes no %s" % next(iter(option))):
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


def test_every_cli_flag_of_convert_is_an_option_field():
    """The CLI reads the same object: each convert flag is a field (or one of the few CLI
    spellings: --root, --quiet, --storage-option)."""
    from gluon_data.cli.parser import build_parser
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command").choices["convert"]
    fields = set(ConvertOptions.names())
    cli_only = {"help", "source", "output", "layout", "root", "quiet", "storage_option"}
    dests = {a.dest for a in sub._actions}
    assert dests - fields - cli_only == set()
