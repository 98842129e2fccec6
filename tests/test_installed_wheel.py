"""The package as users install it, by README.md's commands as written: the sdist built from
this tree (and the wheel from it), the sdist installed with its extras into a fresh virtual
environment (no ``-e``, no ``PYTHONPATH``,
not this checkout's folder) and used from an empty folder: convert, info, verify, a
``DataLoader(num_workers=2)`` read, a Dask conversion, the demo, and an import of every module
found in the installed package, compared with the modules of the source tree. Where this
Python's install has no MXNet (>= 3.12) the Gluon read skips, the demo is the numpy one and the
Gluon modules must refuse with the ImportError naming MXNet (tests/test_core_wheel.py checks
that install further).

Needs the package registry (pip resolves the extras against constraints.txt): without it the
install fails, and so do these tests. The install happens once for the module (about two to
three minutes, most of it pip).
"""
import importlib.util
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tarfile
import textwrap
import venv
import zipfile
from pathlib import Path

import pytest

# The first test also pays for the build and the install (fixture set-up counts).
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "gluon_data"
# Never copied into the build's copy of the tree: environments, build outputs, caches, data.
JUNK = [".git", ".venv", "venv", "build", "dist", "*.egg-info", "__pycache__", "*.py[cod]",
        ".pytest_cache", ".hypothesis", "demo-data", "bench-data", "bench-data-quick", "*.so"]
# What the sdist must carry besides the package: what README.md links to and the pinned set
# its install commands use.
SDIST_FILES = ["pyproject.toml", "README.md", "FORMAT.md", "constraints.txt",
               "docs/preview.png", "docs/reading.md", "docs/cli.md", "scripts/run.sh",
               "scripts/gen_cli_docs.py", "benchmarks/bench.py",
               "tests/conftest.py", "setup.py", "gluon_data/format/_jpegregion.c",
               "gluon_data/format/_maskrle.c", "gluon_data/convert/_moments.c",
               "gluon_data/arrays/_blur.c"]


#: Where README.md's install commands are: the code block after this line.
README_INSTALL = "Without the checkout's `.venv`, install it as any package"


def readme_install_commands():
    """The commands of README.md's install block, each as argv: ``[from a clone, build, the
    sdist]``. The wheel tests run them as written (``pip`` is the fresh venv's, ``python``
    this interpreter, the build tool of the test extra), in a copy of the tree."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    block = text.split(README_INSTALL, 1)[1].split("```bash\n", 1)[1].split("```", 1)[0]
    return [shlex.split(line.split("  #", 1)[0]) for line in block.splitlines()
            if line.split("  #", 1)[0].strip()]


def run_readme_install(src: Path, py: Path):
    """README's install of the sdist, as written, from the tree copy ``src``: its ``python -m
    build`` there, then its ``pip install`` of ``dist/...tar.gz[extras]`` with ``py``'s pip.
    Returns ``(sdist, wheel)``: the two files the build made (the wheel: this Python's)."""
    _, build, install = readme_install_commands()
    _run([sys.executable] + build[1:], cwd=src, timeout=600, env=dict(os.environ))
    dist = src / "dist"
    sdists, wheels = sorted(dist.glob("*.tar.gz")), sorted(dist.glob("*.whl"))
    assert len(sdists) == 1 and len(wheels) == 1, sorted(os.listdir(dist))
    tag = wheels[0].name.split("-")[2]
    assert tag in ("cp%d%d" % sys.version_info[:2], "py3"), wheels[0].name  # this Python's
    _run([py, "-m"] + install, cwd=src, timeout=900)
    return sdists[0], wheels[0]


def _source_files():
    """Every module file of the package in the source tree, as ``gluon_data/x/y.py``."""
    return {p.relative_to(ROOT).as_posix() for p in (ROOT / PACKAGE).rglob("*.py")
            if "__pycache__" not in p.parts}


def _source_modules():
    """Dotted names of every module of the package in the source tree."""
    names = set()
    for f in _source_files():
        parts = f[:-len(".py")].split("/")
        if parts[-1] == "__init__":
            parts.pop()
        names.add(".".join(parts))
    return names


def _clean_env():
    """The environment of a user's shell: no PYTHONPATH or other hook into this checkout."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "PYTHONSAFEPATH",
                        "VIRTUAL_ENV", "GLUON_DATA_BENCH", "PYTHONNOUSERSITE")}
    env["PYTHONNOUSERSITE"] = "1"  # nothing from ~/.local either
    return env


def _run(cmd, cwd, timeout, env=None, check=True):
    """Run ``cmd`` in its own session; past ``timeout`` the whole session (DataLoader and Dask
    workers included) is killed and the test fails."""
    p = subprocess.Popen([str(c) for c in cmd], cwd=str(cwd), env=env or _clean_env(),
                         stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, err = p.communicate()
        pytest.fail("%s did not finish in %d s\n--- stdout\n%s\n--- stderr\n%s"
                    % (" ".join(map(str, cmd)), timeout, out[-4000:], err[-4000:]))
    finally:
        try:  # workers left behind by a command that exited
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    r = subprocess.CompletedProcess(p.args, p.returncode, out, err)
    if check and r.returncode != 0:
        pytest.fail("%s exited %d\n--- stdout\n%s\n--- stderr\n%s"
                    % (" ".join(map(str, cmd)), r.returncode, r.stdout[-4000:],
                       r.stderr[-4000:]))
    return r


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """Build the sdist and the wheel from it (``python -m build``), install the wheel with the
    dask and remote extras into a fresh venv; yields a dict of the paths."""
    spec = importlib.util.find_spec("build")
    if spec is None or spec.origin is None:  # (a stray build/ folder is a namespace package)
        pytest.fail("the installed-wheel tests need the `build` package of the test extra: "
                    "pip install -c constraints.txt -e .[test]")
    base = tmp_path_factory.mktemp("wheel")
    src, env_dir, work = base / "src", base / "venv", base / "work"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(*JUNK))
    work.mkdir()
    venv.EnvBuilder(with_pip=True, clear=True).create(str(env_dir))
    py = env_dir / "bin" / "python"
    # README's commands as written, in the copy (nothing is written into the checkout): the
    # build (the sdist, and the wheel from it), then the install of the sdist with its extras
    sdist, wheel = run_readme_install(src, py)
    has_mx = _run([py, "-c", "import importlib.util; print(importlib.util.find_spec('mxnet') "
                   "is not None)"], cwd=work, timeout=120).stdout.strip() == "True"
    yield {"sdist": sdist, "wheel": wheel, "python": py,
           "gluon_data": env_dir / "bin" / "gluon-data", "base": base, "has_mxnet": has_mx}


def _needs_mxnet(installed, what: str) -> None:
    """Skip, naming ``what``, where the install brought no MXNet (Python >= 3.12: the
    pyproject markers leave it out; tests/test_core_wheel.py checks that install)."""
    if not installed["has_mxnet"]:
        pytest.skip("%s is the Gluon layer's: this Python's install has no MXNet (it installs "
                    "on Python <= 3.11)" % what)


@pytest.fixture
def empty(installed, tmp_path):
    """An empty folder outside the checkout to run from."""
    d = tmp_path / "empty"
    d.mkdir()
    return d


def test_sdist_carries_the_tree_and_the_wheel_only_the_package(installed):
    with tarfile.open(installed["sdist"]) as t:
        top = t.getnames()[0].split("/")[0]
        members = {n[len(top) + 1:] for n in t.getnames() if n.startswith(top + "/")}
    wanted = set(SDIST_FILES) | _source_files()
    wanted |= {p.name for p in ROOT.glob("LICENSE*")}
    assert not wanted - members, "not in the sdist: %s" % sorted(wanted - members)
    with zipfile.ZipFile(installed["wheel"]) as z:
        names = z.namelist()
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert tops == {PACKAGE}, "the wheel installs more than the package: %s" % sorted(tops)
    missing = _source_files() - set(names)
    assert not missing, "not in the wheel: %s" % sorted(missing)
    assert PACKAGE + "/py.typed" in names, "the wheel does not ship its annotations (py.typed)"


def _can_build_extension() -> bool:
    """Whether this machine builds the optional region decoder: required by the build
    (GLUON_DATA_BUILD_EXT=1), or a C compiler and libjpeg's header are there."""
    if os.environ.get("GLUON_DATA_BUILD_EXT") == "1":
        return True
    header = any(Path(d, "jpeglib.h").exists() for d in ("/usr/include", "/usr/local/include"))
    return header and shutil.which(os.environ.get("CC", "cc")) is not None


def test_wheel_has_the_region_decoder_where_it_can_be_built(installed, empty):
    if not _can_build_extension():
        pytest.skip("no C compiler or libjpeg headers: the wheel is rightly pure Python")
    with zipfile.ZipFile(installed["wheel"]) as z:
        # the region decoder, the mask expander, the pixel statistics, the blur
        for ext in ("format/_jpegregion", "format/_maskrle", "convert/_moments", "arrays/_blur"):
            assert any(n.startswith(PACKAGE + "/%s." % ext) and n.endswith(".so")
                       for n in z.namelist()), "the wheel lacks %s" % ext
    r = _run([installed["python"], "-c", "from gluon_data import decode; "
              "from gluon_data.format import masks; from gluon_data.convert import encode; "
              "from gluon_data.arrays import blur; "
              "print(decode.region_decoder(), masks._ext is not None, "
              "encode._moments is not None, blur.EXACT_ROUTINE)"], cwd=empty, timeout=120)
    assert (r.stdout.startswith("region decode")
            and r.stdout.split()[-3:] == ["True", "True", "True"]), r.stdout


def test_every_module_of_the_tree_is_installed_and_imports(installed, empty):
    """Every module of the tree is in the install and imports; where the install has no MXNet
    the Gluon layer's modules (and only they) refuse with the ImportError that says what to
    install. Modules are found from the installed files, not by importing packages (a
    package that fails to import would hide its modules)."""
    script = textwrap.dedent("""
        import importlib, json, os, pkgutil
        import gluon_data
        found, errors = [gluon_data.__name__], {}
        def walk(path, prefix):
            for m in pkgutil.iter_modules(path):
                yield prefix + m.name
                if m.ispkg:
                    yield from walk([os.path.join(p, m.name) for p in path],
                                    prefix + m.name + ".")
        for name in walk(gluon_data.__path__, "gluon_data."):
            found.append(name)
            if name.endswith(".__main__"):
                continue  # runs the CLI when executed, not on import; found is enough
            try:
                importlib.import_module(name)
            except Exception as e:
                errors[name] = "%s: %s" % (type(e).__name__, e)
        print(json.dumps({"file": gluon_data.__file__, "found": found, "errors": errors}))
    """)
    r = _run([installed["python"], "-c", script], cwd=empty, timeout=300)
    out = json.loads(r.stdout.strip().splitlines()[-1])
    site = Path(out["file"]).resolve()
    assert installed["base"].resolve() / "venv" in site.parents, out["file"]
    assert ROOT not in site.parents, out["file"]
    errors = out["errors"]
    if not installed["has_mxnet"]:
        gluon = {n for n in _source_modules() if n == PACKAGE + ".gluon"
                 or n.startswith(PACKAGE + ".gluon.")}
        assert set(errors) == gluon, sorted(set(errors) ^ gluon)
        assert all(e.startswith("ImportError: ") and "needs MXNet" in e
                   for e in errors.values()), errors
        errors = {}
    assert not errors, errors
    missing = _source_modules() - set(out["found"])
    assert not missing, "in the source tree, not in the installed package: %s" % sorted(missing)


def test_convert_info_verify_dask_from_an_empty_folder(installed, empty):
    py, gd = installed["python"], installed["gluon_data"]
    _run([py, "-c", "from gluon_data.convert.sample import make_voc; make_voc('voc', num_images=12)"],
         cwd=empty, timeout=120)
    r = _run([gd, "convert", "voc", "out/voc.rec", "--layout", "voc", "--split", "trainval",
              "--workers", "2", "--quiet"], cwd=empty, timeout=300)
    assert "wrote 12 records" in r.stdout, r.stdout
    info = json.loads(_run([gd, "info", "out/voc.rec", "--json"], cwd=empty,
                           timeout=120).stdout)
    assert info["records"] == 12 and info["task"] == "segmentation", info
    r = _run([gd, "verify", "out/voc.rec", "--deep"], cwd=empty, timeout=300)
    assert "12 checked (deep: decoded): OK" in r.stdout, r.stdout
    # Dask workers unpickle the shard tasks: they import gluon_data.convert from the venv.
    r = _run([gd, "convert", "voc", "out/s.rec", "--layout", "voc", "--split", "trainval",
              "--shards", "2", "--engine", "dask", "--workers", "2", "--quiet"],
             cwd=empty, timeout=300)
    assert "wrote 12 records" in r.stdout, r.stdout
    assert "12 checked: OK" in _run([gd, "verify", "out/s.shards.json"], cwd=empty,
                                    timeout=300).stdout


def test_gluon_dataloader_read_from_an_empty_folder(installed, empty):
    _needs_mxnet(installed, "gluon_data.DataLoader")
    py, gd = installed["python"], installed["gluon_data"]
    _run([py, "-c", "from gluon_data.convert.sample import make_voc; make_voc('voc', num_images=12)"],
         cwd=empty, timeout=120)
    _run([gd, "convert", "voc", "out/voc.rec", "--layout", "voc", "--split", "trainval",
          "--quiet"], cwd=empty, timeout=300)
    reader = textwrap.dedent("""
        import gluon_data
        from gluon_data.gluon.batchify import SegmentationBatchify
        ds = gluon_data.SegmentationRecordDataset("out/voc.rec")
        loader = gluon_data.DataLoader(ds, batch_size=4, num_workers=2,
                                       batchify_fn=SegmentationBatchify())
        print("read", sum(imgs.shape[0] for imgs, masks in loader), "of", len(ds))
    """)
    assert "read 12 of 12" in _run([py, "-c", reader], cwd=empty, timeout=300).stdout


def test_demo_and_help_from_an_empty_folder(installed, empty):
    """The demo reads through Gluon's DataLoader where the install has MXNet, else as numpy
    arrays (gluon_data.arrays) in the converter's pool of worker processes."""
    gd = installed["gluon_data"]
    r = _run([gd, "demo", "--num-images", "16", "--epochs", "1", "--batch-size", "4"],
             cwd=empty, timeout=300)
    how = ("DataLoader(num_workers=2)" if installed["has_mxnet"] else
           "gluon_data.arrays in 2 worker processes")
    assert "OK: " in r.stdout and "1 times through %s" % how in r.stdout, r.stdout
    assert "--layout" in _run([gd, "convert", "--help"], cwd=empty, timeout=60).stdout
    assert not os.listdir(empty), os.listdir(empty)  # the demo cleans up after itself


def test_bench_is_a_checkout_tool_not_offered_by_a_wheel(installed, empty):
    gd = installed["gluon_data"]
    helptext = _run([gd, "--help"], cwd=empty, timeout=60).stdout
    assert "convert" in helptext and "demo" in helptext
    assert "bench" not in helptext, helptext
    r = _run([gd, "bench", "--quick"], cwd=empty, timeout=60, check=False)
    assert r.returncode != 0 and r.stdout == "", (r.returncode, r.stdout)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "source checkout" in lines[0], r.stderr
    assert "Traceback" not in r.stderr
