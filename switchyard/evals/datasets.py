"""The public labelled sets shipped in evals/data, as traces: RouteLLM's MMLU and GSM8K
(`routellm/`), LLMRouter's 13 task kinds (`llmrouter/`) and arena-bench-v1's graded chat prompts
(`arena-bench-v1/`). Each has its own weak and strong model (`PAIRS`)."""

from __future__ import annotations

import csv
import gzip
import hashlib
import json
import math
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import orjson

from switchyard.core.prices import estimate_tokens
from switchyard.core.traces import ModelOutcome, Trace, read_traces
from switchyard.evals.prices import PRICES

DATA_DIR = Path(__file__).parent / "data" / "routellm"
LLMROUTER_DIR = Path(__file__).parent / "data" / "llmrouter"
ARENA_DIR = Path(__file__).parent / "data" / "arena-bench-v1"
VICUNA_DIR = Path(__file__).parent / "data" / "vicuna80"
WEAK_MODEL = "mistralai/Mixtral-8x7B-Instruct-v0.1"
STRONG_MODEL = "gpt-4-1106-preview"
TEST_FRACTION = 0.2
# Answers are not in these two sets, so their output tokens are a fixed guess (costs are estimates).
LLMROUTER_OUTPUT_TOKENS = 64
ARENA_OUTPUT_TOKENS = 256
ESTIMATE_NOTES = {
    "mmlu": "token counts estimated at 4 characters a token; each answer (a letter) counted as 1 output token",
    "gsm8k": "token counts estimated at 4 characters a token, from the prompts and both models' responses",
    "llmrouter": f"input tokens estimated at 4 characters a token; {LLMROUTER_OUTPUT_TOKENS} output tokens assumed",
    "arena": f"quality = GPT-4 grade / 10; input tokens estimated at 4 characters a token; "
    f"{ARENA_OUTPUT_TOKENS} output tokens assumed",
    "vicuna80": f"quality = mean GPT-4 grade / 10 (from reviews of answer pairs: noisy); input tokens estimated at "
    f"4 characters a token; {ARENA_OUTPUT_TOKENS} output tokens assumed",
}
SOURCES = {
    "mmlu": "RouteLLM mmlu (Apache-2.0)",
    "gsm8k": "RouteLLM gsm8k (Apache-2.0)",
    "llmrouter": "LLMRouter dcrouter train/test (MIT)",
    "arena": "arena-bench-v1 GPT-4 grades (Apache-2.0)",
    "vicuna80": "FastChat Vicuna questions, GPT-4 grades (Apache-2.0)",
}
# Each set's default weak and strong model: the pair its labels are best read for.
PAIRS: dict[str, tuple[str, str]] = {
    "mmlu": (WEAK_MODEL, STRONG_MODEL),
    "gsm8k": (WEAK_MODEL, STRONG_MODEL),
    "llmrouter": ("llama-3.1-8b-instruct", "llama-3.1-nemotron-51b-instruct"),
    "arena": ("Mixtral-8x7B-Instruct-v0.1", "gpt-4-turbo"),
    "vicuna80": ("llama-13b:v1", "gpt-3.5-turbo:20230327"),
}
# The named sets of open-ended chat, judged as chat quality is judged: the default classifier is
# chosen on these first (docs/routing.md, "Which artifact is the default").
CHAT_SETS = ("arena", "vicuna80")


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


def _priced(model: str, score: float, prompt: str, output_tokens: int) -> ModelOutcome:
    price = PRICES.get(model)
    cost = price.cost_usd(max(1, estimate_tokens(prompt)), output_tokens) if price else 0.0
    return ModelOutcome(quality=float(score), cost_usd=cost, output_tokens=output_tokens)


def load_llmrouter() -> list[Trace]:
    """LLMRouter's rows with the split they ship with (5,607 train, 500 test); all nine models."""
    traces = []
    for split in ("train", "test"):
        with gzip.open(LLMROUTER_DIR / f"{split}.json.gz", "rb") as handle:
            rows = json.load(handle)
        for i, row in enumerate(rows):
            prompt = row["question"]
            models = {m: _priced(m, s, prompt, LLMROUTER_OUTPUT_TOKENS) for m, s in row["scores"].items()}
            category = f"cluster-{row.get('cluster_id', 0)}"
            traces.append(Trace(f"llmrouter/{split}/{i}", prompt, category, split, models))
    return traces


def _load_graded_chat(path: Path, name: str) -> list[Trace]:
    """Rows of {prompt, scores: model -> grade 1-10} as traces with quality = grade / 10 (a model
    whose grade is missing is absent from that trace), split 80/20 by prompt hash."""
    traces = []
    with gzip.open(path, "rb") as handle:
        for i, line in enumerate(handle):
            if line.strip():
                row = orjson.loads(line)
                prompt = row["prompt"]
                models = {m: _priced(m, g / 10, prompt, ARENA_OUTPUT_TOKENS) for m, g in row["scores"].items()}
                traces.append(Trace(f"{name}/{i}", prompt, "chat", "train", models))
    assign_splits(traces)
    return traces


def load_arena() -> list[Trace]:
    """arena-bench-v1: 299 chat prompts graded by GPT-4; `hash_folds` for cross-validation."""
    return _load_graded_chat(ARENA_DIR / "graded.jsonl.gz", "arena")


def load_vicuna80() -> list[Trace]:
    """The 76 Vicuna questions, 7 models' answers graded by GPT-4 in pairwise reviews."""
    return _load_graded_chat(VICUNA_DIR / "graded.jsonl.gz", "vicuna80")


def hash_folds(traces: list[Trace], num_folds: int) -> list[list[Trace]]:
    """`num_folds` copies of `traces`, each with a different fifth (by prompt hash) as its test split."""
    ordered = sorted({t.prompt for t in traces}, key=prompt_hash)
    fold_of = {prompt: i % num_folds for i, prompt in enumerate(ordered)}
    return [
        [Trace(t.id, t.prompt, t.category, "test" if fold_of[t.prompt] == k else "train", t.models) for t in traces]
        for k in range(num_folds)
    ]


LOADERS: dict[str, Callable[[], list[Trace]]] = {
    "mmlu": load_mmlu,
    "gsm8k": load_gsm8k,
    "llmrouter": load_llmrouter,
    "arena": load_arena,
    "vicuna80": load_vicuna80,
}


def load_dataset(name_or_path: str) -> tuple[list[Trace], dict]:
    """A named shipped dataset (`mmlu`, `gsm8k`, `llmrouter`, `arena`, `vicuna80`) or a trace file, with its
    metadata."""
    loader = LOADERS.get(name_or_path)
    if loader is not None:
        weak, strong = PAIRS[name_or_path]
        meta = {
            "source": SOURCES[name_or_path],
            "note": ESTIMATE_NOTES[name_or_path],
            "weak_model": weak,
            "strong_model": strong,
        }
        return loader(), meta
    return read_traces(name_or_path)
