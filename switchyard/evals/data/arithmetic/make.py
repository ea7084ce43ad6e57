"""Writes questions.jsonl: arithmetic questions of graded difficulty, for collecting cascade traces
from small local models (which get GSM8K almost always wrong, so its traces teach nothing).

Deterministic (seed 7); written by this project, same licence as the project.

    python evals/data/arithmetic/make.py
"""

from __future__ import annotations

import random
from pathlib import Path

import orjson

LEVELS = [
    ("add-1digit", lambda r: (r.randint(1, 9), "+", r.randint(1, 9))),
    ("add-2digit", lambda r: (r.randint(10, 99), "+", r.randint(10, 99))),
    ("sub-2digit", lambda r: (r.randint(50, 99), "-", r.randint(10, 49))),
    ("mul-1digit", lambda r: (r.randint(2, 9), "*", r.randint(2, 9))),
    ("mul-2digit", lambda r: (r.randint(11, 99), "*", r.randint(11, 99))),
    ("add-4digit", lambda r: (r.randint(1000, 9999), "+", r.randint(1000, 9999))),
]
PER_LEVEL = 50
WORDS = {"+": "plus", "-": "minus", "*": "times"}


def main() -> None:
    rng = random.Random(7)
    rows = []
    for level, draw in LEVELS:
        for i in range(PER_LEVEL):
            a, op, b = draw(rng)
            value = a + b if op == "+" else a - b if op == "-" else a * b
            rows.append(
                {
                    "id": f"{level}/{i}",
                    "prompt": f"What is {a} {WORDS[op]} {b}? Reply with the number only.",
                    "answer": str(value),
                    "grader": "gsm8k",
                    "category": level,
                }
            )
    out = Path(__file__).with_name("questions.jsonl")
    out.write_bytes(b"\n".join(orjson.dumps(r) for r in rows) + b"\n")
    print(f"wrote {len(rows)} questions to {out}")


if __name__ == "__main__":
    main()
