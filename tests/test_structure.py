"""The package's import rules, read from the code with ``ast`` (``scripts/structure_report.py``
prints the figures): loads by module name and lazy re-exports count as imports."""
import importlib.util
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
spec = importlib.util.spec_from_file_location(
    "structure_report", os.path.join(ROOT, "scripts", "structure_report.py"))
report = importlib.util.module_from_spec(spec)
spec.loader.exec_module(report)


@pytest.fixture(scope="module")
def analysis():
    return report.analyse()


def test_no_import_circle_counting_loads_by_name(analysis):
    graph = analysis[0]
    assert report.circles(graph) == []


def test_only_package_inits_and_the_cli_load_modules_by_name(analysis):
    by_name = analysis[1]
    mods = report._modules()
    bad = {m: t for m, t in by_name.items()
           if not (mods[m].endswith("__init__.py") or report._is_cli(m))}
    assert bad == {}


def test_no_framework_module_is_imported_by_a_framework_free_one():
    assert [v for v in report.violations() if "MXNet" in v] == []


def test_layers_import_downwards_only():
    assert [v for v in report.violations() if v.startswith("upward")] == []


def test_no_import_of_our_modules_inside_functions_outside_the_cli(analysis):
    inside = analysis[2]
    assert [i for i in inside if not report._is_cli(i[0])] == []


def test_the_core_never_imports_mxnet(analysis):
    mx = analysis[3]
    assert sorted(m for m in mx if not m.startswith("gluon_data.gluon")) == []


def test_at_most_a_dozen_modules_directly_in_the_package():
    top = [m for m, p in report._modules().items()
           if m.count(".") == 1 and not p.endswith("__init__.py")]
    assert len(top) <= 12, top


def test_the_report_sees_a_load_by_name(tmp_path, monkeypatch):
    """The checks can fail: a module that loads another by name is counted as importing it."""
    pkg = tmp_path / "gluon_data"
    (pkg / "a").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "a" / "__init__.py").write_text("")
    (pkg / "a" / "x.py").write_text("import importlib\nimportlib.import_module('gluon_data.a.y')\n")
    (pkg / "a" / "y.py").write_text("from . import x\n")
    (tmp_path / "README.md").write_text("")
    monkeypatch.setattr(report, "ROOT", str(tmp_path))
    graph, by_name, _, _, _ = report.analyse()
    assert by_name == {"gluon_data.a.x": ["gluon_data.a.y"]}
    assert report.circles(graph) == [["gluon_data.a.x", "gluon_data.a.y"]]


def test_no_private_name_crosses_a_package():
    """Rule 5: a private name is shared inside its package folder only; the crossings left
    (``PRIVATE_LEFT``) may only go away, never be added to."""
    assert [v for v in report.violations() if v.startswith("private name")] == []
    assert len(report.PRIVATE_LEFT) <= 0


def test_the_report_sees_private_names_crossing_packages(tmp_path, monkeypatch):
    """The count can fail: imports, attributes of imported modules and lazy tables across a
    package are counted; inside a package they are allowed; dunders and modules are not
    names."""
    pkg = tmp_path / "gluon_data"
    for sub in ("a", "b"):
        (pkg / sub).mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "a" / "__init__.py").write_text("")
    (pkg / "a" / "_helpers.py").write_text("")
    (pkg / "a" / "x.py").write_text("_K = 1\n\n\ndef _h():\n    pass\n")
    (pkg / "a" / "y.py").write_text("from .x import _h\nfrom . import _helpers\n")
    (pkg / "b" / "__init__.py").write_text(
        "import importlib\n_T = {'_K': '..a.x'}\n\n\ndef __getattr__(name):\n"
        "    return getattr(importlib.import_module(_T[name], __name__), name)\n")
    (pkg / "b" / "z.py").write_text(
        "import gluon_data.a.x\nfrom ..a.x import _h, __doc__\nfrom ..a import x\n"
        "x._K\ngluon_data.a.x._h\n")
    (pkg / "c.py").write_text("from .a import x as xx\nxx._K\n")
    (tmp_path / "README.md").write_text("")
    monkeypatch.setattr(report, "ROOT", str(tmp_path))
    x = "gluon_data.a.x"
    assert report.private_uses() == [
        ("gluon_data.a.y", 1, x, "_h"), ("gluon_data.b", 2, x, "_K"),
        ("gluon_data.b.z", 2, x, "_h"), ("gluon_data.b.z", 4, x, "_K"),
        ("gluon_data.b.z", 5, x, "_h"), ("gluon_data.c", 2, x, "_K")]
    crossing = report.private_crossings()
    assert [u[0] for u in crossing] == ["gluon_data.b", "gluon_data.b.z", "gluon_data.b.z",
                                        "gluon_data.b.z", "gluon_data.c"]
    broken = [v for v in report.violations() if v.startswith("private name")]
    assert len(broken) == 5 and "gluon_data.c:2 uses gluon_data.a.x._K" in broken[-1]


def test_each_constant_is_written_once_in_its_home():
    """Rule 6: ``"data.mdb"``, ``"lock.mdb"``, ``".shards.json"`` and the JPEG SOI marker are
    literals in one module each; every other module imports the name."""
    where = report.constant_literals()
    for lit, (name, home) in report.CONSTANTS.items():
        assert [m for m, _ in where[lit]] == [home], (lit, name, where[lit])
        assert report._modules()[home] and name in open(report._modules()[home]).read()


def test_the_constant_scan_sees_a_second_literal(tmp_path, monkeypatch):
    """The check can fail: a second literal (a bytes constant starting with the marker
    counts) is found, a docstring naming it is not."""
    pkg = tmp_path / "gluon_data"
    (pkg / "a").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "a" / "__init__.py").write_text("")
    (pkg / "a" / "x.py").write_text('"""data.mdb"""\nLMDB_DATA = "data.mdb"\n')
    (pkg / "a" / "y.py").write_text(
        'def f(p):\n    """data.mdb"""\n    return p + "data.mdb", b"\\xff\\xd8\\xff"\n')
    monkeypatch.setattr(report, "ROOT", str(tmp_path))
    where = report.constant_literals()
    assert where["data.mdb"] == [("gluon_data.a.x", 2), ("gluon_data.a.y", 3)]
    assert where[b"\xff\xd8"] == [("gluon_data.a.y", 3)]


def test_no_function_takes_more_than_14_parameters():
    """Rule 8, private functions included (``self``, ``*args``, ``**kwargs`` not counted);
    none is left above (``PARAMS_LEFT`` is empty): options travel as one object."""
    over = {f: n for n, f in report.function_params() if n > report.PARAMS_MAX}
    assert over == {}
    assert report.PARAMS_LEFT == set()


def test_the_parameter_count_counts_keywords_and_skips_self(tmp_path, monkeypatch):
    pkg = tmp_path / "gluon_data"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(
        "def f(a, /, b, *args, c, **kw):\n    pass\n\n\nclass K:\n"
        "    def m(self, a, *, b=1):\n        def inner(x):\n            pass\n")
    monkeypatch.setattr(report, "ROOT", str(tmp_path))
    assert sorted(report.function_params()) == [
        (1, "gluon_data:K.m.inner"), (2, "gluon_data:K.m"), (3, "gluon_data:f")]


def test_no_module_is_over_500_lines():
    """Rule 8."""
    assert {m: n for m, n in report.module_lines().items()
            if n > report.MODULE_LINES_MAX} == {}


def test_private_names_used_outside_their_module_only_go_down():
    """Rule 7: at most ``PRIVATE_NAMES_MAX`` (25) private names of ours are used by a module
    other than their home; the count is held at ``PRIVATE_NAMES_CEILING``, which may only
    fall (it is none today: a name another module needs is public in its home)."""
    names = report.private_names()
    assert len(names) <= report.PRIVATE_NAMES_CEILING, names
    assert report.PRIVATE_NAMES_CEILING == 0
    assert report.PRIVATE_NAMES_MAX == 25


def test_a_c_extension_is_a_module_not_a_private_name(tmp_path, monkeypatch):
    pkg = tmp_path / "gluon_data"
    (pkg / "a").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "a" / "__init__.py").write_text("")
    (pkg / "a" / "_ext.c").write_text("")
    (pkg / "a" / "x.py").write_text("_K = 1\n")
    (pkg / "a" / "y.py").write_text("from . import _ext\nfrom .x import _K\n")
    monkeypatch.setattr(report, "ROOT", str(tmp_path))
    assert report.private_names() == [("gluon_data.a.x", "_K")]


def test_only_the_per_process_rule_tells_processes_apart():
    """Rule 9: ``os.getpid()`` is called by ``storage/perprocess.py`` and by the two modules
    that write a pid into what they make, nowhere else (ask a ``PerProcess`` or a
    ``ProcessMark``)."""
    assert set(report.getpid_users()) <= set(report.GETPID_USERS)
    assert PACKAGE_PERPROCESS in report.getpid_users()


PACKAGE_PERPROCESS = report.PACKAGE + ".storage.perprocess"


def test_every_rule_holds():
    assert report.violations() == []
