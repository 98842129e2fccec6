"""The framework-free core type-checks: mypy (the version pinned in ``pyproject.toml``'s
``typecheck`` extra) over every core package reports no error in the modules of ``CHECKED``
and no more than ``BASELINE`` errors in the rest, a number that may only fall (move a module
into ``CHECKED`` once it is clean). Skipped, with the reason, where that mypy is not
installed (``pip install gluon-data[typecheck]``)."""
import os
import re
import subprocess
import sys
import tempfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MYPY = "1.13.0"
#: the core: everything but the Gluon layer (MXNet) and the command line
CORE = ["gluon_data/storage", "gluon_data/format", "gluon_data/stores", "gluon_data/sampling",
        "gluon_data/arrays", "gluon_data/tools", "gluon_data/convert", "gluon_data/errors.py",
        "gluon_data/_version.py", "gluon_data/_callable.py", "gluon_data/_moved.py",
        "gluon_data/mx_recordio"]
#: modules with no mypy error, kept so
CHECKED = {
    "gluon_data/errors.py", "gluon_data/_version.py", "gluon_data/_callable.py",
    "gluon_data/_moved.py",
    "gluon_data/storage/__init__.py", "gluon_data/storage/cache.py",
    "gluon_data/storage/credentials.py", "gluon_data/storage/fileio.py",
    "gluon_data/storage/fsutil.py", "gluon_data/storage/objects.py",
    "gluon_data/storage/options.py", "gluon_data/storage/perprocess.py",
    "gluon_data/format/__init__.py", "gluon_data/format/codec.py",
    "gluon_data/format/headers.py", "gluon_data/format/layout.py", "gluon_data/format/meta.py",
    "gluon_data/format/rawarray.py",
    "gluon_data/stores/__init__.py", "gluon_data/stores/base.py",
    "gluon_data/stores/recipe_layout.py", "gluon_data/stores/recscan.py",
    "gluon_data/stores/remote/__init__.py", "gluon_data/stores/remote/commit.py",
    "gluon_data/stores/remote/ranged.py",
    "gluon_data/sampling/__init__.py", "gluon_data/sampling/hints.py",
    "gluon_data/sampling/orders.py", "gluon_data/sampling/remote.py",
    "gluon_data/sampling/sampler.py", "gluon_data/sampling/seeding.py",
    "gluon_data/arrays/__init__.py", "gluon_data/arrays/transforms.py",
    "gluon_data/arrays/base.py", "gluon_data/arrays/datasets.py", "gluon_data/arrays/device.py",
    "gluon_data/arrays/plan.py", "gluon_data/arrays/scalecrop.py",
    "gluon_data/arrays/tensorize.py", "gluon_data/format/textindex.py",
    "gluon_data/tools/__init__.py", "gluon_data/tools/progress.py",
}
#: errors in the core outside CHECKED when this list was last brought down
BASELINE = 173


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
    """``{file: [error lines]}`` of mypy over the core, run by this interpreter (so it sees
    the installed numpy's types)."""
    proc = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", os.path.join(ROOT, "pyproject.toml"),
         "--cache-dir", CACHE] + CORE,
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


@pytest.mark.slow
def test_the_core_type_checks():
    found = _installed_mypy()
    if found != MYPY:
        pytest.skip("mypy %s is pinned (pip install gluon-data[typecheck]); found %s"
                    % (MYPY, found or "none"))
    import numpy
    if int(numpy.__version__.split(".")[0]) < 2:
        pytest.skip("the baseline is counted against numpy 2's annotations (the core lane); "
                    "numpy %s is installed here" % numpy.__version__)
    errors = run_mypy()
    in_checked = {f: e for f, e in errors.items() if f in CHECKED}
    assert in_checked == {}, "\n".join(line for e in in_checked.values() for line in e)
    rest = sum(len(e) for f, e in errors.items() if f not in CHECKED)
    assert rest <= BASELINE, "%d mypy errors outside CHECKED, the baseline is %d" % (
        rest, BASELINE)


def test_checked_names_modules_of_the_core_and_py_typed_ships():
    """The list can fail: every entry is a file of the core; the package says it is typed
    (``py.typed``) and the wheel carries that file (package data)."""
    for path in CHECKED:
        assert os.path.isfile(os.path.join(ROOT, path)), path
        assert any(path == c or path.startswith(c + "/") for c in CORE), path
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
                 "stores": 78, "tools": 75, "convert": 65}
ANNOTATED_CORE_MIN = 83


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
