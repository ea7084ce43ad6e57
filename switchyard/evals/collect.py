"""`switchyard eval collect`: run prompts through configured backends and write graded traces.

Every model answers every prompt (temperature 0) with token logprobs when it can give them; the
answer is graded against the reference (a multiple-choice letter, a final number, or a string)
and priced from the configured price table. Lines are appended as prompts finish, so an
interrupted run resumes where it stopped: prompts that already have every model are skipped, the
others are asked only of the models they miss. At the end the file is rewritten once without
duplicates.
"""

from __future__ import annotations

import asyncio
import gzip
import hashlib
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import orjson

from switchyard.backends.registry import ModelEntry
from switchyard.backends.resilience import ResilientExecutor
from switchyard.billing.metering import RequestMeter
from switchyard.core.capabilities import needs
from switchyard.core.chat_wire import ChatCompletionRequest
from switchyard.core.errors import SwitchyardError
from switchyard.core.prices import Price
from switchyard.core.request_context import AnyContext, Deadline, RequestContext
from switchyard.core.traces import HEADER_KEY, TRACE_FORMAT_VERSION, ModelOutcome, Trace, TraceFormatError, read_traces
from switchyard.evals.datasets import DATA_DIR, assign_splits
from switchyard.evals.grading import GRADERS, grade, guess_grader

logger = logging.getLogger("switchyard.collect")

GSM8K_INSTRUCTION = "\nSolve the problem step by step, then give the final answer as a number on the last line."


class CollectError(ValueError):
    """The collection cannot start (dataset, models); the message says what to change."""


@dataclass(frozen=True, slots=True)
class Item:
    id: str
    prompt: str
    reference: str
    grader: str
    category: str = "all"
    split: str = "train"


def _with_splits(items: list[Item]) -> list[Item]:
    traces = [Trace(i.id, i.prompt, i.category, "train", {}) for i in items]
    assign_splits(traces)
    return [
        Item(i.id, i.prompt, i.reference, i.grader, i.category, t.split) for i, t in zip(items, traces, strict=True)
    ]


def gsm8k_items() -> list[Item]:
    with gzip.open(DATA_DIR / "gsm8k_test.jsonl.gz", "rb") as handle:
        rows = [orjson.loads(line) for line in handle if line.strip()]
    items = [
        Item(f"gsm8k/{i}", row["question"] + GSM8K_INSTRUCTION, row["answer"].rsplit("####", 1)[-1].strip(), "gsm8k")
        for i, row in enumerate(rows)
    ]
    return _with_splits(items)


def file_items(path: Path) -> list[Item]:
    """JSONL rows `{"id", "prompt", "answer", "grader"?, "category"?, "split"?}`."""
    try:
        lines = path.read_bytes().splitlines()
    except OSError as exc:
        raise CollectError(f"cannot read {path}: {exc.strerror}") from exc
    items, has_splits = [], False
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = orjson.loads(line)
            reference = str(row["answer"])
            grader = row.get("grader") or guess_grader(reference)
            if grader not in GRADERS:
                raise ValueError(f"grader must be one of {', '.join(GRADERS)}, not {grader!r}")
            has_splits = has_splits or "split" in row
            items.append(
                Item(
                    str(row["id"]),
                    str(row["prompt"]),
                    reference,
                    grader,
                    str(row.get("category") or "all"),
                    row.get("split", "train"),
                )
            )
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            raise CollectError(f"{path}:{number}: {exc!r} (rows need id, prompt and answer)") from exc
    if not items:
        raise CollectError(f"{path} holds no prompts")
    return items if has_splits else _with_splits(items)


def load_items(dataset: str) -> tuple[list[Item], str]:
    if dataset == "gsm8k":
        return gsm8k_items(), "RouteLLM gsm8k questions and references (Apache-2.0)"
    if dataset == "mmlu":
        raise CollectError(
            "the shipped MMLU data (RouteLLM) records whether each model was right, not the right letter, so "
            "answers cannot be graded; give a JSONL file with references instead: --dataset FILE with rows "
            '{"id", "prompt", "answer": "C"}'
        )
    path = Path(dataset)
    if not path.exists():
        raise CollectError(f"--dataset must be gsm8k, mmlu or a JSONL file; {dataset!r} is none of them")
    return file_items(path), str(path)


def sample(items: Sequence[Item], limit: int | None) -> list[Item]:
    """A fixed sample (by a hash of the id), independent of the train/test split."""
    if limit is None or limit >= len(items):
        return list(items)
    return sorted(items, key=lambda i: hashlib.sha256(b"sample:" + i.id.encode()).digest())[:limit]


def _outcome(item: Item, payload: dict, price: Price | None) -> ModelOutcome:
    choice = payload["choices"][0]
    answer = (choice.get("message") or {}).get("content") or ""
    usage = payload.get("usage") or {}
    prompt_tokens, output_tokens = int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0)
    entries = ((choice.get("logprobs") or {}).get("content")) or None
    cost = price.cost_usd(prompt_tokens, output_tokens) if price is not None else 0.0
    return ModelOutcome(
        quality=grade(item.grader, answer, item.reference),
        cost_usd=cost,
        output_tokens=output_tokens,
        token_logprobs=[e["logprob"] for e in entries] if entries else None,
        top_logprobs=(
            [[{"token": a["token"], "logprob": a["logprob"]} for a in e.get("top_logprobs") or ()] for e in entries]
            if entries
            else None
        ),
        extra={"answer": answer, "reference": item.reference},
    )


@dataclass
class Collector:
    entries: list[ModelEntry]
    executor: ResilientExecutor
    prices: dict[str, Price]
    has_logprobs: dict[str, bool]
    max_tokens: int = 256
    concurrency: int = 4
    top_logprobs: int = 5

    async def answer(self, entry: ModelEntry, item: Item) -> ModelOutcome:
        payload = {
            "model": entry.name,
            "messages": [{"role": "user", "content": item.prompt}],
            "max_tokens": self.max_tokens,
            "temperature": 0,
        }
        if self.has_logprobs.get(entry.name, True):
            payload |= {"logprobs": True, "top_logprobs": self.top_logprobs}
        request = ChatCompletionRequest.from_payload(payload)
        started_at = asyncio.get_running_loop().time()
        deadline = Deadline.after(started_at, self.executor.request_timeout_s(entry))
        meter = RequestMeter(None, {}, f"collect-{item.id}")
        ctx: AnyContext = RequestContext(meter.request_id, meter, deadline=deadline)
        answer = await self.executor.complete(entry, request, ctx, needs(request))
        return _outcome(item, answer.whole.parsed, self.prices.get(entry.name))

    async def run(
        self,
        items: Sequence[Item],
        out: Path,
        source: str,
        on_answer: Callable[[], None] = lambda: None,
    ) -> tuple[int, int, list[str]]:
        """Answer what is missing; return (prompts written, prompts skipped as complete, failures)."""
        names = [e.name for e in self.entries]
        existing = _prepare(out, names, source)
        todo = [i for i in items if not all(n in existing.get(i.id, {}) for n in names)]
        semaphore = asyncio.Semaphore(self.concurrency)
        failures: list[str] = []
        written = 0

        async def one(entry: ModelEntry, item: Item) -> ModelOutcome | None:
            async with semaphore:
                try:
                    return await self.answer(entry, item)
                except SwitchyardError as exc:
                    failures.append(f"{item.id} on {entry.name}: {exc.message}")
                    return None
                finally:
                    on_answer()

        async def prompt(item: Item) -> None:
            nonlocal written
            models = dict(existing.get(item.id, {}))
            missing = [e for e in self.entries if e.name not in models]
            outcomes = await asyncio.gather(*(one(e, item) for e in missing))
            answered = [o for o in outcomes if o is not None]
            if len(answered) < len(outcomes):
                return  # not written: a later run asks again
            models |= {e.name: o for e, o in zip(missing, answered, strict=True)}
            trace = Trace(item.id, item.prompt, item.category, item.split, models)
            with out.open("ab") as handle:
                handle.write(orjson.dumps(trace.to_dict()) + b"\n")
            written += 1

        await asyncio.gather(*(prompt(i) for i in todo))
        compact(out)
        return written, len(items) - len(todo), failures


def _prepare(out: Path, names: list[str], source: str) -> dict[str, dict[str, ModelOutcome]]:
    """What the file already holds; a new file gets its header line."""
    existing = _existing(out)
    if not out.exists() or out.stat().st_size == 0:
        out.parent.mkdir(parents=True, exist_ok=True)
        header = {
            HEADER_KEY: TRACE_FORMAT_VERSION,
            "source": f"switchyard eval collect on {source}",
            "weak_model": names[0],
            "strong_model": names[-1],
            "note": "answers at temperature 0, graded against the references; cost from the configured prices",
        }
        out.write_bytes(orjson.dumps(header) + b"\n")
    return existing


def _existing(out: Path) -> dict[str, dict[str, ModelOutcome]]:
    if not out.exists() or out.stat().st_size == 0:
        return {}
    try:
        traces, _ = read_traces(out)
    except TraceFormatError as exc:
        if "no traces" in str(exc):
            return {}
        raise CollectError(f"cannot resume from {out}: {exc}") from exc
    merged: dict[str, dict[str, ModelOutcome]] = {}
    for trace in traces:
        merged.setdefault(trace.id, {}).update(trace.models)
    return merged


def compact(out: Path) -> None:
    """Rewrite the file with one line per prompt (the last written), in first-seen order."""
    lines = out.read_bytes().splitlines()
    header, rows = lines[0], {}
    for line in lines[1:]:
        if line.strip():
            rows[orjson.loads(line)["id"]] = line
    tmp = out.with_suffix(out.suffix + ".tmp")
    tmp.write_bytes(b"\n".join([header, *rows.values()]) + b"\n")
    tmp.replace(out)


async def collect_with_settings(
    settings,
    model_names: Sequence[str],
    items: Sequence[Item],
    out: Path,
    source: str,
    *,
    max_tokens: int,
    concurrency: int,
    on_ready: Callable[[], None] = lambda: None,
    on_answer: Callable[[], None] = lambda: None,
) -> tuple[int, int, list[str]]:
    """Start the named models' backends (loading embedded models), collect, shut down."""
    from switchyard.gateway.services import build_services

    configured = {m.name: m for m in settings.models}
    unknown = [name for name in model_names if name not in configured]
    if unknown:
        raise CollectError(f"not configured: {', '.join(unknown)} (configured: {', '.join(configured) or 'none'})")
    async with build_services(settings, only_models=model_names) as services:
        entries = [services.registry.get(name) for name in model_names]
        for entry in entries:
            health = await entry.backend.health()
            if not health.is_ready and entry.backend.starts_in_background:
                raise CollectError(f"{entry.name} did not start: {health.detail}")
        on_ready()
        collector = Collector(
            entries,
            services.executor,
            services.prices,
            {name: configured[name].has_logprobs for name in model_names},
            max_tokens=max_tokens,
            concurrency=concurrency,
        )
        return await collector.run(items, out, source, on_answer)
