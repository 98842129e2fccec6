"""Shared fixtures: tiny real datasets written by our own converters and by stock im2rec."""
import ast
import importlib.util
import os
import re
import subprocess
import sys

import pytest

import gluon_data
from gluon_data import convert
from gluon_data.convert.sample import make_imagefolder, make_voc


HAS_MXNET = importlib.util.find_spec("mxnet") is not None
#: What a test module imports at module level that needs MXNet (the Gluon layer).
_GLUON_IMPORTS = ("mxnet", "gluoncv", "horovod", "gluon_data.gluon")


def _needs_mxnet(path) -> bool:
    """Whether a test module imports the Gluon layer or MXNet at module level: such a module
    belongs to the full lane only. Read with ``ast``, so nothing is imported to decide."""
    try:
        tree = ast.parse(open(path, encoding="utf-8").read())
    except (OSError, SyntaxError):
        return False
    for node in tree.body:
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            names = [node.module or ""]
            if node.module == "gluon_data":
                names += ["gluon_data.gluon" for a in node.names if a.name in gluon_data._GLUON]
        if any(n == g or n.startswith(g + ".") for n in names for g in _GLUON_IMPORTS):
            return True
        sibling = [os.path.join(os.path.dirname(path), n + ".py") for n in names
                   if n.startswith("test_")]  # a test module borrowing another's helpers
        if any(os.path.exists(s) and _needs_mxnet(s) for s in sibling):
            return True
    return False


def pytest_ignore_collect(collection_path, config):
    """The core lane (no MXNet installed) runs every test module that does not import the
    Gluon layer; tests inside it that need MXNet skip themselves (``importorskip``)."""
    if HAS_MXNET or collection_path.suffix != ".py" or not collection_path.name.startswith("test_"):
        return None
    return True if _needs_mxnet(collection_path) else None


def im2rec_script():
    """MXNet's own ``tools/im2rec.py``; skips the test where MXNet is not installed (the
    framework-free tests run without it, so nothing here imports it at module level)."""
    mx = pytest.importorskip("mxnet", reason="stock im2rec output needs MXNet")
    return os.path.join(os.path.dirname(mx.__file__), "tools", "im2rec.py")


def run_im2rec(root, prefix, *extra):
    """Run MXNet's own im2rec.py: list the folder, then pack it."""
    im2rec = im2rec_script()
    subprocess.run([sys.executable, im2rec, "--list", "--recursive", prefix, root],
                   check=True, capture_output=True)
    subprocess.run([sys.executable, im2rec, "--num-thread", "1", *extra, prefix, root],
                   check=True, capture_output=True)
    return prefix + ".rec"


@pytest.fixture(scope="session", autouse=True)
def _private_cache_dir(tmp_path_factory):
    """What gluon_data caches (downloaded objects, parsed stock indexes) goes to a temporary
    folder during the tests, never the user's ~/.cache (tests that need another set theirs)."""
    mp = pytest.MonkeyPatch()
    mp.setenv("GLUON_DATA_CACHE_DIR", str(tmp_path_factory.mktemp("gluon_data_cache")))
    yield
    mp.undo()


@pytest.fixture(scope="session")
def voc_root(tmp_path_factory):
    return make_voc(str(tmp_path_factory.mktemp("voc") / "VOC2012"), num_images=16,
                    size_range=(20, 48), seed=1)


@pytest.fixture(scope="session")
def voc_rec(voc_root, tmp_path_factory):
    out = str(tmp_path_factory.mktemp("voc_rec") / "voc.rec")
    convert(voc_root, out, "voc", split="trainval")
    return out


@pytest.fixture(scope="session")
def folder_root(tmp_path_factory):
    return make_imagefolder(str(tmp_path_factory.mktemp("folder") / "data"), per_class=4)


@pytest.fixture(scope="session")
def cls_rec(folder_root, tmp_path_factory):
    out = str(tmp_path_factory.mktemp("cls_rec") / "cls.rec")
    convert(folder_root, out, "imagefolder")
    return out


@pytest.fixture(scope="session")
def im2rec_rec(folder_root, tmp_path_factory):
    """A stock im2rec .rec (re-encoded JPEG, shuffled keys)."""
    return run_im2rec(folder_root, str(tmp_path_factory.mktemp("im2rec") / "stock"))


def torch_client_env() -> dict:
    """The environment of a PyTorch client subprocess: torch from the folder
    ``$GLUON_DATA_TORCH_PATH`` names (gluoncv refuses to import where torch >= 2 is, so torch
    lives outside the test environment), or the test skipped where there is none."""
    torch_path = os.environ.get("GLUON_DATA_TORCH_PATH")
    if not torch_path or not os.path.isdir(torch_path):
        pytest.skip("PyTorch is not installed for the client test (scripts/run.sh installs the "
                    "CPU build of torch 2.13.0 where it lies on this machine's disk, and names "
                    "it in GLUON_DATA_TORCH_PATH)")
    return dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (torch_path, os.environ.get("PYTHONPATH")) if p))


def same_output_bytes(a, b):
    """Two output files hold the same bytes, but for what a ``.idx.gdx`` records of the
    ``.idx`` beside it: that file's mtime (FORMAT.md §2), which differs between two runs
    whenever the binary index was written more than the racy interval after its ``.idx``,
    and the header checksum covering it (bytes 64:72)."""
    with open(a, "rb") as fa, open(b, "rb") as fb:
        da, db = fa.read(), fb.read()
    if a.endswith(".gdx") and len(da) == len(db) >= 72:
        da, db = (x[:16] + x[24:64] + x[72:] for x in (da, db))
    return da == db


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist
def pytest_xdist_auto_num_workers(config):
    """The workers of ``-n logical`` (pyproject.toml's addopts, capped at two there): none for
    a run of one test file, which then runs in this process (no workers to start, ``print``
    and ``--pdb`` as usual); xdist's count of the CPUs otherwise."""
    files = {str(a).split("::")[0] for a in config.args}
    if len(files) == 1 and next(iter(files)).endswith(".py"):
        return 0
    return None


# The longest files, longest first (650 s to 100 s each on 2 busy cores): they start first, so the
# two workers do not end on one of them while the other waits (the rest keep their order).
LONG_FILES = ("test_contract.py", "test_remote.py", "test_reliability.py", "test_errors.py",
              "test_bench.py", "test_installed_wheel.py", "test_distributed.py",
              "test_lmdb.py", "test_security.py")


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(LONG_FILES)}
    items.sort(key=lambda item: rank.get(item.path.name, len(LONG_FILES)))


# --------------------------------------------------------------------------- allowed skips
#: The skips a run may have (``bash scripts/run.sh test`` sets GLUON_DATA_STRICT_SKIPS=1).
ALLOWED_SKIPS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "allowed_skips.txt")
_SKIPPED = []  # (test or module, reason): every skip of this run


def allowed_skips(environ=os.environ, has_mxnet=HAS_MXNET):
    """The patterns of :data:`ALLOWED_SKIPS` that hold here (each line: WHEN, a regex)."""
    holds = {"any": True, "core": not has_mxnet, "full": has_mxnet,
             "unbuilt": environ.get("GLUON_DATA_BUILD_EXT") != "1",
             "notorch": environ.get("GLUON_DATA_TORCH_ABSENT") == "1"}
    patterns = []
    with open(ALLOWED_SKIPS, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            when, _, pattern = line.strip().partition(" ")
            if when not in holds or not pattern.strip():
                raise ValueError("%s, line %d: expected WHEN (one of %s) and a pattern"
                                 % (ALLOWED_SKIPS, n, ", ".join(holds)))
            if holds[when]:
                patterns.append(re.compile(pattern.strip()))
    return patterns


def skip_reason(report) -> str:
    """The reason of a skip report (``pytest.skip``'s text, ``skipif``'s ``reason``)."""
    longrepr = report.longrepr
    reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
    return reason[len("Skipped: "):] if reason.startswith("Skipped: ") else reason


def unallowed_skips(skipped, patterns):
    """The ``(test, reason)`` of ``skipped`` that no pattern allows."""
    return [(t, r) for t, r in skipped if not any(p.search(r) for p in patterns)]


def pytest_runtest_logreport(report):
    if report.skipped and not hasattr(report, "wasxfail"):
        _SKIPPED.append((report.nodeid, skip_reason(report)))


def pytest_collectreport(report):
    if report.skipped:  # a module that skips itself (importorskip at its top)
        _SKIPPED.append((report.nodeid, skip_reason(report)))


def pytest_sessionfinish(session, exitstatus):
    """With GLUON_DATA_STRICT_SKIPS=1, a skip that :data:`ALLOWED_SKIPS` does not allow here
    fails the run (in the process that reports: not in an xdist worker)."""
    if os.environ.get("GLUON_DATA_STRICT_SKIPS") != "1" or hasattr(session.config,
                                                                  "workerinput"):
        return
    bad = unallowed_skips(_SKIPPED, allowed_skips())
    if not bad:
        return
    tr = session.config.pluginmanager.get_plugin("terminalreporter")
    lines = ["%d skip(s) that tests/allowed_skips.txt does not allow here (this machine can "
             "run them: fix the setup, or allow the reason there, saying why):" % len(bad)]
    lines += ["  %s: %s" % (t, r) for t, r in bad]
    if tr is not None:
        tr.write_line("\n".join(lines), red=True)
    else:
        print("\n".join(lines), file=sys.stderr)
    session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pool_processes():
    """``(starters, workers)``: the live pool starters this process started (its children
    running the pool's bootstrap) and the workers they forked, read from Linux's /proc."""
    parents = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open("/proc/%s/stat" % pid, "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
            with open("/proc/%s/cmdline" % pid, "rb") as f:
                cmd = f.read()
        except (OSError, IndexError, ValueError):  # (it ended meanwhile)
            continue
        if fields[0] != b"Z" and b"gluon_data.convert.workerprocs" in cmd:
            parents[int(pid)] = int(fields[1])
    starters = [pid for pid, ppid in parents.items() if ppid == os.getpid()]
    return starters, [pid for pid, ppid in parents.items() if ppid in starters]
