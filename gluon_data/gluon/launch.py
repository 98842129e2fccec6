"""Run an MXNet ``dist_sync`` job on this machine: scheduler, servers and workers as local
processes over loopback, through MXNet's own ``DMLC_*`` environment.

``tools/launch.py --launcher local`` does the same but needs dmlc-core's tracker, which the
pip MXNet wheel does not ship; this module needs nothing beyond MXNet. Every process's output
is streamed as it comes, each line prefixed by its role and rank (``[scheduler]``,
``[server 0]``, ``[worker 1]``; worker N is the kvstore's rank N). When any process dies the
whole job is stopped at once with a message naming it, and the command exits non-zero; every
wait is bounded, and every process it started (with its children, e.g. DataLoader workers)
is killed on the way out, whatever happens::

    python -m gluon_data.gluon.launch -n 2 -- python scripts/train_segmentation.py --kvstore dist_sync ...
"""
from __future__ import annotations

import argparse
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import IO, Dict, List, NamedTuple, Optional, Sequence, TextIO, cast

__all__ = ["launch_local", "WorkerResult", "free_port"]

#: What a scheduler or server runs: importing MXNet with DMLC_ROLE set starts the node's
#: loop, which returns when the workers finish.
NODE = "import mxnet"

#: One line of output: ended by a newline, or by a carriage return (a progress bar's update).
_LINE = re.compile(rb"[^\r\n]*(?:\r\n|\r|\n)")


class WorkerResult(NamedTuple):
    """One worker's exit status and its output (stdout and stderr together)."""

    worker: int
    returncode: int
    output: str


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def dmlc_env(role: str, num_workers: int, num_servers: int, port: int,
             host: str = "127.0.0.1") -> Dict[str, str]:
    """The ``DMLC_*`` variables of one node of a job on ``host``."""
    return {"DMLC_ROLE": role, "DMLC_PS_ROOT_URI": host, "DMLC_PS_ROOT_PORT": str(port),
            "DMLC_NUM_SERVER": str(num_servers), "DMLC_NUM_WORKER": str(num_workers),
            "DMLC_NODE_HOST": host}


def _kill(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # its own session: it and its children
        except ProcessLookupError:
            pass
    try:
        proc.wait(5)
    except subprocess.TimeoutExpired:  # pragma: no cover - SIGKILL does not wait on us
        pass


def _free_ports(count: int, host: str) -> List[int]:
    """``count`` distinct TCP ports free on ``host`` right now, ascending."""
    socks = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            socks.append(s)
            s.bind((host, 0))
        return sorted(s.getsockname()[1] for s in socks)
    finally:
        for s in socks:
            s.close()


def _exit_text(code: int) -> str:
    if code < 0:
        try:
            return "was killed by %s" % signal.Signals(-code).name
        except ValueError:
            return "was killed by signal %d" % -code
    return "exited with code %d" % code


class _Reader(threading.Thread):
    """One process's output, read as it comes (a thread per pipe): all of it is kept, and
    with a ``sink`` each line (or progress-bar update, ended by ``\r``) is written to it at
    once, prefixed with the process's name."""

    def __init__(self, proc: subprocess.Popen, name: str, sink: Optional[TextIO],
                 lock: threading.Lock):
        super().__init__(name="output of " + name, daemon=True)
        self.proc, self.sink, self.lock = proc, sink, lock
        self.prefix = ("[%s] " % name).encode()
        self.data = bytearray()

    def run(self) -> None:
        # every process is started with stdout=PIPE (_Nodes.start): never None
        fd, pending = cast(IO[bytes], self.proc.stdout).fileno(), b""
        while True:
            try:
                chunk = os.read(fd, 65536)
            except OSError:
                break
            if not chunk:
                break
            self.data += chunk
            if self.sink is not None:
                pending += chunk
                lines = [m.group() for m in _LINE.finditer(pending)]
                pending = pending[sum(map(len, lines)):]
                self.emit(lines)
        if pending:
            self.emit([pending + b"\n"])

    def emit(self, lines) -> None:
        text = b"".join(self.prefix + line for line in lines if line != b"\r")
        if text and self.sink is not None:
            with self.lock:
                self.sink.write(text.decode("utf-8", "replace"))
                self.sink.flush()

    def output(self) -> str:
        return bytes(self.data).decode("utf-8", "replace")


def launch_local(command: Sequence[str], num_workers: int = 2, num_servers: int = 1, *,
                 timeout: float = 300.0, env: Optional[Dict[str, str]] = None,
                 host: str = "127.0.0.1", python: str = sys.executable,
                 stream: Optional[TextIO] = None) -> List[WorkerResult]:
    """Run ``command`` as ``num_workers`` workers of one ``dist_sync`` job on ``host``.

    Parameters
    ----------
    command : sequence of str
        The worker's command line (e.g. ``[sys.executable, "train.py", "--kvstore",
        "dist_sync"]``); each worker learns its rank from ``mx.kv.create``: worker ``i`` (in
        start order) gets rank ``i``.
    num_workers, num_servers : int
        Processes of each role (plus one scheduler).
    timeout : float, default 300
        Seconds the whole job may take; then every process is killed and ``TimeoutError``
        raised with the workers' output.
    env : dict, optional
        Extra environment for every node (``PYTHONUNBUFFERED=1`` is set unless given).
    stream : text file, optional
        Where every process's output goes as it comes, line by line, prefixed
        ``[scheduler]``, ``[server N]``, ``[worker N]``, plus ``[launch]`` lines saying why
        the job stopped (``python -m gluon_data.gluon.launch`` passes ``sys.stdout``).

    Returns
    -------
    list of WorkerResult
        By rank. A worker that fails makes the others wait at their next barrier forever,
        so the job is stopped as soon as any process fails (the others read -9).

    Examples
    --------
    >>> results = launch_local([sys.executable, "train.py", "--kvstore", "dist_sync"], 2)
    ... # doctest: +SKIP
    >>> [r.returncode for r in results]                                  # doctest: +SKIP
    [0, 0]
    """
    if num_workers < 1 or num_servers < 1:
        raise ValueError("a dist job needs >= 1 worker and >= 1 server, got %d and %d"
                         % (num_workers, num_servers))
    nodes = _Nodes(num_workers, num_servers, host, env, stream)
    deadline = time.monotonic() + timeout
    try:
        nodes.start("scheduler", "scheduler", [python, "-c", NODE])
        for i in range(num_servers):
            nodes.start("server", "server %d" % i, [python, "-c", NODE])
        first = len(nodes.procs)
        for i in range(num_workers):
            nodes.start("worker", "worker %d" % i, list(command))
        _wait(nodes.procs, nodes.readers, first, deadline, timeout, nodes.say)
        return [WorkerResult(i, p.returncode if p.returncode is not None else -9,
                             nodes.readers[first + i].output())
                for i, p in enumerate(nodes.procs[first:])]
    finally:
        nodes.close()


class _Nodes:
    """The processes of one local job: each started with its DMLC environment on a free
    port, its output read by a :class:`_Reader`; :meth:`close` kills and reaps them all."""

    def __init__(self, num_workers: int, num_servers: int, host: str,
                 env: Optional[Dict[str, str]], stream: Optional[TextIO]):
        self.num_workers, self.num_servers, self.host = num_workers, num_servers, host
        self.root, *self.ports = _free_ports(1 + num_servers + num_workers, host)
        self.base = {"PYTHONUNBUFFERED": "1"}
        self.base.update(os.environ)
        self.base.update(env or {})
        self.stream = stream
        self.procs: List[subprocess.Popen] = []
        self.readers: List[_Reader] = []
        self.lock = threading.Lock()

    def say(self, text: str) -> None:
        if self.stream is not None:
            with self.lock:
                self.stream.write("[launch] %s\n" % text)
                self.stream.flush()

    def start(self, role: str, name: str, argv: List[str]) -> None:
        # ps-lite ranks the nodes of a role by their port (PORT): ascending = start order
        node = dict(dmlc_env(role, self.num_workers, self.num_servers, self.root, self.host),
                    **({"PORT": str(self.ports.pop(0))} if role != "scheduler" else {}))
        self.procs.append(subprocess.Popen(
            argv, env=dict(self.base, **node), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True))
        self.readers.append(_Reader(self.procs[-1], name, self.stream, self.lock))
        self.readers[-1].start()

    def close(self) -> None:
        for p in self.procs:
            _kill(p)
        for r in self.readers:
            r.join(5)
            cast(IO[bytes], r.proc.stdout).close()  # stdout=PIPE, see start


def _wait(procs, readers, first, deadline, timeout, say) -> None:
    """Until every worker has exited (then the scheduler and servers, bounded), any process
    fails, or the deadline passes (``TimeoutError``)."""
    while True:
        codes = [p.poll() for p in procs]  # every one, each time (no short circuit)
        if all(c is not None for c in codes[first:]):
            break
        failed = [i for i, c in enumerate(codes) if c not in (None, 0)]
        if failed:  # a worker failed (the others would wait for it at the next barrier),
            # or a scheduler or server died: the job cannot finish
            i = failed[0]
            say("%s %s: stopping the job (killing the other processes)"
                % (readers[i].prefix.decode()[1:-2], _exit_text(codes[i])))
            return
        if time.monotonic() > deadline:
            for r in readers:
                r.join(0.2)
            say("the job did not finish in %.0f s: stopping it" % timeout)
            text = "\n".join("--- %s:\n%s" % (r.prefix.decode()[1:-2], r.output()[-3000:])
                             for r in readers[first:])
            raise TimeoutError("dist job did not finish in %.0f s\n%s" % (timeout, text))
        time.sleep(0.05)
    workers = procs[first:]
    for p in procs[:first]:  # scheduler and servers stop once the workers are done
        if all(w.returncode == 0 for w in workers):
            try:
                p.wait(max(1.0, min(20.0, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                pass
    bad = [(i, w.returncode) for i, w in enumerate(workers) if w.returncode != 0]
    if bad:
        say("worker %d %s" % (bad[0][0], _exit_text(bad[0][1])))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m gluon_data.gluon.launch", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-n", "--num-workers", type=int, default=2)
    p.add_argument("-s", "--num-servers", type=int, default=1)
    p.add_argument("--timeout", type=float, default=3600.0, help="seconds for the whole job")
    p.add_argument("command", nargs=argparse.REMAINDER, help="the worker command (after --)")
    args = p.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        p.error("give the worker command after --")
    # SIGTERM unwinds like Ctrl-C, so the processes started are killed on the way out
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        results = launch_local(command, args.num_workers, args.num_servers,
                               timeout=args.timeout, stream=sys.stdout)
    except TimeoutError:
        return 124
    codes = [r.returncode for r in results]
    ok = all(c == 0 for c in codes)
    print("[launch] %s: workers exited with %s" % ("done" if ok else "failed", codes),
          flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
