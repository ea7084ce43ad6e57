from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from tests.tiny_model import build_tiny_model


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="session")
def tiny_model(tiny_model_dir):
    from switchyard.backends.embedded.models import load_model

    return load_model(str(tiny_model_dir))


@pytest.fixture
async def make_engine(tiny_model) -> AsyncIterator:
    from switchyard.backends.embedded.engine import EmbeddedEngine, EngineLimits

    engines = []

    async def make(**limits) -> EmbeddedEngine:
        model, tokenizer = tiny_model
        engine = EmbeddedEngine(model, tokenizer, EngineLimits(**limits), name="tiny")
        await asyncio.to_thread(engine.start)
        engines.append(engine)
        return engine

    yield make
    for engine in engines:
        await asyncio.to_thread(engine.stop)
