"""Imports of the package run one way (the whole package; tests/test_lower_layers.py checks
the lower layers module by module). Figures: ``python scripts/structure_report.py``."""
import importlib.util
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
spec = importlib.util.spec_from_file_location(
    "structure_report", os.path.join(ROOT, "scripts", "structure_report.py"))
report = importlib.util.module_from_spec(spec)
spec.loader.exec_module(report)

# none: the converter imports the uploader (gluon_data.convert.to_uri), and the remote package
# loads convert_to_uri on first use through its PEP 562 __getattr__, as gluon_data/__init__ does
ALLOWED_INSIDE: set = set()


def _is_cli(module: str) -> bool:
    """The command line loads each command's modules on first use (a fast ``--help``)."""
    return module == "gluon_data.cli" or module.startswith("gluon_data.cli.")


def test_no_import_circle_in_the_package():
    mods = report._modules()
    graph, _, _ = report._graph(mods)
    for me in graph:
        graph[me] = {t for t in graph[me] if not t.startswith(me + ".")}
    assert report._circles(graph) == []


def test_imports_of_our_modules_inside_functions_are_only_the_lazy_ones():
    _, inside, _ = report._graph(report._modules())
    extra = [(m, line, found) for m, line, found in inside if not _is_cli(m)
             and not all((m, f) in ALLOWED_INSIDE for f in found)]
    assert extra == [], extra
