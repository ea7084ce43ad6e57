"""Attention for the batch's decode steps, each request against its own keys only.

transformers' continuous batching runs SDPA on the whole batch as one sequence: its queries are
scored against every request's keys under a block-diagonal mask, after the KV heads are copied out
to the query heads. At 32 requests that was a quarter of the engine thread's time (py-spy, served
process). When every request in a step brings one new token (a decode step, the common case once
prompts are in), `decode_attention` gathers each request's keys into a padded block instead and
runs SDPA once over the batch of requests, grouped by KV head: the work grows with the longest
request, not with the sum of all of them. Prefill steps, sliding-window layers, soft-capping and
everything else go to transformers' own function unchanged.

`install()` puts it in transformers' attention registry under `sdpa`, the name continuous
batching runs with on CPU; a call without a paged cache (any other model in the process) is passed
straight through.
"""

from __future__ import annotations

import torch
from transformers.generation.continuous_batching.cache import PagedAttentionCache
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.modeling_utils import AttentionInterface


def decode_attention(
    module: torch.nn.Module,
    query: torch.Tensor,  # [1, num_heads, num_queries, head_dim]
    key: torch.Tensor,  # [1, num_kv_heads, num_queries, head_dim]: this step's keys
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    position_bias: torch.Tensor | None = None,
    cache: PagedAttentionCache | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    if not _is_decode_step(module, query, cache, position_bias, kwargs):
        return sdpa_attention_forward(
            module,
            query,
            key,
            value,
            attention_mask,
            dropout=dropout,
            scaling=scaling,
            is_causal=is_causal,
            position_bias=position_bias,
            cache=cache,
            **kwargs,
        )
    assert cache is not None
    key, value = cache.update(key_states=key, value_states=value, layer_idx=module.layer_idx, kwargs=kwargs)
    bounds = kwargs["cu_seq_lens_k"].to(torch.long)  # request i's keys: [bounds[i], bounds[i + 1])
    lengths = bounds[1:] - bounds[:-1]
    positions = torch.arange(int(lengths.max()))
    present = positions[None, :] < lengths[:, None]  # [requests, longest]
    index = torch.where(present, bounds[:-1, None] + positions[None, :], 0)
    num_requests, num_heads, head_dim = query.shape[2], query.shape[1], query.shape[3]
    num_kv_heads, longest = key.shape[1], index.shape[1]
    flat = index.flatten()
    # the cache hands keys over as a view of [tokens, kv heads, head_dim]: rows are picked from that
    keys = key[0].transpose(0, 1).index_select(0, flat).view(num_requests, longest, num_kv_heads, head_dim)
    values = value[0].transpose(0, 1).index_select(0, flat).view(num_requests, longest, num_kv_heads, head_dim)
    keys, values = keys.transpose(1, 2), values.transpose(1, 2)  # [requests, kv heads, longest, head_dim]
    # each request's query heads, grouped by the KV head they share: [requests, kv heads, group, head_dim]
    queries = query[0].transpose(0, 1).reshape(num_requests, num_kv_heads, num_heads // num_kv_heads, head_dim)
    out = torch.nn.functional.scaled_dot_product_attention(
        queries, keys, values, attn_mask=present[:, None, None, :], scale=scaling
    )
    return out.reshape(1, num_requests, num_heads, head_dim), None


def _is_decode_step(module, query: torch.Tensor, cache, position_bias, kwargs: dict) -> bool:
    if not isinstance(cache, PagedAttentionCache) or position_bias is not None:
        return False
    if kwargs.get("block_table") is not None or kwargs.get("softcap") is not None:
        return False
    if getattr(module, "sliding_window", None) or not hasattr(module, "layer_idx"):
        return False
    bounds_q = kwargs.get("cu_seq_lens_q")
    # one query token per request: as many queries as requests
    return bounds_q is not None and query.shape[0] == 1 and query.shape[2] == len(bounds_q) - 1


def install() -> None:
    """Serve `sdpa` with `decode_attention` in this process (idempotent)."""
    AttentionInterface.register("sdpa", decode_attention)
