"""Runs a function right after a module is first imported, without importing it (a one-shot
finder on ``sys.meta_path``): how ``import horst`` registers its optimizers with timm only if
and when the program imports ``timm.optim`` (``horst.timm``)."""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
import warnings
from collections.abc import Callable, Sequence
from types import ModuleType


class _CallAfterImport(importlib.abc.MetaPathFinder):
    def __init__(self, name: str, function: Callable[[], None]) -> None:
        self.name, self.function = name, function

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)  # one shot; the finders after it find the module
        spec = importlib.util.find_spec(fullname)
        if spec is None or not hasattr(spec.loader, "exec_module"):
            return spec
        execute = spec.loader.exec_module

        def execute_then_call(module: ModuleType) -> None:
            execute(module)
            try:
                self.function()
            except Exception as error:  # noqa: BLE001 - the user's import must not fail for horst's sake
                warnings.warn(
                    f"horst: {self.function.__qualname__}() after importing {self.name} failed "
                    f"({type(error).__name__}: {error})",
                    stacklevel=2,
                )

        spec.loader.exec_module = execute_then_call
        return spec


def call_after_import(name: str, function: Callable[[], None]) -> None:
    """``function()`` now if module ``name`` is imported, else right after its first import."""
    if name in sys.modules:
        function()
    else:
        sys.meta_path.insert(0, _CallAfterImport(name, function))
