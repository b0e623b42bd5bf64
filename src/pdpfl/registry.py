"""One generic registry for everything pdpfl looks up by name (algorithms, ``compare`` methods).

A :class:`Registry` maps names to items of one type and knows the modules that register pdpfl's
own items (``builtins``): they are imported on first access, so registering costs nothing until
something is looked up, and a user's module registers its own items by being imported first
(``pdpfl run --import my_algorithms.py``). ``builtins`` may be a declared table (name → the
module that registers it): :meth:`Registry.get` of a declared name then imports that one module
only (parsing a config imports the chosen algorithm's package, not every package). Lookups
of an unknown name raise a ``ValueError`` that names the registry's field and the registered
names, ready for a CLI error message.

This module imports nothing of pdpfl: every layer may use it.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator, Mapping
from typing import Generic, TypeVar

__all__ = ["Registry"]

T = TypeVar("T")


class Registry(Generic[T]):
    """Name → item, with pdpfl's own items registered lazily.

    Parameters
    ----------
    field
        What a name stands for in messages, e.g. ``"algorithm.name"``.
    builtins
        Modules that register pdpfl's own items when imported (loaded on first access), or a
        table name → module (a name's module is imported when that name is looked up).
    """

    def __init__(self, field: str, builtins: tuple[str, ...] | Mapping[str, str] = ()) -> None:
        self.field = field
        self._declared: dict[str, str] = dict(builtins) if isinstance(builtins, Mapping) else {}
        self._builtins = tuple(dict.fromkeys(self._declared.values())) or tuple(builtins)
        self._items: dict[str, T] = {}
        self._loaded = not self._builtins
        #: Incremented by every registration (consumers cache derived objects against it).
        self.version = 0

    def _load(self) -> None:
        if self._loaded:
            return
        self._loaded = True
        for module in self._builtins:
            importlib.import_module(module)

    def register(self, name: str, item: T, *, replace: bool = False) -> T:
        """Register ``item`` under ``name`` (ValueError if taken, unless ``replace``)."""
        if not name or not isinstance(name, str):
            raise ValueError(f"{self.field}: a registered name must be a non-empty string")
        if name in self._items and not replace:
            raise ValueError(f"{self.field}: {name!r} is already registered")
        self._items[name] = item
        self.version += 1
        return item

    def decorator(self, name: str, *, replace: bool = False) -> Callable[[T], T]:
        """``@registry.decorator("name")`` registers what it decorates."""

        def wrap(item: T) -> T:
            return self.register(name, item, replace=replace)

        return wrap

    def declared(self) -> dict[str, str]:
        """The declared table of built-in names → the module that registers each."""
        return dict(self._declared)

    def load(self, name: str) -> None:
        """Import the module declared for ``name`` (all built-in modules if it is not declared
        and not registered): afterwards ``name`` is registered if it exists at all."""
        if name in self._items:
            return
        module = self._declared.get(name)
        if module is None:
            self._load()
        else:
            importlib.import_module(module)

    def get(self, name: str) -> T:
        """The item registered as ``name``; ValueError naming the field and the choices."""
        self.load(name)
        try:
            return self._items[name]
        except KeyError:
            raise ValueError(
                f"{self.field}: unknown {name!r}; registered: {', '.join(self.names())}"
            ) from None

    def registered(self, name: str) -> bool:
        """True if ``name`` is registered *now* (does not load the built-in modules)."""
        return name in self._items

    def __contains__(self, name: object) -> bool:
        if name in self._items or name in self._declared:
            return True
        self._load()
        return name in self._items

    def loaded(self) -> list[T]:
        """The items registered *now* (does not load the built-in modules)."""
        return list(self._items.values())

    def names(self) -> list[str]:
        self._load()
        return list(self._items)

    def values(self) -> list[T]:
        self._load()
        return list(self._items.values())

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        self._load()
        return len(self._items)
