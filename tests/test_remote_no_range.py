"""A server that ignores ``Range`` (Python's own ``http.server``: a ``200`` with the whole
object for every GET) is detected at the first ranged GET, said once, never retried, and the
dataset is read whole through the cache instead: ``verify`` calls a valid dataset OK, within a
bounded number of requests.

Real parts only: a ``.rec`` from our converter, ``http.server.SimpleHTTPRequestHandler`` on
127.0.0.1 (bounded socket timeouts, stopped at the end of each test)."""
import functools
import os
import threading
import warnings
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

import pytest

pytest.importorskip("aiohttp")  # fsspec's HTTP filesystem

import gluon_data  # noqa: E402
from gluon_data.convert.sample import make_imagefolder  # noqa: E402
from gluon_data.storage import remotefs  # noqa: E402
from gluon_data.stores.recordio import RecordFile  # noqa: E402


class _NoRangeHandler(SimpleHTTPRequestHandler):
    """The standard library's handler (it ignores ``Range``), logging each request."""
    timeout = 10  # seconds a connection may sit idle

    def log_message(self, *args):
        pass

    def do_GET(self):
        self.server.log.append(("GET", self.path, self.headers.get("Range")))
        super().do_GET()

    def do_HEAD(self):
        self.server.log.append(("HEAD", self.path, self.headers.get("Range")))
        super().do_HEAD()


class PlainServer:
    def __init__(self, root):
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0),
                                          functools.partial(_NoRangeHandler, directory=root))
        self._httpd.daemon_threads = True
        self._httpd.log = []
        self._thread = threading.Thread(target=self._httpd.serve_forever,
                                        kwargs={"poll_interval": 0.1}, daemon=True)
        self._thread.start()

    @property
    def url(self):
        return "http://127.0.0.1:%d" % self._httpd.server_address[1]

    @property
    def log(self):
        return self._httpd.log

    def stop(self):
        stopper = threading.Thread(target=self._httpd.shutdown, daemon=True)
        stopper.start()
        stopper.join(10)
        self._thread.join(10)
        self._httpd.server_close()
        assert not self._thread.is_alive()


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    root = tmp_path_factory.mktemp("plain-http")
    src = make_imagefolder(str(tmp_path_factory.mktemp("src") / "data"), per_class=2)
    gluon_data.convert(src, str(root / "x.rec"), "imagefolder")
    return str(root)


@pytest.fixture
def server(served, tmp_path, monkeypatch):
    monkeypatch.setenv("GLUON_DATA_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("GLUON_DATA_REMOTE_BACKOFF", "0")
    srv = PlainServer(served)
    try:
        yield srv
    finally:
        srv.stop()
        remotefs._NO_RANGES.discard(srv.url)  # (a later server may get the same port)


def _ranged_gets(log, name):
    return [r for r in log if r[0] == "GET" and r[1] == "/" + name and r[2] is not None]


def test_verify_over_a_server_ignoring_range_reads_whole_and_reports_ok(server, served):
    url = server.url + "/x.rec"
    with pytest.warns(RuntimeWarning, match="ignores HTTP Range requests") as said:
        report = gluon_data.verify(url)
    assert report.problems == [], report.problems
    assert report.records == len(RecordFile(os.path.join(served, "x.rec")))
    assert len([w for w in said if "ignores HTTP Range" in str(w.message)]) == 1  # once
    assert len(_ranged_gets(server.log, "x.rec")) == 1  # detected, never retried
    assert len(server.log) <= 12, server.log
    first = len(server.log)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # said once: not again
        deep = gluon_data.verify(url, deep=True)
    assert deep.problems == []
    assert len(_ranged_gets(server.log, "x.rec")) == 1  # no range asked of it again
    assert len(server.log) - first <= 6, server.log[first:]


def test_a_download_in_chunks_from_a_server_ignoring_range_is_read_whole(server, served,
                                                                          monkeypatch):
    """An object bigger than one chunk (the chunk made small here): the first ranged GET
    shows the server ignores ``Range``; the object comes in one more GET, checked."""
    monkeypatch.setattr(remotefs, "CHUNK_BYTES", 1000)
    local = RecordFile(os.path.join(served, "x.rec"))
    assert local.file_size > 1000
    with pytest.warns(RuntimeWarning, match="ignores HTTP Range requests"):
        store = gluon_data.stores.open_store(server.url + "/x.rec")
        got = [store.read(i) for i in range(len(store))]
    store.close()
    assert got == [local.read(i) for i in range(len(local))]
    rec_gets = [r for r in server.log if r[0] == "GET" and r[1] == "/x.rec"]
    assert len(rec_gets) == 2 and rec_gets[1][2] is None, rec_gets  # one range, one whole
    assert len(server.log) <= 12, server.log
