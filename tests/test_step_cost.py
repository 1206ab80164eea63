"""The step-cost model behind the batching claims: it recovers known costs and refuses bad input."""
from types import SimpleNamespace

import pytest

from minillm.bench.step_cost import FastestTime, Speedup, StepCost, fastest_steps


def steps(shapes, cost=None, durations=None):
    durations = durations or [cost.step_s(p, d) for p, d in shapes]
    return [SimpleNamespace(num_prefill_tokens=p, num_decode_tokens=d, duration_s=t) for (p, d), t in zip(shapes, durations)]


def test_fit_recovers_known_costs_and_predicts_another_schedule():
    truth = StepCost(0.09, 0.004, 0.007)
    fitted = StepCost.fit(steps([(594, 0)] + [(0, n) for n in (16, 16, 12, 9, 4, 2)], truth))
    assert fitted.fixed_s == pytest.approx(0.09) and fitted.per_decode_row_s == pytest.approx(0.007)
    assert fitted.per_prompt_token_s == pytest.approx(0.004)
    other = steps([(42, 0)] * 3 + [(0, 6)] * 20, truth)
    assert fitted.predict(other) == pytest.approx(sum(s.duration_s for s in other))


def test_fit_needs_three_shapes():
    with pytest.raises(ValueError, match="three different shapes"):
        StepCost.fit(steps([(0, 4)] * 5 + [(8, 0)], StepCost(0.1, 0.0, 0.01)))


def test_fastest_steps_takes_each_steps_minimum_and_needs_one_schedule():
    shapes = [(20, 0), (0, 2), (0, 2)]
    a, b = steps(shapes, durations=[18.0, 0.1, 0.3]), steps(shapes, durations=[0.5, 0.2, 0.2])
    assert fastest_steps([a, b]) == [0.5, 0.1, 0.2]
    with pytest.raises(ValueError, match="different schedules"):
        fastest_steps([a, steps([(20, 0), (0, 2)], durations=[1.0, 1.0])])


def test_fastest_time_leaves_each_repeat_out_and_speedup_divides_them():
    shapes = [(0, 2)] * 3
    quiet, busy_first, busy_last = ([0.1, 0.1, 0.1], [0.9, 0.1, 0.1], [0.1, 0.1, 0.9])
    plain = FastestTime.of([steps(shapes, durations=d) for d in (quiet, busy_first, busy_last)])
    assert plain.total_s == pytest.approx(0.3)
    # leaving the quiet repeat out leaves both busy steps' other repeat: still each step's quiet time
    assert plain.leave_one_out_s == pytest.approx((0.3, 0.3, 0.3))
    lone_quiet = FastestTime.of([steps(shapes, durations=d) for d in (quiet, [0.9] * 3, [0.9] * 3)])
    assert lone_quiet.total_s == pytest.approx(0.3) and lone_quiet.leave_one_out_s == pytest.approx((2.7, 0.3, 0.3))
    spec = FastestTime.of([steps(shapes, durations=[0.2] * 3)] * 3)
    ratio = Speedup.of(plain, spec)
    assert ratio.value == pytest.approx(0.5) and ratio.sensitivity == pytest.approx(0.0)
    assert Speedup.of(lone_quiet, spec).sensitivity == pytest.approx(4.0)  # 2.7/0.6 - 0.3/0.6
    with pytest.raises(ValueError, match="at least 3"):
        FastestTime.of([steps(shapes, durations=quiet)] * 2)
    with pytest.raises(ValueError, match="same repeats"):
        Speedup.of(plain, FastestTime.of([steps(shapes, durations=quiet)] * 4))
