"""The package type-checks: mypy (the version pinned in ``pyproject.toml``'s ``typecheck``
extra) over the whole package reports no error in the framework-free core (``CORE``) and no
more than ``BASELINE`` in the Gluon layer and the command line, a number that may only fall.
Skipped, with the reason, where that mypy is not installed (``pip install
gluon-data[typecheck]``)."""
import os
import re
import subprocess
import sys
import tempfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MYPY = "1.13.0"
#: the core: everything but the Gluon layer (MXNet) and the command line; no mypy error
CORE = ["gluon_data/storage", "gluon_data/format", "gluon_data/stores", "gluon_data/sampling",
        "gluon_data/arrays", "gluon_data/tools", "gluon_data/convert", "gluon_data/errors.py",
        "gluon_data/_version.py", "gluon_data/_callable.py", "gluon_data/_moved.py",
        "gluon_data/mx_recordio"]
#: the rest of the package, checked against a baseline (MXNet has no annotations: Any)
REST = ["gluon_data/gluon", "gluon_data/cli", "gluon_data/__init__.py",
        "gluon_data/__main__.py"]
#: errors in ``REST`` when this number was last brought down
BASELINE = 0


def _installed_mypy():
    try:
        import mypy.version
    except ImportError:
        return None
    return mypy.version.__version__


#: mypy's incremental cache, kept between runs (outside the tree): a rerun checks only what
#: changed, in seconds instead of a minute
CACHE = os.path.join(tempfile.gettempdir(), "gluon_data-mypy-%d" % os.getuid())


def run_mypy():
    """``{file: [error lines]}`` of mypy over the package, run by this interpreter (so it
    sees the installed numpy's types)."""
    proc = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", os.path.join(ROOT, "pyproject.toml"),
         "--cache-dir", CACHE] + CORE + REST,
        cwd=ROOT, capture_output=True, text=True, timeout=600)
    if proc.returncode not in (0, 1):
        raise AssertionError("mypy failed to run (%d): %s%s"
                             % (proc.returncode, proc.stdout[-2000:], proc.stderr[-2000:]))
    errors = {}
    for line in proc.stdout.splitlines():
        m = re.match(r"(gluon_data/[^:]+):\d+: error: ", line)
        if m:
            errors.setdefault(m.group(1), []).append(line)
    return errors


def _in(path, homes):
    return any(path == h or path.startswith(h + "/") for h in homes)


@pytest.mark.slow
def test_the_package_type_checks():
    found = _installed_mypy()
    if found != MYPY:
        pytest.skip("mypy %s is pinned (pip install gluon-data[typecheck]); found %s"
                    % (MYPY, found or "none"))
    import numpy
    if int(numpy.__version__.split(".")[0]) < 2:
        pytest.skip("the baseline is counted against numpy 2's annotations (the core lane); "
                    "numpy %s is installed here" % numpy.__version__)
    errors = run_mypy()
    in_core = {f: e for f, e in errors.items() if _in(f, CORE)}
    assert in_core == {}, "\n".join(line for e in in_core.values() for line in e)
    rest = sum(len(e) for f, e in errors.items() if _in(f, REST))
    assert rest <= BASELINE, "%d mypy errors in the Gluon layer and the command line, the " \
        "baseline is %d" % (rest, BASELINE)


def test_the_checked_paths_cover_the_package_and_py_typed_ships():
    """The lists can fail: each entry exists, every module of the package is in one of them;
    the package says it is typed (``py.typed``) and the wheel carries that file."""
    for path in CORE + REST:
        assert os.path.exists(os.path.join(ROOT, path)), path
    for folder, _, files in os.walk(os.path.join(ROOT, "gluon_data")):
        for name in files:
            if name.endswith(".py"):
                rel = os.path.relpath(os.path.join(folder, name), ROOT).replace(os.sep, "/")
                assert _in(rel, CORE + REST), rel
    assert os.path.isfile(os.path.join(ROOT, "gluon_data", "py.typed"))
    text = open(os.path.join(ROOT, "pyproject.toml")).read()
    assert re.search(r'\[tool\.setuptools\.package-data\]\s*\ngluon_data = \[[^]]*"py\.typed"',
                     text)
    assert re.search(r'typecheck = \["mypy==%s"\]' % re.escape(MYPY), text)


def _report():
    import importlib.util
    spec = importlib.util.spec_from_file_location(
        "structure_report", os.path.join(ROOT, "scripts", "structure_report.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


#: the share of public functions and methods fully annotated (every parameter and the
#: return), per package of the core, as ``scripts/structure_report.py`` counts it: it may
#: only rise
ANNOTATED_MIN = {"arrays": 100, "sampling": 100, "errors": 100, "format": 87, "storage": 93,
                 "stores": 86, "tools": 75, "convert": 75, "mx_recordio": 95}
ANNOTATED_CORE_MIN = 87


def test_the_public_api_of_the_core_stays_annotated():
    ann = _report().annotations()
    share = {p.split(".")[-1]: 100 * d // t for p, (d, t) in ann.items() if t}
    assert {p: s for p, s in share.items() if s < ANNOTATED_MIN.get(p, 0)} == {}, share
    done, total = sum(d for d, _ in ann.values()), sum(t for _, t in ann.values())
    assert 100 * done // total >= ANNOTATED_CORE_MIN


def test_the_annotation_count_can_fail(tmp_path, monkeypatch):
    report = _report()
    (tmp_path / "gluon_data" / "a").mkdir(parents=True)
    (tmp_path / "gluon_data" / "__init__.py").write_text("")
    (tmp_path / "gluon_data" / "a" / "__init__.py").write_text(
        "def f(x: int) -> int:\n    pass\n\n\ndef g(x) -> int:\n    pass\n\n\n"
        "def _h(x):\n    pass\n\n\nclass K:\n    def __init__(self, a: int):\n        pass\n\n"
        "    def m(self):\n        pass\n")
    monkeypatch.setattr(report, "ROOT", str(tmp_path))
    assert report.annotations()["gluon_data.a"] == (2, 4)
