from switchyard.core.metrics import Metrics


def test_repeated_label_values_count_on_one_series_and_new_ones_on_their_own():
    metrics = Metrics()
    for status in (200, 200, 429):
        metrics.request_done(model="m", backend="openai#0", tier="t", route="explicit", status=status, duration_s=0.1)
    for team in (None, None, "a"):
        metrics.attempt_done(
            team=team, model="m", prompt=3, completion=5, cost_usd=0.5, ttft_s=0.2, cache_read=2, cache_write=1
        )
    sample = metrics.registry.get_sample_value
    labels = {"model": "m", "backend": "openai#0", "tier": "t", "route": "explicit"}
    assert sample("switchyard_requests_total", {**labels, "status": "200"}) == 2
    assert sample("switchyard_requests_total", {**labels, "status": "429"}) == 1
    assert sample("switchyard_request_duration_seconds_count", {"model": "m"}) == 3
    assert sample("switchyard_tokens_total", {"team": "", "model": "m", "kind": "completion"}) == 10
    assert sample("switchyard_tokens_total", {"team": "a", "model": "m", "kind": "prompt"}) == 3
    assert sample("switchyard_cost_usd_total", {"team": "", "model": "m"}) == 1.0
    assert sample("switchyard_cache_tokens_total", {"team": "", "model": "m", "kind": "read"}) == 4
    assert sample("switchyard_cache_tokens_total", {"team": "a", "model": "m", "kind": "write"}) == 1
    assert sample("switchyard_time_to_first_token_seconds_count", {"model": "m"}) == 3
