"""The batch's decode steps attend per request: the same answer as SDPA on each request's own keys."""

from __future__ import annotations

import torch
from transformers.generation.continuous_batching.cache import PagedAttentionCache

from switchyard.backends.embedded.decode_attention import decode_attention

NUM_HEADS, NUM_KV_HEADS, HEAD_DIM = 6, 2, 8


class _Cache(PagedAttentionCache):
    """What the paged cache hands attention: every request's keys, one after another."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor) -> None:  # no pages: the test's tensors
        self.keys, self.values = keys, values
        self.num_updates = 0

    def update(self, key_states, value_states, layer_idx, kwargs):
        self.num_updates += 1
        return self.keys, self.values


class _Layer(torch.nn.Module):
    layer_idx = 0
    sliding_window = None


def _case(lengths: list[int], seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    total = sum(lengths)
    query = torch.randn(1, NUM_HEADS, len(lengths), HEAD_DIM, generator=generator)
    keys = torch.randn(1, NUM_KV_HEADS, total, HEAD_DIM, generator=generator)
    values = torch.randn(1, NUM_KV_HEADS, total, HEAD_DIM, generator=generator)
    bounds = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    return query, keys, values, bounds


def _one_by_one(query, keys, values, bounds) -> torch.Tensor:
    """Each request alone: its query heads against its own keys, KV heads repeated for the group."""
    group = NUM_HEADS // NUM_KV_HEADS
    rows = []
    for i in range(query.shape[2]):
        own = slice(int(bounds[i]), int(bounds[i + 1]))
        k = keys[0][:, own].repeat_interleave(group, dim=0)
        v = values[0][:, own].repeat_interleave(group, dim=0)
        q = query[0][:, i : i + 1]
        rows.append(torch.nn.functional.scaled_dot_product_attention(q, k, v, scale=0.3)[:, 0])  # [heads, dim]
    return torch.stack(rows)[None]  # [1, requests, heads, dim]


def test_a_decode_step_is_each_request_against_its_own_keys():
    lengths = [5, 1, 17, 9]
    query, keys, values, bounds = _case(lengths)
    cache = _Cache(keys, values)
    kwargs = {"cu_seq_lens_q": torch.arange(len(lengths) + 1, dtype=torch.int32), "cu_seq_lens_k": bounds}
    out, _ = decode_attention(
        _Layer(), query, keys[:, :, :4], values[:, :, :4], None, scaling=0.3, cache=cache, **kwargs
    )
    assert cache.num_updates == 1  # this step's keys were written once
    assert out.shape == (1, len(lengths), NUM_HEADS, HEAD_DIM)
    torch.testing.assert_close(out, _one_by_one(query, keys, values, bounds), rtol=1e-5, atol=1e-6)


def test_a_step_with_a_prompt_in_it_goes_to_transformers(monkeypatch):
    import switchyard.backends.embedded.decode_attention as module

    calls = []
    monkeypatch.setattr(
        module, "sdpa_attention_forward", lambda *args, **kwargs: calls.append(kwargs) or ("ours", None)
    )
    query, keys, values, bounds = _case([6, 3])
    cache = _Cache(keys, values)
    kwargs = {"cu_seq_lens_q": torch.tensor([0, 3, 4], dtype=torch.int32), "cu_seq_lens_k": bounds}
    prefill = torch.randn(1, NUM_HEADS, 4, HEAD_DIM)  # 3 prompt tokens of the first request, 1 decode
    assert decode_attention(_Layer(), prefill, keys, values, None, cache=cache, **kwargs)[0] == "ours"
    assert decode_attention(_Layer(), query, keys, values, None, cache=None)[0] == "ours"  # no paged cache
    assert len(calls) == 2 and cache.num_updates == 0  # transformers' function updates the cache itself
