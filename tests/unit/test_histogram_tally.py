"""A tally of a stream's gaps, flushed at its end, shows on a scrape as observing each gap would."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Histogram, generate_latest

from switchyard.core.metrics import TOKEN_GAP_BUCKETS_S, HistogramTally

# on a bound, between bounds, below the first, above the last, and zero
GAPS = [0.001, 0.0025, 0.003, 0.0001, 7.5, 0.0, 0.05, 0.05, 1.0, 0.26]


def _histogram() -> tuple[CollectorRegistry, Histogram]:
    registry = CollectorRegistry()
    return registry, Histogram("gaps_seconds", "gaps", ("model",), buckets=TOKEN_GAP_BUCKETS_S, registry=registry)


def _samples(registry: CollectorRegistry) -> list[str]:
    """The exposition's sample lines, but the time each child was created."""
    return [line for line in generate_latest(registry).decode().splitlines() if "_created" not in line]


def test_a_flushed_tally_exposes_what_observing_each_value_would():
    observed_registry, observed = _histogram()
    tallied_registry, tallied = _histogram()
    for gap in GAPS:
        observed.labels("m").observe(gap)
    tally = HistogramTally(tallied.labels("m"))
    for gap in GAPS:
        tally.add(gap)
    assert 'gaps_seconds_count{model="m"} 0.0' in _samples(tallied_registry)  # nothing before the flush
    tally.flush()
    assert _samples(tallied_registry) == _samples(observed_registry)


def test_a_tally_flushed_twice_adds_only_what_came_in_between():
    registry, histogram = _histogram()
    tally = HistogramTally(histogram.labels("m"))
    tally.add(0.002)
    tally.flush()
    tally.flush()  # nothing new: nothing added
    tally.add(0.3)
    tally.flush()
    text = generate_latest(registry).decode()
    assert 'gaps_seconds_count{model="m"} 2.0' in text
    assert 'gaps_seconds_bucket{le="0.0025",model="m"} 1.0' in text
    assert 'gaps_seconds_bucket{le="0.5",model="m"} 2.0' in text
