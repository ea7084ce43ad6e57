"""RouteLLM's MMLU and GSM8K outcomes (shipped in evals/data/routellm) as traces."""

from __future__ import annotations

import csv
import gzip
import hashlib
import math
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import orjson

from switchyard.core.prices import estimate_tokens
from switchyard.core.traces import ModelOutcome, Trace, read_traces
from switchyard.evals.prices import PRICES

DATA_DIR = Path(__file__).parent / "data" / "routellm"
WEAK_MODEL = "mistralai/Mixtral-8x7B-Instruct-v0.1"
STRONG_MODEL = "gpt-4-1106-preview"
TEST_FRACTION = 0.2
ESTIMATE_NOTES = {
    "mmlu": "token counts estimated at 4 characters a token; each answer (a letter) counted as 1 output token",
    "gsm8k": "token counts estimated at 4 characters a token, from the prompts and both models' responses",
}


def prompt_hash(prompt: str) -> str:
    return hashlib.sha256(prompt.encode()).hexdigest()


def assign_splits(traces: list[Trace], test_fraction: float = TEST_FRACTION) -> None:
    """Deterministic split by a hash of the prompt, stratified by category.

    Within each category the distinct prompts are ordered by their hash and the first
    `test_fraction` of them (rounded up) are the test split; repeated prompts share a split.
    """
    prompts_by_category: dict[str, set[str]] = defaultdict(set)
    for trace in traces:
        prompts_by_category[trace.category].add(trace.prompt)
    test_prompts: set[str] = set()
    for prompts in prompts_by_category.values():
        ordered = sorted(prompts, key=prompt_hash)
        test_prompts.update(ordered[: math.ceil(len(ordered) * test_fraction)])
    for trace in traces:
        trace.split = "test" if trace.prompt in test_prompts else "train"


def _outcome(model: str, correct: str, prompt: str, output_tokens: int) -> ModelOutcome:
    if correct not in ("True", "False"):
        raise ValueError(f"unexpected correctness value {correct!r} for {model}")
    cost = PRICES[model].cost_usd(max(1, estimate_tokens(prompt)), output_tokens)
    return ModelOutcome(quality=1.0 if correct == "True" else 0.0, cost_usd=cost, output_tokens=output_tokens)


def _contaminated_prompts() -> set[str]:
    with (DATA_DIR / "mmlu_contaminated_prompts.jsonl").open("rb") as handle:
        return {orjson.loads(line)["eval_prompt"] for line in handle if line.strip()}


def load_mmlu() -> list[Trace]:
    contaminated = _contaminated_prompts()
    traces = []
    with gzip.open(DATA_DIR / "mmlu.csv.gz", "rt", newline="") as handle:
        for i, row in enumerate(csv.DictReader(handle)):
            if row["prompt"] in contaminated:
                continue
            models = {m: _outcome(m, row[m], row["prompt"], output_tokens=1) for m in (WEAK_MODEL, STRONG_MODEL)}
            traces.append(Trace(f"mmlu/{row['subject']}/{i}", row["prompt"], row["subject"], "train", models))
    assign_splits(traces)
    return traces


def load_gsm8k() -> list[Trace]:
    traces = []
    with gzip.open(DATA_DIR / "gsm8k_responses.csv.gz", "rt", newline="") as handle:
        for i, row in enumerate(csv.DictReader(handle)):
            models = {
                m: _outcome(m, row[m], row["prompt"], output_tokens=max(1, estimate_tokens(row[f"{m}_response"])))
                for m in (WEAK_MODEL, STRONG_MODEL)
            }
            traces.append(Trace(f"gsm8k/{i}", row["prompt"], "gsm8k", "train", models))
    assign_splits(traces)
    return traces


LOADERS: dict[str, Callable[[], list[Trace]]] = {"mmlu": load_mmlu, "gsm8k": load_gsm8k}


def load_dataset(name_or_path: str) -> tuple[list[Trace], dict]:
    """A named RouteLLM dataset (`mmlu`, `gsm8k`) or a trace file, with its metadata."""
    loader = LOADERS.get(name_or_path)
    if loader is not None:
        meta = {
            "source": f"RouteLLM {name_or_path} (Apache-2.0)",
            "note": ESTIMATE_NOTES[name_or_path],
            "weak_model": WEAK_MODEL,
            "strong_model": STRONG_MODEL,
        }
        return loader(), meta
    return read_traces(name_or_path)
