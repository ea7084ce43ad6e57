"""The cascade's view of OpenAI wire objects: asking for logprobs, reading them, hiding them again.

Chat answers carry `choices[0].logprobs.content[*] = {token, logprob, top_logprobs: [{token,
logprob}]}`; legacy completions carry `choices[0].logprobs = {tokens, token_logprobs,
top_logprobs: [{token: logprob}]}`. Both become a `TokenEvidence`.
"""

from __future__ import annotations

from typing import Any

from switchyard.cascade.confidence import TokenEvidence
from switchyard.core.chat_wire import ChatCompletionRequest, RawJSON
from switchyard.core.requests import GenerationRequest


def with_logprobs(request: GenerationRequest, top_logprobs: int) -> GenerationRequest:
    """The same request asking for the logprobs a judged rung needs (at least what the client asked)."""
    payload = request.wire_payload()
    if isinstance(request, ChatCompletionRequest):
        payload["logprobs"] = True
        payload["top_logprobs"] = max(top_logprobs, request.top_logprobs or 0)
    else:
        payload["logprobs"] = max(top_logprobs, request.logprobs or 0)
    return type(request).from_payload(payload)


def client_top_logprobs(request: GenerationRequest) -> int | None:
    """How many alternatives the client asked for; None when it asked for no logprobs at all."""
    if isinstance(request, ChatCompletionRequest):
        return (request.top_logprobs or 0) if request.logprobs else None
    return request.logprobs


def _choice_evidence(choice: dict[str, Any]) -> tuple[list[float], list[list[float]]]:
    logprobs = choice.get("logprobs") or {}
    if "content" in logprobs:  # chat
        entries = logprobs.get("content") or []
        return (
            [float(e["logprob"]) for e in entries],
            [[float(a["logprob"]) for a in e.get("top_logprobs") or ()] for e in entries],
        )
    chosen = [float(x) for x in logprobs.get("token_logprobs") or () if x is not None]
    tops = [[float(v) for v in (alt or {}).values()] for alt in logprobs.get("top_logprobs") or ()]
    return chosen, tops


class EvidenceBuffer:
    """Token evidence accumulated from an answer or from stream chunks, first choice only."""

    def __init__(self) -> None:
        self.logprobs: list[float] = []
        self.top: list[list[float]] = []
        self.is_finished = False

    def add(self, obj: RawJSON) -> None:
        for choice in obj.parsed.get("choices") or ():
            if choice.get("index", 0) != 0:
                continue
            chosen, tops = _choice_evidence(choice)
            self.logprobs += chosen
            self.top += tops
            if choice.get("finish_reason"):
                self.is_finished = True

    def evidence(self) -> TokenEvidence | None:
        if not self.logprobs:
            return None
        top = self.top if len(self.top) == len(self.logprobs) and all(self.top) else None
        return TokenEvidence(list(self.logprobs), top)

    @property
    def num_tokens(self) -> int:
        return len(self.logprobs)


def evidence_of(obj: RawJSON) -> EvidenceBuffer:
    buffer = EvidenceBuffer()
    buffer.add(obj)
    return buffer


def for_client(obj: RawJSON, wanted: int | None):
    """The object with logprobs as the client asked: none at all, or at most `wanted` alternatives."""
    choices = obj.parsed.get("choices") or ()
    if not any(c.get("logprobs") for c in choices):
        return obj
    payload = dict(obj.parsed)
    trimmed = []
    for choice in choices:
        choice = dict(choice)
        if wanted is None:
            choice["logprobs"] = None
        elif choice.get("logprobs"):
            choice["logprobs"] = _trim(choice["logprobs"], wanted)
        trimmed.append(choice)
    payload["choices"] = trimmed
    return type(obj).from_dict(payload, obj.upstream_model)


def _trim(logprobs: dict[str, Any], wanted: int) -> dict[str, Any]:
    if "content" in logprobs:
        content = [{**e, "top_logprobs": (e.get("top_logprobs") or [])[:wanted]} for e in logprobs["content"] or ()]
        return {**logprobs, "content": content}
    tops = [
        dict(sorted((alt or {}).items(), key=lambda kv: -kv[1])[:wanted]) for alt in logprobs.get("top_logprobs") or ()
    ]
    return {**logprobs, "top_logprobs": tops}
