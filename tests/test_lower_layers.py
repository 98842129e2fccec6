"""The format and file layer imports one way: no circle, no import of our own modules made
inside a function to dodge one (read from the code with ``ast``, as the modules stand)."""
import ast
import os

import pytest

import gluon_data

PKG = os.path.dirname(gluon_data.__file__)
# the modules below the converters and the datasets' views
LOWER = ("errors", "fileio", "documents", "meta", "store", "ownership", "fsutil", "cache",
         "codec", "recindex", "recordio", "recwriter", "lmdb_pages", "lmdb_writer", "lmdbio",
         "legacy", "datasets", "salvage", "stats", "sample")


def _imports(name):
    """``[(module imported, inside a function?)]`` for the gluon_data modules ``name`` imports."""
    tree = ast.parse(open(os.path.join(PKG, name + ".py")).read())
    out = []

    def visit(node, in_fn):
        for ch in ast.iter_child_nodes(node):
            if isinstance(ch, ast.ImportFrom) and (ch.level or (ch.module or "").startswith(
                    "gluon_data")):
                base = (ch.module or "").replace("gluon_data.", "").replace("gluon_data", "")
                for a in ch.names:
                    target = base.split(".")[0] if base else a.name
                    out.append((target, in_fn))
            elif isinstance(ch, ast.Import):
                out.extend((a.name.split(".")[1], in_fn) for a in ch.names
                           if a.name.startswith("gluon_data."))
            visit(ch, in_fn or isinstance(ch, (ast.FunctionDef, ast.AsyncFunctionDef)))
    visit(tree, False)
    return out


@pytest.mark.parametrize("name", LOWER)
def test_no_import_of_our_modules_inside_functions(name):
    """Expected: every import of a gluon_data module in the lower layer is at module level."""
    inside = sorted({m for m, in_fn in _imports(name) if in_fn})
    assert not inside, "%s imports %s inside a function" % (name, inside)


def test_lower_layer_has_no_import_circle():
    """Expected: following imports from any lower-layer module never returns to it."""
    ours = {f[:-3] for f in os.listdir(PKG) if f.endswith(".py") and f != "__init__.py"}
    graph = {m: {t for t, _ in _imports(m) if t in ours and t != m} for m in ours}
    for start in LOWER:
        seen, todo = set(), list(graph[start])
        while todo:
            m = todo.pop()
            assert m != start, "%s reaches itself through its imports" % start
            if m not in seen and m in graph:
                seen.add(m)
                todo += graph[m]

