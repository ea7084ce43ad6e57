"""Worst-case estimates: what budgets reserve and rate limits count before a call is answered."""

from __future__ import annotations

from switchyard.core.chat_wire import ChatCompletionRequest, CompletionRequest
from switchyard.core.estimates import (
    ANSWER_TOKENS_FOR_COST,
    estimated_cost_usd,
    estimated_prompt_tokens,
    worst_case_tokens,
)
from switchyard.core.prices import Price

PER_TOKEN = Price(1e6, 1e6)  # $1 a token, in and out: costs read as token counts


def chat(**extra) -> ChatCompletionRequest:
    return ChatCompletionRequest.from_payload(
        {"model": "m", "messages": [{"role": "user", "content": "abcdefgh"}], **extra}
    )


def test_every_answer_is_counted_n_of_them():
    assert worst_case_tokens(chat(max_tokens=5)) == 2 + 5
    assert worst_case_tokens(chat(max_tokens=5, n=100)) == 2 + 500
    assert estimated_cost_usd(chat(max_tokens=5, n=100), PER_TOKEN) == 502
    assert worst_case_tokens(chat(n=3)) == 2 + 3 * ANSWER_TOKENS_FOR_COST


def test_a_batch_of_prompts_counts_every_prompt_and_every_answer():
    batch = CompletionRequest.from_payload(
        {"model": "m", "prompt": ["abcd", "abcdefgh", "ab"], "max_tokens": 4, "n": 2}
    )
    assert estimated_prompt_tokens(batch) == 1 + 2 + 1
    assert worst_case_tokens(batch) == 4 + 3 * 2 * 4


def test_token_ids_count_as_they_are():
    one = CompletionRequest.from_payload({"model": "m", "prompt": [1, 2, 3, 4, 5, 6, 7], "max_tokens": 1})
    many = CompletionRequest.from_payload({"model": "m", "prompt": [[1, 2], [3, 4, 5]], "max_tokens": 1})
    assert (estimated_prompt_tokens(one), worst_case_tokens(one)) == (7, 8)
    assert (estimated_prompt_tokens(many), worst_case_tokens(many)) == (5, 7)
