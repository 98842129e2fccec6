"""Modules named like the function they export stay callable.

``gluon_data.convert``, ``gluon_data.tools.verify`` and ``gluon_data.tools.salvage`` are both a module and
the function ``from gluon_data import convert`` promises. Once the module has been imported
(by anything), Python binds the package attribute to the module, so the function the lazy
table names would be shadowed; calling the module forwards to the function instead.
"""
import sys
import types

__all__ = ["callable_module"]


class _CallableModule(types.ModuleType):
    def __call__(self, *args, **kwargs):
        return getattr(self, self.__name__.rpartition(".")[2])(*args, **kwargs)


def callable_module(name: str) -> None:
    """Make module ``name`` (already in ``sys.modules``) call its same-named function."""
    sys.modules[name].__class__ = _CallableModule
