"""Print the package's structure figures and check its import rules.

    python scripts/structure_report.py

Reads the code with ``ast`` only (nothing is imported or run). An import is any of:

* an ``import`` / ``from ... import`` statement, at module level or inside a function;
* a load by module name (``importlib.import_module("...")``, ``__import__``);
* a lazy re-export: a module that loads by a computed name (a PEP 562 ``__getattr__`` over a
  table) imports every module of ours that its string constants name (``"stores.base"``,
  ``"..engines"``, ``"gluon_data.convert.to_uri"``), and the package root imports every
  module its alias table (``gluon_data/_moved.py``) names.

The rules (``tests/test_structure.py`` asserts them):

1. the import graph has no circle;
2. only package ``__init__`` files and the CLI load modules by name;
3. no module that imports MXNet or gluoncv is imported by one that does not (a module whose
   package imports MXNet imports it too: ``gluon_data/gluon/__init__.py`` does), except by
   the two facades, the package root and the command line, which name Gluon modules in
   their lazy tables and load them on first use only (``gluon_data.gluon`` then says what to
   install where MXNet is missing);
4. the layers import downwards only (``LAYERS``);
5. no private name crosses a package: a name starting with ``_`` (not a dunder) that a module
   of ours defines may be used by another module only inside the same package folder
   directly under ``gluon_data/`` (``stores/`` and ``stores/remote/`` modules share their
   helpers: a package-private API); a module directly in ``gluon_data/`` is its own package.
   A use is ``from .x import _name``, ``x._name`` on a module of ours bound by an import, and
   an entry of a lazy table (``"_name": ".x"``). A name another package needs is public (no
   underscore, in its module's ``__all__``) or moves to where it is used. Tests, benchmarks
   and scripts are not counted, nor private modules (``_version``, ``_callable``: a file, not
   a name), nor attributes of objects (``store._keys``), nor the alias table's entries (the old
   layout's names, ``gluon_data/_moved.py``), which are counted apart. ``PRIVATE_LEFT`` lists
   the crossings not yet removed: the rule is broken by any crossing not on it, and the list
   may only shrink;
6. each constant of ``CONSTANTS`` (LMDB's file names, the manifest suffix, the JPEG SOI
   marker) is written as a literal in one module, its home (docstrings aside);
7. at most ``PRIVATE_NAMES_MAX`` (25) private names are used by a module other than their
   home (counted as rule 5 counts a use, inside a package too; a C extension such as
   ``format/_maskrle`` is a module, not a name); the count is held at
   ``PRIVATE_NAMES_CEILING``, which may only fall;
8. no module is over ``MODULE_LINES_MAX`` (500) lines and no function takes more than
   ``PARAMS_MAX`` (14) parameters, private ones included (``PARAMS_LEFT``, the ones still
   above, is empty and stays so);
9. no module but ``storage/perprocess.py`` reads the process id to tell processes apart
   (``GETPID_USERS``: the few that write it into a name or a lock file).
"""
import ast
import glob
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = "gluon_data"
#: The layers, lowest first: a module may import its own layer and those listed before it.
LAYERS = ("gluon_data._version", "gluon_data.errors", "gluon_data._callable",
          "gluon_data._moved", "gluon_data.storage", "gluon_data.format", "gluon_data.stores",
          "gluon_data.sampling", "gluon_data.arrays", "gluon_data.tools", "gluon_data.convert",
          "gluon_data.mx_recordio", "gluon_data.gluon", "gluon_data.cli", "gluon_data",
          "gluon_data.__main__")
_FRAMEWORKS = ("mxnet", "gluoncv", "horovod.mxnet")
_LOADERS = ("import_module", "__import__")
#: Private names still crossing a package, as ``(user, home, name)``: each is to become public
#: in its home module or to move to its user. Take an entry off once it no longer crosses;
#: never add one (``tests/test_structure.py`` holds the list to its present length).
PRIVATE_LEFT = frozenset(
    (PACKAGE + "." + user, PACKAGE + "." + home, name) for user, home, names in (
    ) for name in names.split())


def _modules():
    files = sorted(glob.glob(os.path.join(ROOT, PACKAGE, "**", "*.py"), recursive=True))
    return {os.path.relpath(p, ROOT)[:-3].replace(os.sep, ".").replace(".__init__", ""): p
            for p in files}


def _extensions():
    """The package's C extension modules (``gluon_data/format/_maskrle.c`` ->
    ``gluon_data.format._maskrle``): modules, not names, though no ``.py`` file holds them."""
    files = glob.glob(os.path.join(ROOT, PACKAGE, "**", "*.c"), recursive=True)
    return {os.path.relpath(p, ROOT)[:-2].replace(os.sep, ".") for p in files}


def _resolve(name, mods):
    while name and name not in mods:
        name = name.rpartition(".")[0]
    return name


def _relative(text, pkg):
    """``"..engines"`` seen from package ``pkg`` -> ``gluon_data.convert.engines``."""
    level = len(text) - len(text.lstrip("."))
    parts = pkg.split(".")
    parts = parts[:len(parts) - (level - 1)]
    rest = text.lstrip(".")
    return ".".join(parts + ([rest] if rest else []))


def _statement_targets(node, me, pkg, mods):
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    else:
        base = _relative("." * node.level + (node.module or ""), pkg) if node.level else (
            node.module or "")
        names = [base + "." + a.name for a in node.names] + [base]
    out = set()
    for t in names:
        t = _resolve(t, mods)
        if t and t != me:
            out.add(t)
            if isinstance(node, ast.ImportFrom):
                break
    return out


def _string_targets(text, pkg, mods):
    """The module of ours a string constant names, if any."""
    if not text or not all(c.isalnum() or c in "._" for c in text):
        return None
    for cand in ((_relative(text, pkg),) if text.startswith(".") else
                 (text, pkg + "." + text, PACKAGE + "." + text)):
        if cand in mods:
            return cand
    return None


def _frameworks(node):
    names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
        [node.module or ""] if not node.level else [])
    return any(n == f or n.startswith(f + ".") for n in names for f in _FRAMEWORKS)


def analyse():
    """``(graph, by_name, inside, mx, funcs)``: every import edge, the modules that load by
    name, the in-function imports, the modules importing a framework, function sizes."""
    mods = _modules()
    graph, by_name, inside, mx, funcs = {}, {}, [], set(), []
    for me, path in mods.items():
        tree = ast.parse(open(path).read())
        pkg = me if path.endswith("__init__.py") else me.rpartition(".")[0]
        edges, loads, computed = set(), [], False
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                funcs.append((node.end_lineno - node.lineno + 1, "%s:%s" % (me, node.name)))
                for sub in ast.walk(node):
                    if isinstance(sub, (ast.Import, ast.ImportFrom)):
                        found = _statement_targets(sub, me, pkg, mods)
                        if found:
                            inside.append((me, sub.lineno, sorted(found)))
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                edges |= _statement_targets(node, me, pkg, mods)
                if _frameworks(node):
                    mx.add(me)
            if isinstance(node, ast.Call) and getattr(
                    node.func, "attr", getattr(node.func, "id", None)) in _LOADERS:
                arg = node.args[0] if node.args else None
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                    target = _string_targets(arg.value, pkg, mods)
                    if target:
                        loads.append(target)
                    if any(arg.value == f or arg.value.startswith(f + ".") for f in _FRAMEWORKS):
                        mx.add(me)
                else:
                    computed = True
        if computed:  # a lazy table: every module its strings name is imported
            for node in ast.walk(tree):
                if isinstance(node, ast.Constant) and isinstance(node.value, str):
                    target = _string_targets(node.value, pkg, mods)
                    if target and target != me:
                        loads.append(target)
            if me == PACKAGE:  # the root's alias table
                moved = ast.parse(open(mods[PACKAGE + "._moved"]).read())
                for node in ast.walk(moved):
                    if isinstance(node, ast.Constant) and isinstance(node.value, str):
                        target = _string_targets(node.value, pkg, mods)
                        if target and target != me:
                            loads.append(target)
        if loads or computed:
            by_name[me] = sorted(set(loads))
        graph[me] = edges | set(loads)
    for me in mods:  # importing a module runs its packages' __init__ first
        parent = me.rpartition(".")[0]
        while parent:
            if parent in mx:
                mx.add(me)
            parent = parent.rpartition(".")[0]
    # a package importing its own submodules is how it re-exports them, not a circle
    for me in graph:
        graph[me] = {t for t in graph[me] if not t.startswith(me + ".")}
    return graph, by_name, inside, mx, funcs


def circles(graph):
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def _is_cli(module):
    return module == PACKAGE + ".cli" or module.startswith(PACKAGE + ".cli.")


def layer(module):
    best = None
    for i, name in enumerate(LAYERS):
        if module == name or module.startswith(name + "."):
            if best is None or len(name) > len(LAYERS[best]):
                best = i
    return best


def is_private(name):
    """``_name`` and ``_Name``, not ``__dunder__``."""
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def package_of(module):
    """The package a module belongs to for rule 5: its folder directly under ``gluon_data/``
    (``gluon_data.stores`` for ``gluon_data.stores.remote.commit``), or the module itself
    when it sits directly in ``gluon_data/`` (``gluon_data.errors``, the root)."""
    return ".".join(module.split(".")[:2])


def _bindings(tree, pkg, mods):
    """The names a module binds to modules of ours: ``import gluon_data.x as y``,
    ``from . import x``, ``import gluon_data.x`` (binds ``gluon_data``)."""
    bound = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.asname and a.name in mods:
                    bound[a.asname] = a.name
                elif not a.asname and a.name.split(".")[0] == PACKAGE:
                    bound[PACKAGE] = PACKAGE
        elif isinstance(node, ast.ImportFrom):
            base = _relative("." * node.level + (node.module or ""), pkg) if node.level else (
                node.module or "")
            for a in node.names:
                if base + "." + a.name in mods:
                    bound[a.asname or a.name] = base + "." + a.name
    return bound


def _module_named(node, bound, mods):
    """The module of ours an expression (``x``, ``gluon_data.stores.base``) stands for."""
    if isinstance(node, ast.Name):
        return bound.get(node.id)
    if isinstance(node, ast.Attribute):
        outer = _module_named(node.value, bound, mods)
        if outer and outer + "." + node.attr in mods:
            return outer + "." + node.attr
    return None


def _lazy_entries(tree):
    """``(line, name, where)`` of each private entry of a lazy table: ``{"_x": ".mod"}``,
    ``{"_x": ("..mod", "real")}`` and ``{n: ".mod" for n in ("_x", ...)}``."""
    out = []
    for node in ast.walk(tree):
        pairs = []
        if isinstance(node, ast.Dict):
            pairs = [(k.value, v) for k, v in zip(node.keys, node.values)
                     if isinstance(k, ast.Constant) and isinstance(k.value, str)]
        elif (isinstance(node, ast.DictComp) and isinstance(node.key, ast.Name)
              and len(node.generators) == 1
              and isinstance(node.generators[0].iter, (ast.Tuple, ast.List))):
            pairs = [(e.value, node.value) for e in node.generators[0].iter.elts
                     if isinstance(e, ast.Constant) and isinstance(e.value, str)]
        for key, value in pairs:
            if isinstance(value, ast.Tuple) and len(value.elts) == 2 and all(
                    isinstance(e, ast.Constant) and isinstance(e.value, str)
                    for e in value.elts):
                out.append((node.lineno, value.elts[1].value, value.elts[0].value))
            elif isinstance(value, ast.Constant) and isinstance(value.value, str):
                out.append((node.lineno, key, value.value))
    return out


def private_uses():
    """Every use by one module of ours of a private name another module of ours defines, as
    ``(user, line, home, name)``: ``from .x import _name``, ``x._name`` on a module bound by
    an import, and private entries of a lazy table (rule 5 says which are allowed)."""
    mods = _modules()
    exts = _extensions()
    out = []
    for me, path in mods.items():
        tree = ast.parse(open(path).read())
        pkg = me if path.endswith("__init__.py") else me.rpartition(".")[0]
        bound = _bindings(tree, pkg, mods)
        lazy = False
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                base = _relative("." * node.level + (node.module or ""), pkg) if node.level \
                    else (node.module or "")
                for a in node.names:
                    if base in mods and is_private(a.name) and \
                            base + "." + a.name not in mods and base + "." + a.name not in exts:
                        out.append((me, node.lineno, base, a.name))
            elif isinstance(node, ast.Attribute) and is_private(node.attr):
                home = _module_named(node.value, bound, mods)
                if home and home != me:
                    out.append((me, node.lineno, home, node.attr))
            elif isinstance(node, ast.Call) and getattr(
                    node.func, "attr", getattr(node.func, "id", None)) in _LOADERS:
                lazy = lazy or not (node.args and isinstance(node.args[0], ast.Constant))
        if lazy and me != PACKAGE:  # the root's table is the alias table: alias_entries()
            for line, name, where in _lazy_entries(tree):
                home = _string_targets(where, pkg, mods)
                if home and home != me and is_private(name):
                    out.append((me, line, home, name))
    return sorted(set(out))


def private_crossings(uses=None):
    """The private uses that cross a package (rule 5), as ``(user, line, home, name)``."""
    uses = private_uses() if uses is None else uses
    return [u for u in uses if package_of(u[0]) != package_of(u[2])]


def alias_entries():
    """``(old module, name, home)`` of each private name the alias table
    (``gluon_data/_moved.py``) serves: the old layout's private names, counted apart."""
    tree = ast.parse(open(_modules()[PACKAGE + "._moved"]).read())
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Dict):
            for k, v in zip(node.keys, node.values):
                if isinstance(v, ast.Dict) and isinstance(k, ast.Constant):
                    out += [(k.value, n.value, h.value) for n, h in zip(v.keys, v.values)
                            if isinstance(n, ast.Constant) and is_private(n.value)]
    return sorted(out)


#: Each constant's one definition: ``literal -> (name, home module)``. The literal is written
#: once in the package's code (a string or bytes constant equal to it, or, for bytes, starting
#: with it), in its home; every other module imports the name (rule 6).
CONSTANTS = {
    "data.mdb": ("LMDB_DATA", PACKAGE + ".storage.fsutil"),
    "lock.mdb": ("LMDB_LOCK", PACKAGE + ".storage.fsutil"),
    ".shards.json": ("MANIFEST_SUFFIX", PACKAGE + ".format.layout"),
    b"\xff\xd8": ("JPEG_SOI", PACKAGE + ".format.headers"),
}
#: At most this many private names of ours may be used by a module other than their own
#: (rule 7; ``private_names``).
PRIVATE_NAMES_MAX = 25
#: The count today: none (a helper another module uses is public in its home, the
#: conversion package's lazy table names public names only); it may only fall.
PRIVATE_NAMES_CEILING = 0
#: The modules that call ``os.getpid()`` (rule 9): the per-process rule, and the two that
#: write the pid into what they make (a lock file's holder, a temporary file's name).
GETPID_USERS = {
    PACKAGE + ".storage.perprocess": "the per-process rule (PerProcess, ProcessMark)",
    PACKAGE + ".storage.fsutil": "OutputLock writes its holder's pid into the lock file",
    PACKAGE + ".storage.cache": "a download's partial file is named by pid and thread",
}
#: No module is longer than this many lines (rule 8).
MODULE_LINES_MAX = 500
#: No function takes more parameters than this (rule 8; ``self``/``cls``, ``*args`` and
#: ``**kwargs`` not counted, private functions counted).
PARAMS_MAX = 14
#: Functions still over ``PARAMS_MAX``, with why; the list may only shrink.
PARAMS_LEFT = set()


def constant_literals():
    """``literal -> [(module, line), ...]``: where each literal of :data:`CONSTANTS` is
    written in the package (docstrings are not code and are skipped)."""
    out = {lit: [] for lit in CONSTANTS}
    for me, path in _modules().items():
        tree = ast.parse(open(path).read())
        docs = {id(n.body[0].value) for n in ast.walk(tree)
                if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef,
                                  ast.AsyncFunctionDef))
                and n.body and isinstance(n.body[0], ast.Expr)
                and isinstance(n.body[0].value, ast.Constant)}
        for node in ast.walk(tree):
            if not isinstance(node, ast.Constant) or id(node) in docs:
                continue
            for lit in CONSTANTS:
                v = node.value
                if type(v) is type(lit) and (v == lit or (isinstance(v, bytes)
                                                           and v.startswith(lit))):
                    out[lit].append((me, node.lineno))
    return out


def private_names(uses=None):
    """The private names (``(home, name)``) that a module other than their home uses."""
    uses = private_uses() if uses is None else uses
    return sorted({(u[2], u[3]) for u in uses})


def _param_count(fn, in_class):
    a = fn.args
    names = [x.arg for x in a.posonlyargs + a.args]
    n = len(names) + len(a.kwonlyargs)
    if in_class and names and names[0] in ("self", "cls", "mcs"):
        n -= 1
    return n


def function_params():
    """``[(parameters, "module:qualified name"), ...]`` of every function of the package."""
    out = []

    def visit(node, prefix, me, in_class):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = prefix + child.name
                out.append((_param_count(child, in_class), "%s:%s" % (me, name)))
                visit(child, name + ".", me, False)
            elif isinstance(child, ast.ClassDef):
                visit(child, prefix + child.name + ".", me, True)
            else:
                visit(child, prefix, me, in_class)

    for me, path in _modules().items():
        visit(ast.parse(open(path).read()), "", me, False)
    return out


def getpid_users():
    """The modules that call ``os.getpid`` (or a bare ``getpid``)."""
    out = set()
    for me, path in _modules().items():
        for node in ast.walk(ast.parse(open(path).read())):
            if isinstance(node, ast.Call) and getattr(
                    node.func, "attr", getattr(node.func, "id", None)) == "getpid":
                out.add(me)
    return sorted(out)


def _public_functions(tree):
    """``(name, node, in_class)`` of each public function and method of a module: no
    leading underscore on it, on its class or on an enclosing function (dunders aside)."""
    out = []

    def visit(node, prefix, in_class):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                if not child.name.startswith("_") or child.name == "__init__":
                    out.append((prefix + child.name, child, in_class))
            elif isinstance(child, ast.ClassDef) and not child.name.startswith("_"):
                visit(child, prefix + child.name + ".", True)
            elif not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                visit(child, prefix, in_class)

    visit(tree, "", False)
    return out


def _fully_annotated(fn, in_class):
    a = fn.args
    params = a.posonlyargs + a.args + a.kwonlyargs + [p for p in (a.vararg, a.kwarg) if p]
    if in_class and (a.posonlyargs + a.args) and (a.posonlyargs + a.args)[0].arg in (
            "self", "cls", "mcs"):
        params = params[1:]
    returns = fn.returns is not None or fn.name == "__init__"
    return returns and all(p.annotation is not None for p in params)


def annotations():
    """``{package: (annotated, public functions)}`` of the framework-free core (everything
    but ``gluon_data.gluon`` and ``gluon_data.cli``): how many public functions and methods
    have every parameter and the return annotated."""
    out = {}
    for me, path in _modules().items():
        if me.startswith((PACKAGE + ".gluon", PACKAGE + ".cli")) or me == PACKAGE + ".__main__":
            continue
        key = package_of(me)
        done, total = out.get(key, (0, 0))
        for _, fn, in_class in _public_functions(ast.parse(open(path).read())):
            total += 1
            done += _fully_annotated(fn, in_class)
        out[key] = (done, total)
    return out


def module_lines():
    """``{module: lines}``."""
    return {m: sum(1 for _ in open(p)) for m, p in _modules().items()}


def violations():
    """Each broken rule as a line (empty: the rules hold)."""
    graph, by_name, _, mx, _ = analyse()
    out = ["circle: " + " <-> ".join(c) for c in circles(graph)]
    for me, loads in sorted(by_name.items()):
        is_init = _modules()[me].endswith("__init__.py")
        if loads and not (is_init or _is_cli(me)):
            out.append("load by name outside a package __init__ and the CLI: %s -> %s"
                       % (me, ", ".join(loads)))
    for me, targets in sorted(graph.items()):
        for t in sorted(targets):
            if t in mx and me not in mx and me != PACKAGE and not _is_cli(me):
                out.append("%s imports %s, which imports MXNet or gluoncv" % (me, t))
            if layer(t) is not None and layer(me) is not None and layer(t) > layer(me):
                out.append("upward import: %s -> %s" % (me, t))
    for user, line, home, name in private_crossings():
        if (user, home, name) not in PRIVATE_LEFT:
            out.append("private name across packages: %s:%d uses %s.%s"
                       % (user, line, home, name))
    for lit, where in sorted(constant_literals().items(), key=repr):
        name, home = CONSTANTS[lit]
        if [m for m, _ in where] != [home]:
            out.append("constant %r written %d times (%s): define it once, as %s.%s"
                       % (lit, len(where), ", ".join("%s:%d" % w for w in where), home, name))
    for n, func in function_params():
        if n > PARAMS_MAX and func not in PARAMS_LEFT:
            out.append("function over %d parameters: %s takes %d" % (PARAMS_MAX, func, n))
    for mod, n in sorted(module_lines().items()):
        if n > MODULE_LINES_MAX:
            out.append("module over %d lines: %s has %d" % (MODULE_LINES_MAX, mod, n))
    names = private_names()
    if len(names) > max(PRIVATE_NAMES_MAX, PRIVATE_NAMES_CEILING):
        out.append("%d private names used outside their module (at most %d)"
                   % (len(names), max(PRIVATE_NAMES_MAX, PRIVATE_NAMES_CEILING)))
    for mod in getpid_users():
        if mod not in GETPID_USERS:
            out.append("%s reads the process id: ask a PerProcess or a ProcessMark" % mod)
    return out


def _print_private():
    uses = private_uses()
    cross = private_crossings(uses)
    names = {(u[2], u[3]) for u in uses}
    print("private names used by another module of ours: %d uses of %d names; inside their "
          "package (allowed): %d; across packages: %d"
          % (len(uses), len(names), len(uses) - len(cross), len(cross)))
    for title, key in (("by the defining package", 2), ("by the using package", 0)):
        counts = {}
        for u in cross:
            counts[package_of(u[key])] = counts.get(package_of(u[key]), 0) + 1
        print("  across packages %s: %s" % (title, ", ".join(
            "%s %d" % (p, n) for p, n in sorted(counts.items())) or "none"))
    for user, line, home, name in cross:
        left = "" if (user, home, name) in PRIVATE_LEFT else "  (new: rule broken)"
        print("  %s:%d uses %s.%s%s" % (user, line, home, name, left))
    found = {(u[0], u[2], u[3]) for u in cross}
    for user, home, name in sorted(PRIVATE_LEFT - found):
        print("  no longer crosses, take it off PRIVATE_LEFT: %s uses %s.%s" % (user, home, name))
    print("alias-table entries naming private names (the old layout's, counted apart): %d"
          % len(alias_entries()))
    names = private_names(uses)
    print("private names used outside their module: %d (at most %d; held at %d)"
          % (len(names), PRIVATE_NAMES_MAX, PRIVATE_NAMES_CEILING))


def main():
    mods = _modules()
    graph, by_name, inside, mx, funcs = analyse()
    lines = sorted(((sum(1 for _ in open(p)), m) for m, p in mods.items()), reverse=True)
    top = [m for m in mods if m.count(".") == 1 and not mods[m].endswith("__init__.py")]
    print("modules: %d (%d directly in %s/)" % (len(mods), len(top), PACKAGE))
    print("import edges (statements, loads by name, lazy re-exports): %d"
          % sum(len(v) for v in graph.values()))
    found = circles(graph)
    print("import circles: %d%s" % (len(found), "".join("\n  " + " <-> ".join(c)
                                                         for c in found)))
    print("modules loading others by name: %s" % (", ".join(sorted(by_name)) or "none"))
    print("modules importing MXNet or gluoncv: %s" % ", ".join(sorted(mx)))
    outside_cli = [i for i in inside if not _is_cli(i[0])]
    print("imports of our modules inside functions (outside the CLI): %d" % len(outside_cli))
    for me, line, where in outside_cli:
        print("  %s:%d -> %s" % (me, line, ", ".join(where)))
    _print_private()
    broken = violations()
    print("rules broken: %d" % len(broken))
    for line in broken:
        print("  " + line)
    print("largest modules: " + ", ".join("%s %d" % (m, n) for n, m in lines[:5]))
    print("largest functions: " + ", ".join("%s %d" % (f, n)
                                            for n, f in sorted(funcs, reverse=True)[:8]))
    ann = annotations()
    done, total = sum(d for d, _ in ann.values()), sum(t for _, t in ann.values())
    print("public functions of the core fully annotated: %d of %d (%d%%): %s"
          % (done, total, 100 * done // max(total, 1), ", ".join(
              "%s %d%%" % (p.split(".")[-1], 100 * d // max(t, 1))
              for p, (d, t) in sorted(ann.items()))))
    readme = sum(1 for _ in open(os.path.join(ROOT, "README.md")))
    pages = glob.glob(os.path.join(ROOT, "docs", "*.md"))
    print("README lines: %d; docs pages: %d" % (readme, len(pages)))
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
