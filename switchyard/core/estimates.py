"""What a request will cost before it is answered: its tokens estimated, its worst-case cost.

Routing compares these against budget headroom, the budgets reserve them before a call, and rate
limits count the tokens (prompt plus the answer budget, as OpenAI counts them).
"""

from __future__ import annotations

from typing import cast

from switchyard.core.prices import Price, estimate_tokens
from switchyard.core.protocol import ChatCompletionRequest, CompletionRequest, message_text

ANSWER_TOKENS_FOR_COST = 256  # the answer length an estimate assumes when max_tokens is not set


def routing_text(request: ChatCompletionRequest | CompletionRequest) -> str:
    """What the classifier reads: the system prompt(s) and the last user turn."""
    if isinstance(request, CompletionRequest):
        prompt = request.prompt
        return prompt if isinstance(prompt, str) else (prompt[0] if prompt and isinstance(prompt[0], str) else "")
    parts = [message_text(m.content) for m in request.messages if m.role in ("system", "developer")]
    users = [m for m in request.messages if m.role == "user"]
    if users:
        parts.append(message_text(users[-1].content))
    return "\n".join(p for p in parts if p)


def _prompts(request: CompletionRequest) -> list[str | list[int]]:
    """A completions request's prompts: one string, one list of token ids, or a batch of either."""
    prompt = request.prompt
    if isinstance(prompt, str) or (prompt and isinstance(prompt[0], int)):
        return [prompt]
    # a batch; mypy cannot tell list[int] out by its first item
    return list(cast("list[str] | list[list[int]]", prompt))


def estimated_prompt_tokens(request: ChatCompletionRequest | CompletionRequest) -> int:
    """Prompt tokens, estimated (`estimate_tokens`); token ids count as they are; a batch, every prompt."""
    if isinstance(request, ChatCompletionRequest):
        return estimate_tokens("".join(message_text(m.content) for m in request.messages))
    return sum(estimate_tokens(p) if isinstance(p, str) else len(p) for p in _prompts(request))


def num_answers(request: ChatCompletionRequest | CompletionRequest) -> int:
    """How many answers the upstream writes: `n` for each prompt."""
    prompts = len(_prompts(request)) if isinstance(request, CompletionRequest) else 1
    return (request.n or 1) * max(1, prompts)


def answer_budget(request: ChatCompletionRequest | CompletionRequest) -> int | None:
    if isinstance(request, ChatCompletionRequest):
        return request.max_completion_tokens or request.max_tokens
    return request.max_tokens


def estimated_tokens(request: ChatCompletionRequest | CompletionRequest) -> int:
    """Prompt tokens at four characters a token, plus the answer budget asked for."""
    return estimated_prompt_tokens(request) + (answer_budget(request) or 0)


def worst_case_answer_tokens(request: ChatCompletionRequest | CompletionRequest) -> int:
    """Every answer at `max_tokens` (or ANSWER_TOKENS_FOR_COST): `n` of them for each prompt."""
    return (answer_budget(request) or ANSWER_TOKENS_FOR_COST) * num_answers(request)


def worst_case_tokens(request: ChatCompletionRequest | CompletionRequest) -> int:
    """What rate limits count: the prompt plus every answer at `max_tokens` (or ANSWER_TOKENS_FOR_COST)."""
    return estimated_prompt_tokens(request) + worst_case_answer_tokens(request)


def estimated_cost_usd(request: ChatCompletionRequest | CompletionRequest, price: Price | None) -> float:
    """The prompt estimated, every answer at `max_tokens` (or ANSWER_TOKENS_FOR_COST)."""
    if price is None:
        return 0.0
    return price.cost_usd(estimated_prompt_tokens(request), worst_case_answer_tokens(request))
