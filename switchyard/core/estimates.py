"""What a request will cost before it is answered: its tokens estimated, its worst-case cost.

Routing compares these against budget headroom, the budgets reserve them before a call, and rate
limits count the tokens (prompt plus the answer budget, as OpenAI counts them).
"""

from __future__ import annotations

from typing import cast

from switchyard.core.chat_wire import ChatCompletionRequest, CompletionRequest, message_text
from switchyard.core.embeddings_wire import EmbeddingRequest
from switchyard.core.prices import Price, estimate_tokens
from switchyard.core.requests import AnyRequest

ANSWER_TOKENS_FOR_COST = 256  # the answer length an estimate assumes when max_tokens is not set


def routing_text(request: ChatCompletionRequest | CompletionRequest, include_system: bool = True) -> str:
    """What the classifier reads: the system prompt(s) (unless `include_system` is false) and the
    last user turn."""
    if isinstance(request, CompletionRequest):
        prompt = request.prompt
        return prompt if isinstance(prompt, str) else (prompt[0] if prompt and isinstance(prompt[0], str) else "")
    roles = ("system", "developer") if include_system else ()
    parts = [message_text(m.content) for m in request.messages if m.role in roles]
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


def estimated_prompt_tokens(request: AnyRequest) -> int:
    """Prompt tokens, estimated (`estimate_tokens`); token ids count as they are; a batch, every
    prompt; embeddings, every input."""
    if isinstance(request, ChatCompletionRequest):
        return estimate_tokens("".join(message_text(m.content) for m in request.messages))
    prompts: list[str | list[int]] = _prompts(request) if isinstance(request, CompletionRequest) else _inputs(request)
    return sum(estimate_tokens(p) if isinstance(p, str) else len(p) for p in prompts)


def _inputs(request: EmbeddingRequest) -> list[str | list[int]]:
    given = request.input
    if isinstance(given, str) or (given and isinstance(given[0], int)):
        return [given]  # one string, or one list of token ids
    return list(cast("list[str | list[int]]", given))


def num_answers(request: AnyRequest) -> int:
    """How many answers the upstream writes: `n` for each prompt (embeddings: one list)."""
    if isinstance(request, EmbeddingRequest):
        return 1
    prompts = len(_prompts(request)) if isinstance(request, CompletionRequest) else 1
    return (request.n or 1) * max(1, prompts)


def answer_budget(request: AnyRequest) -> int | None:
    """The answer tokens asked for (None: not said); embeddings write none."""
    if isinstance(request, EmbeddingRequest):
        return 0
    if isinstance(request, ChatCompletionRequest):
        return request.max_completion_tokens or request.max_tokens
    return request.max_tokens


def estimated_tokens(request: AnyRequest) -> int:
    """Prompt tokens at four characters a token, plus the answer budget asked for."""
    return estimated_prompt_tokens(request) + (answer_budget(request) or 0)


def worst_case_answer_tokens(request: AnyRequest) -> int:
    """Every answer at `max_tokens` (or ANSWER_TOKENS_FOR_COST): `n` of them for each prompt."""
    budget = answer_budget(request)
    return (ANSWER_TOKENS_FOR_COST if budget is None else budget) * num_answers(request)


def worst_case_tokens(request: AnyRequest) -> int:
    """What rate limits count: the prompt plus every answer at `max_tokens` (or ANSWER_TOKENS_FOR_COST)."""
    return estimated_prompt_tokens(request) + worst_case_answer_tokens(request)


def estimated_cost_usd(request: AnyRequest, price: Price | None) -> float:
    """The prompt estimated, every answer at `max_tokens` (or ANSWER_TOKENS_FOR_COST)."""
    if price is None:
        return 0.0
    return price.cost_usd(estimated_prompt_tokens(request), worst_case_answer_tokens(request))


def cost_range_usd(
    price: Price, prompt_tokens: int, max_tokens: int | None, context_window: int | None
) -> tuple[float, float]:
    """A counted prompt's cost: alone, and with the longest answer it may get (`max_tokens`, else
    the rest of the context window, else ANSWER_TOKENS_FOR_COST)."""
    if max_tokens is not None:
        answer = max_tokens
    elif context_window is not None:
        answer = max(0, context_window - prompt_tokens)
    else:
        answer = ANSWER_TOKENS_FOR_COST
    return price.cost_usd(prompt_tokens, 0), price.cost_usd(prompt_tokens, answer)
