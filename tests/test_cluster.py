"""Conversions on a real Dask cluster started as a user starts one: a ``dask scheduler`` and a
``dask worker`` process on 127.0.0.1, the worker in its own working directory and with an
environment that has no S3 credentials (and an endpoint that refuses connections, so nothing
it does can leave loopback unless the task says where to go). S3 is moto's server on
127.0.0.1; it records which access key signed each request.
"""
import importlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time

import pytest

from gluon_data.cli import main
from gluon_data.errors import ConversionError, RemoteError, RemoteNotFoundError, WorkerPathError
from gluon_data.convert.to_uri import convert_to_uri
from gluon_data.storage.remotefs import filesystem
from gluon_data.convert.sample import make_imagefolder
from gluon_data.convert.sharded import convert_sharded

dd = pytest.importorskip("dask.distributed")
pytest.importorskip("moto.server")
from test_remote import S3Server  # noqa: E402  (the moto server of the remote tests)

BUCKET = "gd-cluster"
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLIENT_KEY, CLIENT_SECRET = "AKIDCLIENT5e1f", "client-secret-7d0c93ab2f"


class SigningS3(S3Server):
    """moto's S3 server that also records the access key id signing each request."""

    def _wrap(self, inner):
        app = super()._wrap(inner)

        def signed(environ, start_response):
            auth = environ.get("HTTP_AUTHORIZATION", "")
            key = auth.split("Credential=", 1)[1].split("/", 1)[0] if "Credential=" in auth \
                else None
            self.signers.append((environ["REQUEST_METHOD"], environ.get("PATH_INFO", ""), key))
            return app(environ, start_response)
        return signed

    def start(self):
        self.signers = []
        super().start()


def _closed_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def s3():
    mp = pytest.MonkeyPatch()
    for k in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):
        mp.delenv(k, raising=False)
    mp.setenv("AWS_ACCESS_KEY_ID", CLIENT_KEY)  # the client's standard environment
    mp.setenv("AWS_SECRET_ACCESS_KEY", CLIENT_SECRET)
    mp.setenv("AWS_DEFAULT_REGION", "us-east-1")
    for k in ("AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE"):
        mp.setenv(k, os.devnull)
    mp.setenv("AWS_EC2_METADATA_DISABLED", "true")
    server = SigningS3()
    fs, _ = filesystem("s3://%s" % BUCKET, {"endpoint_url": server.url})
    fs.mkdir(BUCKET)
    yield server
    server.stop()
    mp.undo()


def _stop(proc):
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """``(scheduler address, worker cwd, log files)``: one scheduler, one worker process."""
    base = tmp_path_factory.mktemp("cluster")
    cwd = base / "worker-cwd"
    cwd.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(PYTHONPATH=ROOT, GLUON_DATA_CACHE_DIR=str(base / "worker-cache"),
               AWS_EC2_METADATA_DISABLED="true", AWS_CONFIG_FILE=os.devnull,
               AWS_SHARED_CREDENTIALS_FILE=os.devnull, AWS_DEFAULT_REGION="us-east-1",
               AWS_ENDPOINT_URL="http://127.0.0.1:%d" % _closed_port(),
               GLUON_DATA_REMOTE_RETRIES="1", GLUON_DATA_REMOTE_BACKOFF="0.05")
    logs = [base / "scheduler.log", base / "worker.log"]
    sched_file = base / "scheduler.json"
    procs = []
    try:
        with open(logs[0], "wb") as log:
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "dask", "scheduler", "--host", "127.0.0.1", "--port",
                 "0", "--no-dashboard", "--scheduler-file", str(sched_file)],
                cwd=str(base), env=env, stdout=log, stderr=subprocess.STDOUT))
        deadline = time.monotonic() + 60
        while not sched_file.exists() and time.monotonic() < deadline:
            assert procs[0].poll() is None, logs[0].read_text()
            time.sleep(0.1)
        address = json.loads(sched_file.read_text())["address"]
        with open(logs[1], "wb") as log:
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "dask", "worker", address, "--nworkers", "1",
                 "--nthreads", "1", "--host", "127.0.0.1", "--no-dashboard",
                 "--death-timeout", "60"],
                cwd=str(cwd), env=env, stdout=log, stderr=subprocess.STDOUT))
        with dd.Client(address, timeout=60) as client:
            client.wait_for_workers(1, timeout=90)
        yield address, cwd, logs
    finally:
        for p in reversed(procs):
            _stop(p)


def _worker_run(address, fn):
    with dd.Client(address, timeout=60) as client:
        return list(client.run(fn).values())


def _tree(folder):
    """``{relative path: bytes}`` (not ``.gdx``: a parsed-index cache keyed by the file's stat)"""
    out = {}
    for d, _, names in os.walk(folder):
        for n in names:
            if n.endswith(".gdx"):
                continue
            with open(os.path.join(d, n), "rb") as f:
                out[os.path.relpath(os.path.join(d, n), folder)] = f.read()
    return out


def _objects(fs, prefix):
    return {p.rsplit("/", 1)[-1]: fs.cat_file(p) for p in fs.find("%s/%s/" % (BUCKET, prefix))}


# ---------------------------------------------------------------- paths
def test_relative_paths_resolve_on_the_client(cluster, tmp_path, monkeypatch, capsys):
    """A relative source and output given from the client's cwd name the client's files,
    although the worker runs in another directory: the shards are the local engine's."""
    address, worker_cwd, _ = cluster
    assert _worker_run(address, os.getcwd) == [str(worker_cwd)]
    client_cwd = tmp_path / "client"
    client_cwd.mkdir()
    make_imagefolder(str(client_cwd / "data"), per_class=3)
    monkeypatch.chdir(client_cwd)
    rep = convert_sharded("data", "out/c.rec", "imagefolder", shards=3, engine="dask",
                          scheduler=address)
    assert rep.outputs == {"train": str(client_cwd / "out" / "c.shards.json")}
    convert_sharded("data", "ref/c.rec", "imagefolder", shards=3)
    assert _tree("out") == _tree("ref") and len(_tree("out")) == 10
    assert not os.listdir(str(worker_cwd))  # nothing landed in the worker's folder
    # the CLI, the same way
    assert main(["convert", "data", "cli/c.rec", "--layout", "imagefolder", "--shards", "3",
                 "--engine", "dask", "--scheduler", address, "--quiet"]) == 0
    assert _tree("cli") == _tree("ref")
    assert "wrote 9 records to %s" % (client_cwd / "cli" / "c.shards.json") \
        in capsys.readouterr().out


def test_a_path_not_shared_with_the_workers_is_a_typed_error(cluster, tmp_path, monkeypatch):
    """``/proc/self/cwd/...`` names another folder in every process: exactly a path that is
    not the same on the workers. The task says so (worker host, path, rule); a shard written
    into a folder of the worker's that the client does not see is refused by the client."""
    address, worker_cwd, _ = cluster
    client_cwd = tmp_path / "client"
    client_cwd.mkdir()
    make_imagefolder(str(client_cwd / "data"), per_class=2)
    monkeypatch.chdir(client_cwd)
    with pytest.raises(WorkerPathError) as e:
        convert_sharded("/proc/self/cwd/data", str(tmp_path / "o" / "c.rec"), "imagefolder",
                        shards=2, engine="dask", scheduler=address, retries=0)
    assert e.value.path == "/proc/self/cwd/data"
    assert "the source is not on worker host %s" % socket.gethostname() in str(e.value)
    assert "shared filesystem" in str(e.value)
    assert not (tmp_path / "o").exists()  # the output folder made for the run: removed
    # the output folder: missing on the worker ...
    with pytest.raises(WorkerPathError, match="output folder is not on worker host"):
        convert_sharded(str(client_cwd / "data"), "/proc/self/cwd/out/c.rec", "imagefolder",
                        shards=2, engine="dask", scheduler=address, retries=0)
    # ... or there, but another folder than the client's
    (worker_cwd / "out").mkdir()
    try:
        with pytest.raises(WorkerPathError, match="not on this machine") as e:
            convert_sharded(str(client_cwd / "data"), "/proc/self/cwd/out/c.rec",
                            "imagefolder", shards=2, engine="dask", scheduler=address,
                            retries=0)
        assert e.value.path.startswith("/proc/self/cwd/out/c-0000")
        assert not os.path.exists("out/c.shards.json")
    finally:
        _remove_when_idle(str(worker_cwd / "out"))


def _remove_when_idle(path: str, ceiling_s: float = 60.0) -> None:
    """Remove a folder the workers write into: the other shard's task, cancelled when the
    first one failed, may still be running there (Dask does not stop a running task), so
    retry until it is done, a bounded number of times."""
    for _ in range(int(ceiling_s / 0.2)):
        try:
            shutil.rmtree(path)
            return
        except OSError:  # a file appeared while it was removed: the task is still writing
            time.sleep(0.2)
    shutil.rmtree(path)


def test_a_worker_running_another_gluon_data_version_is_refused(cluster, tmp_path):
    address, _, _ = cluster
    src = make_imagefolder(str(tmp_path / "data"), per_class=2)
    from gluon_data import _version  # the one definition of the version
    mine = _version.__version__
    _worker_run(address, lambda: setattr(importlib.import_module("gluon_data._version"),
                                         "__version__", "0.0.1-old"))
    try:
        with pytest.raises(ConversionError) as e:
            convert_sharded(src, str(tmp_path / "o" / "c.rec"), "imagefolder", shards=2,
                            engine="dask", scheduler=address)
    finally:
        _worker_run(address, lambda: setattr(importlib.import_module("gluon_data._version"),
                                             "__version__", mine))
    assert "gluon_data %s on this client, but 0.0.1-old on 1 worker(s)" % mine in str(e.value)
    assert not os.path.exists(str(tmp_path / "o" / "c.shards.json"))


# ---------------------------------------------------------------- credentials
def _signers(s3, prefix, method="PUT"):
    return {k for m, p, k in s3.signers if m == method and "/%s/" % prefix in p}


def test_workers_use_their_own_environment_not_the_clients(s3, cluster, tmp_path):
    """Without forwarding, a worker without credentials fails saying why (not the client's
    credentials silently sent, nor a bare NoCredentialsError); with its own, it uses them."""
    address, _, _ = cluster
    src = make_imagefolder(str(tmp_path / "data"), per_class=2)
    so = {"endpoint_url": s3.url}  # explicit options travel with the tasks
    uri = "s3://%s/own/c.rec" % BUCKET
    with pytest.raises(RemoteError) as e:
        convert_to_uri(src, uri, "imagefolder", shards=2, engine="dask", scheduler=address,
                       storage_options=so, cache_dir=str(tmp_path / "c"), retries=0)
    assert "no credentials on host %s" % socket.gethostname() in str(e.value)
    assert "--forward-credentials" in str(e.value) and CLIENT_SECRET not in str(e.value)
    _worker_run(address, lambda: os.environ.update(AWS_ACCESS_KEY_ID="AKIDWORKER",
                                                   AWS_SECRET_ACCESS_KEY="worker-secret"))
    try:
        s3.signers.clear()
        rep = convert_to_uri(src, uri, "imagefolder", shards=2, engine="dask",
                             scheduler=address, storage_options=so,
                             cache_dir=str(tmp_path / "c"), resume=True)
    finally:
        _worker_run(address, lambda: [os.environ.pop(k) for k in ("AWS_ACCESS_KEY_ID",
                                                                   "AWS_SECRET_ACCESS_KEY")])
    assert rep.outputs == {"train": "s3://%s/own/c.shards.json" % BUCKET}
    shard_keys = {k for m, p, k in s3.signers if m == "PUT" and "-of-00002" in p}
    assert shard_keys == {"AKIDWORKER"}  # the worker's own
    assert {k for m, p, k in s3.signers if p.endswith("c.shards.json") and m == "PUT"} \
        == {CLIENT_KEY}  # the client uploads the manifest with its own


def test_forwarded_credentials_reach_the_workers_and_are_written_nowhere(
        s3, cluster, tmp_path, monkeypatch, capsys):
    """``--forward-credentials``: the client's credentials and endpoint, from its standard
    environment, sign the workers' uploads; the secret is in no object, manifest, log,
    output, error message or repr, also when a task fails on the worker."""
    address, _, logs = cluster
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3.url)
    monkeypatch.setenv("GLUON_DATA_CACHE_DIR", str(tmp_path / "client-cache"))
    src = make_imagefolder(str(tmp_path / "data"), per_class=2)
    uri = "s3://%s/fwd/c.rec" % BUCKET
    s3.signers.clear()
    assert main(["convert", src, uri, "--layout", "imagefolder", "--shards", "2",
                 "--engine", "dask", "--scheduler", address, "--forward-credentials",
                 "--quiet"]) == 0
    assert _signers(s3, "fwd") == {CLIENT_KEY}
    assert len([1 for m, p, _ in s3.signers if m == "PUT" and "-of-00002" in p]) == 8
    # a task failing on the worker (Dask logs the failed task) with forwarded credentials
    bad = tmp_path / "bad"
    shutil.copytree(src, str(bad))
    victim = sorted((bad / sorted(os.listdir(str(bad)))[0]).iterdir())[0]
    victim.write_bytes(b"not an image")
    assert main(["convert", str(bad), "s3://%s/fwdbad/c.rec" % BUCKET, "--layout",
                 "imagefolder", "--shards", "2", "--engine", "dask", "--scheduler", address,
                 "--forward-credentials", "--quiet"]) == 1
    out = capsys.readouterr()
    assert victim.name in out.err
    fs, _ = filesystem("s3://%s" % BUCKET, {"endpoint_url": s3.url})
    blobs = list(_objects(fs, "fwd").values()) + list(_objects(fs, "fwdbad").values())
    assert len(blobs) >= 9 and any(b"gluon_data-shards" in b for b in blobs)
    texts = [out.out, out.err] + [p.read_text() for p in logs]
    assert "Compute Failed" in texts[-1]  # the worker logged the failed task (and its job)
    for root in (tmp_path / "client-cache",):
        for d, _, names in os.walk(str(root)):
            for n in names:
                with open(os.path.join(d, n), "rb") as f:
                    blobs.append(f.read())
    secret = CLIENT_SECRET.encode()
    assert not [b for b in blobs if secret in b]
    assert not [t for t in texts if CLIENT_SECRET in t]
    from gluon_data.storage.credentials import forward_options
    opts = forward_options(uri)
    assert opts["secret"] == CLIENT_SECRET and opts["endpoint_url"] == s3.url
    assert CLIENT_SECRET not in repr(opts) and CLIENT_SECRET not in str(opts)
    import pickle
    assert pickle.loads(pickle.dumps(opts)) == opts
    assert CLIENT_SECRET not in repr(pickle.loads(pickle.dumps(opts)))


# ---------------------------------------------------------------- the destination
@pytest.mark.parametrize("sharded", [False, True])
def test_a_missing_bucket_is_refused_before_converting(s3, tmp_path, sharded, capsys):
    src = make_imagefolder(str(tmp_path / "data"), per_class=2)
    cache = tmp_path / "cache"
    extra = {"shards": 2} if sharded else {}
    t0 = time.monotonic()
    with pytest.raises(RemoteNotFoundError) as e:
        convert_to_uri(src, "s3://no-such-bucket-4f1/v.rec", "imagefolder",
                       storage_options={"endpoint_url": s3.url}, cache_dir=str(cache), **extra)
    assert "bucket 'no-such-bucket-4f1' does not exist" in str(e.value)
    assert time.monotonic() - t0 < 30
    assert not (cache / "staging").exists() or not any(os.scandir(str(cache / "staging")))
    argv = ["convert", src, "s3://no-such-bucket-4f1/v.rec", "--quiet", "--workers", "1",
            "--storage-option", "endpoint_url=" + s3.url] + (["--shards", "2"] if sharded
                                                            else [])
    assert main(argv) == 1
    assert "no-such-bucket-4f1" in capsys.readouterr().err


def test_the_destination_is_probed_writable_then_left_clean(s3, tmp_path):
    src = make_imagefolder(str(tmp_path / "data"), per_class=2)
    s3.signers.clear()
    convert_to_uri(src, "s3://%s/probe/v.rec" % BUCKET, "imagefolder",
                   storage_options={"endpoint_url": s3.url}, cache_dir=str(tmp_path / "c"))
    probes = [(m, p) for m, p, _ in s3.signers if "gluon-data-probe" in p]
    assert [m for m, _ in probes] == ["PUT", "DELETE"] and probes[0][1] == probes[1][1]
    first_data = min(i for i, (m, p, _) in enumerate(s3.signers)
                     if m == "PUT" and p.endswith("v.rec"))
    assert s3.signers.index(("PUT", probes[0][1], CLIENT_KEY)) < first_data
    fs, _ = filesystem("s3://%s" % BUCKET, {"endpoint_url": s3.url})
    assert sorted(_objects(fs, "probe")) == ["v.idx", "v.meta.json", "v.rec"]


# ---------------------------------------------------------------- the report
def test_a_rerun_reports_written_and_kept(s3, cluster, tmp_path, capsys):
    address, _, _ = cluster
    src = make_imagefolder(str(tmp_path / "data"), per_class=4)  # 12 items
    out = str(tmp_path / "o" / "c.rec")
    for engine in ("local", "dask"):
        argv = ["convert", src, out, "--layout", "imagefolder", "--shards", "3", "--quiet",
                "--engine", engine] + (["--scheduler", address] if engine == "dask" else [])
        assert main(argv) == 0
        text = capsys.readouterr().out
        if engine == "local":
            assert "12 written, 0 skipped" in text
        else:
            assert "0 records written, 12 kept in 3 shards already complete" in text
    os.remove(str(tmp_path / "o" / "c-00001-of-00003.rec"))
    rep = convert_sharded(src, out, "imagefolder", shards=3, engine="dask", scheduler=address)
    assert rep.written == {"train": 4} and rep.kept == {"train": 8} and rep.kept_shards == 2
    assert "4 records written, 8 kept in 2 shards already complete" in str(rep)
    assert rep.bytes_written == os.path.getsize(str(tmp_path / "o" / "c-00001-of-00003.rec"))
    # an upload resumed with every receipt in place: nothing written, everything kept
    uri = "s3://%s/rep/c.rec" % BUCKET
    so = {"endpoint_url": s3.url}
    convert_to_uri(src, uri, "imagefolder", shards=3, storage_options=so,
                   cache_dir=str(tmp_path / "c"))
    rep = convert_to_uri(src, uri, "imagefolder", shards=3, storage_options=so,
                         cache_dir=str(tmp_path / "c"), resume=True)
    assert rep.written == {"train": 0} and rep.kept == {"train": 12} and rep.kept_shards == 3
    assert "0 records written, 12 kept in 3 shards already complete" in str(rep)


def test_a_scheduler_that_cannot_be_reached_is_named_with_the_flag(tmp_path):
    """A ``--scheduler`` address nothing answers at (or of a scheme Dask does not know) is a
    ConversionError naming the address and the flag, not Dask's bare connect timeout."""
    import dask
    src = make_imagefolder(str(tmp_path / "src"), per_class=2)
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with dask.config.set({"distributed.comm.timeouts.connect": "2s"}):
        for address in ("tcp://127.0.0.1:%d" % port, "http://127.0.0.1:%d" % port):
            with pytest.raises(ConversionError,
                               match=r"cannot reach the Dask scheduler at %s \(--scheduler\)"
                               % address):
                convert_sharded(src, str(tmp_path / "o.rec"), "imagefolder", shards=2,
                                engine="dask", scheduler=address)


def test_a_scheduler_with_no_worker_is_an_error_after_a_bounded_wait(tmp_path):
    """A ``--scheduler`` that no worker joins: its tasks would wait for as long as none
    joins, silently. The conversion gives one ``scheduler_wait`` seconds, then says how to
    start one, and writes nothing."""
    src = make_imagefolder(str(tmp_path / "src"), per_class=2)
    out = tmp_path / "out"
    with dd.LocalCluster(n_workers=0, processes=False, dashboard_address=None) as empty:
        t0 = time.monotonic()
        with pytest.raises(ConversionError, match=r"scheduler at %s \(--scheduler\) has no "
                           r"worker: none joined in 1 s; start its workers \(`dask worker %s`\)"
                           r", give them longer \(--scheduler-wait\)"
                           % (empty.scheduler_address, empty.scheduler_address)):
            convert_sharded(src, str(out / "o.rec"), "imagefolder", shards=2, engine="dask",
                            scheduler=empty.scheduler_address, scheduler_wait=1)
        assert time.monotonic() - t0 < 30
    assert not out.exists()


def test_an_adaptive_cluster_starts_its_workers_for_the_conversion(tmp_path):
    """An adaptive cluster with no worker yet (dask-jobqueue, dask-gateway, Kubernetes)
    starts one only for tasks waiting: the conversion's wait for a worker is a task."""
    src = make_imagefolder(str(tmp_path / "src"), per_class=2)
    with dd.LocalCluster(n_workers=0, processes=False, threads_per_worker=1,
                         dashboard_address=None) as adaptive:
        adaptive.adapt(minimum=0, maximum=1, interval="100ms", wait_count=1)
        report = convert_sharded(src, str(tmp_path / "o.rec"), "imagefolder", shards=2,
                                 engine="dask", scheduler=adaptive.scheduler_address,
                                 scheduler_wait=60)
    assert report.total_written == 6
