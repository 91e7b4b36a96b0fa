"""tune's search (tune.search): the candidates (neighbours, all_splits), the bootstrap ratio and the pattern search,
against a synthetic machine: tokens/s = 1 / (sum(layers_i * cost_i) + hop), with Gaussian noise of a few % and,
where said, a slow drift over the calls. The seeds are fixed, so every run sees the same noise."""

import functools
import math
import random
import statistics
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from llama_rpc_deploy.tune.search import all_splits, choose, corners, neighbours, ratio_interval, search

from .helpers import ci_examples

ASYMMETRIC = (1.0, 2.0, 1.0)  # the middle place is twice as slow per layer: the best empties it
SYMMETRIC = (1.0, 1.0, 1.0)
START = (3, 3, 3)
SEEDS = range(6)
pytestmark = pytest.mark.xdist_group("tune search")  # one worker, so each interval is bootstrapped once (below)


def anything(split):
    return True


@pytest.fixture(scope="module", autouse=True)
def each_interval_bootstrapped_once():
    """search() bootstraps an interval for every comparison (ratio_interval: 4000 resamplings, nearly all of a search's
    time). The machines here are seeded, so the searches of one seed, budget after budget and test after test, make
    the same comparisons on the same measurements: 43% of this module's intervals are ones computed before. An
    interval is a function of its arguments alone (it has its own seed), so each is computed once and given again;
    the search runs as it is. The tests of ratio_interval below call it directly."""
    module = sys.modules[search.__module__]
    bootstrap = module.ratio_interval
    computed = functools.cache(
        lambda base, other, args, kwargs: bootstrap(list(base), list(other), *args, **dict(kwargs))
    )

    def once(base, other, *args, **kwargs):
        return computed(tuple(base), tuple(other), args, tuple(sorted(kwargs.items())))

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(module, "ratio_interval", once)
        yield


def speed(split, costs, hop=1.0):
    """The noise-free tokens/s of split."""
    return 1.0 / (sum(n * c for n, c in zip(split, costs)) + hop)


class Machine:
    """measure() for the synthetic model: multiplicative noise (random.Random(seed)) and a linear drift per call;
    every call recorded, and fits() checked on each."""

    def __init__(self, costs, seed, noise=0.025, drift=0.0, fits=anything):
        self.costs, self.noise, self.drift, self.fits = costs, noise, drift, fits
        self.rng = random.Random(seed)
        self.calls = []

    def __call__(self, split):
        assert self.fits(split), f"measured {split}, which does not fit"
        self.calls.append(split)
        return speed(split, self.costs) * (1 + self.drift * len(self.calls)) * self.rng.gauss(1.0, self.noise)


def best_of(total, places, costs, fits=anything):
    """The exhaustive (noise-free) best speed over every split that fits."""
    return max(speed(s, costs) for s in all_splits(total, places, fits))


# --- the search finds the gain, and no gain where there is none ---


@pytest.mark.parametrize("seed", SEEDS)
def test_asymmetric_costs_find_the_exhaustive_best_in_a_third_of_the_sweep(seed):
    sweep_calls = len(all_splits(9, 3, anything)) * 3  # every split, 3 repeats
    machine = Machine(ASYMMETRIC, seed)
    r = search(START, anything, machine, budget=sweep_calls // 3)
    assert speed(r.best, ASYMMETRIC) >= 0.98 * best_of(9, 3, ASYMMETRIC)
    assert len(machine.calls) <= sweep_calls // 3
    assert r.significant and r.gain > 1.10
    assert r.interval[0] > 1.0 and r.interval[0] <= r.gain <= r.interval[1]


@pytest.mark.parametrize("seed", SEEDS)
def test_symmetric_costs_with_noise_and_drift_change_nothing(seed):
    """Every split is as fast as any other: whatever the noise and a 0.2 %-a-call drift suggest, the start stays."""
    r = search(START, anything, Machine(SYMMETRIC, seed, noise=0.03, drift=0.002), budget=40)
    assert not r.significant
    assert r.best == START


def test_a_gain_within_min_gain_is_not_taken():
    """Noise-free and 0.5 % faster one layer over: real, but below min_gain (1 %), so no move."""
    costs = (1.0, 1.02, 1.0)
    r = search((1, 1, 1), anything, Machine(costs, 0, noise=0.0), budget=40, step=1)
    assert r.best == (1, 1, 1) and not r.significant and r.measurements


# --- what it measures ---


def test_only_splits_that_fit_are_measured():
    """Place 0 may hold at most 4 layers, though the costs pull layers there: the best that fits is found and
    nothing else is ever measured (Machine asserts it)."""
    fits = lambda split: split[0] <= 4  # noqa: E731
    for seed in SEEDS:
        r = search(START, fits, Machine(ASYMMETRIC, seed, fits=fits), budget=100)
        assert fits(r.best) and speed(r.best, ASYMMETRIC) >= 0.98 * best_of(9, 3, ASYMMETRIC, fits)


def test_a_start_that_does_not_fit_is_refused_before_any_measurement():
    machine = Machine(ASYMMETRIC, 0)
    with pytest.raises(ValueError, match="does not fit"):
        search((5, 2, 2), lambda split: split[0] <= 4, machine, budget=40)
    assert machine.calls == []


def test_the_minimum_is_kept():
    machine = Machine(ASYMMETRIC, 0)
    search(START, anything, machine, budget=100, minimum=(1, 2, 1))
    assert all(s[0] >= 1 and s[1] >= 2 and s[2] >= 1 for s in machine.calls)


@pytest.mark.parametrize("budget", [16, 17, 21, 22, 28, 40, 55, 200])
def test_the_budget_is_never_exceeded(budget):
    for seed in range(3):
        machine = Machine(ASYMMETRIC, seed)
        r = search(START, anything, machine, budget=budget)
        assert len(machine.calls) == len(r.measurements) <= budget
        assert [m.index for m in r.measurements] == list(range(len(r.measurements)))
        assert [m.split for m in r.measurements] == machine.calls


def test_a_small_budget_stops_for_the_budget_and_a_large_one_for_the_step():
    """16 = one comparison and the confirmation: the first move (2 layers from place 0 to the cheaper place 1)
    wins and the budget ends the search, the win still confirmed; 200 lets the step run down to 0."""
    small = search(START, anything, Machine((2.0, 1.0, 1.0), 0), budget=16, step=2, jump=False)
    assert small.reason.startswith("budget spent") and len(small.measurements) == 16 and small.significant
    large = search(START, anything, Machine(ASYMMETRIC, 0), budget=200)
    assert large.reason.startswith("step reached 0") and len(large.measurements) < 200


def test_a_budget_too_small_for_a_comparison_and_the_confirmation_is_refused():
    machine = Machine(ASYMMETRIC, 0)
    with pytest.raises(ValueError, match="budget 15"):
        search(START, anything, machine, budget=15)  # 2 * 5 + 2 * 3 = 16
    with pytest.raises(ValueError, match="budget 9"):
        search(START, anything, machine, budget=9, repeats=2, confirm=3)
    assert machine.calls == []


# --- alternation ---


def alternates(block):
    """block is a, b, a, b, ... with a != b."""
    a, b = block[0], block[1]
    return a != b and block == [a, b] * (len(block) // 2)


@pytest.mark.parametrize("repeats, confirm", [(3, 5), (2, 4), (4, 3)])
def test_every_comparison_alternates_and_the_first_side_swaps(repeats, confirm):
    for seed in SEEDS:
        r = search(START, anything, Machine(ASYMMETRIC, seed), budget=120, repeats=repeats, confirm=confirm)
        assert r.significant  # so the last 2 * confirm measurements are the confirmation
        splits = [m.split for m in r.measurements]
        searched, confirmation = splits[: -2 * confirm], splits[-2 * confirm :]
        assert alternates(confirmation) and confirmation[:2] == [r.start, r.best]
        assert len(searched) % (2 * repeats) == 0
        blocks = [searched[i : i + 2 * repeats] for i in range(0, len(searched), 2 * repeats)]
        assert len(blocks) >= 3 and all(alternates(b) for b in blocks)
        # The current split of each comparison follows from the one before: it stayed, or the candidate won.
        current, candidate = r.start, None
        for k, block in enumerate(blocks):
            if current not in block:
                current = candidate
            candidate = next(s for s in block if s != current)
            assert current in block
            assert (block[0] == current) == (k % 2 == 0), f"comparison {k}: {block}"


def test_the_corners_are_tried_first_where_single_moves_find_nothing():
    """Each place that computes costs a fixed overhead (the RPC round trips of a device), every layer the same: every
    layer on one place is 2x faster than (3, 3, 3). The corners are compared first, and the search ends on one,
    confirmed."""

    def measure(seed):
        rng = random.Random(seed)
        return lambda split: 1.0 / (sum(split) + 9.0 * sum(1 for c in split if c)) * (1 + rng.gauss(0, 0.02))

    for seed in SEEDS:
        jumped = search(START, anything, measure(seed), budget=60)
        assert jumped.best in corners(START, anything) and jumped.significant and jumped.gain > 1.8, jumped
        first = [m.split for m in jumped.measurements[:6]]  # the first comparison: start against a corner
        assert set(first) == {START, (9, 0, 0)}
    assert corners((3, 3, 3), anything) == [(9, 0, 0), (0, 9, 0), (0, 0, 9)]
    # each other place at its minimum; one that does not fit is left out
    assert corners((9, 0, 0), lambda s: s[2] < 8, minimum=(0, 1, 0)) == [(8, 1, 0), (0, 9, 0)]
    assert corners((9, 0, 0), anything) == [(0, 9, 0), (0, 0, 9)]  # not the start itself


# --- a KeyboardInterrupt goes through ---


@pytest.mark.parametrize("at", [1, 5, 40])
def test_a_keyboard_interrupt_from_measure_propagates(at):
    """At the first call, mid-comparison and in the confirmation (here calls 37 to 46)."""
    machine = Machine(ASYMMETRIC, 0)

    def measure(split):
        if len(machine.calls) + 1 == at:
            raise KeyboardInterrupt
        return machine(split)

    with pytest.raises(KeyboardInterrupt):
        search(START, anything, measure, budget=100)
    assert len(machine.calls) == at - 1


def test_the_log_has_one_line_per_comparison_and_decision():
    lines = []
    r = search(START, anything, Machine(ASYMMETRIC, 0), budget=100, log=lines.append)
    comparisons = (len(r.measurements) - 10) // 6
    assert all("\n" not in line for line in lines)
    assert sum(" vs " in line for line in lines) == comparisons + 1  # and the confirmation's
    assert any("confirm" in line for line in lines) and any(r.reason in line for line in lines)


# --- neighbours and all_splits: properties ---

counts = st.lists(st.integers(0, 9), min_size=1, max_size=5)


@st.composite
def split_cases(draw):
    """A split, a step, a minimum (sometimes above the split's own counts) and a fits that rejects some splits."""
    split = tuple(draw(counts))
    minimum = draw(st.one_of(st.none(), st.lists(st.integers(0, 3), min_size=len(split), max_size=len(split))))
    salt = draw(st.integers(0, 6))
    return split, draw(st.integers(1, 4)), minimum, lambda s: (sum(i * c for i, c in enumerate(s)) + salt) % 7 != 0


def test_an_empty_place_does_not_part_two_runs():
    """(6, 0, 2): the CPU's layers and RPC1's meet, RPC0 holds none: moving one from one to the other is one step."""
    assert neighbours((6, 0, 2), 1, anything) == [(5, 1, 2), (5, 0, 3), (7, 0, 1), (6, 1, 1)]
    assert (5, 0, 3) not in neighbours((6, 1, 1), 1, anything)  # RPC0's layer parts them


# The check below enumerates every split of the total (up to C(49, 4) = 211876 for 5 places of 9 layers), so a few
# large examples make the cost: the ci profile's 100 took 3 s here, more than every other property of this file
# together; 50 take 0.2 to 0.8 s (which ones the derandomized profile draws follows the test's source).
@ci_examples(50)
@given(split_cases())
def test_neighbours_move_step_layers_across_one_boundary(case):
    split, step, minimum, fits = case
    low = minimum or [0] * len(split)
    found = neighbours(split, step, fits, minimum)
    assert len(set(found)) == len(found) and split not in found
    assert found == neighbours(split, step, fits, minimum)  # deterministic
    for n in found:
        assert sum(n) == sum(split) and fits(n) and all(c >= m for c, m in zip(n, low))
        changed = [i for i in range(len(split)) if n[i] != split[i]]
        # two places whose runs of layers meet: adjacent, or only empty places between them
        assert len(changed) == 2 and not any(split[changed[0] + 1 : changed[1]])
        assert sorted(n[i] - split[i] for i in changed) == [-step, step]
    # and every such split is there: all_splits, filtered by the difference, is an independent list of them
    expected = {
        s
        for s in all_splits(sum(split), len(split), fits, minimum)
        if sorted(a - b for a, b in zip(s, split) if a != b) == [-step, step]
        and not any(
            split[k] for k in range(len(s)) if min(d := [i for i in range(len(s)) if s[i] != split[i]]) < k < max(d)
        )
    }
    assert set(found) == expected


@given(st.integers(0, 12), st.integers(1, 4), st.data())
def test_all_splits_are_every_composition_that_fits_in_order(total, places, data):
    minimum = data.draw(st.lists(st.integers(0, 3), min_size=places, max_size=places))
    salt = data.draw(st.integers(0, 4))
    fits = lambda s: (s[0] * 3 + salt) % 5 != 0  # noqa: E731
    found = all_splits(total, places, fits, minimum)
    assert found == sorted(set(found))  # lexicographic, no duplicates
    for s in found:
        assert len(s) == places and sum(s) == total and fits(s) and all(c >= m for c, m in zip(s, minimum))
    free = total - sum(minimum)
    every = all_splits(total, places, anything, minimum)
    assert len(every) == (math.comb(free + places - 1, places - 1) if free >= 0 else 0)
    assert found == [s for s in every if fits(s)]
    assert len(all_splits(total, places, anything)) == math.comb(total + places - 1, places - 1)


# --- ratio_interval ---

samples = st.lists(st.floats(0.1, 100.0), min_size=1, max_size=8)


@given(samples, samples, st.integers(0, 2**32), st.sampled_from([1, 7, 200]))
def test_ratio_interval_is_deterministic_and_contains_the_ratio(base, other, seed, draws):
    ratio, low, high = ratio_interval(base, other, draws=draws, seed=seed)
    assert ratio == statistics.median(other) / statistics.median(base)
    assert low <= ratio <= high
    assert (ratio, low, high) == ratio_interval(list(base), list(other), draws=draws, seed=seed)


def test_ratio_interval_separates_what_differs_and_not_what_does_not():
    rng = random.Random(3)
    base = [100 * rng.gauss(1, 0.02) for _ in range(5)]
    faster = [110 * rng.gauss(1, 0.02) for _ in range(5)]
    same = [100 * rng.gauss(1, 0.02) for _ in range(5)]
    assert ratio_interval(base, faster)[1] > 1.0
    ratio, low, high = ratio_interval(base, same)
    assert low < 1.0 < high

    many = [100 * rng.gauss(1, 0.02) for _ in range(30)]  # enough distinct medians for the seed to show
    assert ratio_interval(base, many, seed=2) != ratio_interval(base, many, seed=1)
    assert ratio_interval(base, many, seed=2) == ratio_interval(base, many, seed=2)


def test_ratio_interval_refuses_what_has_no_ratio():
    with pytest.raises(ValueError):
        ratio_interval([], [1.0])
    with pytest.raises(ValueError):
        ratio_interval([0.0, 1.0], [1.0])


# --- choose: a few settings that are not a split (the speculation stage) ---


def noisy(speeds: dict, seed: int, noise: float = 0.025):
    """measure() for choose: tokens/s of each key, with multiplicative noise; every call recorded."""
    rng, calls = random.Random(seed), []

    def measure(key):
        calls.append(key)
        return speeds[key] * rng.gauss(1.0, noise)

    measure.calls = calls
    return measure


@pytest.mark.parametrize("seed", SEEDS)
def test_choose_turns_speculation_off_where_it_loses(seed):
    """Deployed max 3 (key (3,)) is 0.8x off (0,): off wins, is confirmed, and every comparison alternates."""
    speeds = {(3,): 80.0, (0,): 100.0, (1,): 90.0, (6,): 70.0}
    measure = noisy(speeds, seed)
    r = choose((3,), [(0,), (1,), (6,)], measure, repeats=3, confirm=4)
    assert r.best == (0,) and r.significant and r.interval[0] > 1.0
    assert len(measure.calls) == 3 * 2 * 3 + 2 * 4
    assert all(a != b for a, b in zip(measure.calls[::2], measure.calls[1::2]))


@pytest.mark.parametrize("seed", SEEDS)
def test_choose_keeps_what_is_deployed_when_nothing_beats_it(seed):
    speeds = {(3,): 150.0, (0,): 100.0, (1,): 130.0, (6,): 149.0}
    r = choose((3,), [(0,), (1,), (6,)], noisy(speeds, seed), repeats=3, confirm=4)
    assert r.best == (3,) and not r.significant


def test_choose_finds_a_better_bound():
    """Doubling the maximum pays 1.2x: (6,) is taken over the deployed (3,), off and (1,) lose."""
    speeds = {(3,): 150.0, (0,): 100.0, (1,): 130.0, (6,): 180.0}
    r = choose((3,), [(0,), (1,), (6,)], noisy(speeds, 1), repeats=3, confirm=4)
    assert r.best == (6,) and r.significant and 1.1 < r.gain < 1.3


def test_choose_refuses_no_measurements():
    with pytest.raises(ValueError, match="at least 1"):
        choose((3,), [(0,)], noisy({(3,): 1.0, (0,): 1.0}, 0), repeats=0)
