"""Every error a client can be told is defined in `switchyard.core.errors` and drawn in its tree."""

from __future__ import annotations

import importlib
import pkgutil
import re

import switchyard
from switchyard.core import errors
from switchyard.core.errors import SwitchyardError


def _every_module() -> None:
    for module in pkgutil.walk_packages(switchyard.__path__, "switchyard."):
        if not module.name.endswith("__main__"):  # runs the CLI
            importlib.import_module(module.name)


def _subclasses(cls: type) -> set[type]:
    found = set(cls.__subclasses__())
    for sub in list(found):
        found |= _subclasses(sub)
    return found


def _tree() -> dict[str, int]:
    """Each class the docstring draws, with its depth in the tree."""
    doc = errors.__doc__ or ""
    drawn = {}
    for line in doc.splitlines():
        match = re.match(r"^    ([│ ]*)(?:[├└]── )?([A-Z]\w+)\s", line)
        if match:
            drawn[match.group(2)] = len(match.group(1)) // 4 + (1 if "──" in line else 0)
    return drawn


def test_every_client_error_is_defined_in_core_errors() -> None:
    _every_module()
    elsewhere = sorted(
        f"{cls.__module__}.{cls.__name__}"
        for cls in _subclasses(SwitchyardError)
        if cls.__module__.startswith("switchyard.") and cls.__module__ != "switchyard.core.errors"
    )
    assert elsewhere == []


def test_the_docstring_draws_every_class_under_its_parent() -> None:
    drawn = _tree()
    defined = {
        cls.__name__: cls
        for cls in [SwitchyardError, *_subclasses(SwitchyardError)]
        if cls.__module__ == "switchyard.core.errors"
    }
    assert set(drawn) == set(defined)
    for name, cls in defined.items():
        if cls is not SwitchyardError:
            assert drawn[name] == drawn[cls.__mro__[1].__name__] + 1, name
