from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from switchyard.backends.balancer import LeastOutstanding


@dataclass(eq=False)
class R:
    name: str
    num_outstanding: int = 0
    is_ready: bool = True


def test_least_outstanding_wins():
    replicas = [R("a", 3), R("b", 1), R("c", 2)]
    assert LeastOutstanding().pick(replicas).name == "b"


def test_ties_rotate():
    replicas = [R("a"), R("b"), R("c")]
    balancer = LeastOutstanding()
    assert Counter(balancer.pick(replicas).name for _ in range(30)) == {"a": 10, "b": 10, "c": 10}


def test_unready_replicas_are_skipped_unless_all_are_unready():
    replicas = [R("a", 0, is_ready=False), R("b", 5)]
    balancer = LeastOutstanding()
    assert balancer.pick(replicas).name == "b"
    replicas[1].is_ready = False
    assert balancer.pick(replicas).name == "a"


def test_in_flight_load_spreads_evenly():
    replicas = [R("a"), R("b")]
    balancer = LeastOutstanding()
    for _ in range(10):
        balancer.pick(replicas).num_outstanding += 1
    assert [r.num_outstanding for r in replicas] == [5, 5]
