from __future__ import annotations

import orjson
import pytest

from switchyard.core.traces import ModelOutcome, Trace, TraceFormatError, read_traces, write_traces
from switchyard.evals.datasets import assign_splits


def _trace(i: int, category: str = "a", prompt: str | None = None) -> Trace:
    models = {
        "weak": ModelOutcome(quality=1.0, cost_usd=0.001, output_tokens=3, token_logprobs=[-0.5]),
        "strong": ModelOutcome(quality=0.0, cost_usd=0.01, output_tokens=4),
    }
    return Trace(f"t{i}", prompt or f"prompt {i}", category, "train", models)


def test_round_trip_with_header(tmp_path):
    path = tmp_path / "t.jsonl.gz"
    traces = [_trace(i) for i in range(3)]
    write_traces(path, traces, source="unit test")
    loaded, header = read_traces(path)
    assert [t.to_dict() for t in loaded] == [t.to_dict() for t in traces]
    assert header["source"] == "unit test"
    assert loaded[0].models["weak"].token_logprobs == [-0.5]
    assert loaded[0].models["strong"].token_logprobs is None


def test_a_file_without_header_with_one_token_logprob_and_extra_keys(tmp_path):
    line = {
        "id": "q1",
        "prompt": "2+2?",
        "category": "maths",
        "split": "test",
        "models": {
            "m": {
                "quality": 1,
                "cost_usd": 0.0,
                "output_tokens": 1,
                "token_logprobs": [-0.01],
                "top_logprobs": [[{"token": "4", "logprob": -0.01}]],
                "answer": "4",
            }
        },
    }
    path = tmp_path / "t.jsonl"
    path.write_bytes(orjson.dumps(line) + b"\n\n")
    [trace], header = read_traces(path)
    assert header == {}
    assert trace.models["m"].extra == {"answer": "4"}
    assert trace.models["m"].to_dict()["answer"] == "4"


@pytest.mark.parametrize(
    ("line", "message"),
    [
        (b'{"switchyard_trace_format": 2}', "version 2 is not understood"),
        (b"{nope", "not JSON"),
        (b'{"id": "x", "prompt": "p"}', "missing 'models'"),
        (
            b'{"id": "x", "prompt": "p", "models": {"m": {"quality": 2, "cost_usd": 0, "output_tokens": 1}}}',
            "outside 0..1",
        ),
        (b'{"id": "x", "prompt": "p", "models": {"m": {"quality": 1, "output_tokens": 1}}}', "missing 'cost_usd'"),
        (b'{"id": "x", "prompt": "p", "split": "dev", "models": {"m": {}}}', "split must be one of"),
    ],
)
def test_bad_lines_name_file_and_line(tmp_path, line, message):
    path = tmp_path / "bad.jsonl"
    path.write_bytes(line + b"\n")
    with pytest.raises(TraceFormatError, match=message) as info:
        read_traces(path)
    assert f"{path}:1" in str(info.value) or "version" in message


def test_split_is_stratified_deterministic_and_keeps_repeats_together():
    traces = [_trace(i, "a") for i in range(50)] + [_trace(100 + i, "b") for i in range(10)]
    traces += [_trace(200, "a", prompt="prompt 3"), _trace(201, "a", prompt="prompt 3")]
    assign_splits(traces)
    first = [t.split for t in traces]
    assign_splits(traces)
    assert [t.split for t in traces] == first
    by_prompt = {}
    for t in traces:
        by_prompt.setdefault(t.prompt, set()).add(t.split)
    assert all(len(splits) == 1 for splits in by_prompt.values())
    assert sum(t.split == "test" for t in traces if t.category == "b") == 2  # ceil(10 * 0.2)
    distinct_a = {t.prompt for t in traces if t.category == "a"}
    assert sum(1 for p in distinct_a if by_prompt[p] == {"test"}) == 10  # ceil(50 * 0.2)


def test_further_top_level_keys_are_kept_and_written_back(tmp_path):
    path = tmp_path / "rows.jsonl"
    line = {
        "id": "r1",
        "prompt": "",
        "split": "train",
        "created_at": 1_790_000_000.5,
        "embedding": [0.25, -0.5],
        "models": {"m": {"quality": 1.0, "cost_usd": 0.0, "output_tokens": 3}},
    }
    path.write_bytes(orjson.dumps(line) + b"\n")
    [trace], _ = read_traces(path)
    assert trace.extra == {"created_at": 1_790_000_000.5, "embedding": [0.25, -0.5]}
    write_traces(path, [trace])
    [again], _ = read_traces(path)
    assert again == trace and again.to_dict()["embedding"] == [0.25, -0.5]
