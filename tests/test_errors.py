"""Clear errors, and conversions that resume after every failure.

Every bad input or option a user can give gets one line naming the file or the option, exit
status 1, and leaves nothing behind that a later ``--resume`` would refuse. A conversion
that fails, fills the disk or is interrupted after a checkpoint continues with ``--resume``
to the same bytes as an uninterrupted run; an interrupt ends a multi-worker run within
seconds with its workers reaped.
"""
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time

import pytest

from gluon_data import SegmentationRecordDataset
from gluon_data import convert
from gluon_data.convert.sample import make_voc

pytestmark = pytest.mark.reliability
STRESS = os.environ.get("GLUON_DATA_STRESS") == "1"


def cli(*args, timeout=180, env=None, cwd=None):
    return subprocess.run([sys.executable, "-m", "gluon_data", *args], capture_output=True,
                          text=True, timeout=timeout, cwd=cwd,
                          env=dict(os.environ, **(env or {})))


def one_line_error(p, *needles):
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 1, (p.returncode, p.stderr[-3000:])
    assert len(lines) == 1 and lines[0].startswith("gluon-data: error: "), p.stderr[-3000:]
    for n in needles:
        assert n in lines[0], (n, lines[0])
    return lines[0]


def leftovers(folder):
    return sorted(f for f in os.listdir(folder) if f.endswith((".partial", ".resume.json"))
                  or ".partial" in f or ".resume" in f)


def rec_bytes(path):
    stem = path[:-4]
    return {ext: open(stem + ext, "rb").read() for ext in (".rec", ".idx")}


def norm_meta(meta):
    meta = dict(meta)
    meta.pop("created_by", None)
    return meta


@pytest.fixture(scope="module")
def voc40(tmp_path_factory):
    return make_voc(str(tmp_path_factory.mktemp("voc40") / "VOC2012"), num_images=40,
                    size_range=(40, 56), seed=5)


# ---------------------------------------------------------------- options and outputs
def test_bad_options_are_one_line_and_leave_nothing(voc_root, tmp_path):
    out = str(tmp_path / "o.rec")
    for args, needle in ((["--resize", "-5"], "--resize"), (["--quality", "1000"], "--quality"),
                         (["--workers", "0"], "--workers"),
                         (["--max-pixels", "0"], "--max-pixels"),
                         (["--max-file-bytes", "-1"], "--max-file-bytes"),
                         (["--ignore-label", "70000"], "--ignore-label")):
        p = cli("convert", voc_root, out, "--layout", "voc", "--quiet", *args)
        line = one_line_error(p, needle)
        assert str(args[1]) in line
    assert os.listdir(tmp_path) == []


def test_unusable_outputs_are_one_line(voc_root, tmp_path):
    d = tmp_path / "adir"
    d.mkdir()
    (d / "mine.txt").write_text("keep")
    one_line_error(cli("convert", voc_root, str(d), "--layout", "voc", "--quiet"),
                   "output is a directory", str(d))
    assert os.listdir(d) == ["mine.txt"]
    one_line_error(cli("convert", voc_root, "", "--layout", "voc", "--quiet"),
                   "output name is empty")
    f = tmp_path / "afile.lmdb"
    f.write_text("not a directory")
    one_line_error(cli("convert", voc_root, str(f), "--layout", "voc", "--quiet"),
                   "not a directory", str(f))
    one_line_error(cli("convert", voc_root, str(f / "x.rec"), "--layout", "voc", "--quiet"),
                   "not a directory")
    assert sorted(os.listdir(tmp_path)) == ["adir", "afile.lmdb"]


@pytest.mark.parametrize("line, needle", [
    ("-1\t0\tcat/000.jpg", "index -1 out of range"),
    ("12345678901234567890\t0\tcat/000.jpg", "index 12345678901234567890 out of range"),
    ("0\tnan\tcat/000.jpg", "not a finite"),
    ("0\tinf\tcat/000.jpg", "not a finite"),
    ("0\t1e39\tcat/000.jpg", "not a finite float32"),
])
def test_bad_lst_lines_are_one_line(folder_root, tmp_path, line, needle):
    lst = tmp_path / "bad.lst"
    lst.write_text("1\t0\tcat/001.jpg\n" + line + "\n")
    out = tmp_path / "out"
    out.mkdir()
    p = cli("convert", str(lst), str(out / "o.rec"), "--layout", "lst", "--root", folder_root,
            "--quiet")
    one_line_error(p, needle, "bad.lst line 2")
    assert os.listdir(out) == []


@pytest.mark.parametrize("field, value", [("classes", 5), ("num_classes", "21"),
                                          ("ignore_label", "255"), ("palette", [[1, 2]]),
                                          ("class_pixels", {"0": "many"}),
                                          ("num_records", True)])
def test_metadata_fields_of_the_wrong_type_are_one_line(voc_rec, tmp_path, field, value):
    dst = str(tmp_path / "v.rec")
    for ext in (".rec", ".idx", ".meta.json"):
        shutil.copy(voc_rec[:-4] + ext, dst[:-4] + ext)
    mp = dst[:-4] + ".meta.json"
    meta = json.load(open(mp))
    meta[field] = value
    json.dump(meta, open(mp, "w"))
    needle = repr(field) if field != "num_records" else field
    for cmd in (["info", dst], ["stats", dst], ["show", dst, "--out", str(tmp_path / "s.png")]):
        one_line_error(cli(*cmd), mp, needle)
    p = cli("verify", dst)  # the verdict on stdout, one BAD line per problem on stderr
    assert p.returncode == 1 and "1 problem(s)" in p.stdout and "BAD" not in p.stdout
    assert [ln for ln in p.stderr.splitlines()
            if "BAD" in ln and mp in ln and needle in ln], p.stderr
    assert not os.path.exists(tmp_path / "s.png")


# ---------------------------------------------------------------- real mounts
def _unshare(script, code, timeout=240):
    if not shutil.which("unshare"):
        pytest.skip("unshare not available")
    p = subprocess.run(["unshare", "-rm", "sh", "-c", script], capture_output=True, text=True,
                       env=dict(os.environ, CODE=code), timeout=timeout)
    if p.returncode != 0 and "mount" in p.stderr and "STEP" not in p.stdout:
        pytest.skip("cannot mount here: %s" % p.stderr.strip()[-200:])
    return p


def test_read_only_output_folder_is_one_line(voc_root, tmp_path):
    src, mnt = tmp_path / "src", tmp_path / "mnt"
    src.mkdir()
    mnt.mkdir()
    code = ("import subprocess, sys\n"
            "for out in (%r, %r):\n"
            "    p = subprocess.run([sys.executable, '-m', 'gluon_data', 'convert', %r, out, "
            "'--layout', 'voc', '--quiet', '--workers', '1'], capture_output=True, text=True)\n"
            "    print('STEP', p.returncode, repr(p.stderr.strip()))\n"
            % (str(mnt / "o.rec"), str(mnt / "o.lmdb"), voc_root))
    script = ("mount --bind %s %s && mount -o remount,bind,ro %s && %s -c \"$CODE\""
              % (src, mnt, mnt, sys.executable))
    p = _unshare(script, code)
    steps = [ln for ln in p.stdout.splitlines() if ln.startswith("STEP")]
    assert len(steps) == 2, p.stdout + p.stderr[-2000:]
    for step in steps:
        rc, err = step.split(" ", 2)[1:]
        assert rc == "1" and "\\n" not in err, step
        assert "gluon-data: error:" in err and "Read-only file system" in err \
            and str(mnt) in err, step
    assert os.listdir(src) == []


def _disk_full_then_resume(src_dir, ref, out_name, tmp_path, size_k, every=4, extra=()):
    """Fill a small tmpfs mid-conversion, grow it, resume; return the step lines."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    out = str(mnt / out_name)
    code = ("import os, subprocess, sys\n"
            "cmd = [sys.executable, '-m', 'gluon_data', 'convert', %r, %r, '--layout', 'voc',"
            " '--split', 'trainval', '--encoding', 'raw', '--quiet', '--workers', '1'] + %r\n"
            "env = dict(os.environ, GLUON_DATA_CHECKPOINT_EVERY='%d')\n"
            "p = subprocess.run(cmd, capture_output=True, text=True, env=env)\n"
            "print('STEP1', p.returncode, repr(p.stderr.strip()))\n"
            "print('LEFT', sorted(os.listdir(%r)))\n"
            "subprocess.run(['mount', '-o', 'remount,size=64m', %r], check=True)\n"
            "p = subprocess.run(cmd + ['--resume'], capture_output=True, text=True, env=env)\n"
            "print('STEP2', p.returncode, repr(p.stderr.strip()[-500:]))\n"
            "import shutil\n"
            "shutil.copytree(%r, %r, dirs_exist_ok=True)\n"
            % (src_dir, out, list(extra), every, str(mnt), str(mnt), str(mnt),
               str(tmp_path / "copied")))
    script = "mount -t tmpfs -o size=%dk tmpfs %s && %s -c \"$CODE\"" % (size_k, mnt,
                                                                      sys.executable)
    p = _unshare(script, code)
    lines = {ln.split(" ", 1)[0]: ln for ln in p.stdout.splitlines()}
    assert "STEP2" in lines, p.stdout + p.stderr[-3000:]
    return lines, str(tmp_path / "copied" / out_name)


def test_disk_full_rec_is_one_line_and_resumes_to_the_same_bytes(voc40, tmp_path):
    ref = str(tmp_path / "ref" / "v.rec")
    convert(voc40, ref, "voc", split="trainval", encoding="raw")
    lines, got = _disk_full_then_resume(voc40, ref, "v.rec", tmp_path, 160)
    assert lines["STEP1"].startswith("STEP1 1 'gluon-data: error:"), lines
    assert "No space left on device" in lines["STEP1"] and "--resume" in lines["STEP1"]
    assert "v.rec.resume.json" in lines["LEFT"], lines  # a checkpoint to continue from
    assert lines["STEP2"].startswith("STEP2 0"), lines
    assert rec_bytes(got) == rec_bytes(ref)


def test_disk_full_lmdb_is_one_line_and_resumes(voc40, tmp_path):
    ref = str(tmp_path / "ref" / "v.rec")
    convert(voc40, ref, "voc", split="trainval", encoding="raw")
    lines, got = _disk_full_then_resume(voc40, ref, "v.lmdb", tmp_path, 320)
    assert lines["STEP1"].startswith("STEP1 1 'gluon-data: error:"), lines
    assert "v.lmdb" in lines["STEP1"] and "disk may be full" in lines["STEP1"], lines
    assert "v.lmdb.partial" in lines["LEFT"], lines
    assert lines["STEP2"].startswith("STEP2 0"), lines
    back = str(tmp_path / "back.rec")
    convert(got, back, split="trainval")
    assert rec_bytes(back) == rec_bytes(ref)


def test_disk_full_before_any_checkpoint_leaves_nothing(voc40, tmp_path):
    lines, _ = _disk_full_then_resume(voc40, None, "v.rec", tmp_path, 48, every=1000)
    assert lines["STEP1"].startswith("STEP1 1 'gluon-data: error:"), lines
    assert lines["LEFT"] == "LEFT []", lines
    assert lines["STEP2"].startswith("STEP2 0"), lines  # --resume with nothing: a fresh run


# ---------------------------------------------------------------- resume after failures
def test_failure_mid_conversion_resumes_with_the_source_spelled_differently(voc40, tmp_path):
    """A bad item after the first checkpoint fails the run; once it is fixed, ``--resume``
    continues (the source given relative instead of absolute) to the same bytes."""
    ref = str(tmp_path / "ref.rec")
    convert(voc40, ref, "voc", split="trainval")
    src = tmp_path / "work" / "VOC2012"
    shutil.copytree(voc40, src)
    bad = src / "JPEGImages" / "2007_000030.jpg"
    good = bad.read_bytes()
    bad.write_bytes(good[:len(good) // 2])  # truncated: a corrupt image at position 30
    out = str(tmp_path / "o.rec")
    env = {"GLUON_DATA_CHECKPOINT_EVERY": "8"}
    p = cli("convert", str(src), out, "--layout", "voc", "--split", "trainval", "--quiet",
            "--workers", "1", env=env)
    one_line_error(p, "2007_000030.jpg", "--resume")
    assert os.path.exists(out + ".resume.json") and os.path.exists(out + ".partial")
    bad.write_bytes(good)
    p = cli("convert", "VOC2012", out, "--layout", "voc", "--split", "trainval", "--quiet",
            "--workers", "1", "--resume", env=env, cwd=str(tmp_path / "work"))
    assert p.returncode == 0, p.stderr[-2000:]
    assert rec_bytes(out) == rec_bytes(ref)
    assert leftovers(str(tmp_path)) == []


def _wait_for(path, proc, limit=120.0):
    t0 = time.monotonic()
    while not os.path.exists(path):
        if proc.poll() is not None or time.monotonic() - t0 > limit:
            return False
        time.sleep(0.005)
    return True


def _wait_progress(out, proc, limit=60.0):
    """Until the partial LMDB holds a committed checkpoint (read lock-free, read-only)."""
    from gluon_data.stores.lmdbio import LMDBWriter
    t0 = time.monotonic()
    while proc.poll() is None and time.monotonic() - t0 < limit:
        try:
            if LMDBWriter.read_progress(out) is not None:
                return True
        except Exception:  # caught mid-creation: look again
            pass
        time.sleep(0.005)
    return False


@pytest.mark.parametrize("sig, rc", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
@pytest.mark.parametrize("fmt", ["rec", "lmdb"])
def test_interrupt_keeps_a_resumable_checkpoint(voc40, tmp_path, sig, rc, fmt):
    ref = str(tmp_path / "ref.rec")
    convert(voc40, ref, "voc", split="trainval", encoding="png")
    out = str(tmp_path / ("o." + fmt))
    cmd = [sys.executable, "-m", "gluon_data", "convert", voc40, out, "--layout", "voc",
           "--split", "trainval", "--encoding", "png", "--quiet", "--workers", "1"]
    env = dict(os.environ, GLUON_DATA_CHECKPOINT_EVERY="2")
    for attempt in range(5):
        proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, env=env)
        marker = out + (".resume.json" if fmt == "rec" else ".partial/data.mdb")
        checkpointed = _wait_for(marker, proc) and (fmt == "rec" or _wait_progress(out, proc))
        proc.send_signal(sig)
        err = proc.communicate(timeout=60)[1]
        if proc.returncode == rc and checkpointed:
            # the partial output and its checkpoint are kept for --resume
            assert os.path.exists(out + ".partial") and (
                fmt == "lmdb" or os.path.exists(out + ".resume.json")), os.listdir(tmp_path)
            break
        if proc.returncode == rc:  # interrupted before a checkpoint: nothing may be left
            assert leftovers(str(tmp_path)) == [], os.listdir(tmp_path)
            continue
        # only a run that had finished (or was exiting after finishing) may dodge the signal
        done = os.path.exists(os.path.join(out, "data.mdb") if fmt == "lmdb"
                              else out[:-4] + ".meta.json")
        assert proc.returncode in (0, -sig) and done, (proc.returncode, err)
        if os.path.isdir(out):
            shutil.rmtree(out)
        for e in (".rec", ".idx", ".meta.json", ".idx.gdx"):
            if fmt == "rec" and os.path.exists(out[:-4] + e):
                os.remove(out[:-4] + e)
    else:
        pytest.skip("the conversion always finished before the signal")
    assert "--resume" in err
    p = subprocess.run(cmd + ["--resume"], capture_output=True, text=True, env=env,
                       timeout=180)
    assert p.returncode == 0, p.stderr[-2000:]
    if fmt == "lmdb":
        back = str(tmp_path / "back.rec")
        convert(out, back, split="trainval")
        out = back
    assert rec_bytes(out) == rec_bytes(ref)
    assert leftovers(str(tmp_path)) == []


# ---------------------------------------------------------------- Ctrl-C with workers
def _group_alive(pgid) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False


@pytest.mark.stress
@pytest.mark.slow
def test_ctrl_c_ends_a_multi_worker_conversion_every_time(tmp_path):
    """SIGINT to the whole process group (what a terminal's Ctrl-C does) at random moments
    of a 2-worker conversion: every run exits within the bound and leaves no process."""
    voc = make_voc(str(tmp_path / "VOC2012"), num_images=240, size_range=(40, 64), seed=2)
    runs = 40 if STRESS else int(os.environ.get("GLUON_DATA_CTRL_C_RUNS", "4"))
    rng = random.Random(1234)
    for k in range(runs):
        out = str(tmp_path / ("o%d.rec" % k))
        proc = subprocess.Popen([sys.executable, "-m", "gluon_data", "convert", voc, out,
                                 "--layout", "voc", "--split", "trainval", "--encoding", "png",
                                 "--quiet", "--workers", "2"],
                                stderr=subprocess.PIPE, text=True, start_new_session=True,
                                env=dict(os.environ, GLUON_DATA_CHECKPOINT_EVERY="4"))
        time.sleep(rng.uniform(0.5, 3.0))
        t0 = time.monotonic()
        try:
            os.killpg(proc.pid, signal.SIGINT)
        except ProcessLookupError:
            pass
        try:
            err = proc.communicate(timeout=20)[1]
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            pytest.fail("run %d did not exit within 20 s of SIGINT" % k)
        waited = time.monotonic() - t0
        # 130: interrupted and cleaned up; 0: finished first; -SIGINT: interrupted while
        # Python was still starting (before any handler) or already shutting down; 1 with a
        # KeyboardInterrupt: interrupted inside an import (numpy turns it into ImportError)
        assert proc.returncode in (0, 130, -signal.SIGINT) or (
            proc.returncode == 1 and "KeyboardInterrupt" in err
            and "gluon_data/convert/" not in err), (k, proc.returncode, err[-3000:])
        deadline = time.monotonic() + 10
        while _group_alive(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        if _group_alive(proc.pid):
            os.killpg(proc.pid, signal.SIGKILL)
            pytest.fail("run %d left worker processes behind" % k)
        assert waited < 20
