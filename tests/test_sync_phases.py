"""benchmarks/sync_phases.py: the phase timer of ``benchmarks/k8s.py --phases``."""

from __future__ import annotations

import inspect

from benchmarks.sync_phases import SYNC_PHASES, PhaseTimer, growth
from sources import native


class Worker:
    """A toy with a phase that recurses and one that raises."""

    def work(self, depth: int) -> int:
        total = sum(range(20_000))
        return total + (self.work(depth - 1) if depth else 0)

    def fail(self) -> None:
        raise ValueError("no")


_TOY = ((__name__, "Worker", "work", "work"), (__name__, "Worker", "fail", "fail"))


def test_times_calls_once_per_outermost_call_and_restores() -> None:
    original = Worker.__dict__["work"]
    w = Worker()
    with PhaseTimer(_TOY) as timer:
        assert Worker.__dict__["work"] is not original
        assert w.work(2) == 3 * sum(range(20_000))
        w.work(0)
        try:
            w.fail()
        except ValueError:
            pass
    assert Worker.__dict__["work"] is original
    assert timer.calls == {"work": 2, "fail": 1}
    assert timer.cpu_s["work"] > 0
    figures = timer.figures(2)
    assert figures["initial_sync_phase_calls"] == {"work": 2, "fail": 1}
    assert figures["initial_sync_phase_us_per_service"]["work"] == round(
        timer.cpu_s["work"] / 2 * 1e6, 1
    )


def test_a_phase_that_is_missing_leaves_nothing_wrapped() -> None:
    original = Worker.__dict__["work"]
    try:
        with PhaseTimer(((__name__, "Worker", "work", "work"),
                         (__name__, "Worker", "gone", "gone"))):
            raise AssertionError("entered")
    except KeyError:
        pass
    assert Worker.__dict__["work"] is original


def test_every_sync_phase_is_a_plain_method_that_exists() -> None:
    """A rename in the agent's code fails here, not in a benchmark run."""
    with PhaseTimer() as timer:
        assert set(timer.cpu_s) == {phase for *_, phase in SYNC_PHASES}
    for module, cls_name, method, _ in SYNC_PHASES:
        cls = getattr(__import__(module, fromlist=[cls_name]), cls_name)
        fn = cls.__dict__[method]
        # A Python function; in the compiled converter (sources/native.py) a method
        # compiled by mypyc, which the timer wraps alike.
        compiled = module == native.MODULE and native.converter() == "compiled"
        assert compiled or inspect.isfunction(fn), method
        assert callable(fn) and not inspect.iscoroutinefunction(fn), method


def test_growth_is_per_service_cpu_at_the_largest_over_the_smallest() -> None:
    sizes = [
        {"initial_sync_cpu_us_per_service": 400.0,
         "initial_sync_phase_us_per_service": {"a": 100.0, "b": 50.0, "idle": 0.0}},
        {"initial_sync_cpu_us_per_service": 480.0,
         "initial_sync_phase_us_per_service": {"a": 150.0, "b": 50.0, "idle": 1.0}},
    ]
    assert growth(sizes) == ({"a": 1.5, "b": 1.0}, 1.2)


def test_the_converters_phases_are_timed_compiled_or_not() -> None:
    """`K8sConverter` stays a Python class when its module is compiled: the timer wraps
    its methods, and its own dispatch (`upsert`) calls the wrapped ones."""
    from sources.k8s_convert import K8sConverter
    from statedb import DB
    from tables.lb_writer import LBWriter
    from tests.sources.test_k8s_convert import eps, service

    writer = LBWriter.create(DB())
    conv = K8sConverter(writer)
    with PhaseTimer() as timer, writer.write_txn() as txn:
        conv.upsert(txn, service())
        conv.upsert(txn, eps())
    assert timer.calls["apply_service"] == 1
    assert timer.calls["apply_endpoint_slice"] == 1
