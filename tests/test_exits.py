"""How the gluon-data command ends: every run exits promptly with its status and no traceback,
whatever its worker processes were doing; a closed stdout, Ctrl-C and SIGTERM are quiet.

Every command here is a real subprocess; every wait is bounded and every process started is
stopped (each runs in its own session, killed as a group if a check fails)."""
import ast
import glob
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from gluon_data.cli import build_parser
from gluon_data.convert.sample import make_voc

STRESS = os.environ.get("GLUON_DATA_STRESS") == "1"


def _live_in_group(pgid):
    """Pids of the processes of group ``pgid`` still running (zombies, already ended but not
    yet reaped by whoever inherited them, are not counted)."""
    alive = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % d) as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            alive.append(int(d))
    return alive


def _no_leftovers(pgid, limit=15.0):
    deadline = time.monotonic() + limit
    while _live_in_group(pgid) and time.monotonic() < deadline:
        time.sleep(0.05)
    left = _live_in_group(pgid)
    if left:
        os.killpg(pgid, signal.SIGKILL)
        pytest.fail("processes left behind: %s" % left)


def _run(cmd, timeout, **kw):
    """Run ``cmd`` in its own session; (returncode, stdout, stderr, seconds); a run past
    ``timeout`` is killed with all its processes and fails the test."""
    t0 = time.monotonic()
    env = dict(kw.pop("env", os.environ), PYTHONFAULTHANDLER="1")  # stacks if it hangs
    proc = subprocess.Popen(cmd, stdout=kw.pop("stdout", subprocess.PIPE),
                            stderr=subprocess.PIPE, text=True, start_new_session=True, env=env,
                            **kw)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGABRT)  # every process of it dumps its threads' stacks
        try:
            out, err = proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
        pytest.fail("%s hung: still running after %d s\n--- stdout\n%s\n--- stderr\n%s"
                    % (cmd[3:5], timeout, (out or "")[-2000:], (err or "")[-6000:]))
    _no_leftovers(proc.pid)
    return proc.returncode, out, err, time.monotonic() - t0


# ---------------------------------------------------------------- workers and SIGTERM
_STUCK_WORKER = textwrap.dedent("""
    import ctypes, multiprocessing as mp, os, signal, sys, threading, time
    from gluon_data.cli import signals as cli

    def stuck(flag):
        open(flag, "w").close()
        mutex = ctypes.create_string_buffer(64)  # a zeroed (default) pthread mutex
        libc = ctypes.CDLL(None)
        libc.pthread_mutex_lock(mutex)
        libc.pthread_mutex_lock(mutex)  # waits on a futex for good, as a deadlocked library

    if __name__ == "__main__":
        signal.signal(signal.SIGTERM, cli._on_sigterm)  # as main() installs it
        cli._handler = cli.ProcessMark()
        pool = mp.get_context("fork").Pool(2)
        pool.apply_async(stuck, (sys.argv[1],))
        deadline = time.monotonic() + 60
        while not os.path.exists(sys.argv[1]) and time.monotonic() < deadline:
            time.sleep(0.01)
        procs = list(pool._pool)
        stop = threading.Thread(target=pool.terminate, daemon=True)
        stop.start()
        stop.join(10)
        print("TERMINATED" if not stop.is_alive() else "HUNG", [p.exitcode for p in procs])
        sys.stdout.flush()
        if stop.is_alive():
            for p in procs:
                p.kill()
        os._exit(0)
""")


def test_forked_workers_do_not_inherit_the_raising_sigterm_handler(tmp_path):
    """A pool forked by the command (Gluon's DataLoader forks its workers) is terminated the
    way multiprocessing does it, by SIGTERM, with one worker waiting in native code: every
    worker dies of that SIGTERM, at once, printing nothing. Inherited, the command's handler
    raised inside the idle worker (a traceback) and never ran in the stuck one (a Python
    handler runs between bytecodes), whose join then hung."""
    script = tmp_path / "stuck.py"
    script.write_text(_STUCK_WORKER)
    rc, out, err, _ = _run([sys.executable, str(script), str(tmp_path / "started")], 90)
    assert rc == 0 and out.startswith("TERMINATED "), (out, err[-3000:])
    codes = ast.literal_eval(out.split(" ", 1)[1])  # (the idle one may have left on the sentinel)
    assert -signal.SIGTERM in codes and set(codes) <= {0, -signal.SIGTERM}, out
    assert "Traceback" not in err, err[-3000:]


@pytest.mark.stress
@pytest.mark.slow
def test_demo_exits_cleanly_every_time(tmp_path):
    """``gluon-data demo`` (a 2-process conversion pool, then a 2-worker Gluon DataLoader)
    run again and again: every run ends with OK, exit status 0, within the bound, with no
    traceback and no process left. GLUON_DATA_STRESS=1: 50 runs of the full demo; by
    default a few runs of a smaller one."""
    runs = 50 if STRESS else int(os.environ.get("GLUON_DATA_DEMO_RUNS", "5"))
    small = [] if STRESS else ["--num-images", "16", "--epochs", "1"]
    for k in range(runs):
        rc, out, err, _ = _run([sys.executable, "-m", "gluon_data", "demo", "--workdir",
                                str(tmp_path / ("d%d" % k)), *small], 180)
        assert rc == 0 and "OK: " in out, (k, rc, out[-2000:], err[-3000:])
        assert "Traceback" not in err and "Exception ignored" not in err, (k, err[-3000:])


# ---------------------------------------------------------------- a closed stdout
@pytest.mark.parametrize("extra", [[], ["--json"]])
def test_closed_stdout_is_a_quiet_exit_141(voc_rec, extra):
    """stdout a pipe whose reader has gone (``gluon-data info X | head``, the reader closed
    before anything was written): status 141, as a tool stopped by SIGPIPE, and nothing on
    stderr (no error line, no traceback, no 'Exception ignored' at exit)."""
    r, w = os.pipe()
    os.close(r)
    try:
        rc, _, err, _ = _run([sys.executable, "-m", "gluon_data", "info", voc_rec, *extra], 120,
                             stdout=w)
    finally:
        os.close(w)
    assert (rc, err) == (141, ""), (rc, err[-3000:])


# ---------------------------------------------------------------- Ctrl-C of a Dask conversion
def test_ctrl_c_of_a_dask_conversion_is_quiet(tmp_path):
    """Ctrl-C (SIGINT to the whole process group, as a terminal sends it) while a
    ``--engine dask`` conversion is writing its shards: the command says to rerun with
    --resume and exits 130, within the bound, with no traceback from it or from the Dask
    worker processes, and leaves no process behind."""
    pytest.importorskip("dask.distributed")
    # enough items that the signal, 0.3 s after the first shard starts, lands while shards
    # are written, not in the process's exit after the manifest (a re-encode of 120 items
    # took 0.35 s from the first shard to the manifest)
    voc = make_voc(str(tmp_path / "VOC2012"), num_images=480, size_range=(40, 64), seed=3)
    out = str(tmp_path / "o.rec")
    cmd = [sys.executable, "-m", "gluon_data", "convert", voc, out, "--layout", "voc",
           "--split", "trainval", "--encoding", "png", "--shards", "12", "--engine", "dask",
           "--workers", "1", "--quiet"]
    for attempt in range(3):
        for f in glob.glob(str(tmp_path / "o*")):
            os.remove(f)
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)
        try:
            deadline = time.monotonic() + 120
            while (not glob.glob(str(tmp_path / "o-*.partial")) and proc.poll() is None
                   and time.monotonic() < deadline):
                time.sleep(0.02)
            converting = proc.poll() is None and glob.glob(str(tmp_path / "o-*.partial"))
            assert converting or proc.poll() is not None, "no shard started within 120 s"
            time.sleep(0.3)
            t0 = time.monotonic()
            os.killpg(proc.pid, signal.SIGINT)
            _, err = proc.communicate(timeout=60)
            took = time.monotonic() - t0
        except BaseException:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            raise
        _no_leftovers(proc.pid)
        if proc.returncode == 0 and os.path.exists(str(tmp_path / "o.shards.json")):
            continue  # finished before the signal: try again
        break
    else:
        pytest.skip("the conversion always finished before the signal")
    assert proc.returncode == 130, (proc.returncode, err[-3000:])
    assert "Traceback" not in err, err[-3000:]
    assert err.rstrip().endswith("interrupted; rerun the same command with --resume to "
                                 "continue"), err[-3000:]
    assert took < 30, took


# ---------------------------------------------------------------- help texts
def _subparsers():
    parser = build_parser()
    action = next(a for a in parser._actions if a.dest == "command")
    return action.choices


def test_help_names_each_default_once():
    """Every option of every command: at most one ``(default: ...)``, and no empty one
    (``None`` / ``False``)."""
    for name, sub in _subparsers().items():
        text = sub.format_help()
        entries = text.replace("\n  -", "\n\0-").split("\0")[1:]
        assert entries or not sub.add_help, name  # (bench: its own parser)
        for entry in entries:
            flat = " ".join(entry.split())
            assert flat.count("(default") <= 1, (name, flat)
            assert "(default: None)" not in flat and "(default: False)" not in flat, \
                (name, flat)


def test_convert_help_resume_covers_every_output():
    p = subprocess.run([sys.executable, "-m", "gluon_data", "convert", "--help"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    flat = " ".join(p.stdout.split())
    at = flat.index("--resume continue")
    resume = flat[at:flat.index(" --", at + 2)]  # up to the next flag
    assert ".lmdb" in resume and "upload" in resume and "(.rec output)" not in resume, resume


#: The command, with a line on stdout once the package is imported. A Ctrl-C that lands
#: before ``main``'s first instruction has run (in this script, or as ``main`` is entered: the
#: interpreter checks for signals on entering a function) exits 99 and is not counted; one
#: that escapes from inside ``main`` prints its traceback (the failure this test looks for).
EARLY = ("import sys, traceback\n"
         "try:\n"
         "    import gluon_data.cli as cli\n"
         "    print('ready', flush=True)\n"
         "    main = cli.main\n"
         "except KeyboardInterrupt:\n"
         "    sys.exit(99)\n"
         "try:\n"
         "    code = main(sys.argv[1:])\n"
         "except KeyboardInterrupt as e:\n"
         "    tb = e.__traceback__.tb_next\n"
         "    if tb is None or (tb.tb_next is None and\n"
         "                      tb.tb_lineno == main.__code__.co_firstlineno):\n"
         "        sys.exit(99)\n"
         "    raise\n"
         "sys.exit(code)\n")


LATE = ("import os, signal, sys, time\n"
        "from gluon_data.cli import main\n"
        "class Late:\n"
        "    def __del__(self):  # run as the interpreter frees this module, once it has\n"
        "        os.kill(os.getpid(), signal.SIGINT)  # given SIGINT its default action back\n"
        "        time.sleep(0.2)\n"
        "late = Late()\n"
        "sys.exit(main())\n")


@pytest.mark.parametrize("missing,status", [(False, 0), (True, 1)])
def test_ctrl_c_while_the_interpreter_exits_keeps_the_status(voc_rec, tmp_path, missing,
                                                              status):
    """A Ctrl-C that lands once the command has ended, while the interpreter exits (here as
    it frees the script's module, when Python has given SIGINT its default action back),
    leaves the command's exit status, success or error, instead of killing the process by
    the signal (-SIGINT: a finished conversion would look interrupted)."""
    path = str(tmp_path / "none.rec") if missing else voc_rec
    code, out, err, _ = _run([sys.executable, "-c", LATE, "info", path], timeout=120)
    assert code == status, (code, err[-2000:])
    assert "Traceback" not in err, err[-2000:]
    assert ("none.rec" in err) if missing else ("records" in out), (out, err)


@pytest.mark.parametrize("command", ["info", "verify", "show"])
def test_ctrl_c_during_imports_and_parsing_is_quiet(voc_rec, command, tmp_path):
    """A Ctrl-C at any moment from the first line of ``main`` on -- while the commands'
    modules import and the arguments parse, the first ~0.5 s of every command -- ends it with
    one line and exit 130 (or lets it finish), never a traceback. Bounded by count: 6 runs
    with the signal from 0 to 0.5 s after the package is imported."""
    extra = ["--index", "0", "--out", str(tmp_path / "s.png")] if command == "show" else []
    codes = []
    for delay in (0.0, 0.05, 0.1, 0.2, 0.3, 0.5):
        p = subprocess.Popen([sys.executable, "-c", EARLY, command, voc_rec] + extra,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            assert p.stdout.readline().strip() == "ready"
            time.sleep(delay)
            p.send_signal(signal.SIGINT)
            _, err = p.communicate(timeout=120)
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
        assert "Traceback" not in err, (delay, err)
        # 0/1: it finished first; -SIGINT: the signal came as the interpreter exited; 99: it
        # came before main (in this test's own script)
        assert p.returncode in (0, 1, 99, 130, -signal.SIGINT), (delay, p.returncode, err)
        if p.returncode == 130:
            assert err.strip().endswith("gluon-data: interrupted"), err
        codes.append(p.returncode)
    assert codes.count(130) >= 2, codes  # most land while the commands' modules import


OPENING = textwrap.dedent("""
    import json, os, signal, sys
    from gluon_data.storage.fileio import open_regular
    from gluon_data.storage.fsutil import open_new

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGALRM, interrupt)
    path, which, runs = sys.argv[1], sys.argv[2], int(sys.argv[3])
    open(path, "wb").close()
    seen = {}
    for i in range(runs):
        try:
            try:
                signal.setitimer(signal.ITIMER_REAL, 5e-6 * (1 + i % 20))
                f = (open_new(path, "w", encoding="ascii", newline="\\n") if which == "new"
                     else open_regular(path, "rb"))
                f.close()
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
            what = "opened"
        except KeyboardInterrupt:
            what = "interrupted"
        except OSError as e:
            what = "%s: %s" % (type(e).__name__, e)
        seen[what] = seen.get(what, 0) + 1
    print(json.dumps(seen))
""")


@pytest.mark.parametrize("which", ["new", "regular"])
def test_ctrl_c_while_a_file_opens_stays_a_ctrl_c(tmp_path, which):
    """An interrupt that lands while gluon-data opens a file (an output: ``open_new``; an
    input: ``open_regular``) is a ``KeyboardInterrupt``, never an ``OSError``: the file object
    owns its descriptor from the moment it exists, so nothing closes it a second time (a
    conversion's Ctrl-C once ended in "writing failed: Bad file descriptor" that way).
    A timer raises the interrupt at 5-100 microseconds into each of 2,000 opens."""
    import json
    code, out, err, _ = _run([sys.executable, "-c", OPENING, str(tmp_path / "f"), which,
                              "2000"], timeout=300)
    assert code == 0, err[-2000:]
    seen = json.loads(out)
    assert set(seen) <= {"opened", "interrupted"}, seen
    assert seen.get("interrupted", 0) >= 100, seen  # the interrupts did land


INTERRUPTED = textwrap.dedent("""
    import os, signal, sys, threading, time
    from gluon_data.cli import main

    def written(path):
        try:
            return os.path.getsize(path) > 0
        except OSError:
            return False

    def interrupt_once(path):  # Ctrl-C once ``path`` holds bytes (polled, 60 s at most)
        deadline = time.monotonic() + 60
        while not written(path) and time.monotonic() < deadline:
            time.sleep(0.001)
        os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=interrupt_once, args=(sys.argv[1],), daemon=True).start()
    sys.exit(main(sys.argv[2:]))
""")


def _interrupted_setup(tmp_path, every):
    """``(source, output, environment, when)`` of a conversion interrupted once ``when``
    holds bytes: the first checkpoint with ``every`` (a checkpoint every N items), else the
    partial output (records written, no checkpoint due yet)."""
    voc = make_voc(str(tmp_path / "VOC2012"), num_images=300, size_range=(64, 96), seed=3)
    out = str(tmp_path / "o.rec")
    env = dict(os.environ)
    env.pop("GLUON_DATA_CHECKPOINT_EVERY", None)
    if every:
        env["GLUON_DATA_CHECKPOINT_EVERY"] = every
    return voc, out, env, out + (".resume.json" if every else ".partial")


@pytest.mark.parametrize("every", [None, "2"])
def test_an_interrupted_conversion_says_whether_resume_can_continue(tmp_path, every):
    """Ctrl-C during a conversion: with a checkpoint taken, the last line says to rerun with
    --resume, and the checkpoint is there; before the first checkpoint (the default takes one
    after 64 items and 5 s), it says nothing was kept, and nothing is left to resume from."""
    voc, out, env, when = _interrupted_setup(tmp_path, every)
    code, _, err, _ = _run([sys.executable, "-c", INTERRUPTED, when, "convert", voc, out,
                            "--layout", "voc", "--split", "trainval", "--encoding", "png",
                            "--quiet"], timeout=300, env=env)
    assert code == 130, err[-2000:]
    last = err.strip().splitlines()[-1]
    checkpoint = os.path.exists(out + ".resume.json")
    if every:
        assert checkpoint and last.endswith("rerun the same command with --resume to continue")
    else:
        assert not checkpoint and "nothing was kept" in last and "--resume" not in last, last
        assert not os.path.exists(out) and not os.path.exists(out + ".partial")


INTERRUPTED_CALL = INTERRUPTED.replace(
    "sys.exit(main(sys.argv[2:]))\n",
    "from gluon_data import convert\n"
    "try:\n"
    "    convert(*sys.argv[2:5], split='trainval', encoding='png')\n"
    "except KeyboardInterrupt as e:\n"
    "    print('\\n'.join(getattr(e, '__notes__', [])))\n")
assert INTERRUPTED_CALL != INTERRUPTED


@pytest.mark.parametrize("every", [None, "2"])
def test_an_interrupted_convert_call_carries_a_note_saying_what_was_kept(tmp_path, every):
    """From Python, the KeyboardInterrupt that stopped ``convert()`` carries a note (printed
    under its traceback) saying whether ``resume=True`` continues from a checkpoint."""
    voc, out, env, when = _interrupted_setup(tmp_path, every)
    code, out_text, err, _ = _run([sys.executable, "-c", INTERRUPTED_CALL, when, voc, out,
                                   "voc"], timeout=300, env=env)
    assert code == 0, err[-2000:]
    assert out_text.strip() == ("gluon-data: a checkpoint was kept: the same call with "
                                "resume=True continues" if every else
                                "gluon-data: stopped before its first checkpoint: nothing "
                                "was kept"), out_text
