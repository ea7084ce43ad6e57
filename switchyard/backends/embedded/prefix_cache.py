"""Prefix caching: the KV blocks of earlier prompts reused by later prompts that start the same way.

transformers 5.23's paged cache does the core of it (`cache_allocators/cache_allocator.py`), as
vLLM does: once a forward pass fills a block, the block gets a hash of its tokens chained to its
parent block's hash, so equal hashes mean equal tokens at equal positions; a new request's prompt
is matched block by block (never its last token, which must be computed for the first logits) and
shares the matched blocks, reference-counted; a block no request holds any more keeps its hash and
stays in the ledger's `cached_blocks`, free to be evicted, until a later prompt claims it.

What this module changes, on the engine's own cache (`install`):

- Eviction is least recently used and only as deep as needed: a cached block is evicted when an
  allocation needs its room. transformers would evict every cached block at once, whenever the free
  blocks fall under the scheduler's safety margin (the engine sets that margin to 0, see
  `engine.py`) or an allocation fails. A request's blocks are released tail first, so a prefix
  loses its last block before its first (a chain cut at its head would leave unreachable blocks).
- Each request's matched tokens are reported (`on_match`): its `cached_tokens`.

Only models whose layers all use full attention share blocks: a sliding-window layer keeps only
the last tokens of a prompt, not its whole prefix.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass

from transformers.generation.continuous_batching.cache import PagedAttentionCache, group_layers_by_attn_type
from transformers.generation.continuous_batching.cache_allocators import FULL_ATTENTION, CacheAllocator
from transformers.generation.continuous_batching.requests import RequestState


@dataclass(slots=True)
class PrefixCacheCounts:
    """Prompt tokens looked up in the prefix cache, and found there (their KV reused, not computed)."""

    num_query_tokens: int = 0
    num_hit_tokens: int = 0

    def add(self, num_prompt_tokens: int, num_cached_tokens: int) -> None:
        self.num_query_tokens += num_prompt_tokens
        self.num_hit_tokens += num_cached_tokens


@dataclass(frozen=True, slots=True)
class PrefixCacheStats:
    num_query_tokens: int
    num_hit_tokens: int
    num_cached_tokens: int  # tokens whose KV the cache holds now, reusable by a later prompt


def supports_prefix_caching(model_config) -> bool:
    return set(group_layers_by_attn_type(model_config.get_text_config())) == {FULL_ATTENTION}


def num_cached_tokens(cache: PagedAttentionCache) -> int:
    """Tokens in hashed blocks (held by requests or kept for reuse): what a later prompt may match."""
    return sum(len(a.ledger.block_to_hash) * a.tokens_per_page for a in cache.cache_allocators.values())


def install(cache: PagedAttentionCache, on_match: Callable[[str, int], None]) -> None:
    """LRU eviction on demand and match reporting, on a cache built with `allow_block_sharing`."""
    if not cache.use_prefix_sharing:
        return
    search_prefix_match = cache.search_prefix_match
    can_store_request_tokens = cache.can_store_request_tokens

    def search_and_report(request_id: str, prompt_ids: list[int]) -> int:
        num_matched = search_prefix_match(request_id, prompt_ids)
        on_match(request_id, num_matched)
        return num_matched

    def store_after_making_room(state: RequestState, request_len: int, dry_run: bool = False) -> bool:
        if not dry_run:
            _make_room(cache, state, request_len)
        return can_store_request_tokens(state, request_len, dry_run)

    cache.search_prefix_match = search_and_report  # type: ignore[method-assign]
    cache.can_store_request_tokens = store_after_making_room  # type: ignore[method-assign]
    for allocator in cache.cache_allocators.values():
        allocator.free_blocks = _tail_first(allocator)  # type: ignore[method-assign]


def _make_room(cache: PagedAttentionCache, state: RequestState, request_len: int) -> None:
    """Evict the least recently released cached blocks that the request's new tokens need."""
    for allocator in cache.cache_allocators.values():
        num_needed = allocator.needs_new_blocks(state.request_id, state.current_len(), request_len)
        num_free_sectors = cache.pool.num_free_sectors
        num_free = cache.pool.count_free_blocks(allocator.index) + num_free_sectors * allocator.blocks_per_sector
        if num_needed > num_free:
            cache.pool.free_blocks(allocator.index, _evict_lru(allocator, num_needed - num_free))


def _evict_lru(allocator: CacheAllocator, num_blocks: int) -> list[int]:
    ledger = allocator.ledger
    # `cached_blocks` is in release order: a block claimed by a match leaves it, and re-enters at the end.
    evicted = list(itertools.islice(ledger.cached_blocks, num_blocks))
    for block_id in evicted:
        del ledger.cached_blocks[block_id]
        del ledger.hash_to_block[ledger.block_to_hash.pop(block_id)]
    return evicted


def _tail_first(allocator: CacheAllocator) -> Callable[..., None]:
    free_blocks = allocator.free_blocks

    def free_tail_first(request_id: str, no_cache: bool = False) -> None:
        allocator.block_table.get(request_id, []).reverse()
        free_blocks(request_id, no_cache)

    return free_tail_first
