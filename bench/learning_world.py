"""A scripted world for the learning demonstration: two chat models on one fake OpenAI upstream
whose answers are right or wrong, and sure or unsure, by a script the demonstration knows.

Prompts come in two kinds. Multiple-choice questions (A-D): the weak model gets a quarter wrong,
and when it is wrong it is unsure from its first token (a low mean log-probability), which is
what the shipped cascade scorer (`first_mean_logprob`) sees. Word problems, two thirds of them with one
product (the weak model wrong 15% of the time) and a third with two ("crates" of "cartons": wrong
90%): a wrong answer is fluent, its one unsure token the final number, after the first 16 tokens
the shipped scorer reads; a scorer over the whole answer (`min_logprob`) can tell. Which problems
are hard shows in the prompt, so a re-tuned classifier can route them. The
strong model is always right and sure. A request with the judge's rubric is answered as a judge
that knows the truth: the right answer wins, two right or two wrong answers tie.

Each request's answer is injected into tests/fakes' OpenAI upstream as its `fake` behaviour
(words and per-token log-probabilities), so streams, usage and logprobs follow the real wire
format the rest of the suite checks.
"""

from __future__ import annotations

import hashlib
import random
import re
from dataclasses import dataclass
from typing import Any

import orjson

from switchyard.learning.graders import JUDGE_RUBRIC, choice_of, final_number
from tests.fakes.openai_upstream import FakeOpenAIUpstream, FakeState

WEAK, STRONG = "world-weak", "world-strong"  # the upstream's model ids
KINDS = ("choice", "word")
WRONG_SHARE = {"choice": 0.25, "word": 0.15, "crates": 0.9}  # of the weak model's answers

_NOUNS = ("pens", "apples", "stamps", "bolts", "cards", "tiles", "beads", "seeds", "coins", "shells")
_NAMES = ("Ann", "Ravi", "Mei", "Tomas", "Ife", "Lena", "Omar", "Sofia", "Kenji", "Aylin")
_TOPICS = ("chemistry", "geography", "music theory", "biology", "economics", "astronomy", "law", "history")


@dataclass(frozen=True, slots=True)
class Item:
    prompt: str
    kind: str  # choice | word
    truth: str  # the letter or the number
    weak_is_right: bool


def make_items(kind: str, count: int, seed: int) -> list[Item]:
    """`count` prompts of one kind, with their truths and whether the weak model gets each right."""
    rng = random.Random(f"{kind}-{seed}")
    items = []
    for i in range(count):
        if kind == "choice":
            topic = rng.choice(_TOPICS)
            options = [f"{topic} fact {rng.randrange(10_000)}" for _ in range(4)]
            truth = "ABCD"[rng.randrange(4)]
            lines = "\n".join(f"{letter}) {text}" for letter, text in zip("ABCD", options, strict=True))
            prompt = f"Question {i} on {topic}: which statement is correct?\n{lines}\nAnswer with the letter."
        else:
            per, boxes, given = rng.randrange(3, 40), rng.randrange(2, 15), rng.randrange(1, 20)
            name, noun = rng.choice(_NAMES), rng.choice(_NOUNS)
            if rng.random() < 0.65:  # one product: the weak model mostly right
                truth, shape = str(per * boxes - given), "word"
                prompt = (
                    f"{name} buys {boxes} boxes with {per} {noun} in each and gives away {given} {noun}. "
                    f"How many {noun} does {name} have left?"
                )
            else:  # crates of boxes: two products, the weak model mostly wrong
                crates = rng.randrange(2, 9)
                truth, shape = str(crates * boxes * per - given), "crates"
                prompt = (
                    f"A warehouse holds {crates} crates; every crate packs {boxes} cartons and every carton "
                    f"{per} {noun}. {name} ships out {given} {noun}. How many {noun} remain in the warehouse?"
                )
            items.append(Item(prompt, kind, truth, rng.random() >= WRONG_SHARE[shape]))
            continue
        items.append(Item(prompt, kind, truth, rng.random() >= WRONG_SHARE[kind]))
    return items


class World:
    """The script: every item the demonstration will send, looked up by its prompt."""

    def __init__(self, items: list[Item]) -> None:
        self.by_prompt = {item.prompt: item for item in items}

    def answer(self, model: str, messages: list[dict[str, Any]]) -> tuple[list[str], list[float]]:
        """The answer's tokens and their log-probabilities."""
        system = str(messages[0].get("content", "")) if messages else ""
        if system == JUDGE_RUBRIC:
            return self._judge(str(messages[-1].get("content", "")))
        item = self.by_prompt.get(_last_user(messages))
        if item is None:  # a prompt the script does not know: a sure, short answer
            return ["I", "cannot", "say."], [-0.05, -0.05, -0.05]
        right = model == STRONG or item.weak_is_right
        given = item.truth if right else _wrong(item)
        if item.kind == "choice":
            tokens = ["The", "answer", "is", f"{given}."]
            if right:
                return tokens, [-0.05, -0.04, -0.03, -0.06]
            return tokens, [-1.6, -1.2, -0.9, -1.4]  # unsure from the first token
        # longer than the cascade's first 16 tokens: the unsure number comes after them
        tokens = [*"Let me work through this one step at a time , multiplying the counts and then taking away".split()]
        tokens += ["what", "was", "given", "away", ".", "####", given]
        logprobs = [-0.08] * (len(tokens) - 1)
        if right:
            return tokens, [*logprobs, -0.2]
        return tokens, [*logprobs, -3.2]  # fluent, one unsure number

    def _judge(self, shown: str) -> tuple[list[str], list[float]]:
        question = re.search(r"user: (.*?)\n>>>", shown, flags=re.S)
        item = self.by_prompt.get(question.group(1).strip()) if question else None
        answers = re.findall(r"Answer [AB]:\n<<<\n(.*?)\n>>>", shown, flags=re.S)
        if item is None or len(answers) != 2:
            return ["Verdict:", "TIE"], [-0.1, -0.1]
        right = [_is_right(item, text) for text in answers]
        verdict = "TIE" if right[0] == right[1] else ("A" if right[0] else "B")
        return ["Verdict:", verdict], [-0.05, -0.05]


def _wrong(item: Item) -> str:
    salt = int(hashlib.sha256(item.prompt.encode()).hexdigest(), 16)
    if item.kind == "choice":
        return [letter for letter in "ABCD" if letter != item.truth][salt % 3]
    return str(int(item.truth) + 1 + salt % 9)


def _is_right(item: Item, text: str) -> bool:
    given = choice_of(text) if item.kind == "choice" else final_number(text)
    return given == item.truth


def _last_user(messages: list[dict[str, Any]]) -> str:
    for message in reversed(messages):
        if message.get("role") == "user" and isinstance(message.get("content"), str):
            return str(message["content"])
    return ""


class WorldUpstream:
    """An ASGI app: tests/fakes' OpenAI upstream, each chat request's answer chosen by the world."""

    def __init__(self, world: World) -> None:
        self.world = world
        self.upstream = FakeOpenAIUpstream(FakeState(model_id=WEAK))
        self.calls: dict[str, int] = {WEAK: 0, STRONG: 0, "judge": 0}

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or scope["path"] != "/v1/chat/completions":
            await self.upstream(scope, receive, send)
            return
        chunks = []
        while True:
            message = await receive()
            chunks.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        body = orjson.loads(b"".join(chunks))
        messages = body.get("messages") or []
        tokens, logprobs = self.world.answer(str(body.get("model")), messages)
        is_judge = bool(messages) and messages[0].get("content") == JUDGE_RUBRIC
        key = "judge" if is_judge else str(body.get("model"))
        self.calls[key] = self.calls.get(key, 0) + 1
        body["fake"] = {"words": tuple(tokens), "logprobs": logprobs, "num_tokens": len(tokens)}
        sent = False

        async def replay():
            nonlocal sent
            if sent:
                return await receive()
            sent = True
            return {"type": "http.request", "body": orjson.dumps(body), "more_body": False}

        await self.upstream(scope, replay, send)


def world_items(n: int) -> list[Item]:
    """The demonstration's prompts: `n` multiple-choice questions, `4 n` word problems."""
    return make_items("choice", n, 0) + make_items("word", 4 * n, 0)


if __name__ == "__main__":  # the world in a process of its own: python bench/learning_world.py PORT N
    import sys

    import uvicorn

    port, n = int(sys.argv[1]), int(sys.argv[2])
    uvicorn.run(WorldUpstream(World(world_items(n))), host="127.0.0.1", port=port, log_level="warning")
