"""`switchyard eval collect` against fake upstreams: graded traces with logprobs, resumable."""

from __future__ import annotations

from contextlib import ExitStack

import orjson
import pytest
import yaml
from typer.testing import CliRunner

from switchyard.cli import app
from switchyard.core.traces import read_traces
from tests.fakes.openai_upstream import FakeBehaviour, FakeOpenAIUpstream, FakeState
from tests.fakes.server import serve_in_thread

runner = CliRunner()


@pytest.fixture
def two_models(tmp_path):
    states = {"cheap": FakeState(), "strong": FakeState(behaviour=FakeBehaviour(words=("so", "18")))}
    with ExitStack() as stack:
        urls = {n: stack.enter_context(serve_in_thread(FakeOpenAIUpstream(s))) + "/v1" for n, s in states.items()}
        config = tmp_path / "switchyard.yaml"
        models = [
            {
                "name": "cheap",
                "base_url": urls["cheap"],
                "price": {"input_usd_per_mtok": 0.1, "output_usd_per_mtok": 0.2},
            },
            {
                "name": "strong",
                "base_url": urls["strong"],
                "price": {"input_usd_per_mtok": 1, "output_usd_per_mtok": 2},
            },
        ]
        config.write_text(yaml.safe_dump({"models": models}))
        yield states, config


def _dataset(path, n):
    rows = [{"id": f"q{i}", "prompt": f"Janet has {i} ducks … how much?", "answer": "18"} for i in range(n)]
    path.write_bytes(b"\n".join(orjson.dumps(r) for r in rows))


def test_collect_grades_prices_and_resumes(tmp_path, two_models):
    states, config = two_models
    dataset, out = tmp_path / "questions.jsonl", tmp_path / "traces.jsonl"
    _dataset(dataset, 10)
    args = ["eval", "collect", "--dataset", str(dataset), "--models", "cheap,strong", "--config", str(config)]
    result = runner.invoke(app, [*args, "--limit", "4", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "wrote 4 prompts" in result.output
    traces, header = read_traces(out)
    assert (header["weak_model"], header["strong_model"]) == ("cheap", "strong")
    assert len(traces) == 4 and {t.split for t in traces} <= {"train", "test"}
    for trace in traces:
        cheap, strong = trace.models["cheap"], trace.models["strong"]
        assert (cheap.quality, strong.quality) == (0.0, 1.0)  # "alpha bravo …" vs "… 18"
        assert len(cheap.token_logprobs) == 5 and len(cheap.top_logprobs[0]) == 5
        assert 0 < cheap.cost_usd < strong.cost_usd
        assert cheap.extra["answer"].startswith("alpha")
    assert states["cheap"].records[0].body["temperature"] == 0
    # resume: the four are not asked again; six more are
    result = runner.invoke(app, [*args, "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "wrote 6 prompts" in result.output and "4 already complete" in result.output
    assert states["cheap"].num_requests == 10 and states["strong"].num_requests == 10
    traces, _ = read_traces(out)
    assert sorted(t.id for t in traces) == sorted(f"q{i}" for i in range(10))


def test_a_prompt_is_written_only_when_every_model_answered(tmp_path, two_models):
    states, config = two_models
    dataset, out = tmp_path / "questions.jsonl", tmp_path / "traces.jsonl"
    _dataset(dataset, 3)
    states["strong"].behaviour.failure = "400"
    args = ["eval", "collect", "-d", str(dataset), "--models", "cheap,strong", "-c", str(config), "--out", str(out)]
    result = runner.invoke(app, args)
    assert result.exit_code == 1 and "run again" in result.output
    states["strong"].behaviour.failure = None
    assert runner.invoke(app, args).exit_code == 0
    traces, _ = read_traces(out)
    assert len(traces) == 3


def test_collect_says_why_mmlu_cannot_be_graded(tmp_path, two_models):
    _, config = two_models
    result = runner.invoke(app, ["eval", "collect", "-d", "mmlu", "--models", "cheap", "-c", str(config)])
    assert result.exit_code != 0 and "not the right letter" in result.output
    result = runner.invoke(app, ["eval", "collect", "-d", "gsm8k", "--models", "cheap,nope", "-c", str(config)])
    assert result.exit_code != 0 and "not configured: nope" in result.output
