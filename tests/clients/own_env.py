"""Clients whose packages do not install beside the openai 3.x SDK in .venv (docs/clients.md).

`make test-clients-openai2` runs their test files in .venv-clients-openai2, where they install with
openai 2.x, and sets SWITCHYARD_CLIENTS_OPENAI2=1: there a missing package fails the run. Elsewhere
(`make test`, in .venv) the files skip, with a reason naming that target."""

from __future__ import annotations

import importlib
import importlib.metadata
import os
from types import ModuleType

import pytest

OWN_ENV = "SWITCHYARD_CLIENTS_OPENAI2"


def import_client(module: str, why: str) -> ModuleType:
    if not os.environ.get(OWN_ENV):
        return pytest.importorskip(module, reason=f"{why}; `make test-clients-openai2` runs them in their own env")
    # The env's openai 2.x must shadow .venv's 3.x (Makefile); else these would test the wrong SDK.
    openai_version = importlib.metadata.version("openai")
    if not openai_version.startswith("2."):
        raise RuntimeError(f"{OWN_ENV} is set but openai is {openai_version}, not 2.x")
    return importlib.import_module(module)
