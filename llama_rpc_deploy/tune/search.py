"""The search behind `llama-rpc tune`: which split of the layers over the places is fastest, found by measuring.

A split is the number of layers on each place (compute device), in llama.cpp's order; the layers form contiguous
runs in that order, so moving layers shifts the boundary between two adjacent places and the total never changes.

A measurement is expensive (llama-server restarts, about 10 s) and noisy (a few %), and the machine drifts, so two
splits are only ever compared on samples taken in alternation (A, B, A, B, ...), and a move is kept only when the
bootstrap interval of the ratio of their medians lies above 1. First the corners (every layer on one place) are
compared with the start: each device that computes costs round trips of its own, so the fastest split can be far
from the start. Then a pattern (coordinate) search, not a grid: from the current split, try moving `step` layers
across one boundary and take the first move that wins; when none does, halve the step. The split it ends on is then measured again against the start, on fresh alternating
samples: the search's winning comparisons are its luckiest draws, the confirmation is what the gain is reported on.
"""

from __future__ import annotations

import math
import random
import statistics
from dataclasses import dataclass
from typing import Callable, Iterator, Sequence

Split = tuple[int, ...]


@dataclass
class Measurement:
    split: Split
    value: float  # what measure() returned (tokens/s: higher is better)
    index: int  # 0, 1, 2, ... in the order measure() was called


@dataclass
class TuneResult:
    start: Split
    best: Split  # == start when no significant gain was found
    gain: float  # median(confirmation samples of the candidate) / median(start's); 1.0 when nothing was confirmed
    interval: tuple[float, float]  # the gain's 95% bootstrap interval; (1.0, 1.0) when nothing was confirmed
    significant: bool  # the interval's low end > 1.0 and gain >= 1 + min_gain
    measurements: list[Measurement]  # every call of measure(), in order
    reason: str  # one line: why the search stopped (and, when it was not confirmed, that the candidate was not)


# --- candidates ---


def _minimum(places: int, minimum: Sequence[int] | None) -> Split:
    """The least count of each place: minimum, checked, or 0 everywhere."""
    if minimum is None:
        return (0,) * places
    if len(minimum) != places or any(m < 0 for m in minimum):
        raise ValueError(f"minimum {list(minimum)}: expected {places} counts, none negative")
    return tuple(minimum)


def neighbours(
    split: Split, step: int, fits: Callable[[Split], bool], minimum: Sequence[int] | None = None
) -> list[Split]:
    """Every split that moves `step` layers across one boundary between places whose runs of layers meet: i and j > i
    with no layer on any place between them (adjacent places, or places with only empty ones between: an empty
    place does not part the runs). From i to j or j to i, keeping each count >= minimum[i] (default 0) and for
    which fits(split) is true. Deterministic order (by i, then j, rightwards before leftwards), no duplicates,
    never `split` itself."""
    if step < 1:
        raise ValueError(f"step {step}: expected at least 1 layer")
    low = _minimum(len(split), minimum)
    out = []
    pairs = [(i, j) for i in range(len(split)) for j in range(i + 1, len(split)) if not any(split[i + 1 : j])]
    for i, j in pairs:
        for giver, taker in ((i, j), (j, i)):
            moved = list(split)
            moved[giver] -= step
            moved[taker] += step
            candidate = tuple(moved)
            if all(c >= m for c, m in zip(candidate, low)) and fits(candidate):
                out.append(candidate)
    return out


def _compositions(total: int, low: Split) -> Iterator[Split]:
    """Every tuple of len(low) counts, each >= its low, that sums to total, in lexicographic order."""
    if len(low) == 1:
        if total >= low[0]:
            yield (total,)
        return
    for first in range(low[0], total - sum(low[1:]) + 1):
        for rest in _compositions(total - first, low[1:]):
            yield (first, *rest)


def all_splits(
    total: int, places: int, fits: Callable[[Split], bool], minimum: Sequence[int] | None = None
) -> list[Split]:
    """Every split of `total` layers over `places` places (each >= minimum[i]) that fits, in lexicographic order:
    the exhaustive sweep's candidates."""
    if places < 1:
        raise ValueError(f"places {places}: expected at least 1")
    return [s for s in _compositions(total, _minimum(places, minimum)) if fits(s)]


def corners(split: Split, fits: Callable[[Split], bool], minimum: Sequence[int] | None = None) -> list[Split]:
    """Every split with all the layers on one place (each other place at its minimum) that fits and is not split
    itself, place by place: far from a start, where steps of a few layers do not go. (On the lab, every layer on one
    device beat the deployed 3, 3, 2 by 1.29x: each device that computes costs its own RPC round trips.)"""
    low = _minimum(len(split), minimum)
    out = []
    for i in range(len(split)):
        corner = tuple(sum(split) - (sum(low) - low[i]) if k == i else low[k] for k in range(len(split)))
        if corner != split and corner[i] >= low[i] and corner not in out and fits(corner):
            out.append(corner)
    return out


# --- statistics ---


def _percentile(ordered: list[float], q: float) -> float:
    """The q-quantile of ordered (sorted) values, interpolated linearly between neighbouring ranks."""
    pos = q * (len(ordered) - 1)
    below = math.floor(pos)
    above = min(below + 1, len(ordered) - 1)
    return ordered[below] + (ordered[above] - ordered[below]) * (pos - below)


def ratio_interval(
    base: list[float], other: list[float], draws: int = 4000, seed: int = 1
) -> tuple[float, float, float]:
    """(median(other) / median(base), low, high): the ratio and its 95% bootstrap interval (each list resampled
    independently with random.Random(seed): the same data always give the same interval). Medians, not means:
    one measurement disturbed by something else on the machine moves a median of a few samples far less."""
    if not base or not other:
        raise ValueError("ratio_interval: expected at least one sample on each side")
    if min(base) <= 0:
        raise ValueError(f"ratio_interval: base samples {base}: expected all > 0 (the ratio divides by them)")
    if draws < 1:
        raise ValueError(f"draws {draws}: expected at least 1")
    rng = random.Random(seed)
    ratio = statistics.median(other) / statistics.median(base)
    ratios = sorted(
        statistics.median(rng.choices(other, k=len(other))) / statistics.median(rng.choices(base, k=len(base)))
        for _ in range(draws)
    )
    # The sample ratio sits well inside the bootstrap distribution; with very few draws a percentile could still
    # land past it, and an interval that does not contain its own estimate would read as nonsense.
    return ratio, min(_percentile(ratios, 0.025), ratio), max(_percentile(ratios, 0.975), ratio)


def _beyond_noise(low: float, ratio: float, min_gain: float) -> bool:
    """A gain worth a change: the whole interval above 1 and the ratio itself at least 1 + min_gain."""
    return low > 1.0 and ratio >= 1.0 + min_gain


# --- the search ---


class _Recorder:
    """measure(), each call recorded as a Measurement (the result's list and the budget's count)."""

    def __init__(self, measure: Callable[[Split], float]):
        self.measure = measure
        self.measurements: list[Measurement] = []

    def __call__(self, split: Split) -> float:
        value = self.measure(split)
        self.measurements.append(Measurement(split, value, len(self.measurements)))
        return value


def _alternate(record: _Recorder, first: Split, second: Split, times: int) -> tuple[list[float], list[float]]:
    """`times` samples of each split, taken first, second, first, second, ...: a drift hits both alike."""
    a, b = [], []
    for _ in range(times):
        a.append(record(first))
        b.append(record(second))
    return a, b


def _compare(
    record: _Recorder, current: Split, candidate: Split, repeats: int, candidate_first: bool
) -> tuple[list[float], list[float]]:
    """(current's samples, candidate's), taken in alternation, candidate_first choosing who starts."""
    if candidate_first:
        theirs, ours = _alternate(record, candidate, current, repeats)
    else:
        ours, theirs = _alternate(record, current, candidate, repeats)
    return ours, theirs


def _check(
    start: Split,
    fits: Callable[[Split], bool],
    budget: int,
    repeats: int,
    confirm: int,
    step: int | None,
    minimum: Sequence[int] | None,
) -> None:
    """The arguments search() refuses, before it measures anything."""
    if repeats < 1 or confirm < 1:
        raise ValueError(f"repeats {repeats}, confirm {confirm}: expected at least 1 measurement each")
    need = 2 * confirm + 2 * repeats
    if budget < need:
        raise ValueError(
            f"budget {budget}: expected at least {need} measurements (one comparison, 2 x {repeats}, "
            f"and the confirmation, 2 x {confirm})"
        )
    if step is not None and step < 1:
        raise ValueError(f"step {step}: expected at least 1 layer")
    low = _minimum(len(start), minimum)
    if any(c < m for c, m in zip(start, low)):
        raise ValueError(f"start {list(start)}: below the minimum {list(low)}")
    if not fits(start):
        raise ValueError(f"start {list(start)}: does not fit, so it cannot be measured")


def _wins(
    record: _Recorder,
    current: Split,
    candidate: Split,
    repeats: int,
    min_gain: float,
    log: Callable[[str], None],
    won: str,
) -> bool:
    """One comparison, logged (`won` says what a win means): whether candidate is faster than current beyond the
    noise. The candidate is measured first in every odd comparison: each one, the corners' and the pattern
    search's, takes 2 * repeats measurements, so the count so far says which one this is."""
    candidate_first = len(record.measurements) // (2 * repeats) % 2 == 1
    ours, theirs = _compare(record, current, candidate, repeats, candidate_first=candidate_first)
    ratio, low, high = ratio_interval(ours, theirs)
    faster = _beyond_noise(low, ratio, min_gain)
    log(
        f"{list(candidate)} vs {list(current)}: {ratio:.3f}x ({low:.3f} to {high:.3f}): "
        + (won if faster else "not faster beyond the noise")
    )
    return faster


def _jump(
    start: Split,
    fits: Callable[[Split], bool],
    record: _Recorder,
    *,
    spendable: int,
    repeats: int,
    min_gain: float,
    minimum: Sequence[int] | None,
    log: Callable[[str], None],
) -> Split:
    """Each corner compared with the best so far, in alternation: the split the pattern search starts from (start,
    unless a corner is faster beyond the noise)."""
    current = start
    for corner in corners(start, fits, minimum):
        if len(record.measurements) + 2 * repeats > spendable:
            break
        if _wins(record, current, corner, repeats, min_gain, log, "faster, searching from there"):
            current = corner
    return current


def _descend(
    start: Split,
    fits: Callable[[Split], bool],
    record: _Recorder,
    *,
    spendable: int,
    repeats: int,
    min_gain: float,
    step: int,
    minimum: Sequence[int] | None,
    log: Callable[[str], None],
) -> tuple[Split, str]:
    """The pattern search: (the split it ends on, why it stopped), using at most `spendable` measurements.

    Every move was a win, so each earlier current is slower than the present one: those are skipped as
    candidates (the one just left is the one compared against this current; older ones cannot be better and
    would only let the noise walk the search in a circle)."""
    current, visited = start, {start}
    while step > 0:
        moved = False
        for candidate in neighbours(current, step, fits, minimum):
            if candidate in visited:
                continue
            if len(record.measurements) + 2 * repeats > spendable:
                return current, (
                    f"budget spent: {len(record.measurements)} measurements searched, "
                    f"too few left for another comparison"
                )
            moved = _wins(record, current, candidate, repeats, min_gain, log, "faster, moving there")
            if moved:
                current = candidate
                visited.add(current)
                break
        if not moved:
            log(f"no move of {step} layer(s) from {list(current)} is faster: step {step // 2}")
            step //= 2
    return current, f"step reached 0: no move of one layer from {list(current)} is faster beyond the noise"


def _confirmed(
    start: Split,
    candidate: Split,
    record: _Recorder,
    *,
    confirm: int,
    min_gain: float,
    reason: str,
    log: Callable[[str], None],
) -> TuneResult:
    """The result: candidate measured against start in alternation, kept only when the gain is beyond the noise."""
    if candidate == start:
        log(f"no split beat the start {list(start)}: nothing to confirm")
        return TuneResult(start, start, 1.0, (1.0, 1.0), False, record.measurements, reason)
    log(f"confirming {list(candidate)} against the start {list(start)}: {confirm} measurements each, alternating")
    base, other = _alternate(record, start, candidate, confirm)
    gain, low, high = ratio_interval(base, other)
    significant = _beyond_noise(low, gain, min_gain)
    log(
        f"{list(candidate)} vs the start {list(start)}: {gain:.3f}x ({low:.3f} to {high:.3f}): "
        + ("confirmed" if significant else "within the noise, keeping the start")
    )
    if not significant:
        reason += f"; {list(candidate)} not confirmed ({gain:.3f}x, within the noise)"
    return TuneResult(
        start, candidate if significant else start, gain, (low, high), significant, record.measurements, reason
    )


def search(
    start: Split,
    fits: Callable[[Split], bool],
    measure: Callable[[Split], float],
    *,
    budget: int,
    repeats: int = 3,
    confirm: int = 5,
    min_gain: float = 0.01,
    step: int | None = None,
    minimum: Sequence[int] | None = None,
    jump: bool = True,
    log: Callable[[str], None] = lambda line: None,
) -> TuneResult:
    """The fastest split near start, by a pattern search of alternating comparisons, then confirmed against start.
    With jump, the corners (every layer on one place) are compared first, and the search starts from the fastest
    of them when it beats start beyond the noise.

    At most `budget` calls of measure(), 2 * confirm of them kept from the start for the confirmation; measure()
    is only called on splits that fit. A KeyboardInterrupt from measure() goes straight through (the caller puts
    the deployed split back)."""
    start = tuple(start)
    _check(start, fits, budget, repeats, confirm, step, minimum)
    record = _Recorder(measure)
    spendable = budget - 2 * confirm
    origin = (
        _jump(start, fits, record, spendable=spendable, repeats=repeats, min_gain=min_gain, minimum=minimum, log=log)
        if jump
        else start
    )
    best, reason = _descend(
        origin,
        fits,
        record,
        spendable=spendable,
        repeats=repeats,
        min_gain=min_gain,
        step=step or max(1, sum(start) // 4),
        minimum=minimum,
        log=log,
    )
    log(f"search stopped: {reason}")
    return _confirmed(start, best, record, confirm=confirm, min_gain=min_gain, reason=reason, log=log)


def choose(
    start: Split,
    candidates: Sequence[Split],
    measure: Callable[[Split], float],
    *,
    repeats: int = 3,
    confirm: int = 5,
    min_gain: float = 0.01,
    log: Callable[[str], None] = lambda line: None,
) -> TuneResult:
    """The fastest of a few settings that are not a split (tune's speculation stage: off, or a draft-token bound),
    by the same alternating comparisons: each candidate in turn against the best so far, then the best confirmed
    against start on fresh samples. At most 2 * repeats * len(candidates) + 2 * confirm calls of measure()."""
    start = tuple(start)
    if repeats < 1 or confirm < 1:
        raise ValueError(f"repeats {repeats}, confirm {confirm}: expected at least 1 measurement each")
    record = _Recorder(measure)
    current = start
    for candidate in candidates:
        if tuple(candidate) != current and _wins(record, current, tuple(candidate), repeats, min_gain, log, "faster"):
            current = tuple(candidate)
    reason = f"{len(candidates)} candidates compared in turn with the best so far"
    return _confirmed(start, current, record, confirm=confirm, min_gain=min_gain, reason=reason, log=log)
