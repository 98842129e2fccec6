"""moto's S3 server on 127.0.0.1 for the tests of datasets in object storage.

The server runs in-process (``ThreadedMotoServer``); a tiny WSGI middleware in front of it
logs every request with the bytes it served, and can cut a response short and stop the
server (a server dying mid-download). s3fs talks to it through ``endpoint_url``.
Framework-free (the core lane's tests use it as the Gluon ones do); importing it skips the
importing test module where moto is not installed.
"""
import contextlib
import logging
import os
import socket
import threading
import time

import pytest

from gluon_data.storage.remotefs import filesystem

moto_server = pytest.importorskip("moto.server")

BUCKET = "gd-test"
FAST = {"retries": 2, "backoff": 0.05}  # bounded retries for the tests


class S3Server:
    """moto's S3 server on loopback with a request log (method, path, bytes served)."""

    def __init__(self):
        self.port = None
        self.log = []
        self.kill_after = None  # (path suffix, bytes, stop): cut that GET short (and stop)
        self.kill_on_put = None  # path suffix: stop when a PUT of it arrives
        self.drop_put = None  # (path suffix, n): the next n PUTs of it go unanswered
        self._server = None
        self._stopping = None  # the thread stopping the server from inside a request
        self.start()

    def start(self):
        # a stop begun from inside a request must finish first: the old listening socket
        # holds the port until then, and ThreadedMotoServer.start() waits without a bound for
        # a server that could not bind (a client giving up quickly used to hang the suite here)
        if self._stopping is not None:
            self._stopping.join(30)
            assert not self._stopping.is_alive(), "the S3 test server did not stop"
            self._stopping = None
        if self.port:
            deadline = time.monotonic() + 10
            while True:  # bounded: the port is free again once the old socket is closed
                with socket.socket() as probe:
                    probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                    try:
                        probe.bind(("127.0.0.1", self.port))
                        break
                    except OSError:
                        if time.monotonic() > deadline:
                            raise
                time.sleep(0.05)
        self._server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1",
                                                      port=self.port or 0, verbose=False)
        self._server.start()
        self.port = self._server.get_host_and_port()[1]
        inner = self._server._server.app
        self._server._server.app = self._wrap(inner)

    def _wrap(self, inner):
        def app(environ, start_response):
            entry = [environ["REQUEST_METHOD"], environ.get("PATH_INFO", ""), 0]
            self.log.append(entry)
            if (self.kill_on_put and entry[0] == "PUT"
                    and entry[1].endswith(self.kill_on_put)):
                self.kill_on_put = None
                # take the body first: werkzeug would otherwise wait for more of it while
                # the client waits for an answer
                environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0))
                self._stopping = threading.Thread(target=self.stop)
                self._stopping.start()
                raise ConnectionAbortedError("server stopped (test)")  # dropped, no answer
            if self.drop_put and entry[0] == "PUT" and entry[1].endswith(self.drop_put[0]):
                n = self.drop_put[1] - 1
                self.drop_put = (self.drop_put[0], n) if n > 0 else None
                environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0))
                raise ConnectionAbortedError("PUT dropped (test)")  # no answer, server stays
            kill = self.kill_after
            for chunk in inner(environ, start_response):
                if (kill and entry[0] == "GET" and entry[1].endswith(kill[0])
                        and entry[2] + len(chunk) > kill[1]):
                    self.kill_after = None
                    part = chunk[:kill[1] - entry[2]]
                    entry[2] += len(part)
                    yield part
                    if kill[2]:
                        self._stopping = threading.Thread(target=self.stop)
                        self._stopping.start()
                    raise ConnectionAbortedError("response cut short (test)")
                entry[2] += len(chunk)
                yield chunk
        return app

    def stop(self):
        server, self._server = self._server, None
        if server is not None:
            server.stop()
            server._server.server_close()

    @property
    def url(self):
        return "http://127.0.0.1:%d" % self.port

    def served(self, suffix, method="GET"):
        return sum(e[2] for e in self.log if e[0] == method and e[1].endswith(suffix))

    def requests(self, suffix, method):
        return [e for e in self.log if e[0] == method and e[1].endswith(suffix)]


@contextlib.contextmanager
def moto_s3(bucket=BUCKET):
    """A moto S3 server on 127.0.0.1 with test credentials in the environment (restored
    after) and ``bucket`` made; yields the server, stopped at the end."""
    saved = {k: os.environ.get(k) for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
                                            "AWS_DEFAULT_REGION", "AWS_CONFIG_FILE",
                                            "AWS_SHARED_CREDENTIALS_FILE")}
    os.environ.update(AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing",
                      AWS_DEFAULT_REGION="us-east-1", AWS_CONFIG_FILE=os.devnull,
                      AWS_SHARED_CREDENTIALS_FILE=os.devnull)
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = S3Server()
    try:
        fs, _ = filesystem("s3://%s" % bucket, _options(server))
        if not fs.exists(bucket):  # moto's state is per process: another server of this
            fs.mkdir(bucket)       # process (another module's fixture) may have made it
        yield server
    finally:
        server.stop()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@contextlib.contextmanager
def s3_session(prefix):
    """:func:`moto_s3` with what a test module needs of it: ``(server, storage options, an
    s3fs file system, "s3://BUCKET/prefix")``."""
    with moto_s3() as server:
        opts = _options(server)
        fs, _ = filesystem("s3://%s" % BUCKET, opts)
        yield server, opts, fs, "s3://%s/%s" % (BUCKET, prefix)


def _options(server):
    return {"endpoint_url": server.url,
            "config_kwargs": {"connect_timeout": 2, "read_timeout": 10,
                              "retries": {"max_attempts": 1}}}
