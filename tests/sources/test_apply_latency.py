"""The delivery-to-commit histogram: fixed buckets, quantiles as bucket upper bounds,
differences of two readings."""

from __future__ import annotations

from sources.apply_latency import LatencyHistogram, bucket_of, quantile_of, upper_ms


def test_buckets_are_fine_below_100_ms_and_coarse_above() -> None:
    assert upper_ms(bucket_of(0.2)) == 0.5
    assert upper_ms(bucket_of(7.3)) == 7.5
    assert upper_ms(bucket_of(99.9)) == 100.0
    assert upper_ms(bucket_of(100.0)) == 110.0
    assert upper_ms(bucket_of(5_000.0)) == 5_010.0
    assert upper_ms(bucket_of(60_000.0)) == 10_000.0  # the open bucket


def test_quantiles_weigh_each_change() -> None:
    h = LatencyHistogram()
    h.add(1.2, n=98)
    h.add(30.0, n=2)
    assert h.total == 100 and h.max_ms == 30.0
    assert h.quantile(0.5) == 1.5
    assert h.quantile(0.99) == 30.5
    doc = h.to_json()
    assert doc["p99_ms"] == 30.5 and sum(doc["buckets"].values()) == 100


def test_the_difference_of_two_readings_is_what_came_between() -> None:
    h = LatencyHistogram()
    h.add(500.0, n=10)
    before = list(h.counts)
    h.add(2.0, n=10)
    between = [b - a for a, b in zip(before, h.counts, strict=True)]
    assert quantile_of(between, 0.99) == 2.5
    assert quantile_of([0] * 5, 0.5) == 0.0
