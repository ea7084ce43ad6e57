"""Grading a pair of answers to one request: directly where the answer can be checked, else a judge.

A shadowed request has two answers, the weak side's and the strong side's (`answers` is always
(weak, strong)), and no reference answer. What can be checked without one:

- `json_schema`: each answer on its own: valid JSON that the request's schema accepts is 1, else 0.
- `multiple_choice`, `number`, `exact`: the strong answer is the reference. The weak answer scores
  1 when it gives the same choice, number or text, else 0; the strong one scores 1. When the strong
  answer gives no choice or number, the pair goes to the judge instead.
- `judge`: a model compares both answers against a fixed rubric, asked twice with the answers in
  both orders. The same winner both times wins (1 and 0); a tie both times, or a different winner
  in each order, is a tie (0.5 each). An unreadable verdict gives no label.
- `auto` (the default): `json_schema` when the request asked for a schema, `multiple_choice` when
  the prompt lists lettered options (A-D or more), `number` when it asks for a quantity and both
  answers end on a number, else the judge.

The judge is a callable the caller supplies (messages in, text out), so that its calls go through
the proxy's relay and are metered and budgeted like the shadow's own.
"""

from __future__ import annotations

import json
import re
import unicodedata
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

GRADER_KINDS = ("auto", "multiple_choice", "number", "exact", "json_schema", "judge")
GraderKind = Literal["auto", "multiple_choice", "number", "exact", "json_schema", "judge"]
Judge = Callable[[list[dict[str, Any]]], Awaitable[str]]

# What the judge reads of the conversation (the end is kept: the last question matters most).
MAX_CONVERSATION_CHARS = 12_000
MAX_ANSWER_CHARS = 6_000

JUDGE_RUBRIC = (
    "You are grading two answers to the same request. Judge which answer better serves the user: "
    "first correctness (facts, arithmetic, code that works), then whether it does what was asked "
    "(complete, follows the instructions and format), then clarity. Length is not a merit. "
    "If both are equally good or equally bad, say TIE. "
    "End your reply with one line: `Verdict: A`, `Verdict: B` or `Verdict: TIE`."
)


@dataclass(frozen=True, slots=True)
class Answer:
    model: str
    text: str


@dataclass(frozen=True, slots=True)
class Label:
    quality: dict[str, float]  # model -> 0..1
    source: Literal["verifiable", "judge"]
    detail: str  # the grader and what it found, for people reading the rows


async def grade(
    messages: Sequence[dict[str, Any]],
    answers: tuple[Answer, Answer],
    *,
    kind: str = "auto",
    judge: Judge | None = None,
    json_schema: dict[str, Any] | None = None,
) -> Label | None:
    """Label the pair `answers` = (weak, strong) for the chat request `messages`; None when it cannot
    be graded (no judge for a pair that needs one, or a verdict the judge did not make readable)."""
    if kind not in GRADER_KINDS:
        raise ValueError(f"unknown grader {kind!r}; known: {', '.join(GRADER_KINDS)}")
    weak, strong = answers
    if kind in ("auto", "json_schema") and json_schema is not None:
        return _by_schema(answers, json_schema)
    if kind == "json_schema":
        raise ValueError("the json_schema grader needs the request's schema")
    prompt = last_user_text(messages)
    if kind == "multiple_choice" or (kind == "auto" and has_lettered_options(prompt)):
        label = _by_reference(answers, "multiple_choice", choice_of)
        if label is not None or kind == "multiple_choice" and judge is None:
            return label
    elif kind == "number" or (kind == "auto" and asks_for_quantity(prompt) and _both_end_on_numbers(answers)):
        label = _by_reference(answers, "number", final_number)
        if label is not None or kind == "number" and judge is None:
            return label
    elif kind == "exact":
        return _by_reference(answers, "exact", normalised)
    if judge is None:
        return None
    return await _by_judge(messages, weak, strong, judge)


# --- verifiable -------------------------------------------------------------------------------


def _by_schema(answers: tuple[Answer, Answer], schema: dict[str, Any]) -> Label:
    quality = {}
    found = []
    for answer in answers:
        problem = schema_problem(answer.text, schema)
        quality[answer.model] = 0.0 if problem else 1.0
        found.append(f"{answer.model}: {problem or 'valid'}")
    return Label(_merged(answers, quality), "verifiable", "json_schema; " + "; ".join(found))


def schema_problem(text: str, schema: dict[str, Any]) -> str | None:
    """Why `text` is not a JSON value `schema` accepts (None: it is)."""
    import jsonschema

    try:
        value = json.loads(_strip_fence(text))
    except ValueError:
        return "not JSON"
    try:
        jsonschema.validate(value, schema)
    except jsonschema.ValidationError as exc:
        return f"schema: {exc.message[:200]}"
    except jsonschema.SchemaError:
        return "the request's schema is not valid"
    return None


def _by_reference(answers: tuple[Answer, Answer], grader: str, extract: Callable[[str], str | None]) -> Label | None:
    weak, strong = answers
    reference = extract(strong.text)
    if reference is None:
        return None
    given = extract(weak.text)
    agrees = given == reference
    quality = _merged(answers, {weak.model: 1.0 if agrees else 0.0, strong.model: 1.0})
    return Label(quality, "verifiable", f"{grader}; strong: {reference!r}; weak: {given!r}")


def _merged(answers: tuple[Answer, Answer], quality: dict[str, float]) -> dict[str, float]:
    """Both answers from one model (a shadow that landed on the same model): the lower grade."""
    if answers[0].model == answers[1].model:
        return {answers[0].model: min(quality.values())}
    return quality


_OPTION = re.compile(r"(?m)^\s*(?:\(([A-J])\)|([A-J])[.):])\s+\S")
_CHOICE_PATTERNS = (
    re.compile(r"(?i:\banswer)\s*(?i:is|:)?\s*(?i:option\s*)?\(?\**([A-J])\b"),
    re.compile(r"(?i:\b(?:option|choice))\s*\(?([A-J])\)?\b"),
    re.compile(r"^\s*\(?\**([A-J])\**\)?(?:[.):]|\s*$|\s*\n)"),
)


def has_lettered_options(prompt: str) -> bool:
    letters = {a or b for a, b in _OPTION.findall(prompt)}
    return len(letters) >= 3 and "A" in letters and "B" in letters


def choice_of(text: str) -> str | None:
    """The option letter an answer gives: `Answer: C`, `The answer is (C)`, `**C**`, or a leading `C.`"""
    for pattern in _CHOICE_PATTERNS:
        found = pattern.findall(text)
        if found:
            return str(found[-1] if pattern is not _CHOICE_PATTERNS[2] else found[0]).upper()
    return None


_QUANTITY = re.compile(
    r"(?i)\bhow (?:many|much|long|far|old)\b|\bcalculate\b|\bcompute\b|\bsolve\b|\bwhat is the (?:total|sum|"
    r"product|value|result|difference|average|number)\b|\bhow many\b"
)
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?(?:/\d+)?")


def asks_for_quantity(prompt: str) -> bool:
    return bool(_QUANTITY.search(prompt)) and any(ch.isdigit() for ch in prompt)


def final_number(text: str) -> str | None:
    """The answer's final number (GSM8K's `#### 42`, `answer is 42`, else the last number of its last
    line that has one), normalised: no thousands commas, no trailing `.0`."""
    marked = re.search(r"####\s*(" + _NUMBER.pattern + ")", text) or re.search(
        r"(?i)answer\s*(?:is|:)\s*\$?\s*(" + _NUMBER.pattern + ")", text
    )
    if marked:
        return _canonical_number(marked.group(1))
    for line in reversed(text.strip().splitlines()):
        numbers = _NUMBER.findall(line)
        if numbers:
            return _canonical_number(numbers[-1])
    return None


def _canonical_number(raw: str) -> str:
    raw = raw.replace(",", "")
    if "/" in raw:
        return raw
    try:
        value = float(raw)
    except ValueError:
        return raw
    return str(int(value)) if value == int(value) else repr(round(value, 6))


def _both_end_on_numbers(answers: tuple[Answer, Answer]) -> bool:
    return all(final_number(answer.text) is not None for answer in answers)


def normalised(text: str) -> str:
    """Text for exact comparison: NFKC, case-folded, punctuation and runs of spaces dropped."""
    text = unicodedata.normalize("NFKC", _strip_fence(text)).casefold()
    text = re.sub(r"[^\w\s]", "", text)
    return " ".join(text.split())


def _strip_fence(text: str) -> str:
    fenced = re.fullmatch(r"\s*```[\w-]*\n(.*?)\n?```\s*", text, flags=re.S)
    return fenced.group(1) if fenced else text.strip()


# --- the judge --------------------------------------------------------------------------------


async def _by_judge(messages: Sequence[dict[str, Any]], weak: Answer, strong: Answer, judge: Judge) -> Label | None:
    conversation = render_conversation(messages)
    first = parse_verdict(await judge(judge_messages(conversation, weak.text, strong.text)))
    if first is None:
        return None
    second = parse_verdict(await judge(judge_messages(conversation, strong.text, weak.text)))
    if second is None:
        return None
    # In the second order A is the strong answer: map both verdicts to "weak", "strong" or "tie".
    winners = ({"A": "weak", "B": "strong"}.get(first, "tie"), {"A": "strong", "B": "weak"}.get(second, "tie"))
    winner = winners[0] if winners[0] == winners[1] else "tie"
    if weak.model == strong.model or winner == "tie":
        quality = {weak.model: 0.5, strong.model: 0.5}
    else:
        quality = {weak.model: float(winner == "weak"), strong.model: float(winner == "strong")}
    agreement = "orders agree" if winners[0] == winners[1] else "orders disagree"
    return Label(quality, "judge", f"judge; verdicts {first}/{second} ({agreement}): {winner}")


def judge_messages(conversation: str, answer_a: str, answer_b: str) -> list[dict[str, Any]]:
    user = (
        f"The request:\n<<<\n{conversation}\n>>>\n\n"
        f"Answer A:\n<<<\n{_tail(answer_a, MAX_ANSWER_CHARS)}\n>>>\n\n"
        f"Answer B:\n<<<\n{_tail(answer_b, MAX_ANSWER_CHARS)}\n>>>\n\n"
        "Which answer is better? End with `Verdict: A`, `Verdict: B` or `Verdict: TIE`."
    )
    return [{"role": "system", "content": JUDGE_RUBRIC}, {"role": "user", "content": user}]


_VERDICT = re.compile(r"(?i)verdict\W*(A|B|TIE)\b")


def parse_verdict(text: str) -> Literal["A", "B", "TIE"] | None:
    """`Verdict: A` (the last one, any case, markdown around it allowed); else a reply that is just
    `A`, `B` or `TIE`; else None."""
    found = _VERDICT.findall(text)
    token = found[-1] if found else text.strip().strip("*`.\"' ")
    token = token.upper()
    if token == "A" or token == "B" or token == "TIE":
        return token  # type: ignore[return-value]
    return None


def render_conversation(messages: Sequence[dict[str, Any]]) -> str:
    """The conversation as text for the judge: `role: text` per message, images named, the end kept."""
    lines = [f"{message.get('role', 'user')}: {content_text(message.get('content'))}" for message in messages]
    return _tail("\n\n".join(lines), MAX_CONVERSATION_CHARS)


def last_user_text(messages: Sequence[dict[str, Any]]) -> str:
    for message in reversed(messages):
        if message.get("role") == "user":
            return content_text(message.get("content"))
    return ""


def content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, dict):
                parts.append(str(part.get("text", "")) if part.get("type") == "text" else f"[{part.get('type')}]")
        return "\n".join(parts)
    return ""


def _tail(text: str, limit: int) -> str:
    return text if len(text) <= limit else "[…]" + text[-limit:]
