"""`POST /v1/tokenize` and `POST /v1/detokenize`: which model would answer, and what it counts.

The model is found as a chat request's is (`proxy/decide.py`), but nothing is reserved, limited or
admitted: a named model the caller's team may use (else the same 404 or 403), for `auto` the model
the tier routing would choose for these messages (classifier, team, capabilities, context window,
health, budget headroom, the team's default adapter), for `cascade` the ladder's first rung that
can serve them. The count is that model's backend's (`Backend.tokenize`); the cost range is its
price over the count (`core.estimates.cost_range_usd`).
"""

from __future__ import annotations

from switchyard.backends.registry import ModelEntry
from switchyard.billing.teams import Principal
from switchyard.core.capabilities import needs
from switchyard.core.chat_wire import ChatCompletionRequest, CompletionRequest
from switchyard.core.errors import ArrayTooLong, BudgetExceeded, InvalidRequest
from switchyard.core.estimates import cost_range_usd
from switchyard.core.requests import GenerationRequest
from switchyard.core.tokenize_wire import (
    CostRange,
    DetokenizeRequest,
    DetokenizeResponse,
    TokenizeRequest,
    TokenizeResponse,
)
from switchyard.gateway.auto_router import CASCADE_MODEL, auto_not_configured, cascade_not_configured
from switchyard.gateway.decide import allowed, with_default_adapter
from switchyard.gateway.services import Services

CHAT_FIELDS = ("model", "messages", "max_tokens", "tools", "tool_choice")
PROMPT_FIELDS = ("model", "prompt", "max_tokens")


async def count_tokens(
    services: Services, principal: Principal | None, body: TokenizeRequest, quality: str | None
) -> TokenizeResponse:
    """The tokenize answer for `body`; `quality`: the x-switchyard-quality header (for `auto`)."""
    request = as_generation_request(body)
    entry = await answering_model(services, principal, request, quality)
    counted = await entry.backend.tokenize(request)
    window = counted.max_model_len if counted.max_model_len is not None else entry.capabilities.context_window
    price = services.prices.get(entry.name)
    cost = None
    if price is not None:
        low, high = cost_range_usd(price, counted.count, body.max_tokens, window)
        cost = CostRange(min=round(low, 12), max=round(high, 12))  # whole picodollars: no float noise
    return TokenizeResponse(
        model=body.model,
        count=counted.count,
        max_model_len=window,
        tokens=counted.tokens,
        estimated_cost_usd=cost,
        approximate=counted.is_approximate,
        tokenizer=counted.tokenizer,
        routed_to=entry.name if entry.name != body.model else None,
    )


def as_generation_request(body: TokenizeRequest) -> GenerationRequest:
    """The chat request (`messages`) or completion request (`prompt`) whose prompt is counted."""
    if body.messages is not None and body.prompt is not None:
        raise InvalidRequest("Give either 'messages' or 'prompt', not both.", param="prompt", code="invalid_value")
    payload = body.payload if body.payload is not None else body.model_dump(exclude_unset=True)
    if body.messages is not None:
        return ChatCompletionRequest.from_payload({k: payload[k] for k in CHAT_FIELDS if k in payload})
    if body.prompt is None:
        raise InvalidRequest(
            "Missing required parameter: 'messages' (or 'prompt').",
            param="messages",
            code="missing_required_parameter",
        )
    return CompletionRequest.from_payload({k: payload[k] for k in PROMPT_FIELDS if k in payload})


async def answering_model(
    services: Services, principal: Principal | None, request: GenerationRequest, quality: str | None
) -> ModelEntry:
    """The model a chat request like `request` would be answered by, decided as `decide()` does."""
    team = principal.team if principal is not None else None
    if request.model == "auto":
        if services.auto_router is None:
            raise auto_not_configured()
        try:
            headroom = await services.budgets.headroom(principal)
        except BudgetExceeded:  # a chat request would be refused; the count is still the routed model's
            headroom = None
        decision = await services.auto_router.route(request, quality, team, headroom, needs(request), is_counted=False)
        return with_default_adapter(services, team, decision.entry)
    if request.model == CASCADE_MODEL:
        if services.cascade is None:
            raise cascade_not_configured()
        allowed(team, services.cascade.rungs[0].entry, CASCADE_MODEL)
        first, _ = services.cascade.first_capable(needs(request))
        return allowed(team, first, CASCADE_MODEL)
    return allowed(team, services.registry.get(request.model), request.model)


async def read_tokens(services: Services, principal: Principal | None, body: DetokenizeRequest) -> DetokenizeResponse:
    """The detokenize answer: the named model's text for its token ids."""
    limit = services.settings.server.max_prompt_token_ids
    if len(body.tokens) > limit:
        raise ArrayTooLong(
            f"'tokens' has {len(body.tokens)} token ids; the limit is {limit} (server.max_prompt_token_ids).",
            param="tokens",
        )
    if body.model in ("auto", CASCADE_MODEL):
        raise InvalidRequest(
            f"Token ids belong to one model's tokenizer: name it ('{body.model}' chooses among several).",
            param="model",
            code="unsupported_model",
        )
    team = principal.team if principal is not None else None
    entry = allowed(team, services.registry.get(body.model), body.model)
    return DetokenizeResponse(model=body.model, prompt=await entry.backend.detokenize(body.tokens))
