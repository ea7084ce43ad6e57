"""What a request will cost before it is answered: its tokens estimated, its worst-case cost.

Routing compares these against budget headroom, the budgets reserve them before a call, and rate
limits count the tokens (prompt plus the answer budget, as OpenAI counts them).
"""

from __future__ import annotations

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


def estimated_prompt_tokens(request: ChatCompletionRequest | CompletionRequest) -> int:
    """Prompt tokens, estimated (`estimate_tokens`)."""
    if isinstance(request, ChatCompletionRequest):
        return estimate_tokens("".join(message_text(m.content) for m in request.messages))
    return estimate_tokens(routing_text(request))


def answer_budget(request: ChatCompletionRequest | CompletionRequest) -> int | None:
    if isinstance(request, ChatCompletionRequest):
        return request.max_completion_tokens or request.max_tokens
    return request.max_tokens


def estimated_tokens(request: ChatCompletionRequest | CompletionRequest) -> int:
    """Prompt tokens at four characters a token, plus the answer budget asked for."""
    return estimated_prompt_tokens(request) + (answer_budget(request) or 0)


def worst_case_tokens(request: ChatCompletionRequest | CompletionRequest) -> int:
    """What rate limits count: the prompt plus `max_tokens` (or ANSWER_TOKENS_FOR_COST)."""
    return estimated_prompt_tokens(request) + (answer_budget(request) or ANSWER_TOKENS_FOR_COST)


def estimated_cost_usd(request: ChatCompletionRequest | CompletionRequest, price: Price | None) -> float:
    """The prompt estimated, the answer at `max_tokens` (or ANSWER_TOKENS_FOR_COST)."""
    if price is None:
        return 0.0
    return price.cost_usd(estimated_prompt_tokens(request), answer_budget(request) or ANSWER_TOKENS_FOR_COST)
