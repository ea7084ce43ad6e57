"""Writes pairs.jsonl.gz: prompt pairs labelled "same" (the cached answer may be served for the asked
prompt) or "different" (it must not), for `switchyard eval cache`.

Every pair starts from a real prompt of the sets beside this folder (see ORIGIN.md) and changes it
by one rule; `kind` names the rule. Deterministic (seed 43); written by this project, same licence
as the project; the prompts keep their own sets' licences.

    python switchyard/evals/data/cache_pairs/make.py
"""

from __future__ import annotations

import gzip
import hashlib
import json
import random
import re
from collections.abc import Callable
from pathlib import Path

DATA = Path(__file__).resolve().parent.parent
OUT = Path(__file__).with_name("pairs.jsonl.gz")
HELD_OUT_SHARE = 0.3

# ---- sources -------------------------------------------------------------------------------------


def _jsonl_gz(path: Path) -> list[dict]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def load_sources() -> dict[str, list[str]]:
    chat = [r["prompt"] for r in _jsonl_gz(DATA / "vicuna80" / "graded.jsonl.gz")]
    chat += [r["prompt"].strip() for r in _jsonl_gz(DATA / "arena-bench-v1" / "graded.jsonl.gz")]
    chat = [p for p in chat if len(p) <= 600]
    llmrouter = []
    for part in ("train", "test"):
        with gzip.open(DATA / "llmrouter" / f"{part}.json.gz", "rt", encoding="utf-8") as f:
            llmrouter += [r["question"].strip() for r in json.load(f)]
    code = [q for q in llmrouter if re.search(r"^def \w+\(", q, re.M) and len(q) <= 900]
    questions = [q for q in llmrouter if len(q) <= 160 and "\n" not in q and q not in code]
    math = [r["question"].strip() for r in _jsonl_gz(DATA / "routellm" / "gsm8k_test.jsonl.gz")]
    return {
        "chat": sorted(set(chat)),
        "question": sorted(set(questions)),
        "math": sorted(set(math)),
        "code": sorted(set(code)),
    }


# ---- "same": rewrites a user makes without changing what is asked ------------------------------

REPHRASINGS = [
    (r"^How can I\b", "How do I"),
    (r"^How do I\b", "How can I"),
    (r"^What is\b", "What's"),
    (r"^What's\b", "What is"),
    (r"^What are\b", "Which are"),
    (r"^Can you\b", "Could you"),
    (r"^Could you\b", "Can you"),
    (r"^Write\b", "Please write"),
    (r"^Explain\b", "Can you explain"),
    (r"^Describe\b", "Please describe"),
    (r"^Tell me\b", "Could you tell me"),
    (r"^Give me\b", "Please give me"),
    (r"^Who is\b", "Who's"),
    (r"^I want to\b", "I'd like to"),
    (r"^I would like\b", "I'd like"),
]
WRAPPERS = [
    "Question: {p}",
    "{p} Please answer.",
    "Can you help me with this? {p}",
    "I was wondering: {p}",
    "Quick question. {p}",
    "{p}\nAnswer briefly if you can.",
]
POLITENESS = ["Hi! {p}", "Hello, {p}", "Please help: {p}", "{p} Thanks!", "{p} Thank you.", "Hey there. {p}"]
SYNONYMS = {
    "explain": "describe",
    "describe": "explain",
    "write": "compose",
    "create": "make",
    "make": "create",
    "big": "large",
    "large": "big",
    "small": "little",
    "quick": "fast",
    "fast": "quick",
    "help": "assist",
    "show": "demonstrate",
    "improve": "enhance",
    "best": "top",
    "ways": "methods",
    "method": "way",
    "find": "determine",
    "main": "primary",
    "important": "significant",
    "buy": "purchase",
    "begin": "start",
    "start": "begin",
    "choose": "pick",
    "example": "instance",
    "difference": "distinction",
    "answer": "reply",
    "story": "tale",
    "short": "brief",
    "simple": "easy",
    "people": "persons",
    "job": "work",
    "famous": "well-known",
}


def rephrase(p: str, rng: random.Random) -> str | None:
    for pattern, replacement in REPHRASINGS:
        if re.search(pattern, p):
            return re.sub(pattern, replacement, p, count=1)
    return rng.choice(WRAPPERS).format(p=p)


def surface(p: str, rng: random.Random) -> str | None:
    edits = [
        lambda s: s.lower(),
        lambda s: s.rstrip("?.! ") if s.rstrip()[-1:] in "?.!" else s + ("?" if "?" in s[-40:] else "."),
        lambda s: "  ".join(s.split(" ")),
        lambda s: s[:1].lower() + s[1:] if s[:1].isupper() else s[:1].upper() + s[1:],
        lambda s: s.strip() + "\n",
    ]
    out = rng.choice(edits)(p)
    return out if out != p else None


def politeness(p: str, rng: random.Random) -> str | None:
    return rng.choice(POLITENESS).format(p=p)


def synonym(p: str, rng: random.Random) -> str | None:
    words = [m for m in re.finditer(r"\b[a-z]+\b", p) if m.group() in SYNONYMS]
    if not words:
        return None
    m = rng.choice(words)
    return p[: m.start()] + SYNONYMS[m.group()] + p[m.end() :]


# ---- "different": one change that needs another answer ------------------------------------------

ANTONYMS = [
    ("enable", "disable"),
    ("increase", "decrease"),
    ("add", "remove"),
    ("include", "exclude"),
    ("before", "after"),
    ("maximum", "minimum"),
    ("largest", "smallest"),
    ("most", "least"),
    ("more", "less"),
    ("true", "false"),
    ("allow", "block"),
    ("start", "stop"),
    ("open", "close"),
    ("encrypt", "decrypt"),
    ("install", "uninstall"),
    ("upload", "download"),
    ("import", "export"),
    ("buy", "sell"),
    ("win", "lose"),
    ("positive", "negative"),
    ("higher", "lower"),
    ("always", "never"),
    ("with", "without"),
    ("above", "below"),
    ("advantages", "disadvantages"),
    ("pros", "cons"),
    ("best", "worst"),
    ("first", "last"),
    ("hot", "cold"),
    ("even", "odd"),
]
AUXILIARIES = r"\b(is|are|was|were|can|could|does|do|did|should|will|would|has|have|must)\b"


def negation(p: str, rng: random.Random) -> str | None:
    options: list[Callable[[], str | None]] = []
    lookup = {a: b for a, b in ANTONYMS} | {b: a for a, b in ANTONYMS}
    found = [m for m in re.finditer(r"\b[A-Za-z]+\b", p) if m.group().lower() in lookup]
    if found:

        def swap() -> str:
            m = rng.choice(found)
            new = lookup[m.group().lower()]
            new = new.capitalize() if m.group()[:1].isupper() else new
            return p[: m.start()] + new + p[m.end() :]

        options.append(swap)
    if re.search(r"\b(not|n't)\b|n't\b", p):
        options.append(lambda: re.sub(r"\s?\bnot\b|n't\b", "", p, count=1))
    if re.search(AUXILIARIES, p):

        def insert_not() -> str:
            ms = list(re.finditer(AUXILIARIES, p))
            m = rng.choice(ms)
            return p[: m.end()] + " not" + p[m.end() :]

        options.append(insert_not)
    if not options:
        return None
    return rng.choice(options)()


NUMBER_WORDS = ["two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "twelve", "twenty"]


def number(p: str, rng: random.Random) -> str | None:
    ms = list(re.finditer(r"(?<![\w.])\d+(?:\.\d+)?(?![\w])", p))
    if ms:
        m = rng.choice(ms)
        text = m.group()
        if "." in text:
            new = f"{float(text) * rng.choice([0.5, 2, 1.5]):g}"
        else:
            value = int(text)
            new = str(rng.choice([value + 1, value - 1 if value > 1 else value + 2, value * 2, value + 10]))
        return p[: m.start()] + new + p[m.end() :] if new != text else None
    words = [m for m in re.finditer(r"\b[a-z]+\b", p) if m.group() in NUMBER_WORDS]
    if words:
        m = rng.choice(words)
        new = rng.choice([w for w in NUMBER_WORDS if w != m.group()])
        return p[: m.start()] + new + p[m.end() :]
    return None


ENTITY = re.compile(r"\b[A-Z][a-z]+(?: [A-Z][a-z]+)*\b")
NOT_ENTITIES = {"I", "The", "A", "An", "What", "Which", "Who", "How", "Why", "When", "Where", "In", "If", "Please"}


def entity_spans(p: str) -> list[re.Match[str]]:
    """Capitalised words mid-sentence: a sentence's first word may be any word."""
    return [
        m
        for m in ENTITY.finditer(p)
        if m.group() not in NOT_ENTITIES
        and not re.search(r"(^|[.!?:;(\"“'\n])\s*$", p[max(0, m.start() - 4) : m.start()])
        and m.start() > 3
    ]


def entity(p: str, rng: random.Random, pool: list[str]) -> str | None:
    spans = entity_spans(p)
    if not spans:
        return None
    m = rng.choice(spans)
    choices = [e for e in pool if e.lower() != m.group().lower() and e.lower() not in p.lower()]
    return p[: m.start()] + rng.choice(choices) + p[m.end() :]


def entity_order(p: str, rng: random.Random) -> str | None:
    """PAWS' word swap: two named things trade places, every word stays."""
    spans = entity_spans(p)
    distinct = {m.group().lower() for m in spans}
    if len(spans) < 2 or len(distinct) < 2:
        return None
    a, b = rng.sample(spans, 2)
    if a.group().lower() == b.group().lower():
        return None
    a, b = sorted((a, b), key=lambda m: m.start())
    return p[: a.start()] + b.group() + p[a.end() : b.start()] + a.group() + p[b.end() :]


IDENT_PARTS = ["list", "count", "max", "sum", "value", "index", "items", "total", "key", "pair", "prime", "sorted"]


def code_identifier(p: str, rng: random.Random) -> str | None:
    names = re.findall(r"^def (\w+)\(", p, re.M) + re.findall(r"`([A-Za-z_][\w.]*\(?\)?)`", p)
    if not names:
        return None
    name = rng.choice(names)
    base = name.rstrip("()")
    parts = base.split("_")
    if len(parts) > 1:
        i = rng.randrange(len(parts))
        parts[i] = rng.choice([w for w in IDENT_PARTS if w != parts[i]])
        new = "_".join(parts)
    else:
        new = base + rng.choice(["_all", "_v2", "Async", "s"])
    if new == base:
        return None
    if rng.random() < 0.5:  # the name everywhere: the same task, but the answer's code names another function
        return re.sub(rf"\b{re.escape(base)}\b", new, p)
    return re.sub(rf"\b{re.escape(base)}\b", new, p, count=1)


QUOTED = re.compile(r"\"([^\"\n]{1,80})\"|“([^”\n]{1,80})”|'([^'\n]{2,80})'(?!\w)")


def quoted(p: str, rng: random.Random, pool: list[str]) -> str | None:
    ms = [m for m in QUOTED.finditer(p) if not re.search(r"\w'\w", m.group())]
    if not ms:
        return None
    m = rng.choice(ms)
    group = next(i for i in (1, 2, 3) if m.group(i) is not None)
    inner = m.group(group)
    words = inner.split()
    if len(words) > 1 and rng.random() < 0.5:
        i = rng.randrange(len(words))
        words[i] = rng.choice([w for w in pool if w.lower() != words[i].lower()])
        new = " ".join(words)
    else:
        new = rng.choice([w for w in pool if w.lower() != inner.lower()])
    return p[: m.start(group)] + new + p[m.end(group) :]


def neighbour_pairs(prompts: list[str], rng: random.Random, limit: int) -> list[tuple[str, str]]:
    """Real hard negatives: for a prompt, the other prompt of its set that shares most words."""

    def words(p: str) -> set[str]:
        return set(re.findall(r"[a-z]+", p.lower())) - {"the", "a", "an", "of", "to", "is", "in", "and", "what"}

    picked = rng.sample(prompts, min(limit * 3, len(prompts)))
    sets = {p: words(p) for p in prompts}
    out = []
    for p in picked:
        best, score = None, 0.0
        for q in prompts:
            if q == p or not sets[q]:
                continue
            jaccard = len(sets[p] & sets[q]) / len(sets[p] | sets[q])
            if jaccard > score:
                best, score = q, jaccard
        # too near to be sure they need another answer: OpenBookQA's stems repeat with other options
        if best is not None and score >= 0.3 and len(sets[p] ^ sets[best]) > 2:
            out.append((p, best))
        if len(out) >= limit:
            break
    return out


# ---- the set -----------------------------------------------------------------------------------


def part_of(prompt: str) -> str:
    digest = int(hashlib.sha256(prompt.encode()).hexdigest()[:8], 16)
    return "held_out" if digest % 1000 < HELD_OUT_SHARE * 1000 else "tune"


def main() -> None:
    rng = random.Random(43)
    sources = load_sources()
    every = [p for prompts in sources.values() for p in prompts]
    entity_pool = sorted({m.group() for p in every for m in entity_spans(p) if len(m.group()) > 3})
    quote_pool = sorted({w for p in every for w in re.findall(r"\b[a-z]{4,10}\b", p)})
    same: dict[str, Callable[[str, random.Random], str | None]] = {
        "rephrase": rephrase,
        "surface": surface,
        "politeness": politeness,
        "synonym": synonym,
    }
    different: dict[str, Callable[[str, random.Random], str | None]] = {
        "negation": negation,
        "number": number,
        "entity": lambda p, r: entity(p, r, entity_pool),
        "entity_order": entity_order,
        "code_identifier": code_identifier,
        "quoted": lambda p, r: quoted(p, r, quote_pool),
    }
    per_source = {
        "chat": {"rephrase": 60, "surface": 40, "politeness": 40, "synonym": 60, "negation": 90, "number": 50,
                 "entity": 70, "entity_order": 30, "code_identifier": 30, "quoted": 40},
        "question": {"rephrase": 200, "surface": 150, "politeness": 120, "synonym": 120, "negation": 250,
                     "number": 120, "entity": 250, "entity_order": 80},
        "math": {"rephrase": 60, "surface": 40, "politeness": 40, "synonym": 40, "negation": 60, "number": 200,
                 "entity": 60},
        "code": {"rephrase": 40, "surface": 30, "politeness": 30, "code_identifier": 150, "number": 40,
                 "quoted": 30},
    }  # fmt: skip
    rows: list[dict] = []
    seen: set[tuple[str, str]] = set()
    for source, quotas in per_source.items():
        prompts = sources[source]
        for kind, quota in quotas.items():
            label = "same" if kind in same else "different"
            make = same.get(kind) or different[kind]
            made = 0
            for cached in rng.sample(prompts, len(prompts)):
                if made >= quota:
                    break
                asked = make(cached, rng)
                if asked is None or asked.strip() == cached.strip() or (asked, cached) in seen:
                    continue
                seen.add((asked, cached))
                rows.append({"asked": asked, "cached": cached, "label": label, "kind": kind, "source": source})
                made += 1
    for source, limit in (("question", 150), ("chat", 60), ("math", 60)):
        for cached, asked in neighbour_pairs(sources[source], rng, limit):
            rows.append({"asked": asked, "cached": cached, "label": "different", "kind": "neighbour", "source": source})
    for i, row in enumerate(rows):
        row["id"] = i
        row["part"] = part_of(row["cached"])
    with gzip.GzipFile(OUT, "wb", mtime=0) as f:
        f.write(b"".join(json.dumps(r, ensure_ascii=False).encode() + b"\n" for r in rows))
    print(f"wrote {len(rows)} pairs to {OUT}")


if __name__ == "__main__":
    main()
