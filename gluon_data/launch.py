"""Run an MXNet ``dist_sync`` job on this machine: scheduler, servers and workers as local
processes over loopback, through MXNet's own ``DMLC_*`` environment.

``tools/launch.py --launcher local`` does the same but needs dmlc-core's tracker, which the
pip MXNet wheel does not ship; this module needs nothing beyond MXNet. Every wait is bounded,
and every process it started (with its children, e.g. DataLoader workers) is killed on the
way out, whatever happens::

    python -m gluon_data.launch -n 2 -- python scripts/train_segmentation.py --kvstore dist_sync ...
"""
from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, NamedTuple, Optional, Sequence

__all__ = ["launch_local", "WorkerResult", "free_port"]

#: What a scheduler or server runs: importing MXNet with DMLC_ROLE set starts the node's
#: loop, which returns when the workers finish.
NODE = "import mxnet"


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


def launch_local(command: Sequence[str], num_workers: int = 2, num_servers: int = 1, *,
                 timeout: float = 300.0, env: Optional[Dict[str, str]] = None,
                 host: str = "127.0.0.1", python: str = sys.executable) -> List[WorkerResult]:
    """Run ``command`` as ``num_workers`` workers of one ``dist_sync`` job on ``host``.

    Parameters
    ----------
    command : sequence of str
        The worker's command line (e.g. ``[sys.executable, "train.py", "--kvstore",
        "dist_sync"]``); each worker learns its rank from ``mx.kv.create``.
    num_workers, num_servers : int
        Processes of each role (plus one scheduler).
    timeout : float, default 300
        Seconds the whole job may take; then every process is killed and ``TimeoutError``
        raised with the workers' output.
    env : dict, optional
        Extra environment for every node.

    Returns
    -------
    list of WorkerResult
        In start order (a worker's rank is assigned by the scheduler). A worker that fails
        makes the others wait at their next barrier, so the job is stopped as soon as one
        worker fails.

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
    port = free_port(host)
    base = dict(os.environ, **(env or {}))
    procs: List[subprocess.Popen] = []
    logs = []
    deadline = time.monotonic() + timeout

    def start(role, argv):
        log = tempfile.TemporaryFile()
        logs.append(log)
        procs.append(subprocess.Popen(
            argv, env=dict(base, **dmlc_env(role, num_workers, num_servers, port, host)),
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True))

    def output(i):
        logs[i].seek(0)
        return logs[i].read().decode("utf-8", "replace")

    try:
        start("scheduler", [python, "-c", NODE])
        for _ in range(num_servers):
            start("server", [python, "-c", NODE])
        first = len(procs)
        for _ in range(num_workers):
            start("worker", list(command))
        workers = procs[first:]
        while True:
            codes = [p.poll() for p in procs]  # every one, each time (no short circuit)
            if all(c is not None for c in codes[first:]):
                break
            if any(c not in (None, 0) for c in codes):
                break  # a worker failed (the others would wait for it at the next
                # barrier), or a scheduler or server died: the job cannot finish
            if time.monotonic() > deadline:
                text = "\n".join("--- worker %d:\n%s" % (i, output(first + i)[-3000:])
                                 for i in range(num_workers))
                raise TimeoutError("dist job did not finish in %.0f s\n%s" % (timeout, text))
            time.sleep(0.05)
        for p in procs[:first]:  # scheduler and servers stop once the workers are done
            if all(w.returncode == 0 for w in workers):
                try:
                    p.wait(max(1.0, min(20.0, deadline - time.monotonic())))
                except subprocess.TimeoutExpired:
                    pass
        return [WorkerResult(i, p.returncode if p.returncode is not None else -9,
                             output(first + i)) for i, p in enumerate(workers)]
    finally:
        for p in procs:
            _kill(p)
        for log in logs:
            log.close()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m gluon_data.launch", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-n", "--num-workers", type=int, default=2)
    p.add_argument("-s", "--num-servers", type=int, default=1)
    p.add_argument("--timeout", type=float, default=3600.0, help="seconds for the whole job")
    p.add_argument("command", nargs=argparse.REMAINDER, help="the worker command (after --)")
    args = p.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        p.error("give the worker command after --")
    results = launch_local(command, args.num_workers, args.num_servers, timeout=args.timeout)
    for r in results:
        sys.stdout.write("--- worker %d (exit %d)\n%s" % (r.worker, r.returncode, r.output))
    return 0 if all(r.returncode == 0 for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
