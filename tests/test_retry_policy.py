"""The one retry and time-bound policy of remote calls (``gluon_data.storage.retry``): read
from the environment when a call is made (not when the module was imported, nor when the
client object was made), an explicit ``retries`` winning, a bad variable refused by name
before any request. Requests are counted on a real server that drops every connection:
``retries + 1`` attempts make exactly ``retries + 1`` requests (the HTTP clients' own retries
are off: aiohttp's second send of an idempotent request, botocore's retries); nothing is
timed.
Framework-free: runs in the core lane."""
import os
import socket
import subprocess
import sys
import threading

import pytest

from gluon_data.errors import RemoteConnectionError
from gluon_data.storage import remotefs
from gluon_data.storage.remotefs import Remote, call_bound, filesystem
from gluon_data.storage.retry import ENVIRONMENT, RetryPolicy

pytest.importorskip("aiohttp")  # fsspec's HTTP filesystem


class DroppingServer:
    """A TCP server on 127.0.0.1 that reads each request and closes the connection without
    an answer (a transient failure: retried), counting the connections."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.connections = 0
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with self._lock:
                self.connections += 1
            conn.settimeout(5)
            try:
                conn.recv(65536)
            except OSError:
                pass
            conn.close()

    def count(self):
        with self._lock:
            n, self.connections = self.connections, 0
        return n

    def url(self, name="x.rec"):
        return "http://127.0.0.1:%d/%s" % (self.sock.getsockname()[1], name)

    def close(self):
        try:
            self.sock.shutdown(socket.SHUT_RDWR)  # wakes the accept() under way
        except OSError:
            pass
        self.sock.close()
        self._thread.join(10)
        assert not self._thread.is_alive()


@pytest.fixture
def dropping():
    server = DroppingServer()
    yield server
    server.close()


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch):
    for var in ENVIRONMENT.values():
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("GLUON_DATA_REMOTE_BACKOFF", "0")  # no sleeps between attempts


def _attempts(remote, server):
    with pytest.raises(RemoteConnectionError) as e:
        remote.cat(server.url())
    assert e.value.path == server.url()
    return e.value, server.count()


def test_the_environment_is_read_at_each_call(dropping, monkeypatch):
    """The object and the module exist before the variable is set: the call reads it."""
    remote = Remote()
    monkeypatch.setenv("GLUON_DATA_REMOTE_RETRIES", "0")
    err, connections = _attempts(remote, dropping)
    assert "after 1 attempts" in str(err) and connections == 1
    monkeypatch.setenv("GLUON_DATA_REMOTE_RETRIES", "3")
    err, connections = _attempts(remote, dropping)
    assert "after 4 attempts" in str(err) and connections == 4
    assert remote.policy().retries == 3 and remote.policy().backoff == 0
    monkeypatch.delenv("GLUON_DATA_REMOTE_RETRIES")
    assert remote.policy().retries == remotefs.RETRIES == 4  # the default, not frozen


def test_an_explicit_retries_wins_over_the_environment(dropping, monkeypatch):
    monkeypatch.setenv("GLUON_DATA_REMOTE_RETRIES", "3")
    remote = Remote(retries=1)
    err, connections = _attempts(remote, dropping)
    assert "after 2 attempts" in str(err) and connections == 2
    # it travels with the object (a task's remote_retries); the rest stays the environment's
    clone = Remote.__new__(Remote)
    clone.__setstate__(remote.__getstate__())
    assert clone.retries == 1 and clone.policy().retries == 1
    assert Remote().__getstate__()["retries"] is None


@pytest.mark.parametrize("var,value,want", [
    ("GLUON_DATA_REMOTE_RETRIES", "lots", "a non-negative integer"),
    ("GLUON_DATA_REMOTE_RETRIES", "-1", "a non-negative integer"),
    ("GLUON_DATA_REMOTE_RETRIES", "2.5", "a non-negative integer"),
    ("GLUON_DATA_REMOTE_BACKOFF", "inf", "a non-negative number of seconds"),
    ("GLUON_DATA_REMOTE_CONNECT_TIMEOUT", "0", "a positive number of seconds"),
    ("GLUON_DATA_REMOTE_READ_TIMEOUT", "soon", "a positive number of seconds"),
    ("GLUON_DATA_REMOTE_MIN_RATE", "-5", "a positive number of bytes per second"),
])
def test_an_invalid_variable_is_refused_by_name_before_any_request(dropping, monkeypatch,
                                                                    var, value, want):
    remote = Remote()
    monkeypatch.setenv(var, value)
    with pytest.raises(ValueError) as e:
        remote.cat(dropping.url())
    assert var in str(e.value) and want in str(e.value) and repr(value) in str(e.value)
    assert dropping.count() == 0
    with pytest.raises(ValueError, match=var):
        call_bound()


def test_an_invalid_explicit_value_is_refused_when_given():
    with pytest.raises(ValueError, match="remote_retries"):
        Remote(retries=-1)
    with pytest.raises(ValueError, match="backoff"):
        Remote(backoff=float("nan"))


def test_the_command_line_names_the_variable(dropping):
    env = {"GLUON_DATA_REMOTE_CONNECT_TIMEOUT": "never"}
    out = subprocess.run([sys.executable, "-m", "gluon_data", "info", dropping.url()],
                         capture_output=True, text=True, timeout=120,
                         env=dict(os.environ, **env))
    assert out.returncode == 1, out.stderr[-2000:]
    assert out.stderr.startswith("gluon-data: error: GLUON_DATA_REMOTE_CONNECT_TIMEOUT"), \
        out.stderr[-2000:]
    assert dropping.count() == 0


def test_timeouts_and_bounds_follow_the_environment_now(monkeypatch):
    pytest.importorskip("s3fs")
    remote = Remote({"key": "k", "secret": "s"})
    monkeypatch.setenv("GLUON_DATA_REMOTE_CONNECT_TIMEOUT", "1.5")
    monkeypatch.setenv("GLUON_DATA_REMOTE_READ_TIMEOUT", "2.5")
    monkeypatch.setenv("GLUON_DATA_REMOTE_RETRIES", "2")
    monkeypatch.setenv("GLUON_DATA_REMOTE_BACKOFF", "0.5")
    fs, _ = remote.fs("s3://bucket/x.rec")
    assert fs.config_kwargs["connect_timeout"] == 1.5
    assert fs.config_kwargs["read_timeout"] == 2.5
    assert fs.config_kwargs["retries"] == {"total_max_attempts": 1} and fs.retries == 1
    assert call_bound() == pytest.approx(3 * (1.5 + 2.5) + 0.5 + 1.0)
    monkeypatch.setenv("GLUON_DATA_REMOTE_CONNECT_TIMEOUT", "3")  # a new client, new timeouts
    assert remote.fs("s3://bucket/x.rec")[0].config_kwargs["connect_timeout"] == 3.0
    # storage_options' config_kwargs still win over the environment
    so = {"config_kwargs": {"connect_timeout": 0.25, "read_timeout": 0.25}}
    assert filesystem("s3://bucket/x", so)[0].config_kwargs["connect_timeout"] == 0.25
    assert call_bound(storage_options=so) == pytest.approx(3 * 0.5 + 0.5 + 1.0)


def test_the_policy_read_from_a_mapping():
    p = RetryPolicy.from_env(environ={"GLUON_DATA_REMOTE_RETRIES": " 2 ",
                                      "GLUON_DATA_REMOTE_BACKOFF": "4",
                                      "GLUON_DATA_REMOTE_MIN_RATE": ""})
    assert (p.retries, p.backoff, p.min_rate) == (2, 4.0, RetryPolicy().min_rate)
    assert p.sleeps() == (4.0, 8.0) and p.attempts == 3
    assert RetryPolicy(retries=6, backoff=1, max_sleep=10).sleeps()[-1] == 10
    assert RetryPolicy.from_env(retries=0, environ={"GLUON_DATA_REMOTE_RETRIES": "9"}).retries == 0
    assert p.attempt_limit(nbytes=2_000_000) == pytest.approx(10 + 60 + 2)


@pytest.mark.parametrize("retries", [0, 2])
def test_only_the_policy_retries_an_s3_call(dropping, monkeypatch, retries):
    """botocore (``max_attempts`` counts its retries: 1 was a second request) and
    aiobotocore's aiohttp session (a second send of an idempotent request) retried under
    the policy: a server that resets sees one request per attempt."""
    pytest.importorskip("s3fs")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "k")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s")
    monkeypatch.setenv("GLUON_DATA_REMOTE_RETRIES", str(retries))
    endpoint = "http://127.0.0.1:%d" % dropping.sock.getsockname()[1]
    remote = Remote({"endpoint_url": endpoint})
    with pytest.raises(RemoteConnectionError, match="after %d attempts" % (retries + 1)):
        remote.cat("s3://bucket/x.rec")
    assert dropping.count() == retries + 1
