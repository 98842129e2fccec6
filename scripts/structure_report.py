"""Print the package's structure figures: import circles, imports of our own modules made
inside functions, the largest modules and functions, README lines and docs pages.

    python scripts/structure_report.py

Reads the code with ``ast`` only (nothing is imported or run).
"""
import ast
import glob
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _modules():
    files = sorted(glob.glob(os.path.join(ROOT, "gluon_data", "**", "*.py"), recursive=True))
    return {os.path.relpath(p, ROOT)[:-3].replace(os.sep, ".").replace(".__init__", ""): p
            for p in files}


def _targets(node, me, mods, is_pkg):
    """The gluon_data modules one import statement names."""
    pkg = me if is_pkg else me.rpartition(".")[0]
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    else:
        base = node.module or ""
        if node.level:
            parts = pkg.split(".")
            parts = parts[:len(parts) - (node.level - 1)]
            base = ".".join(parts + ([base] if base else []))
        names = [base + "." + a.name for a in node.names] + [base]
    out = set()
    for t in names:
        while t and t not in mods:
            t = t.rpartition(".")[0]
        if t and t != me:
            out.add(t)
            if not isinstance(node, ast.Import):
                break
    return out


def _graph(mods):
    graph, inside, funcs = {}, [], []
    for me, path in mods.items():
        tree = ast.parse(open(path).read())
        is_pkg = path.endswith("__init__.py")
        graph[me] = set()
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                funcs.append((node.end_lineno - node.lineno + 1, "%s:%s" % (me, node.name)))
                for sub in ast.walk(node):
                    if isinstance(sub, (ast.Import, ast.ImportFrom)):
                        found = _targets(sub, me, mods, is_pkg)
                        if found:
                            inside.append((me, sub.lineno, sorted(found)))
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                graph[me] |= _targets(node, me, mods, is_pkg)
    return graph, inside, funcs


def _circles(graph):
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


def main():
    mods = _modules()
    graph, inside, funcs = _graph(mods)
    # a package importing its own submodules is how it re-exports them, not a circle
    for me in graph:
        graph[me] = {t for t in graph[me] if not t.startswith(me + ".")}
    circles = _circles(graph)
    lines = sorted(((sum(1 for _ in open(p)), m) for m, p in mods.items()), reverse=True)
    print("modules: %d" % len(mods))
    print("import circles: %d%s" % (len(circles), "".join("\n  " + " <-> ".join(c)
                                                          for c in circles)))
    outside_cli = [i for i in inside if i[0] != "gluon_data.cli"
                   and not i[0].startswith("gluon_data.cli.")]
    print("imports of our modules inside functions (outside the CLI): %d" % len(outside_cli))
    for me, line, found in outside_cli:
        print("  %s:%d -> %s" % (me, line, ", ".join(found)))
    print("largest modules: " + ", ".join("%s %d" % (m, n) for n, m in lines[:5]))
    print("largest functions: " + ", ".join("%s %d" % (f, n)
                                            for n, f in sorted(funcs, reverse=True)[:8]))
    readme = sum(1 for _ in open(os.path.join(ROOT, "README.md")))
    pages = glob.glob(os.path.join(ROOT, "docs", "*.md"))
    print("README lines: %d; docs pages: %d" % (readme, len(pages)))


if __name__ == "__main__":
    main()
