"""A draft model: a smaller model with the target's vocabulary proposes the next tokens one at a
time, and the target verifies them in one forward pass (`speculation.py`).

The drafter keeps the KV of what it has read, as the single-stream path does, and brings it up to
the context before each proposal: the context's tokens it has not read (the target's last choices)
are fed in one pass, drafts it proposed and the target rejected are cropped away. Under greedy
decoding it proposes its argmax; when sampling, it draws from its own distribution with the
request's temperature and top_p and hands that distribution to `verify_sampled`.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache

from switchyard.backends.embedded.sampler import SamplingParams, sampling_probs


class DraftModelError(ValueError):
    """The configured draft model cannot draft for this target model."""


def supports_cropping(config) -> bool:
    """Full attention in every layer: a `DynamicCache` of it can be cut back to any length."""
    layer_types = getattr(config, "layer_types", None) or ["full_attention"]
    return all(kind == "full_attention" for kind in layer_types) and not getattr(config, "sliding_window", None)


def check_draft_model(draft_model, draft_tokenizer, target_model, target_tokenizer) -> None:
    """Refuse a draft model whose tokens mean something else than the target's, or whose cache
    cannot be cut back (sliding-window or linear-attention layers)."""
    draft_rows = draft_model.get_output_embeddings().weight.shape[0]
    target_rows = target_model.get_output_embeddings().weight.shape[0]
    if draft_rows != target_rows or draft_tokenizer.get_vocab() != target_tokenizer.get_vocab():
        raise DraftModelError(
            f"the draft model's vocabulary ({len(draft_tokenizer)} tokens, {draft_rows} logits) is not the "
            f"target's ({len(target_tokenizer)} tokens, {target_rows} logits): a draft model must share "
            "the target's tokenizer"
        )
    if not supports_cropping(draft_model.config):
        raise DraftModelError(
            "the draft model has sliding-window or non-attention layers; its cache cannot be cut back"
        )


class DraftModel:
    """One single-stream path's drafter: the draft weights (shared) and the KV it has read (its own)."""

    def __init__(self, model, num_tokens: int) -> None:
        self.model = model
        self.num_tokens = num_tokens
        self._ids: list[int] = []  # the tokens whose KV `_cache` holds
        self._cache: DynamicCache | None = None

    def reset(self) -> None:
        self._ids, self._cache = [], None

    def propose(
        self, context_ids: list[int], max_tokens: int, params: SamplingParams
    ) -> tuple[list[int], list[torch.Tensor] | None]:
        """Up to `max_tokens` drafts (never more than `num_tokens`) continuing `context_ids`, and the
        distribution each was drawn from (None under greedy decoding)."""
        limit = min(max_tokens, self.num_tokens)
        if limit <= 0 or params.constraint is not None:  # a grammar's mask is the target's alone
            return [], None
        pending = self._catch_up(context_ids)
        drafts: list[int] = []
        probs: list[torch.Tensor] = []
        assert self._cache is not None
        while True:
            logits = self._forward(pending)
            if params.is_greedy:
                token_id = int(torch.argmax(logits))
            else:
                q = sampling_probs(logits, params)
                q = q / q.sum()
                token_id = int(torch.multinomial(q, num_samples=1, generator=params.generator))
                probs.append(q)
            drafts.append(token_id)
            self._ids.extend(pending)
            if len(drafts) == limit:
                break
            pending = [token_id]
        return drafts, (None if params.is_greedy else probs)

    def _catch_up(self, context_ids: list[int]) -> list[int]:
        """Crop the cache to its longest common prefix with the context (leaving at least the last
        token unread) and return the context's tokens still to be fed."""
        if self._cache is None:
            self._cache = DynamicCache(config=self.model.config)
            self._ids = []
        limit = min(len(self._ids), len(context_ids) - 1)
        num_common = next((i for i in range(limit) if self._ids[i] != context_ids[i]), limit)
        if num_common < len(self._ids):
            self._cache.crop(num_common - len(self._ids))  # a negative count: tokens removed from the end
            del self._ids[num_common:]
        return context_ids[num_common:]

    def _forward(self, input_ids: list[int]) -> torch.Tensor:
        out = self.model(
            input_ids=torch.tensor([input_ids]), past_key_values=self._cache, use_cache=True, logits_to_keep=1
        )
        return out.logits[0, -1].float()
