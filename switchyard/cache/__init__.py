"""The response cache: answers kept for requests asked again, exactly or nearly (docs/cache.md).

`entries` holds what a store keeps and the store's interface; the stores (in-process, Valkey), the
request's keys, the guard that refuses near-misses that need another answer, and the policy of what
may be cached live beside it. The gateway consults it after routing and before any model is called.
"""
