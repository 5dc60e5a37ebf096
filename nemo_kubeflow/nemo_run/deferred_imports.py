"""Importing a module while some packages it names are stand-ins, for a command that never uses them.

``import nemo_run`` imports every executor NeMo-Run has and what each needs (``nemo_run_import.NEMO_RUN_DEFERRED``
lists the packages ``render`` and ``validate`` never call: most of NeMo-Run's import time). For the span
of that one import (``import_deferring``) those packages answer with stand-in modules; on leaving, the
stand-ins leave ``sys.modules``, and any later ``import`` gets the real package.

Only the modules that imported a stand-in keep it (NeMo-Run's Lepton and Kubeflow executors, its SSH
tunnel, its experiment runner, fiddle's code printing): calling into one of its names afterwards raises
``DeferredImportError`` naming the package and the setting that turns deferral off. A module that fails
to import this way (a version that uses one of them while importing) is imported again, in full.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import os
import sys
import types
from typing import Iterable, NoReturn

#: Set to 1 to import everything for real (the stand-ins are then never made).
FULL_IMPORT_ENV = "NEMO_KUBEFLOW_FULL_IMPORT"


class DeferredImportError(ImportError):
    """A name of a deferred package was used."""


#: How many ``import_deferring`` calls are importing now: while one is, a stand-in called makes an
#: inert object (a module-level ``logger = pkg.get_logger()``); afterwards it raises.
_importing = 0


class _StandIn(type):
    """What a deferred package's names are: classes (each can be subclassed, called while importing,
    subscripted or put in an annotation), whose attributes are stand-ins again."""

    #: The deferred package the name is from (set by ``stand_in``).
    _package: str

    def __call__(cls, *args, **kwargs):
        if not _importing:
            _unavailable(cls.__qualname__, cls._package)
        return super().__call__()

    def __getattr__(cls, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return stand_in(f"{cls.__qualname__}.{name}", cls._package)

    def __getitem__(cls, item):
        return cls


def _unavailable(qualname: str, package: str) -> NoReturn:
    raise DeferredImportError(
        f"{qualname} is from {package}, which this command does not import (it defers it to "
        f"start faster); set {FULL_IMPORT_ENV}=1 to import it"
    )


def stand_in(qualname: str, package: str) -> type:
    def unavailable(self, *args, **kwargs):
        _unavailable(qualname, package)  # the class made here is self's

    return _StandIn(
        qualname.rsplit(".", 1)[-1],
        (),
        {
            "__qualname__": qualname,
            "_package": package,
            "__call__": unavailable,
            "__getattr__": unavailable,
        },
    )


class StandInModule(types.ModuleType):
    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return stand_in(f"{self.__name__}.{name}", self.__name__.partition(".")[0])


class _StandInFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, packages: Iterable[str]):
        self.packages = frozenset(packages)

    def find_spec(self, fullname, path=None, target=None):
        if fullname.partition(".")[0] in self.packages:
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        module = StandInModule(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module):
        pass


def import_deferring(module: str, packages: Iterable[str]) -> types.ModuleType:
    """``import module``, with ``packages`` (top-level names) as stand-ins while it imports.

    Imports in full when the module is already imported, when one of the packages already is (its
    modules hold the real one), or when ``NEMO_KUBEFLOW_FULL_IMPORT`` is set."""
    packages = tuple(packages)
    if (
        module in sys.modules
        or os.environ.get(FULL_IMPORT_ENV)
        or any(name.partition(".")[0] in packages for name in sys.modules)
    ):
        return importlib.import_module(module)
    global _importing
    before = set(sys.modules)
    finder = _StandInFinder(packages)
    sys.meta_path.insert(0, finder)
    _importing += 1
    try:
        return importlib.import_module(module)
    except Exception:
        # whatever this import brought in may hold stand-ins: forget all of it, then import in full
        for name in set(sys.modules) - before:
            del sys.modules[name]
    finally:
        _importing -= 1
        sys.meta_path.remove(finder)
        for name in [n for n, m in sys.modules.items() if isinstance(m, StandInModule)]:
            del sys.modules[name]
    return importlib.import_module(module)
