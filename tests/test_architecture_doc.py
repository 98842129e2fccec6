"""The docs are true to the code: ``docs/architecture.md``'s table of concerns names homes
that exist and define what the table says, and every module or name of ours that a page or
a docstring spells (``gluon_data.x.y``, ``gluon_data/x/y.py``) is there.

Read with ``ast`` (nothing imported), so the check runs without MXNet too."""
import ast
import builtins
import functools
import glob
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE_FILES = sorted(glob.glob(os.path.join(ROOT, "gluon_data", "**", "*.py"), recursive=True))
PAGES = sorted(glob.glob(os.path.join(ROOT, "docs", "*.md"))) + [
    os.path.join(ROOT, "README.md"), os.path.join(ROOT, "FORMAT.md")]
#: a file name in backticks (``OUTPUT.lock``, ``pyproject.toml``), not code
_FILE_NAME = re.compile(r".*\.(toml|lock|json|rec|idx|gdx|lmdb|mdb|md|py|c)$")


def module_file(dotted, root=ROOT):
    """The file of module ``dotted`` (a ``.py``, a package's ``__init__.py`` or a C
    extension's ``.c``), or None."""
    base = os.path.join(root, *dotted.split("."))
    for path in (base + ".py", os.path.join(base, "__init__.py"), base + ".c"):
        if os.path.isfile(path):
            return path
    return None


@functools.lru_cache(maxsize=None)
def defined(path):
    """Every name ``path`` binds (definitions, assignments, attributes assigned, imports)
    and the string constants it holds (a table's keys, a document's fields)."""
    if not path.endswith(".py"):
        return frozenset()
    out = set()
    for node in ast.walk(ast.parse(open(path).read())):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(node.name)
        elif isinstance(node, (ast.Name, ast.Attribute)) and isinstance(node.ctx, ast.Store):
            out.add(node.id if isinstance(node, ast.Name) else node.attr)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            out.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            out.add(node.value)
    return frozenset(out)


@functools.lru_cache(maxsize=None)
def moved(root=ROOT):
    """The alias table (``gluon_data/_moved.py``): ``MOVED_MODULES`` and ``MOVED_NAMES``,
    read as data. An old module name a page still spells resolves through it."""
    tables = {}
    path = os.path.join(root, "gluon_data", "_moved.py")
    if os.path.isfile(path):
        for node in ast.parse(open(path).read()).body:
            if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
                tables[node.targets[0].id] = ast.literal_eval(node.value)
    return tables.get("MOVED_MODULES", {}), tables.get("MOVED_NAMES", {})


def resolves(dotted, root=ROOT):
    """Whether ``gluon_data.a.b[.Name[.attr]]`` names a module of ours, or a name its
    longest module prefix defines (an old module name: through the alias table)."""
    parts = dotted.split(".")
    modules, names = moved(root)
    for i in range(len(parts), 0, -1):
        prefix = ".".join(parts[:i])
        path = module_file(prefix, root)
        if path:
            return i == len(parts) or parts[i] in defined(path)
        if prefix in modules:
            if i == len(parts):
                return True
            home = names.get(prefix, {}).get(parts[i], modules[prefix])
            return resolves(".".join([home] + parts[i:]), root)
    return False


def _docstrings():
    for path in PACKAGE_FILES:
        for node in ast.walk(ast.parse(open(path).read())):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef,
                                 ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node)
                if doc:
                    yield "%s:%s" % (os.path.relpath(path, ROOT), getattr(node, "lineno", 1)), doc


def unresolved(texts, root=ROOT):
    """``(where, reference)`` of each module or name of ours in ``texts`` that is not there."""
    bad = []
    for where, text in texts:
        for m in re.finditer(r"(?<![\w./])gluon_data(?:\.[A-Za-z_]\w*)+", text):
            if not resolves(m.group(0), root):
                bad.append((where, m.group(0)))
        for m in re.finditer(r"(?<![\w./])(gluon_data/[\w/]+\.(?:py|c))", text):
            if not os.path.exists(os.path.join(root, m.group(1))):
                bad.append((where, m.group(1)))
    return bad


def test_every_module_a_page_or_a_docstring_names_is_there():
    pages = [(os.path.relpath(p, ROOT), open(p).read()) for p in PAGES]
    assert unresolved(pages + list(_docstrings())) == []


def test_the_reference_check_can_fail(tmp_path):
    (tmp_path / "gluon_data" / "a").mkdir(parents=True)
    (tmp_path / "gluon_data" / "__init__.py").write_text("")
    (tmp_path / "gluon_data" / "a" / "__init__.py").write_text("")
    (tmp_path / "gluon_data" / "a" / "x.py").write_text("def f():\n    pass\n")
    text = ("see gluon_data.a.x.f, gluon_data.a.y, gluon_data.a.x.g and "
            "gluon_data/a/x.py, gluon_data/a/z.py")
    assert unresolved([("page", text)], str(tmp_path)) == [
        ("page", "gluon_data.a.y"), ("page", "gluon_data.a.x.g"), ("page", "gluon_data/a/z.py")]


def concern_rows(text):
    """``(concern, home cell, mechanism cell)`` of each row of the table of concerns."""
    section = text.split("\n## One home per concern\n", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        if line.startswith("| ") and not line.startswith(("| concern ", "| ---")):
            cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
            rows.append((cells[0], cells[1], " | ".join(cells[2:])))
    return rows


def _code_name(token):
    """The name a backticked token of code stands for (``open_store(location, ...)`` ->
    ``open_store``, ``Cache.staging`` -> ``Cache``), or None for prose, flags and files."""
    m = re.fullmatch(r"([A-Za-z_]\w*)(?:\.[A-Za-z_]\w*)?(\(.*\))?", token)
    if not m or _FILE_NAME.match(token):
        return None
    name = m.group(1)
    if "_" in name or name[0].isupper() or any(c.isupper() for c in name) or m.group(2) \
            or "." in token:
        return name
    return None


def concern_problems(text, root=ROOT):
    """What a row of the table says that the code does not hold: a home file missing, the
    row's mechanism (its first name of code) not defined in its home, a name it mentions
    defined nowhere in the package."""
    files = glob.glob(os.path.join(root, "gluon_data", "**", "*.py"), recursive=True)
    everywhere = set()
    for path in files:
        everywhere |= defined(path)
    modules = {os.path.basename(p)[:-3] for p in files}
    out = []
    for concern, home, mechanism in concern_rows(text):
        homes = re.findall(r"`(gluon_data/[\w/]+\.py)`", home)
        if not homes:
            out.append((concern, "names no home module"))
        home_names = set()
        for path in homes:
            if not os.path.isfile(os.path.join(root, path)):
                out.append((concern, "home %s does not exist" % path))
            else:
                home_names |= defined(os.path.join(root, path))
        names = [n for n in map(_code_name, re.findall(r"`([^`]+)`", mechanism)) if n]
        if names and names[0] not in home_names:
            out.append((concern, "%s is not defined in %s" % (names[0], ", ".join(homes))))
        in_home = [n for n in map(_code_name, re.findall(r"`([^`]+)`", home)) if n]
        for name in in_home:
            if name not in home_names:
                out.append((concern, "%s is not defined in %s" % (name, ", ".join(homes))))
        for name in names:
            if not (name in everywhere or name in modules or hasattr(builtins, name)
                    or hasattr(os, name)):
                out.append((concern, "%s is defined nowhere in the package" % name))
    return out


def test_each_home_of_the_table_of_concerns_exists_and_defines_its_mechanism():
    text = open(os.path.join(ROOT, "docs", "architecture.md")).read()
    assert len(concern_rows(text)) >= 20
    assert concern_problems(text) == []


@pytest.mark.parametrize("row, problem", [
    ("| cache | `gluon_data/a/x.py` | `Cache`: one folder |", None),
    ("| cache | `gluon_data/a/gone.py` | `Cache` |", "home gluon_data/a/gone.py does not exist"),
    ("| cache | `gluon_data/a/x.py` | `Store`: elsewhere |", "Store is not defined in"),
    ("| cache | `gluon_data/a/x.py` (`open_cache`) | `Cache` |", "open_cache is not defined"),
    ("| cache | `gluon_data/a/x.py` | `Cache`, then `gone_helper()` |", "defined nowhere"),
])
def test_the_table_check_can_fail(tmp_path, row, problem):
    (tmp_path / "gluon_data" / "a").mkdir(parents=True)
    (tmp_path / "gluon_data" / "a" / "x.py").write_text("class Cache:\n    pass\n")
    (tmp_path / "gluon_data" / "a" / "y.py").write_text("class Store:\n    pass\n")
    text = ("# A\n\n## One home per concern\n\n| concern | home | the mechanism |\n"
            "| --- | --- | --- |\n%s\n\n## Next\n" % row)
    found = concern_problems(text, str(tmp_path))
    if problem is None:
        assert found == []
    else:
        assert found and problem in found[0][1], found
