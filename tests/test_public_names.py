"""Public names keep working whatever was imported first."""
import subprocess
import sys

import pytest


@pytest.mark.parametrize("name,module", [("convert", "gluon_data.convert.driver"),
                                         ("verify", "gluon_data.tools.verify"),
                                         ("salvage", "gluon_data.tools.salvage")])
def test_a_function_named_like_its_module_stays_callable(name, module):
    """``import gluon_data.tools.salvage`` binds the package attribute to the module; ``from
    gluon_data import salvage`` must still give something that runs the function."""
    code = ("import inspect, %s\nfrom gluon_data import %s as f\nimport gluon_data.%s as m\n"
            "assert callable(f), f\n"
            "assert inspect.signature(getattr(m, %r)).parameters\n"
            "try:\n    f()\nexcept TypeError as e:\n"
            "    assert 'required positional argument' in str(e), e\n"
            "    print('raised', e)\n" % (module, name, name, name))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0 and "raised" in out.stdout, out.stderr[-2000:]


@pytest.mark.parametrize("name", ["RecipeLMDBDataset", "CaffeLMDBDataset"])
def test_moved_legacy_dataset_names_warn_and_still_work(name):
    import gluon_data
    import gluon_data.stores.legacy as legacy
    with pytest.warns(DeprecationWarning, match="moved to gluon_data.%s" % name):
        cls = getattr(legacy, name)
    assert cls is getattr(gluon_data, name)
