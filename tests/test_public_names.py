"""Every public name of the flat layout stays importable from where it was, moved modules
through the one alias table (``gluon_data/_moved.py``) with a ``DeprecationWarning``, and is
the very object of its new home. ``PUBLIC`` is the flat layout's public names (each module's
``__all__``, or its public top-level definitions), taken before the move."""
import importlib
import json
import subprocess
import sys
import warnings

import pytest

from gluon_data._moved import MOVED_MODULES, MOVED_NAMES

PUBLIC = {
    "gluon_data._callable": (
        "callable_module",
    ),
    "gluon_data.batchify": (
        "MultiSizeBatchify", "SegmentationBatchify", "StackBatchify",
    ),
    "gluon_data.buffers": (
        "SamplePool", "batch_buffer", "host_view", "samples", "stack_staged",
    ),
    "gluon_data.cache": (
        "Cache", "parse_size",
    ),
    "gluon_data.cli": (
        "main", "storage_option_parser",
    ),
    "gluon_data.cli.bench": (
        "BENCH_MODULE", "bench_path", "load_bench", "load_bench_part",
    ),
    "gluon_data.cli.commands": (
        "describe", "run_demo",
    ),
    "gluon_data.cli.parser": (
        "build_parser", "storage_option_parser",
    ),
    "gluon_data.codec": (
        "DEFAULT_MAX_PIXELS", "MAX_RECORD_BYTES", "RECORDIO_MAGIC", "Record", "decode_image",
        "decode_mask", "encode_mask", "encode_raw", "frame", "image_size", "is_raw",
        "pack_classification", "pack_segmentation", "record_checksum", "unframe", "unpack",
    ),
    "gluon_data.convert": (
        "ConversionReport", "ENCODINGS", "EncodeOptions", "FORMATS", "Outputs", "SplitJobs",
        "convert", "convert_sharded", "copy_dataset", "drive", "encode_item", "import_lmdb",
        "is_dataset", "open_writers", "output_format", "output_paths", "outputs_for",
    ),
    "gluon_data.convert.copy": (
        "copy_dataset", "import_lmdb",
    ),
    "gluon_data.convert.driver": (
        "SplitJobs", "convert", "drive",
    ),
    "gluon_data.convert.encode": (
        "EncodeOptions", "encode_item", "encode_legacy", "image_part", "mask_part",
    ),
    "gluon_data.convert.loop": (
        "SplitJobs", "drive",
    ),
    "gluon_data.convert.outputs": (
        "ConversionReport", "ENCODINGS", "FORMATS", "Outputs", "open_writers", "output_format",
        "output_paths", "outputs_for",
    ),
    "gluon_data.convert.shard_task": (
        "ShardJob", "write_shard",
    ),
    "gluon_data.convert.sharded": (
        "ShardJob", "convert_sharded", "write_shard",
    ),
    "gluon_data.convert.to_uri": (
        "convert_to_uri",
    ),
    "gluon_data.credentials": (
        "Secret", "forward_options",
    ),
    "gluon_data.datasets": (
        "CaffeLMDBDataset", "ClassificationDataset", "ImageLMDBDataset", "ImageRecordDataset",
        "RecipeLMDBDataset", "SegmentationDataset", "SegmentationLMDBDataset",
        "SegmentationRecordDataset", "numpy_classification_transform", "numpy_image_transform",
        "open_segmentation",
    ),
    "gluon_data.decode": (
        "REGION_MAX_FRACTION", "decode_region", "region_decoder", "region_decoding",
    ),
    "gluon_data.distributed": (
        "DistributedSegmentationMetric", "allreduce_sum", "evaluate_segmentation",
    ),
    "gluon_data.documents": (
        "Doc", "F", "KINDS", "Spec", "check_document", "load_document",
    ),
    "gluon_data.engines": (
        "ENGINES", "SHARED_PATH_RULE", "import_dask", "run_tasks", "sigint_blocked",
    ),
    "gluon_data.errors": (
        "CacheError", "ChecksumMismatchError", "ConversionError", "CorruptRecordError",
        "DecodeError", "FormatError", "GluonDataError", "OutputError", "RemoteConnectionError",
        "RemoteError", "RemoteNotFoundError", "ResourceError", "SourceError",
        "TruncatedDownloadError", "WorkerPathError",
    ),
    "gluon_data.fastpath": (
        "numpy_classification_transform", "numpy_image_transform",
    ),
    "gluon_data.fileio": (
        "ProcessDescriptor", "advise_willneed", "open_or_explain", "require_regular",
    ),
    "gluon_data.fsutil": (
        "KINDS", "LOCATIONS", "OutputLock", "atomic_write", "check_disjoint",
        "check_replaceable", "classify_location", "exchange_dirs", "fsync_dir", "is_ours",
        "open_new", "register_sniffer", "remove_partial_dir",
    ),
    "gluon_data.launch": (
        "WorkerResult", "free_port", "launch_local",
    ),
    "gluon_data.legacy": (
        "CaffeLMDBStore", "LEGACY_LAYOUTS", "RecipeLMDBStore", "caffe_lmdb_items",
        "datum_class", "open_legacy_store", "raw_lmdb_items",
    ),
    "gluon_data.lmdb_pages": (
        "KNOWN_DATA_VERSIONS", "KNOWN_LIBRARIES", "LMDB_MAGIC", "MAX_DBS", "META_DB",
        "PAGES_ENV", "PageReader", "check_data_file", "direct_reads_refused", "record_key",
    ),
    "gluon_data.lmdb_writer": (
        "LMDBWriter",
    ),
    "gluon_data.lmdbio": (
        "LMDBFile", "LMDBWriter", "ProcessEnv", "is_lmdb", "read_lmdb_meta", "record_key",
        "shared_env",
    ),
    "gluon_data.loader": (
        "DataLoader", "HintedBatches", "WorkerDiedError", "prefetch_batch",
    ),
    "gluon_data.meta": (
        "CONTAINER_KEYS", "FORMAT_NAME", "FORMAT_VERSION", "SUPPORTED_VERSIONS", "TASKS",
        "check_meta", "dumps_meta", "ids_are_keys", "meta_checksum", "meta_path", "read_meta",
    ),
    "gluon_data.normalize": (
        "InputNormalize",
    ),
    "gluon_data.orders": (
        "block_order", "epoch_order",
    ),
    "gluon_data.ownership": (
        "KINDS", "LOCATIONS", "check_disjoint", "check_replaceable", "classify_location",
        "is_ours", "register_sniffer",
    ),
    "gluon_data.plan": (
        "PlanDigest", "changed_files", "plan_digest", "source_head",
    ),
    "gluon_data.preview": (
        "render_preview",
    ),
    "gluon_data.progress": (
        "progress_bar",
    ),
    "gluon_data.recindex": (
        "BINARY_INDEX_SUFFIX", "binary_index_problem", "file_stamp", "idx_path_for",
        "index_cache_path", "read_index", "write_binary_index",
    ),
    "gluon_data.recordio": (
        "RecordFile", "RecordWriter", "advise_willneed", "idx_path_for", "read_index",
    ),
    "gluon_data.recwriter": (
        "RecordWriter",
    ),
    "gluon_data.remote": (
        "BlockShuffleSampler", "INSTALL_HINT", "PrefetchSampler", "RemoteLMDBStore",
        "RemoteStore", "ShardCache", "ShardUploader", "attempt_limit", "call_bound",
        "convert_to_uri", "filesystem", "parse_size", "parse_storage_options",
        "upload_dataset",
    ),
    "gluon_data.remote.commit": (
        "Commit", "check_bucket", "probe_writable", "put_object",
    ),
    "gluon_data.remote.describe": (
        "Described", "check_lmdb_download", "describe_lmdb", "describe_rec",
        "names_remote_lmdb", "stamp",
    ),
    "gluon_data.remote.fs": (
        "BACKOFF", "CHUNK_BYTES", "CONNECT_TIMEOUT", "INSTALL_HINT", "MIN_RATE",
        "READ_TIMEOUT", "RETRIES", "attempt_limit", "call_bound", "filesystem",
        "parse_storage_options",
    ),
    "gluon_data.remote.layout": (
        "LMDB_COMMIT", "LMDB_DATA", "LMDB_FORMAT", "LMDB_MARKER", "UPLOAD_MARKER",
    ),
    "gluon_data.remote.objects": (
        "ShardCache",
    ),
    "gluon_data.remote.sampling": (
        "PrefetchSampler",
    ),
    "gluon_data.remote.stores": (
        "RemoteShardedStore", "RemoteStore",
    ),
    "gluon_data.remote.upload": (
        "RECEIPT_SUFFIX", "ShardUploader", "upload_dataset",
    ),
    "gluon_data.salvage": (
        "SalvageReport", "salvage", "scan_records",
    ),
    "gluon_data.sample": (
        "make_ade20k", "make_cityscapes", "make_imagefolder", "make_voc", "synthetic_pair",
        "synthetic_photo",
    ),
    "gluon_data.sampler": (
        "BlockShuffleSampler", "DistributedBatchSampler", "DistributedSampler", "SampleKey",
        "block_order", "epoch_order", "sample_rng", "split_key",
    ),
    "gluon_data.seeding": (
        "SeededRandom", "sample_context",
    ),
    "gluon_data.shards": (
        "MANIFEST_FORMAT", "MANIFEST_SUFFIX", "MANIFEST_VERSION", "ShardedStore",
        "convert_sharded", "dataset_files", "is_manifest", "manifest_path", "parse_size",
        "plan_ranges", "read_manifest", "shard_name", "verify_sharded", "write_combined_index",
    ),
    "gluon_data.shardstore": (
        "ShardRouter", "ShardedStore",
    ),
    "gluon_data.sources": (
        "DEFAULT_MAX_FILE_BYTES", "IMAGE_EXTENSIONS", "Item", "LAYOUTS", "Source",
        "VOC_CLASSES", "confine", "detect_layout", "open_source", "read_regular",
        "voc_palette",
    ),
    "gluon_data.stats": (
        "RunningStats", "class_statistics", "format_statistics",
    ),
    "gluon_data.store": (
        "RecordStore", "is_uri", "open_store", "read_bytes", "register_opener",
        "register_reader", "store_splits", "will_need",
    ),
    "gluon_data.taskdatasets": (
        "ClassificationDataset", "MODES", "OUTPUTS", "SegmentationDataset",
        "default_joint_transform",
    ),
    "gluon_data.tensorize": (
        "ImageCropNormalize", "OUTPUTS", "ToTensorNormalize", "to_chw_uint8",
    ),
    "gluon_data.transforms": (
        "CenterCrop", "ColorJitter", "Compose", "ImageCropNormalize", "RandomCrop",
        "RandomGaussianBlur", "RandomHorizontalFlip", "RandomRotation", "RandomScale",
        "RandomScaleCrop", "Resize", "ResizeShort", "SeededRandom", "ToTensorNormalize",
        "sample_context",
    ),
    "gluon_data.verify": (
        "VerifyReport", "register_verifier", "verify",
    ),
}
ROOT_NAMES = (
    "ImageRecordDataset", "SegmentationRecordDataset", "ImageLMDBDataset",
    "SegmentationLMDBDataset", "RecipeLMDBDataset", "CaffeLMDBDataset", "ClassificationDataset",
    "SegmentationDataset", "RecordStore", "open_store", "SampleKey", "RecordFile",
    "RecordWriter", "LMDBFile", "LMDBWriter", "convert", "ConversionReport", "verify",
    "salvage", "SegmentationBatchify", "MultiSizeBatchify", "StackBatchify", "InputNormalize",
    "DataLoader", "WorkerDiedError", "DistributedSampler", "GluonDataError", "FormatError",
    "CorruptRecordError", "DecodeError", "SourceError", "ConversionError", "OutputError",
    "codec", "transforms", "sample", "stats", "preview", "sources", "meta", "store", "sampler")
HAS_MXNET = importlib.util.find_spec("mxnet") is not None


def _home(module, name):
    """Where ``module.name`` lives now."""
    return MOVED_NAMES.get(module, {}).get(name) or MOVED_MODULES.get(module, module)


def _needs_mxnet(home):
    return home.startswith("gluon_data.gluon") and not HAS_MXNET


@pytest.mark.parametrize("module", sorted(PUBLIC))
def test_every_public_name_resolves_to_its_new_home(module):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        old = importlib.import_module(module)
        for name in PUBLIC[module]:
            home = _home(module, name)
            if _needs_mxnet(home):
                continue
            value = getattr(old, name)
            new = getattr(importlib.import_module(home), name)
            assert value is new, (module, name, home)


def test_the_root_names_resolve():
    import gluon_data
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        for name in ROOT_NAMES:
            if not HAS_MXNET and name in gluon_data._GLUON:
                with pytest.raises(ImportError, match="needs MXNet"):
                    getattr(gluon_data, name)
                continue
            assert getattr(gluon_data, name) is not None, name
    assert len(gluon_data.__all__) == len(set(gluon_data.__all__))  # convert: once


def test_every_alias_points_at_a_module_that_exists():
    for old, new in MOVED_MODULES.items():
        if _needs_mxnet(new):
            continue
        assert importlib.util.find_spec(new) is not None, (old, new)
    for old, names in MOVED_NAMES.items():
        for name, home in names.items():
            if not _needs_mxnet(home):
                assert hasattr(importlib.import_module(home), name), (old, name, home)


def test_an_old_module_name_warns_where_it_moved():
    """In a fresh interpreter (a module warns once, when first imported)."""
    code = ("import warnings; warnings.simplefilter('error', DeprecationWarning)\n"
            "for old in %r:\n"
            "    try:\n"
            "        __import__(old)\n"
            "    except DeprecationWarning as w:\n"
            "        assert 'moved to' in str(w), w\n"
            "    else:\n"
            "        raise AssertionError(old + ' did not warn')\n"
            "print('ok')\n" % sorted(m for m in MOVED_MODULES if not _needs_mxnet(MOVED_MODULES[m])))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "ok" in out.stdout, out.stderr[-3000:]


@pytest.mark.parametrize("name,module", [("convert", "gluon_data.convert.driver"),
                                         ("verify", "gluon_data.tools.verify"),
                                         ("salvage", "gluon_data.tools.salvage")])
def test_a_function_named_like_its_module_stays_callable(name, module):
    """``import gluon_data.verify`` (the old module) binds the package attribute to a module;
    ``from gluon_data import verify`` must still give something that runs the function."""
    code = ("import inspect, warnings, %s\nwarnings.simplefilter('ignore')\n"
            "import gluon_data.%s as m\nfrom gluon_data import %s as f\n"
            "assert callable(f), f\n"
            "assert inspect.signature(getattr(m, %r)).parameters\n"
            "try:\n    f()\nexcept TypeError as e:\n"
            "    assert 'required positional argument' in str(e), e\n"
            "    print('raised', e)\n" % (module, name, name, name))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0 and "raised" in out.stdout, out.stderr[-2000:]


def _fresh(old):
    """``old`` imported anew (a moved module warns once, when first imported): the module and
    the place its warning sends the user to."""
    sys.modules.pop(old, None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        module = importlib.import_module(old)
    said = [str(w.message) for w in caught if issubclass(w.category, DeprecationWarning)
            and str(w.message).startswith(old + " moved to ")]
    assert len(said) == 1, (old, [str(w.message) for w in caught])
    return module, said[0][len(old + " moved to "):].split(";")[0]


@pytest.mark.parametrize("old", sorted(MOVED_MODULES))
def test_every_alias_sends_the_user_where_the_name_imports(old):
    """Walks the alias table: every name of an old module (its ``__all__``, its names moved
    elsewhere, its public names before the move) imported from the place its warning gives
    (the module's, or the name's own when it moved elsewhere) is the same object; and
    ``from OLD import *`` still imports the old module's names."""
    if _needs_mxnet(MOVED_MODULES[old]):
        pytest.skip("%s needs MXNet" % MOVED_MODULES[old])
    module, module_place = _fresh(old)
    assert module_place == MOVED_MODULES[old]
    names = set(module.__all__) | set(MOVED_NAMES.get(old, ())) | set(PUBLIC.get(old, ()))
    assert names, old
    for name in sorted(names):
        if _needs_mxnet(_home(old, name)):
            continue
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            value = getattr(module, name)
        own = [str(w.message) for w in caught if str(w.message).startswith(
            "%s.%s moved to " % (old, name))]
        place = own[0].split(" moved to ")[1].split(";")[0] if own else module_place
        assert len(own) == (name in MOVED_NAMES.get(old, ())), (old, name, own)
        namespace = {}
        exec("from %s import %s as found" % (place, name), namespace)  # as the user would
        assert namespace["found"] is value, (old, name, place)
    if any(_needs_mxnet(home) for home in MOVED_NAMES.get(old, {}).values()):
        return  # ``import *`` would import the Gluon names
    star = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        exec("from %s import *" % old, star)
    missing = set(PUBLIC.get(old, ())) - set(star)
    assert not missing and set(module.__all__) <= set(star), (old, sorted(missing))


def test_importing_the_package_loads_nothing_it_does_not_use():
    """``import gluon_data`` (every command's and every worker's first import) loads the
    names lazily: not numpy, and not ``importlib.abc``, which the alias finder does not
    need (it cost each import 12-20 ms)."""
    probe = ("import json, sys; before = set(sys.modules); import gluon_data; "
             "print(json.dumps(sorted(set(sys.modules) - before)))")
    run = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    added = json.loads(run.stdout.splitlines()[-1])
    assert "gluon_data" in added
    assert not [m for m in added if m.split(".")[0] in ("numpy", "cv2", "PIL", "lmdb")], added
    assert "importlib.abc" not in added, added
