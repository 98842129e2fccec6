"""A static HTTP server on 127.0.0.1 serving one folder, with byte ranges (for the tests).

Python's ``http.server`` answers every GET with the whole file; object stores and CDNs answer
``Range: bytes=a-b`` with ``206 Partial Content``. This handler does, for GET and HEAD, with
``Content-Length``, ``Accept-Ranges``, an ``ETag`` and ``Last-Modified`` from the file's
stat (what fsspec's HTTP filesystem reads as the object's size and version). It serves
files only: no directory listings, no writes. Every request is logged (method, path,
range, bytes sent); each connection has a socket timeout, and :meth:`RangeServer.stop`
shuts the server down within a bounded time.
"""
import email.utils
import os
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlsplit

_RANGE = re.compile(r"^bytes=(\d*)-(\d*)$")
CHUNK = 1 << 16


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as aiohttp expects
    timeout = 10  # seconds a connection may sit idle (bounds every read of a request)

    def log_message(self, *args):  # quiet: requests go to server.log instead
        pass

    def _file(self):
        root = self.server.root
        rel = unquote(urlsplit(self.path).path).lstrip("/")
        path = os.path.realpath(os.path.join(root, rel))
        if not (path == root or path.startswith(root + os.sep)) or not os.path.isfile(path):
            return None
        return path

    def _answer(self, head_only: bool):
        path = self._file()
        if path is None:
            self.server.log.append((self.command, self.path, None, 0))
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        st = os.stat(path)
        size, start, end = st.st_size, 0, st.st_size  # [start, end)
        status = 200
        header = self.headers.get("Range")
        if header:
            m = _RANGE.match(header.strip())
            first, last = (m.group(1), m.group(2)) if m else ("", "")
            if m and first:
                start, end = int(first), min(size, int(last) + 1 if last else size)
            elif m and last:  # a suffix: the last N bytes
                start = max(0, size - int(last))
            if not m or (not first and not last) or start >= size or start >= end:
                self.server.log.append((self.command, self.path, header, 0))
                self.send_response(416)
                self.send_header("Content-Range", "bytes */%d" % size)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            status = 206
        self.server.log.append((self.command, self.path, header,
                                0 if head_only else end - start))
        self.send_response(status)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(end - start))
        self.send_header("Accept-Ranges", "bytes")
        if self.server.etag:  # (Python's http.server sends none: Last-Modified alone)
            self.send_header("ETag", '"%x-%x-%x"' % (st.st_ino, st.st_size, st.st_mtime_ns))
        self.send_header("Last-Modified", email.utils.formatdate(st.st_mtime, usegmt=True))
        if status == 206:
            self.send_header("Content-Range", "bytes %d-%d/%d" % (start, end - 1, size))
        self.end_headers()
        if head_only:
            return
        with open(path, "rb") as f:
            f.seek(start)
            left = end - start
            while left > 0:
                data = f.read(min(CHUNK, left))
                if not data:
                    break
                self.wfile.write(data)
                left -= len(data)

    def do_GET(self):
        self._answer(head_only=False)

    def do_HEAD(self):
        self._answer(head_only=True)


class RangeServer:
    """Serve ``root`` on ``127.0.0.1`` (a free port) in a background thread.

    ``url`` is the base (``http://127.0.0.1:PORT``); ``log`` lists ``(method, path, Range
    header or None, bytes sent)``. ``etag=False``: no ETag header, as Python's own
    ``http.server``. Use as a context manager, or call :meth:`stop`."""

    def __init__(self, root: str, etag: bool = True):
        self.root = os.path.realpath(root)
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self._httpd.daemon_threads = True
        self._httpd.root, self._httpd.log, self._httpd.etag = self.root, [], etag
        self._thread = threading.Thread(target=self._httpd.serve_forever,
                                        kwargs={"poll_interval": 0.1},
                                        name="http-range-server", daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return "http://127.0.0.1:%d" % self._httpd.server_address[1]

    @property
    def log(self):
        return self._httpd.log

    def stop(self, timeout: float = 10.0) -> None:
        done = threading.Thread(target=self._httpd.shutdown, daemon=True)
        done.start()
        done.join(timeout)
        self._thread.join(timeout)
        self._httpd.server_close()
        assert not self._thread.is_alive(), "the HTTP test server did not stop"

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()
