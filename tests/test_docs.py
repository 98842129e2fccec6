"""The user docs stay true: the CLI page equals ``--help``, every relative link resolves, and
the architecture page lists exactly the package's modules."""
import importlib.util
import os
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", ROOT / "FORMAT.md"] + sorted((ROOT / "docs").glob("*.md"))
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)|!\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)


def _gen():
    spec = importlib.util.spec_from_file_location("gen_cli_docs",
                                                  ROOT / "scripts" / "gen_cli_docs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_cli_page_matches_help(monkeypatch):
    monkeypatch.setenv("COLUMNS", "100")
    expected = _gen().render()
    actual = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
    assert actual == expected, ("docs/cli.md differs from `gluon-data --help`: run "
                                "`python scripts/gen_cli_docs.py` and commit docs/cli.md")


def slug(heading):
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(path):
    text = FENCE.sub("", path.read_text(encoding="utf-8"))
    return {slug(m.group(1)) for m in re.finditer(r"^#{1,6}\s+(.+?)\s*#*$", text, re.M)}


def links(path):
    text = FENCE.sub("", path.read_text(encoding="utf-8"))
    text = re.sub(r"`[^`\n]*`", "", text)
    for m in LINK.finditer(text):
        yield m.group(1) or m.group(2)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_relative_links_resolve(page):
    bad = []
    for target in links(page):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        name, _, anchor = target.partition("#")
        dest = (page.parent / name).resolve() if name else page
        if not dest.exists():
            bad.append("%s (no such file)" % target)
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            bad.append("%s (no heading with that anchor in %s)"
                       % (target, dest.relative_to(ROOT)))
    assert not bad, "%s has broken links: %s" % (page.relative_to(ROOT), "; ".join(bad))


def test_slug_matches_github():
    assert slug("Cold reads: batch hints") == "cold-reads-batch-hints"
    assert slug("Training a segmentation model (gluoncv's recipe)") == \
        "training-a-segmentation-model-gluoncvs-recipe"
    assert slug("8. Datasets in object storage") == "8-datasets-in-object-storage"


def test_architecture_lists_every_module():
    page = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    listed = set(re.findall(r"`(gluon_data/[\w/]+\.py)`", page))
    present = {p.relative_to(ROOT).as_posix() for p in (ROOT / "gluon_data").rglob("*.py")
               if "__pycache__" not in p.parts}
    assert not present - listed, ("docs/architecture.md does not list %s"
                                  % sorted(present - listed))
    assert not listed - present, ("docs/architecture.md lists modules that do not exist: %s"
                                  % sorted(listed - present))


def test_no_internal_references_in_user_docs():
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for pattern in (r"#1[0-9]\b", r"\bissue #", r"this session"):
            assert not re.search(pattern, text), "%s: %s" % (page.name, pattern)
