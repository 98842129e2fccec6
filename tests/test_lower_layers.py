"""The format and file layer imports one way: no circle, no import of our own modules made
inside a function to dodge one (read from the code with ``ast``, as the modules stand)."""
import ast
import multiprocessing as mp
import os

import pytest

import gluon_data
from gluon_data.storage.fileio import ProcessDescriptor

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



def test_process_descriptor_is_per_process_and_closed_when_its_check_fails(tmp_path):
    """One descriptor per process: a forked child opens its own and closing it leaves the
    parent's open; a failing ``on_open`` check closes the descriptor it was given."""
    path = tmp_path / "f.bin"
    path.write_bytes(b"0123456789")
    d = ProcessDescriptor(str(path), lambda fd: os.fstat(fd).st_size)
    fd, size = d.get()
    assert size == 10 and d.fd() == fd and os.pread(fd, 3, 2) == b"234"

    def child(q):
        cfd, _ = d.get()
        d.close()
        q.put(cfd != fd)

    ctx = mp.get_context("fork")
    q = ctx.Queue()
    p = ctx.Process(target=child, args=(q,))
    p.start()
    assert q.get(timeout=60) is True
    p.join(60)
    assert os.pread(d.fd(), 2, 0) == b"01"  # the child's close left ours alone
    d.close()
    with pytest.raises(OSError):
        os.fstat(fd)

    def refuse(fd):
        refuse.fd = fd
        raise ValueError("replaced")

    bad = ProcessDescriptor(str(path), refuse)
    with pytest.raises(ValueError, match="replaced"):
        bad.get()
    with pytest.raises(OSError):
        os.fstat(refuse.fd)
