"""Brute-force reference evaluators and hypothesis strategies for the algorithm tests.

Streams are lists of events per key in application order; every query rescans them."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

INT64_MIN = np.iinfo(np.int64).min

GAPS = [0, 0, 0, 0, 1, 1, 2, 3, 5, 8, 40, 400, 5000]  # bursts (equal ts), small steps, long gaps


@dataclass
class Stream:
    keys: np.ndarray  # int64[n]
    ts: np.ndarray  # int64[n], non-decreasing
    mult: np.ndarray  # int64[n] >= 0
    vals: np.ndarray  # float64[n]
    ivals: np.ndarray  # int64[n], small alphabet (COUNT DISTINCT)
    cuts: list[int]  # batch boundaries
    n_keys: int

    def n_batches(self) -> int:
        bounds = [0, *self.cuts, len(self.keys)]
        return sum(1 for a, b in zip(bounds[:-1], bounds[1:], strict=True) if b > a)

    def batches(self, rng: np.random.Generator):
        """Yield (start, stop, perm): batch rows in an order that mixes keys but keeps each key's
        rows in arrival order (the interface's "any order within a batch")."""
        bounds = [0, *self.cuts, len(self.keys)]
        for a, b in zip(bounds[:-1], bounds[1:], strict=True):
            if b <= a:
                continue
            prio = rng.permutation(self.n_keys)[self.keys[a:b]]
            perm = a + np.argsort(prio, kind="stable")
            yield a, b, perm


@st.composite
def streams(draw, max_keys: int = 6, max_events: int = 150, max_mult: int = 1) -> Stream:
    K = draw(st.integers(1, max_keys))
    n = draw(st.integers(0, max_events))
    keys = np.array(draw(st.lists(st.integers(0, K - 1), min_size=n, max_size=n)), dtype=np.int64)
    gaps = np.array(draw(st.lists(st.sampled_from(GAPS), min_size=n, max_size=n)), dtype=np.int64)
    ts = 1_000_000 + np.cumsum(gaps).astype(np.int64)
    if max_mult > 1:
        mult = np.array(draw(st.lists(st.integers(0, max_mult), min_size=n, max_size=n)), dtype=np.int64)
    else:
        mult = np.ones(n, np.int64)
    vals = np.array(draw(st.lists(st.integers(-50, 50), min_size=n, max_size=n)), dtype=np.float64) * 0.5
    ivals = np.array(draw(st.lists(st.integers(0, 7), min_size=n, max_size=n)), dtype=np.int64)
    cuts = sorted(draw(st.lists(st.integers(0, max(n, 0)), max_size=4)))
    return Stream(keys, ts, mult, vals, ivals, cuts, K)


def sel_time(s: Stream, k: int, lo: int, hi: int, expired: int) -> np.ndarray:
    return np.nonzero((s.keys == k) & (s.ts > max(lo, expired)) & (s.ts <= hi))[0]


def sel_rows(s: Stream, k: int, n: int, expired: int, upto: int | None = None) -> np.ndarray:
    idx = np.nonzero((s.keys == k) & (s.ts > expired))[0]
    if upto is not None:
        idx = idx[idx < upto]
    return idx[max(0, len(idx) - n) :] if n > 0 else idx[:0]


def kth_newest(s: Stream, k: int, u: int, expired: int) -> int:
    idx = np.nonzero((s.keys == k) & (s.ts > expired))[0]
    acc = 0
    for i in idx[::-1]:
        acc += int(s.mult[i])
        if acc >= u:
            return int(s.ts[i])
    return INT64_MIN


def in_range(x: np.ndarray, lo, hi, lo_strict: bool, hi_strict: bool) -> np.ndarray:
    ok = np.ones(x.shape, bool)
    if lo is not None:
        ok &= (x > lo) if lo_strict else (x >= lo)
    if hi is not None:
        ok &= (x < hi) if hi_strict else (x <= hi)
    return ok


ALGO_SETTINGS = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def feed(
    struct, s: Stream, rng: np.random.Generator, apply, roundtrip_at: int, expire_at: int, expire_to: int
):
    """Apply the stream batch by batch with ``apply(struct, idx)``; round-trip the state through
    bytes after batch ``roundtrip_at`` and expire ``ts <= expire_to`` after batch ``expire_at``
    (lowered below the next batch's timestamps: expiry only drops data older than what follows).
    Returns the (possibly restored) structure and the expiry horizon applied (INT64_MIN: none)."""
    expired = INT64_MIN
    for j, (_, b, perm) in enumerate(s.batches(rng)):
        apply(struct, perm)
        if j == expire_at:
            if b < len(s.ts):
                expire_to = min(expire_to, int(s.ts[b]) - 1)
            struct.expire(expire_to)
            expired = expire_to
        if j == roundtrip_at:
            struct = type(struct).from_bytes(struct.to_bytes())
    return struct, expired


def random_lo(rng: np.random.Generator, t0: int, end: int, expired: int) -> int:
    """A window start at or after the expiry horizon, around the stream's time span."""
    lo_min = max(expired, t0 - 10)
    return int(rng.integers(lo_min, max(lo_min + 1, end + 10)))
