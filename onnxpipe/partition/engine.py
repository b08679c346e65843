"""The exact engine: layered probe, exact bottleneck search, fewest-bytes tie-break pass.

This is the fast path behind :func:`~onnxpipe.partition.solve` and
:func:`~onnxpipe.partition.solve_heterogeneous`; the package docstring gives the argument for why each
step is exact.  It reads the problem only through :class:`_Model`'s canonical formulas, so its answers
can be compared bit for bit with the reference DP's.

Its array searches (:func:`_monotone_search`, :func:`_range_chmin`, :func:`_best_cover`) know nothing of
stages or costs: one finds the latest end a monotone predicate allows, repairing ``searchsorted``'s
floating-point guesses; the others take minima over many intervals at once, exact whatever their inputs'
quality, so that they can be checked on plain arrays.

The latency objective (:func:`latency_bounds`) is the split whose stages and hops add up to the least
time, exactly.  One request at a time (single-sequence decoding, a lone query) waits for every stage and
every hop in turn: its time is ``sum_s (compute_s + transfer_s)``, whether or not the links overlap compute
for a stream.  Written over the cuts, with ``C_s`` stage ``s``'s prefix sums over its speed, that sum is
``C_{K-1}[n] - C_0[0] + sum_{s >= 1} w_s(b_s)`` where ``w_s(p) = C_{s-1}[p] - C_s[p] + transfer_s(p)``:
on identical devices the compute telescopes away and only the hops are left; on different devices each
cut also pays (or earns) the change of speed of the items it moves.  So the best split is a shortest path
over cut positions, layer by layer: stage ``s`` may start at ``a`` and end anywhere in ``(a, r_s(a)]``
(its memory grows with its end: :class:`_Engine`'s memory ends), which makes
each layer a minimum over the intervals covering each position (:meth:`_Engine.shortest`), ``O(n log n)``.
Float addition is monotone, so adding ``w`` after the minimum loses no optimum.  Ties (free links on
identical devices: every split costs the same) go to the fewest bytes crossing the cuts, then the
earliest positions.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from onnxpipe.partition.costmodel import _Model
from onnxpipe.partition.numeric import BoolArr, FloatArr, IntArr
from onnxpipe.partition.result import Partition, _balanced, _choose, _memory_error, _partition_of

_PRUNE_MARGIN = 1e-12  # relative slack that makes the work-based pruning immune to rounding
_ENDGAME = 16.0  # try 'anything better than hi?' once [lo, hi] spans <= 16 snap gaps (tuned)
_BIG = np.iinfo(np.intp).max
"""Marks "no value" in :func:`_range_chmin`'s output: larger than every key it is given."""


@dataclass
class _Probe:
    """One probe's verdict; ``next_lo`` is what lets the search snap ``lo`` to a realised cost."""

    feasible: bool
    bounds: tuple[int, ...] | None
    next_lo: float  # if infeasible: no bottleneck below this value is feasible


@dataclass
class _Layer:
    """Starts of one stage: a window of positions ``lo..lo+len(mask)-1``, which of them are reachable, and
    their latest ends ``r`` under the probed bound and the hard cap ``lim`` on any end (memory, items
    left for later stages; a plain int when only the latter applies)."""

    lo: int
    mask: BoolArr
    r: IntArr
    lim: IntArr | int


class _Lazy:
    """An ``int`` array over positions ``0..n-1`` filled on demand over one contiguous computed range."""

    def __init__(self, n: int, compute: Callable[[int, int], IntArr]) -> None:
        self.values = np.empty(max(n, 1), dtype=np.intp)
        self.compute = compute  # (lo, hi) -> values for positions lo..hi
        self.lo, self.hi = 0, -1

    def get(self, lo: int, hi: int) -> IntArr:
        if self.lo > self.hi:
            self.values[lo : hi + 1] = self.compute(lo, hi)
            self.lo, self.hi = lo, hi
        else:
            if lo < self.lo:
                self.values[lo : self.lo] = self.compute(lo, self.lo - 1)
                self.lo = lo
            if hi > self.hi:
                self.values[self.hi + 1 : hi + 1] = self.compute(self.hi + 1, hi)
                self.hi = hi
        return self.values[lo : hi + 1]


class _Engine:
    """Exact probes of one :class:`_Model`.

    Sets of positions are bit masks over a moving window, so a layer costs a handful of contiguous numpy
    operations.  Stages with identical parameters (all but the first in the homogeneous mode) share one
    lazily filled array of latest ends per probe; memory limits are computed once, lazily.
    """

    def __init__(self, model: _Model) -> None:
        self.m = model
        n, k = model.n, model.k
        keys: dict[tuple[float, ...], int] = {}
        mem_keys: dict[tuple[float, ...], int] = {}
        self.group: list[int] = []
        self.mem: list[_Lazy | None] = []
        for s in range(k):
            cap = float(model.mem_cap[s]) if model.mem_cap is not None else math.inf
            fac = float(model.mem_fac[s]) if model.mem_fac is not None and model.receives(s) else 0.0
            row = model.work.of[s]
            mrow = model.mem.of[s] if model.mem is not None else -1
            if not model.receives(s):
                key: tuple[float, ...] = (0.0, float(model.speed[0]), cap, row, mrow)
            else:
                key = (
                    1.0,
                    float(model.speed[s]),
                    float(model.tr_mul[s]),
                    float(model.tr_div[s]),
                    float(model.tr_add[s]),
                    cap,
                    fac,
                    row,
                    mrow,
                )
            self.group.append(keys.setdefault(key, len(keys)))
            mkey = (float(not model.receives(s)), cap, fac, mrow)
            if math.isinf(cap):
                self.mem.append(None)
            elif mkey in mem_keys:
                self.mem.append(self.mem[mem_keys[mkey]])
            else:
                mem_keys[mkey] = s
                self.mem.append(_Lazy(n, functools.partial(self._memory_ends, s)))
        counts = np.bincount(np.array(self.group), minlength=len(keys))
        self.shared = [bool(c > 1) for c in counts]
        self.win_hi = [n - (k - 1 - s) for s in range(k)]  # later stages need one item each
        rests, weights, self.slack = model.relaxation
        self.work_w = [w * (1.0 + _PRUNE_MARGIN) for w in weights]
        negs: dict[int, FloatArr] = {}  # one array when every stage shares it
        for r in rests:
            if id(r) not in negs:
                negs[id(r)] = -r
        self.neg_rest = [negs[id(r)] for r in rests]  # non-decreasing: -(work left after a)
        self.positions = np.arange(n + 1, dtype=np.intp)

    # -- ends --------------------------------------------------------------------------------------------
    def _memory_ends(self, s: int, lo: int, hi: int) -> IntArr:
        """Latest end of stage ``s`` allowed by its memory cap, for starts ``lo..hi``."""
        m = self.m
        assert m.mem_cap is not None and m.mem is not None and m.mem_fac is not None
        a = self.positions[lo : hi + 1]
        room = float(m.mem_cap[s]) - (m.cut[a] * m.mem_fac[s] if m.receives(s) else 0.0)
        p = m.mem.prefix[m.mem.of[s]]
        guess = (np.searchsorted(p, p[a] + room, side="right") - 1).astype(np.intp)

        def ok(i: IntArr, bb: IntArr) -> BoolArr:
            return m.memory_ok(s, a[i], bb)

        return _monotone_search(a, np.full(a.size, m.n, dtype=np.intp), guess, ok)

    def _time_ends(self, s: int, a: IntArr, bound: float, lim: IntArr) -> IntArr:
        """Latest end ``<= lim`` of stage ``s`` with cost ``<= bound``, for starts ``a``: searchsorted's
        guess on the prefix sums, made exact by :func:`_monotone_search` with the canonical formula."""
        m = self.m
        tr = m.transfer(s, a)
        p = m.prefix(s)
        pa = p[a]
        # How much prefix sum the stage may still add; only a guess, _monotone_search makes it exact
        # (so one that overflows to inf, a huge bound on a fast device, only means "to the end").
        with np.errstate(over="ignore"):
            room = np.where(tr <= bound, bound * m.speed[s], -1.0) if m.overlap else (bound - tr) * m.speed[s]
        guess = (np.searchsorted(p, pa + room, side="right") - 1).astype(np.intp)

        def ok(i: IntArr, bb: IntArr) -> BoolArr:
            out: BoolArr = m.combine(s, (p[bb] - pa[i]) / m.speed[s], tr[i]) <= bound
            return out

        return _monotone_search(a, lim, guess, ok)

    def _unclipped_ends(self, s: int, lo: int, hi: int, bound: float) -> IntArr:
        """Latest end of stage ``s`` under ``bound`` and memory only (no window), starts ``lo..hi``."""
        mem = self.mem[s]
        lim = mem.get(lo, hi) if mem is not None else np.full(hi - lo + 1, self.m.n, dtype=np.intp)
        return self._time_ends(s, self.positions[lo : hi + 1], bound, lim)

    def ends(
        self, s: int, lo: int, hi: int, bound: float, cache: dict[int, _Lazy]
    ) -> tuple[IntArr, IntArr | int]:
        """``(r, lim)`` for starts ``lo..hi`` of stage ``s``: the latest end with cost ``<= bound``, and
        the hard cap on any end (memory, and one item left for every later stage)."""
        mem = self.mem[s]
        win = self.win_hi[s]
        lim: IntArr | int = win if mem is None else np.minimum(mem.get(lo, hi), win)
        g = self.group[s]
        if self.shared[g]:
            lazy = cache.get(g)
            if lazy is None:
                lazy = _Lazy(self.m.n, lambda x, y: self._unclipped_ends(s, x, y, bound))
                cache[g] = lazy
            return np.minimum(lazy.get(lo, hi), win), lim
        lim_arr = np.full(hi - lo + 1, win, dtype=np.intp) if isinstance(lim, int) else lim
        return self._time_ends(s, self.positions[lo : hi + 1], bound, lim_arr), lim

    def _first_alive(self, s: int, bound: float) -> int:
        """First start of stage ``s`` whose remaining work fits the remaining stages even perfectly
        balanced (:attr:`_Model.relaxation`).  Sound: a start that can finish has
        ``rest_s[a] <= bound * weight_s + slack_s`` up to a few ulps, far inside ``_PRUNE_MARGIN``."""
        return int(np.searchsorted(self.neg_rest[s], -(bound * self.work_w[s] + self.slack[s]), side="left"))

    def _comeback(self, s: int, a: int) -> float:
        """A bound below which pruned start ``a`` of stage ``s`` stays pruned (keeps snapping valid).

        The pruning test is monotone in the bound, so it suffices that the value returned is pruned."""
        rest, w, slack = float(-self.neg_rest[s][a]), self.work_w[s], self.slack[s]
        if not (w > 0 and rest > slack):  # cannot happen for a pruned start; stay safe anyway
            return 0.0
        out = ((rest - slack) / w) * (1.0 - 1e-15)
        shrink = 2.0**-50
        while out > 0 and not rest > out * w + slack:
            # a relative step rounds back to ``out`` itself among subnormals (``5e-324 * (1 - 2**-50)``
            # is ``5e-324``): step down at least one ulp, and widen the step each time, so that the loop
            # ends in a few dozen rounds whatever the magnitude (a lower value stays valid, only looser)
            smaller = out * (1.0 - shrink)
            out = smaller if smaller < out else math.nextafter(out, 0.0)
            shrink = min(2.0 * shrink, 0.5)
        return max(out, 0.0)

    # -- probe -------------------------------------------------------------------------------------------
    def probe(self, bound: float) -> _Probe:
        """Is there a partition with every stage cost ``<= bound``?  Exact (see module docstring)."""
        m = self.m
        n, k = m.n, m.k
        cache: dict[int, _Lazy] = {}
        layers: list[_Layer] = []
        comeback = math.inf
        lo, mask = 0, np.ones(1, dtype=bool)
        feasible = False
        for s in range(k):
            first = self._first_alive(s, bound)
            if first > lo:
                dropped = mask[: first - lo]
                if dropped.any():
                    last = lo + dropped.size - 1 - int(dropped[::-1].argmax())
                    comeback = min(comeback, self._comeback(s, last))
                mask = mask[first - lo :]
                lo = first
            if not mask.any():
                break
            i0, i1 = _true_span(mask)
            mask = mask[i0:i1]
            lo += i0
            hi = lo + mask.size - 1
            r, lim = self.ends(s, lo, hi, bound, cache)
            layers.append(_Layer(lo, mask, r, lim))
            if s == k - 1:
                feasible = bool(mask[r == n].any())
                break
            reach = np.where(mask, r, -1)
            np.maximum.accumulate(reach, out=reach)
            top = int(reach[-1])
            if top <= lo:
                break
            if top - lo > reach.size:
                reach = np.concatenate([reach, np.full(top - lo - reach.size, top, dtype=np.intp)])
            mask = (reach[: top - lo] >= self.positions[lo + 1 : top + 1]) & m.allowed[lo + 1 : top + 1]
            lo += 1
        if feasible:
            bounds = [n]
            for layer in reversed(layers):
                b = bounds[-1]
                upto = b - layer.lo
                covers = layer.mask[:upto] & (layer.r[:upto] >= b)
                idx = int(np.argmax(covers))  # the earliest reachable start that can end at b
                assert covers[idx]
                bounds.append(layer.lo + idx)
            return _Probe(True, tuple(reversed(bounds)), math.nan)
        return _Probe(False, None, min(comeback, self._next_bound(layers, cache)))

    def _next_bound(self, layers: list[_Layer], cache: dict[int, _Lazy]) -> float:
        """Smallest cost at which some reachable start could end one item later than it can now."""
        m = self.m
        nxt = math.inf
        union: dict[int, BoolArr] = {}
        for s, layer in enumerate(layers):
            grow = layer.mask & (layer.r < layer.lim)
            g = self.group[s]
            if self.shared[g]:  # same r for every stage of the group: evaluate each start once
                if g not in union:
                    union[g] = np.zeros(m.n, dtype=bool)
                union[g][layer.lo : layer.lo + grow.size] |= grow
                continue
            idx = np.flatnonzero(grow)
            if idx.size:
                nxt = min(nxt, float(m.cost(s, layer.lo + idx, layer.r[idx] + 1).min()))
        for g, grown in union.items():
            a = np.flatnonzero(grown)
            if a.size:
                r = cache[g].values[a]
                nxt = min(nxt, float(m.cost(self.group.index(g), a, r + 1).min()))
        return nxt

    # -- exact minimum bottleneck ------------------------------------------------------------------------
    def min_bottleneck(self, guess: float) -> tuple[float, tuple[int, ...]] | None:
        """The exact optimum and a partition achieving it, or ``None`` if no bound is feasible.

        Invariant: ``lo <= opt <= hi``.  Until a first feasible probe, ``mid`` gallops upward from the
        lower-bound guess; afterwards it bisects.  Every probe moves ``lo`` above ``mid`` or ``hi`` to at
        most ``mid``, so the loop ends, and it ends only when ``lo == hi == opt``.
        """
        lo, hi = 0.0, math.inf
        best: tuple[int, ...] | None = None
        mid = guess * (1.0 - _PRUNE_MARGIN) if guess > 0 and math.isfinite(guess) else 0.0
        step = 0.0
        while lo < hi:
            if not lo <= mid < hi:
                if math.isinf(hi):
                    step = lo * 2.0**-16 if step == 0.0 else step * 8.0
                    mid = lo + step
                else:
                    mid = lo + (hi - lo) * 0.5
                if not lo <= mid < hi:
                    mid = lo
            res = self.probe(mid)
            if res.feasible:
                assert res.bounds is not None
                best = res.bounds
                hi = self.m.bottleneck(best)
                assert hi <= mid, (hi, mid)
                gap = mid - hi
            else:
                if math.isinf(res.next_lo):
                    return None
                lo = max(math.nextafter(mid, math.inf), res.next_lo)
                gap = lo - mid
            # Endgame: the snap distances estimate how far apart realised costs lie here.  When the
            # interval is only a few of those apart, ask directly whether anything beats ``hi``: if not,
            # that single probe proves optimality instead of a long creep of tiny ``lo`` steps.
            mid = math.nan
            if math.isfinite(hi) and hi - lo <= _ENDGAME * gap:
                mid = math.nextafter(hi, -math.inf)
        assert best is not None and lo == hi, (lo, hi)
        return hi, best

    # -- tie-break ---------------------------------------------------------------------------------------
    def min_bytes(self, bound: float) -> tuple[float, tuple[int, ...]]:
        """Fewest total cut bytes over partitions with every stage cost ``<= bound`` (must be feasible)."""
        if not self.m.cut[1 : self.m.n].any():  # no bytes anywhere: the probe's choice is the same, cheaper
            res = self.probe(bound)
            assert res.bounds is not None
            return 0.0, res.bounds
        found = self.shortest(bound)
        assert found is not None
        return found

    def shortest(
        self, bound: float, weight: Callable[[int, IntArr], FloatArr] | None = None
    ) -> tuple[float, tuple[int, ...]] | None:
        """The partition with every stage cost ``<= bound`` whose starts weigh least in all, and that
        total; None when none exists (only possible for a bound no probe proved feasible).

        A shortest path over cut positions, layer by layer: value(b) = weight(s, b) + min over the starts
        ``a`` of stage ``s - 1`` that can end at ``b`` of value(a), where ``weight(s, b)`` is what stage
        ``s`` starting at ``b`` adds (default: the bytes crossing the cut).  Candidates are ordered by
        ``(value, bytes, position)``, so the minimum is unique and the choice deterministic (fewest bytes,
        then the earliest start).  When values are whole bytes the pair ``(value, position)`` is packed
        into one int64 key; otherwise it is ranked.
        """
        m = self.m
        n, k = m.n, m.k
        cache: dict[int, _Lazy] = {}
        lo, vals, nbytes = 0, np.zeros(1), np.zeros(1)
        preds: list[tuple[int, IntArr]] = []
        for s in range(k):
            first = self._first_alive(s, bound) if math.isfinite(bound) else 0
            if first > lo:
                vals, nbytes = vals[first - lo :], nbytes[first - lo :]
                lo = first
            i0, i1 = _true_span(np.isfinite(vals))
            vals, nbytes = vals[i0:i1], nbytes[i0:i1]
            lo += i0
            hi = lo + vals.size - 1
            r, _ = self.ends(s, lo, hi, bound, cache)
            if s == k - 1:
                hit = np.flatnonzero((r == n) & np.isfinite(vals))
                if hit.size == 0:
                    return None
                j = int(hit[np.lexsort((nbytes[hit], vals[hit]))[0]])  # stable: earliest among ties
                bounds = [n, lo + j]
                for plo, parr in reversed(preds):
                    bounds.append(int(parr[bounds[-1] - plo]))
                return float(vals[j]), tuple(reversed(bounds))
            idx = np.flatnonzero(np.isfinite(vals) & (r > self.positions[lo : hi + 1]))
            if idx.size == 0:
                return None
            r2, v2 = r[idx], vals[idx]
            base = lo + int(idx[0])
            offset = idx - (base - lo)  # position - base, ascending
            size = int(r2.max()) - base
            shift = max(size, 1).bit_length()
            allowed = m.allowed[base + 1 : base + 1 + size]
            if weight is None and v2.max() < 2.0 ** (62 - shift) and bool(np.all(v2 == np.floor(v2))):
                keys = (v2.astype(np.intp) << shift) | offset  # (value, position) in one integer
                best = _range_chmin(size, offset, r2 - base - 1, keys)
                ok = (best < _BIG) & allowed
                pred = np.where(ok, base + (best & ((1 << shift) - 1)), -1)
            else:
                order = np.lexsort((nbytes[idx], v2)).astype(np.intp)  # stable: earlier position first
                ok, chosen = _best_cover(size, offset, r2 - base - 1, order, allowed)
                pred = np.where(ok, base + offset[chosen], -1)
            at = np.maximum(pred - lo, 0)  # the chosen start (junk where not ok)
            lo = base + 1
            preds.append((lo, pred))
            cut = m.cut[lo : lo + size]
            add = cut if weight is None else weight(s + 1, self.positions[lo : lo + size])
            vals, nbytes = np.where(ok, vals[at] + add, np.inf), np.where(ok, nbytes[at] + cut, 0.0)
        raise AssertionError("unreachable")


def _finish(model: _Model, lower: float) -> Partition:
    """Solve ``model`` exactly and package the result; ``lower`` (a valid lower bound) seeds the search."""
    return _partition_of(model, lower, _solved_bounds(model, lower))


def _solved_bounds(model: _Model, lower: float, *, balance: bool = True) -> tuple[int, ...]:
    """The optimal bounds: the exact bottleneck, the fewest-bytes tie-break, then (``balance``) the stages
    below the bottleneck balanced among themselves (:func:`_balanced`, whose windows are solved here
    without a level of their own: each re-solve costs a solve)."""
    engine = _Engine(model)
    found = engine.min_bottleneck(lower)
    if found is None:
        raise _memory_error(model, _smallest_uniform_cap(model))
    bounds = _choose(model, found[0], engine.min_bytes)
    if not balance:
        return bounds
    return _balanced(model, bounds, lambda sub: _solved_bounds(sub, sub.spread_bound(), balance=False))


def latency_bounds(model: _Model) -> tuple[int, ...]:
    """The bounds of the split of ``model`` with the least sum of stage and transfer times (memory caps
    and forbidden cuts respected), or :class:`MemoryFitError` naming the smallest cap when none fits:
    the engine's shortest path over the cuts, under no bound on a stage's time, weighed by ``w_s``."""
    found = _Engine(model).shortest(math.inf, lambda s, p: _cut_weight(model, s, p))
    if found is None:  # no stage fits anywhere its predecessors can end
        raise _memory_error(model, _smallest_uniform_cap(model))
    return found[1]


def _cut_weight(model: _Model, s: int, p: IntArr) -> FloatArr:
    """``w_s(p)``: what stage ``s`` starting at ``p`` adds to the latency beyond the constant ends: its
    transfer in, and the items before ``p`` paid at stage ``s - 1``'s speed instead of its own."""
    before = model.prefix(s - 1)[p] / model.speed[s - 1]
    after = model.prefix(s)[p] / model.speed[s]
    out: FloatArr = (before - after) + model.transfer(s, p)
    return out


def _smallest_uniform_cap(model: _Model) -> float:
    """The optimum of the memory problem (:meth:`_Model.memory_model`): only asked when no split fits."""
    mem = model.memory_model()
    found = _Engine(mem).min_bottleneck(min(float(p[-1]) for p in mem.work.prefix) / mem.k)
    assert found is not None
    return found[0]


def _true_span(mask: BoolArr) -> tuple[int, int]:
    """The first True of ``mask`` and one past its last (the whole mask when none is True): a layer's
    positions are trimmed to the span that can still be reached."""
    return int(mask.argmax()), mask.size - int(mask[::-1].argmax())


# -- array searches ------------------------------------------------------------------------------------


def _monotone_search(
    a: IntArr, lim: IntArr, guess: IntArr, ok: Callable[[IntArr, IntArr], BoolArr]
) -> IntArr:
    """Largest ``b`` in ``[a, lim]`` with ``b == a or ok(i, b)``, where ``ok(i, b)`` judges ``b`` as an
    end for the starts ``a[i]`` and is true-then-false in ``b``.

    ``guess`` (from searchsorted) is usually exact; it is verified and, where rounding made it wrong,
    repaired by a vectorised binary search over just those entries — so the result is exact whatever
    the quality of the guess.
    """
    g = np.minimum(np.maximum(guess, a), lim)
    bad = np.zeros(a.size, dtype=bool)
    chk = np.flatnonzero(g > a)
    if chk.size:
        bad[chk] = ~ok(chk, g[chk])
    up = np.zeros(a.size, dtype=bool)
    cand = np.flatnonzero(~bad & (g < lim))
    if cand.size:
        up[cand] = ok(cand, g[cand] + 1)
    lo = np.where(up, g + 1, np.where(bad, a, g))
    hi = np.where(up, lim, np.where(bad, g - 1, g))
    todo = np.flatnonzero(lo < hi)
    if todo.size:
        low, high = lo[todo], hi[todo]
        act = np.flatnonzero(low < high)
        while act.size:
            mid = (low[act] + high[act] + 1) // 2
            good = ok(todo[act], mid)
            low[act] = np.where(good, mid, low[act])
            high[act] = np.where(good, high[act], mid - 1)
            act = act[low[act] < high[act]]
        lo[todo] = low
    return lo


def _range_chmin(size: int, left: IntArr, right: IntArr, vals: IntArr) -> IntArr:
    """``out[i] = min(vals[j] for j with left[j] <= i <= right[j])`` (``_BIG`` where none), vectorised.

    Each interval is covered by two overlapping power-of-two blocks (sparse-table style); block minima
    are then pushed down level by level.  ``O((size + m) log size)``.
    """
    length = right - left + 1
    level = (np.frexp(length.astype(np.float64))[1] - 1).astype(np.intp)
    top = int(level.max())
    table = np.full((top + 1) * size, _BIG, dtype=np.intp)
    np.minimum.at(table, level * size + left, vals)
    np.minimum.at(table, level * size + right - (np.left_shift(1, level)) + 1, vals)
    tab = table.reshape(top + 1, size)
    for j in range(top, 0, -1):
        half = 1 << (j - 1)
        cnt = size - (1 << j) + 1
        row = tab[j, :cnt]
        np.minimum(tab[j - 1, :cnt], row, out=tab[j - 1, :cnt])
        np.minimum(tab[j - 1, half : half + cnt], row, out=tab[j - 1, half : half + cnt])
    out: IntArr = tab[0].copy()
    return out


def _best_cover(
    size: int, left: IntArr, right: IntArr, order: IntArr, allowed: BoolArr
) -> tuple[BoolArr, IntArr]:
    """For each position ``0..size-1``: whether an interval ``[left[j], right[j]]`` covers it (and the
    position is ``allowed``), and the covering ``j`` that comes first in ``order`` (a preference order of
    the intervals: best first).  The layered passes' step, "the best start that can end here"."""
    rank = np.empty(order.size, dtype=np.intp)
    rank[order] = np.arange(order.size, dtype=np.intp)
    best = _range_chmin(size, left, right, rank)
    ok: BoolArr = (best < _BIG) & allowed
    return ok, order[np.where(ok, best, 0)]
