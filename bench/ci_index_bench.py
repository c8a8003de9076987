"""CI-COUNT / CI-SUM benchmark: a replica of Arasu & Widom 2004, section 6.3 (Figure 12).

Workload: K keys with Zipf-skewed activity (like ticker symbols, or IPs at 500,000 keys) over a
6.5-hour trading day; threshold rules ``COUNT(now - T, now] > v`` (and ``SUM(volume) > v``) with
suffix windows T from 15 minutes to 3 hours and thresholds calibrated for a target selectivity;
after a warm-up of half the day, lookups and updates are equally interleaved (one event, one
rule lookup at the event's time, as in the paper). Three exact methods run in the same process
on the same inputs, each from its own copy of the warm state:

* ``paper-naive``: R-INT per key (timestamps and running counts), the window start found by
  binary search, every key checked at every lookup (the paper's baseline);
* ``best-naive``: the structure our post-check uses, every key checked: a dense pre-filter on the
  key's live count, then COUNT > v exactly when the key's (v+1)-th newest timestamp is later
  than now - T (O(1) per key), the keys that pass checked in one batch with branch-free
  gathers (the library's ``check_count``, as in the index's post-check);
* ``ci``: CI-COUNT (or CI-SUM) candidates + exact post-check with R-INT; the index's periodic
  relayout of its key positions runs when due, and its cost measured on the warm state is also
  reported amortized per update (``incl. amortized relayout``; ratios use that rate).

Every method expires data older than the longest window (3 h) every 8,192 events, as the
engine does (R-INT expiry for all, plus CICount.expire for the index).

The interleaved loops run inside Numba (the library's own kernels, called one input at a time),
so per-call Python overhead does not hide the algorithms; all methods must find the same
results (checked). Also measured: batched CI-COUNT updates/s through the public API, exact
lookups/s, bytes per key.

    .venv/bin/python bench/ci_index_bench.py --quick      # < 1 minute smoke run
    .venv/bin/python bench/ci_index_bench.py              # full sweeps + docs/img/*.png
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numba as nb
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from engine.algorithms import CICount, CISum, RInt, exact_count  # noqa: E402
from engine.algorithms import fixed128 as fx  # noqa: E402
from engine.algorithms._levels import (  # noqa: E402
    assign_positions,
    check_count,
    levels_lookup,
    levels_update,
    recompute_blocks,
    relayout,
    relayout_due,
    reset_expired,
    touch,
)
from engine.algorithms._pool import expire_heads, search_after  # noqa: E402
from engine.algorithms.ci_sum import _units  # noqa: E402
from engine.algorithms.rint import _advance_base, kth_one  # noqa: E402
from engine.algorithms.rint import _append as rint_append  # noqa: E402

DAY_MS = int(6.5 * 3600 * 1000)
MIN_T, MAX_T = 15 * 60 * 1000, 3 * 3600 * 1000
PAPER_NAIVE, BEST_NAIVE, CI = 0, 1, 2
EXPIRE_EVERY = 8192  # events between two expiries of data older than the longest window (MAX_T)
METHODS = {PAPER_NAIVE: "paper-naive", BEST_NAIVE: "best-naive", CI: "ci"}


# ---------------------------------------------------------------------------- workload
@dataclass
class Workload:
    K: int
    keys: np.ndarray
    ts: np.ndarray
    vol: np.ndarray  # share volumes (integers, multiples of 100)
    warm: int  # events applied in batch before the timed, interleaved phase
    rule_T: np.ndarray
    rule_v: np.ndarray  # COUNT thresholds (count > v)
    rule_sv: np.ndarray  # SUM(volume) thresholds (sum > v)
    selectivity: float


def make_workload(
    K: int, n: int, selectivity: float, n_rules: int, seed: int, zipf_s: float = 1.1, first_seen: bool = False
) -> Workload:
    """first_seen=False scatters the hot keys uniformly over the id space (the conservative
    case for the index's block summaries); True numbers keys in order of first appearance, as
    :class:`KeyInterner` does in the engine (hot keys then tend to have small ids)."""
    rng = np.random.default_rng(seed)
    w = 1.0 / np.arange(1, K + 1) ** zipf_s
    ids = rng.permutation(K)  # hot keys scattered over the id space
    keys = ids[rng.choice(K, size=n, p=w / w.sum())].astype(np.int64)
    if first_seen:
        _, first = np.unique(keys, return_index=True)
        order = np.full(K, -1, np.int64)
        seen = keys[np.sort(first)]
        order[seen] = np.arange(seen.shape[0])
        unseen = np.flatnonzero(order < 0)
        order[unseen] = seen.shape[0] + np.arange(unseen.shape[0])
        keys = order[keys]
    ts = np.sort(rng.integers(0, DAY_MS, n)).astype(np.int64)
    vol = (np.ceil(rng.lognormal(0.5, 1.2, n)) * 100).astype(np.float64)
    warm = int(np.searchsorted(ts, DAY_MS // 2))
    rule_T = (rng.integers(MIN_T // 1000, MAX_T // 1000 + 1, n_rules) * 1000).astype(np.int64)
    # thresholds for the target selectivity, calibrated at two instants of the timed phase
    checkpoints = [ts[warm], ts[min(n - 1, warm + (n - warm) // 4)]]
    rule_v = np.zeros(n_rules, np.int64)
    rule_sv = np.zeros(n_rules, np.float64)
    rank = max(0, int(round(selectivity * K)))
    for i, T in enumerate(rule_T):
        vs, svs = [], []
        for now in checkpoints:
            sel = (ts > now - T) & (ts <= now)
            cnt = np.sort(np.bincount(keys[sel], minlength=K))[::-1]
            sm = np.sort(np.bincount(keys[sel], weights=vol[sel], minlength=K))[::-1]
            vs.append(cnt[min(rank, K - 1)])
            svs.append(sm[min(rank, K - 1)])
        rule_v[i] = int(np.mean(vs))
        rule_sv[i] = float(np.mean(svs))
    return Workload(K, keys, ts, vol, warm, rule_T, rule_v, rule_sv, selectivity)


# ---------------------------------------------------------------------------- drivers
@nb.njit(cache=True)
def _ci_event(
    i, ev_k, ev_t, units, m, TS, BM, BM2, act, bma, bma2, score, key_of, pos_of, aux, p, L, st, every
):
    """One event into the index, exactly as CICount.update / CISum.update do it: the key's
    position (new keys get the next one), the level update, act / activity, and the periodic
    relayout when due (st = [positions in use, rows since the last relayout])."""
    pos, st[0] = assign_positions(ev_k[i : i + 1], pos_of, key_of, st[0])
    levels_update(pos, ev_t[i : i + 1], units, m, TS, BM, BM2, p, L)
    touch(pos, ev_t[i : i + 1], units, act, bma, bma2, score)
    st[1] += 1
    if relayout_due(st[1], st[0], every):
        relayout(st[0], L * p, score, TS, BM, BM2, m, act, bma, bma2, key_of, pos_of, aux)
        st[1] = 0


@nb.njit(cache=True)
def _expire(
    method,
    now,
    head,
    end,
    base_cnt,
    base_sh,
    base_sl,
    tot,
    c_ts,
    c_cnt,
    c_sh,
    c_sl,
    m,
    TS,
    BM,
    BM2,
    act,
    st,
    p,
    L,
):
    """What the engine does periodically: drop R-INT rows older than the longest window
    (RInt.expire) and, for the index, forget keys without events since (CICount.expire)."""
    before = now - MAX_T
    nh = expire_heads(c_ts, head, end, before)
    _advance_base(nh, head, end, base_cnt, base_sh, base_sl, tot, c_cnt, c_sh, c_sl)
    head[:] = nh
    if method == 2:
        S = L * p
        blocks = reset_expired(before, st[0], m, TS, act, S)
        if blocks.shape[0] > 0:
            recompute_blocks(TS, BM, BM2, blocks, st[0], S)


@nb.njit(cache=True)
def drive_count(method, a, b, do_update, ev_k, ev_t, ones, novals, noh, nol, q_T, q_u, q_slo, q_sure,
                head, end, base_cnt, base_sh, base_sl, last_ts, tot, unit, c_ts, c_cnt, c_sh, c_sl, c_val,
                m, TS, BM, BM2, act, bma, bma2, score, key_of, pos_of, st, every, p, L, K, out, sure,
                scr_i, scr_j, scr_t, fixed_now):  # fmt: skip
    """Inputs a..b-1: event i (if do_update) then a lookup of rule i % R at the event's time
    (at fixed_now when not updating). Returns (exact hits, candidates, checksum of hits,
    candidates post-checked with R-INT)."""
    R = q_T.shape[0]
    hits = 0
    cands = 0
    chk = 0
    checked = 0
    noaux = np.zeros(0)
    for i in range(a, b):
        if do_update:
            rint_append(ev_k[i : i + 1], ev_t[i : i + 1], novals[i : i + 1], noh[i : i + 1], nol[i : i + 1], ones[i : i + 1],
                        head, end, base_cnt, base_sh, base_sl, last_ts, tot, unit, c_ts, c_cnt, c_sh, c_sl, c_val)  # fmt: skip
            if method == 2:
                _ci_event(i, ev_k, ev_t, ones[i : i + 1], m, TS, BM, BM2, act, bma, bma2, score, key_of, pos_of,
                          noaux, p, L, st, every)  # fmt: skip
            now = ev_t[i]
            if i % EXPIRE_EVERY == 0:
                _expire(method, now, head, end, base_cnt, base_sh, base_sl, tot, c_ts, c_cnt, c_sh, c_sl, m, TS, BM, BM2, act, st,
                        p, L)  # fmt: skip
        else:
            now = fixed_now
        q = i % R
        t = now - q_T[q]
        u = q_u[q]
        if method == 0:
            for k in range(K):
                h = head[k]
                e = end[k]
                if e == h:
                    continue
                i1 = search_after(c_ts, h, e, t)
                c = c_cnt[e - 1] - (c_cnt[i1 - 1] if i1 > h else base_cnt[k])
                if c >= u:
                    hits += 1
                    chk += k
        elif method == 1:
            # dense pre-filter on the live count, then the O(1) exact check of the keys that pass,
            # batched exactly like the index's post-check (check_count: branch-free gathers;
            # key_of is the identity here)
            n = 0
            for k in range(K):
                if tot[k] >= u:
                    out[n] = k
                    sure[n] = False
                    n += 1
            n = check_count(out, sure, n, key_of, u, -1, t, head, end, base_cnt, tot, unit, c_ts, c_cnt, scr_i, scr_j,
                            scr_t)  # fmt: skip
            hits += n
            for j in range(n):
                chk += out[j]
        else:
            # the library's exact lookup (exact_count_kernel): index candidates, proofs, and the
            # batched R-INT check of the unproven ones
            n = levels_lookup(q_slo[q], -1, q_sure[q], -1, t, st[0], TS, BM, BM2, act, bma, bma2, out, sure)
            cands += n
            for j in range(n):
                if not sure[j]:
                    checked += 1
            n = check_count(out, sure, n, key_of, u, -1, t, head, end, base_cnt, tot, unit, c_ts, c_cnt, scr_i, scr_j,
                            scr_t)  # fmt: skip
            hits += n
            for j in range(n):
                chk += out[j]
    return hits, cands, chk, checked


@nb.njit(cache=True)
def drive_sum(method, a, b, do_update, ev_k, ev_t, vals, vh, vl, ones, q_T, q_v, q_slo, q_sure, vunit,
              head, end, base_cnt, base_sh, base_sl, last_ts, tot, unit, c_ts, c_cnt, c_sh, c_sl, c_val,
              m, TS, BM, BM2, act, bma, bma2, score, key_of, pos_of, st, every, csum, p, L, K, out, sure,
              fixed_now):  # fmt: skip
    """As drive_count for SUM(volume) > v: naive = R-INT window sums of every key (binary search
    of the window start); ci = CI-SUM candidates + the same exact R-INT check on them."""
    R = q_T.shape[0]
    hits = 0
    cands = 0
    chk = 0
    checked = 0
    for i in range(a, b):
        if do_update:
            rint_append(ev_k[i : i + 1], ev_t[i : i + 1], vals[i : i + 1], vh[i : i + 1], vl[i : i + 1], ones[i : i + 1],
                        head, end, base_cnt, base_sh, base_sl, last_ts, tot, unit, c_ts, c_cnt, c_sh, c_sl, c_val)  # fmt: skip
            if method == 2:
                q0 = pos_of[ev_k[i]]
                if q0 < 0:
                    q0 = st[0]  # the position assign_positions will give it
                units = _units(np.array([q0]), vals[i : i + 1, 0], vunit, csum)
                _ci_event(i, ev_k, ev_t, units, m, TS, BM, BM2, act, bma, bma2, score, key_of, pos_of, csum, p, L,
                          st, every)  # fmt: skip
            now = ev_t[i]
            if i % EXPIRE_EVERY == 0:
                _expire(method, now, head, end, base_cnt, base_sh, base_sl, tot, c_ts, c_cnt, c_sh, c_sl, m, TS, BM, BM2, act, st,
                        p, L)  # fmt: skip
        else:
            now = fixed_now
        q = i % R
        t = now - q_T[q]
        v = q_v[q]
        if method == 2:
            n = levels_lookup(q_slo[q], -1, q_sure[q], -1, t, st[0], TS, BM, BM2, act, bma, bma2, out, sure)
            cands += n
        else:
            n = K
        for j in range(n):
            k = key_of[out[j]] if method == 2 else j
            if method == 2 and sure[j]:
                hits += 1
                chk += k
                continue
            checked += 1
            h = head[k]
            e = end[k]
            if e == h:
                continue
            i1 = search_after(c_ts, h, e, t)
            if i1 > h:
                dh, dl = fx.sub(c_sh[e - 1, 0], c_sl[e - 1, 0], c_sh[i1 - 1, 0], c_sl[i1 - 1, 0])
            else:
                dh, dl = fx.sub(c_sh[e - 1, 0], c_sl[e - 1, 0], base_sh[k, 0], base_sl[k, 0])
            s = fx.to_float(dh, dl)
            if s > v:
                hits += 1
                chk += k
    return hits, cands, chk, checked


# ---------------------------------------------------------------------------- runs
@dataclass
class Run:
    bench: str
    method: str
    K: int
    selectivity: float
    p: int
    inputs: int
    seconds: float
    inputs_per_s: float
    hits_per_lookup: float
    cands_per_lookup: float
    measured_selectivity: float
    extra: dict = field(default_factory=dict)


def _caller(driver, meth: int, head_args: tuple, tail_args: tuple):
    """driver(meth, a, b, do_update, *head_args, *tail_args, fixed_now) as f(a, b, do_update, now)."""

    def call(a: int, b: int, upd: bool, now: int):
        return driver(meth, a, b, upd, *head_args, *tail_args, np.int64(now))

    return call


def _slots(plans: list) -> tuple[np.ndarray, np.ndarray]:
    """(s_lo, sure_lo) per rule."""
    assert all(pl is not None for pl in plans)
    return np.array([pl.s_lo for pl in plans], np.int64), np.array([pl.sure_lo for pl in plans], np.int64)


def _ci_state(ci: CICount) -> tuple:
    """The index arrays the drivers mutate (st = [positions in use, rows since relayout])."""
    st = np.array([ci._K, ci._since], np.int64)
    return (ci.m, ci.TS, ci.BM, ci.BM2, ci.act, ci.bma, ci.bma2, ci.score, ci.key_of, ci.pos_of, st,
            np.int64(ci.relayout_every), np.int64(ci.p), np.int64(ci.L))  # fmt: skip


def _no_ci_state(K: int) -> tuple:
    """Placeholders for the naive methods; key_of is the identity over the K key ids."""
    d = np.zeros((1, 1), np.int64)
    z = np.zeros(1, np.int64)
    ident = np.arange(K, dtype=np.int64)
    return (z, d, d, d, z, z, z, z, ident, z, np.zeros(2, np.int64), np.int64(0), np.int64(1), np.int64(1))


def _clone(obj):
    return type(obj).from_bytes(obj.to_bytes())


def _rint_args(r: RInt):
    p, kc, c = r._pool, r._kcols, r._cols
    return (p.head, p.end, kc["base_cnt"], kc["base_sh"], kc["base_sl"], kc["last_ts"], kc["tot"], kc["unit"], c["ts"],
            c["cnt"], c["sh"], c["sl"], c["val"])  # fmt: skip


@dataclass
class _Racer:
    """One method's state and progress in a race."""

    meth: int
    p: int | None
    call: Any
    start: int
    extra: dict
    keep: tuple = ()  # the arrays the driver mutates (kept alive)
    i: int = -1
    j: int = 0
    spent: float = 0.0
    hits: int = 0
    cands: int = 0
    checked: int = 0
    chk_sum: int = 0
    lk_done: int = 0
    lk_spent: float = 0.0

    def __post_init__(self) -> None:
        self.i = self.start


class Bench:
    def __init__(self, budget_s: float, chunk: int, wall: bool = False, verbose: bool = True) -> None:
        # CPU time of this process by default: the machine's 2 cores are shared, and wall-clock
        # rates would measure the neighbours' load as much as the algorithms.
        self.clock = time.perf_counter if wall else time.process_time
        self.budget_s = budget_s
        self.chunk = chunk
        self.runs: list[Run] = []
        self.verbose = verbose

    def log(self, *a: object) -> None:
        if self.verbose:
            print(*a, flush=True)

    def _chunk(self, j: int) -> int:
        """Inputs per driver call: growing from 8, so slow methods stop near the budget."""
        return min(self.chunk, 8 << j)

    @staticmethod
    def _check(ref: dict, i: int, hits: int, chk: int, meth: int) -> None:
        """Every method must find the same results: cumulative hits and checksum per chunk."""
        if i in ref:
            if ref[i] != (hits, chk):
                raise AssertionError(f"{METHODS[meth]} disagrees with the first method after input {i}")
        else:
            ref[i] = (hits, chk)

    # -------------------------------------------------------------- the race
    def _race(self, racers: list[_Racer], n: int, ref: dict, ts: np.ndarray) -> None:
        """Run all methods round-robin, one chunk each in turn, so that they share the same
        machine conditions (the 2 cores are shared); each stops at its budget or at the end."""
        while True:
            moved = False
            for rc in racers:
                if rc.i >= n or rc.spent >= self.budget_s:
                    continue
                b = min(n, rc.i + self._chunk(rc.j))  # same boundaries for every method (checked)
                rc.j += 1
                t0 = self.clock()
                h, c, chk, ck = rc.call(rc.i, b, True, 0)
                rc.spent += self.clock() - t0
                rc.hits += h
                rc.cands += c
                rc.checked += ck
                rc.chk_sum += chk
                rc.i = b
                self._check(ref, b, rc.hits, rc.chk_sum, rc.meth)
                moved = True
            if not moved:
                break
        # lookups only, each at its own end state: exact lookups/s
        for rc in racers:
            rc.j = 0
        while True:
            moved = False
            for rc in racers:
                nl = min(20_000, max(200, rc.i - rc.start))
                if rc.lk_done >= nl or rc.lk_spent >= self.budget_s / 2:
                    continue
                c = min(self._chunk(rc.j), nl - rc.lk_done)
                rc.j += 1
                t0 = self.clock()
                rc.call(rc.lk_done, rc.lk_done + c, False, int(ts[rc.i - 1]))
                rc.lk_spent += self.clock() - t0
                rc.lk_done += c
                moved = True
            if not moved:
                break

    def _record(self, label: str, wl: Workload, rc: _Racer, name: str) -> None:
        lookups = rc.i - rc.start
        run = Run(
            label, name, wl.K, wl.selectivity, rc.p or 0, 2 * lookups, rc.spent, 2 * lookups / rc.spent,
            rc.hits / max(lookups, 1), (rc.cands / max(lookups, 1)) if rc.meth == CI else float(wl.K),
            rc.hits / max(lookups, 1) / wl.K,
        )  # fmt: skip
        run.extra["checked_per_lookup"] = rc.checked / max(lookups, 1)
        if "relayout_s" in rc.extra:
            # every input pair has one update: add the relayout's amortized cost per update
            per_input = 1 / run.inputs_per_s + rc.extra["relayout_s"] / rc.extra["relayout_every_rows"] / 2
            run.extra["inputs_per_s_with_amortized_relayout"] = 1 / per_input
        if rc.lk_spent > 0:
            run.extra["lookups_per_s"] = rc.lk_done / rc.lk_spent
        run.extra.update(rc.extra)
        self.runs.append(run)
        self.log(self._fmt(run))

    def _measure_relayout(self, ci: CICount, extra: dict) -> None:
        """Time one relayout of the warm index (the drivers relayout when due, as
        CICount.update does); its cost per row, amortized, is reported next to the rate."""
        t0 = self.clock()
        ci.relayout()
        extra["relayout_s"] = self.clock() - t0
        extra["relayout_every_rows"] = max(65536, 4 * ci._K)

    # -------------------------------------------------------------- interleaved COUNT
    def count_runs(self, wl: Workload, ps: list[int], methods: list[int], label: str = "count") -> None:
        rw = RInt(0)
        rw.append(wl.keys[: wl.warm], wl.ts[: wl.warm])
        horizon = int(wl.ts[wl.warm - 1]) - MAX_T  # the engine keeps the longest window only
        rw.expire(horizon)
        rest_k, rest_t = wl.keys[wl.warm :], wl.ts[wl.warm :]
        n = wl.keys.shape[0]
        ones = np.ones(n, np.int64)
        novals = np.zeros((n, 0))
        noh = nol = np.zeros((n, 0), np.int64)
        q_u = wl.rule_v + 1
        todo = [(meth, None) for meth in methods if meth != CI] + [
            (CI, p) for p in (ps if CI in methods else [])
        ]
        racers = []
        for meth, p in todo:
            r = _clone(rw)
            r._prepare(rest_k, rest_t)  # room for every remaining event: the loop only appends
            extra: dict = {}
            if meth == CI:
                assert p is not None
                ci = CICount(p)
                t0 = self.clock()
                ci.update(wl.keys[: wl.warm], wl.ts[: wl.warm])
                extra["warm_batch_updates_per_s"] = wl.warm / max(self.clock() - t0, 1e-9)
                ci.expire(horizon)
                extra["bytes_per_key"] = ci.bytes_per_key()
                ci._grow(wl.K, int(ci.m.max()) + len(rest_k))
                self._measure_relayout(ci, extra)
                slo, ssure = _slots([ci.plan(int(v), None) for v in wl.rule_v])
                cstate = _ci_state(ci)
            else:
                slo = ssure = np.zeros(len(q_u), np.int64)
                cstate = _no_ci_state(wl.K)
            out = np.empty(wl.K, np.int64)
            sure = np.empty(wl.K, np.bool_)
            scratch = tuple(np.empty(wl.K, np.int64) for _ in range(3))
            head_args = (wl.keys, wl.ts, ones, novals, noh, nol, wl.rule_T, q_u, slo, ssure)
            tail_args = (*_rint_args(r), *cstate, np.int64(wl.K), out, sure, *scratch)
            call = _caller(drive_count, meth, head_args, tail_args)
            call(wl.warm, wl.warm, True, 0)  # compile / load from cache outside the clock
            racers.append(_Racer(meth, p, call, wl.warm, extra, keep=(r, cstate)))
        self._race(racers, n, {}, wl.ts)
        for rc in racers:
            self._record(label, wl, rc, METHODS[rc.meth])

    # -------------------------------------------------------------- interleaved SUM
    def sum_runs(self, wl: Workload, ps: list[int]) -> None:
        rw = RInt(1)
        rw.append(wl.keys[: wl.warm], wl.ts[: wl.warm], wl.vol[: wl.warm, None])
        horizon = int(wl.ts[wl.warm - 1]) - MAX_T
        rw.expire(horizon)
        rest_k, rest_t = wl.keys[wl.warm :], wl.ts[wl.warm :]
        n = wl.keys.shape[0]
        ones = np.ones(n, np.int64)
        vals = wl.vol[:, None].copy()
        vh, vl = fx.split_many(vals)
        racers = []
        for meth, p in [(PAPER_NAIVE, None)] + [(CI, p) for p in ps]:
            r = _clone(rw)
            r._prepare(rest_k, rest_t)
            extra: dict = {}
            if meth == CI:
                assert p is not None
                ci = CISum(p, unit=100.0)
                ci.update(wl.keys[: wl.warm], wl.ts[: wl.warm], wl.vol[: wl.warm])
                ci.expire(horizon)
                extra["bytes_per_key"] = ci.bytes_per_key()
                ci._grow(wl.K, int(ci.m.max()) + int(wl.vol[wl.warm :].sum() / 100) + 1)
                self._measure_relayout(ci, extra)
                slo, ssure = _slots([ci.plan(float(v), None) for v in wl.rule_sv])
                c = _ci_state(ci)
                cstate = (*c[:-2], ci.csum, *c[-2:])
                unit = ci.unit
            else:
                unit = 100.0
                slo = ssure = np.zeros(len(wl.rule_sv), np.int64)
                c = _no_ci_state(wl.K)
                cstate = (*c[:-2], np.zeros(1), *c[-2:])
            out = np.empty(wl.K, np.int64)
            sure = np.empty(wl.K, np.bool_)
            head_args = (wl.keys, wl.ts, vals, vh, vl, ones, wl.rule_T, wl.rule_sv, slo, ssure, unit)
            tail_args = (*_rint_args(r), *cstate, np.int64(wl.K), out, sure)
            call = _caller(drive_sum, meth, head_args, tail_args)
            call(wl.warm, wl.warm, True, 0)
            racers.append(_Racer(meth, p, call, wl.warm, extra, keep=(r, cstate)))
        self._race(racers, n, {}, wl.ts)
        for rc in racers:
            self._record("sum", wl, rc, "naive" if rc.meth != CI else "ci")

    # -------------------------------------------------------------- absolute figures
    def absolute(self, wl: Workload, p: int = 8) -> dict:
        res: dict = {}
        ci = CICount(p)
        ci.update(wl.keys[:1000], wl.ts[:1000])  # compile outside the clock
        ci = CICount(p)
        t0 = self.clock()
        for a in range(0, wl.keys.shape[0], 100_000):
            ci.update(wl.keys[a : a + 100_000], wl.ts[a : a + 100_000])
        dt = self.clock() - t0
        res["ci_count_api_batched_updates_per_s"] = wl.keys.shape[0] / dt
        ones = np.ones(wl.keys.shape[0], np.int64)
        ci2 = CICount(p)
        ci2._grow(wl.K, wl.keys.shape[0])
        levels_update(wl.keys[:10], wl.ts[:10], ones[:10], ci2.m, ci2.TS, ci2.BM, ci2.BM2, p, ci2.L)
        ci2 = CICount(p)
        ci2._grow(wl.K, wl.keys.shape[0])
        t0 = self.clock()
        levels_update(wl.keys, wl.ts, ones, ci2.m, ci2.TS, ci2.BM, ci2.BM2, p, ci2.L)
        res["ci_count_kernel_updates_per_s"] = wl.keys.shape[0] / (self.clock() - t0)
        r = RInt(0)
        r.append(wl.keys, wl.ts)
        now = int(wl.ts[-1])
        exact_count(ci, r, int(wl.rule_T[0]), now, int(wl.rule_v[0]), None)  # compile outside the clock
        # one exact lookup through the public Python API (candidates + post-check)
        reps = 0
        t0 = self.clock()
        while self.clock() - t0 < min(1.0, self.budget_s):
            for T, v in zip(wl.rule_T, wl.rule_v, strict=True):
                exact_count(ci, r, int(T), now, int(v), None)
            reps += len(wl.rule_T)
        res["ci_count_api_exact_lookups_per_s"] = reps / (self.clock() - t0)
        res["ci_count_bytes_per_key"] = ci.bytes_per_key()
        res["ci_count_levels"] = ci.L
        res["ci_count_p1_bytes_per_key"] = _bpk(wl, 1)
        res["rint_bytes_per_event"] = r.nbytes / wl.keys.shape[0]
        return res

    @staticmethod
    def _fmt(r: Run) -> str:
        extra = " ".join(
            (f"{k}={v:,.0f}" if abs(v) >= 10 else f"{k}={v:.4f}") if isinstance(v, float) else f"{k}={v}"
            for k, v in r.extra.items()
        )
        return (
            f"{r.bench:5s} K={r.K:>7,d} sel={r.selectivity:6.2%} {r.method:11s} p={r.p:<2d} "
            f"{r.inputs_per_s:>12,.0f} inputs/s  ({r.inputs:,} inputs in {r.seconds:.2f}s; "
            f"hits/lookup {r.hits_per_lookup:.1f} = {r.measured_selectivity:.2%}, cands {r.cands_per_lookup:.1f}) {extra}"
        )


def _bpk(wl: Workload, p: int) -> float:
    ci = CICount(p)
    ci.update(wl.keys, wl.ts)
    return ci.bytes_per_key()


# ---------------------------------------------------------------------------- ablation
@nb.njit(cache=True)
def _ablation_lookups(reps, q_T, q_u, slo, ssure, now, K, TS, BM, BM2, act, bma, bma2, key_of, out, sure,
                      head, end, base_cnt, tot, unit, c_ts, c_cnt, mode, scr_i, scr_j, scr_t):  # fmt: skip
    """reps lookups at a fixed now: mode 0 = index candidates only; 1 = + the unproven ones
    checked one dependent read at a time (kth_one); 2 = + the batched check (check_count);
    3 = count the blocks of 16 positions whose summary passed. Returns (hits, blocks)."""
    hits = 0
    blocks = 0
    for r in range(reps):
        q = r % q_T.shape[0]
        t = now - q_T[q]
        n = levels_lookup(slo[q], -1, ssure[q], -1, t, K, TS, BM, BM2, act, bma, bma2, out, sure)
        if mode == 0:
            hits += n
        elif mode == 3:  # not timed: blocks whose summary passed
            for b in range((K + 15) >> 4):
                if BM[slo[q], b] > t:
                    blocks += 1
        elif mode == 1:
            for j in range(n):
                if (
                    sure[j]
                    or kth_one(key_of[out[j]], q_u[q], head, end, base_cnt, tot, unit, c_ts, c_cnt) > t
                ):
                    hits += 1
        else:
            hits += check_count(out, sure, n, key_of, q_u[q], -1, t, head, end, base_cnt, tot, unit, c_ts, c_cnt,
                                scr_i, scr_j, scr_t)  # fmt: skip
    return hits, blocks


def ablation(bench: Bench, seed: int, quick: bool) -> None:
    """Exact lookups/s at the end of the day on the same data: with and without the relayout of
    the key positions, and with the unproven candidates checked one at a time or batched."""
    cases = [(5000, 300_000 if quick else 2_000_000, 0.04, 64, seed)]
    if not quick:
        cases.append((500_000, 8_000_000, 0.001, 32, seed + 500_000))
    print("\n## ablation: exact lookups/s at the end state, p = 8 (same data, same rules)")
    for K, n, sel, R, sd in cases:
        wl = make_workload(K, n, sel, R, sd)
        r = RInt(0)
        r.append(wl.keys, wl.ts)
        now = np.int64(wl.ts[-1])
        kc = r._kcols
        for every in (0, None):
            ci = CICount(8, relayout_every=every)
            ci.update(wl.keys, wl.ts)
            if every is None:
                ci.relayout()
            slo, ssure = _slots([ci.plan(int(v), None) for v in wl.rule_v])
            out, sure = np.empty(K, np.int64), np.empty(K, np.bool_)
            scr = tuple(np.empty(K, np.int64) for _ in range(3))
            args = (wl.rule_T, wl.rule_v + 1, slo, ssure, now, ci._K, ci.TS, ci.BM, ci.BM2, ci.act, ci.bma, ci.bma2,
                    ci.key_of, out, sure, r._pool.head, r._pool.end, kc["base_cnt"], kc["tot"], kc["unit"],
                    r._cols["ts"], r._cols["cnt"])  # fmt: skip
            res = []
            for mode in (0, 1, 2):
                _ablation_lookups(4, *args, mode, *scr)
                reps, dt = 0, 0.0
                while dt < min(1.0, bench.budget_s):
                    t0 = bench.clock()
                    _ablation_lookups(1000, *args, mode, *scr)
                    dt += bench.clock() - t0
                    reps += 1000
                res.append(reps / dt)
            _, blocks = _ablation_lookups(len(wl.rule_T), *args, 3, *scr)
            name = "relayout by activity" if every is None else "first-seen positions"
            print(f"  K={K:>7,d} sel={sel:.1%} {name:21s}: blocks/lookup {blocks / len(wl.rule_T):6.1f} of "
                  f"{K // 16:,}; lookups/s: candidates only {res[0]:>11,.0f}, + one-at-a-time check {res[1]:>11,.0f}, "
                  f"+ batched check {res[2]:>11,.0f}")  # fmt: skip


# ---------------------------------------------------------------------------- report
def rate(r: Run) -> float:
    """Interleaved inputs/s, for CI with the periodic relayout's cost amortized in (conservative)."""
    return float(r.extra.get("inputs_per_s_with_amortized_relayout", r.inputs_per_s))


def table(runs: list[Run]) -> str:
    lines = [
        "| bench | keys | target sel. | measured sel. | method | p | inputs/s | incl. amortized relayout | vs paper-naive | vs best-naive | exact lookups/s |",
        "|---|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    base: dict[tuple, dict[str, float]] = {}
    for r in runs:
        base.setdefault((r.bench, r.K, r.selectivity), {})
        if r.method != "ci":
            base[(r.bench, r.K, r.selectivity)][r.method] = r.inputs_per_s
    for r in runs:
        b = base[(r.bench, r.K, r.selectivity)]
        pn = b.get("paper-naive") or b.get("naive") or float("nan")
        bn = b.get("best-naive")
        lps = r.extra.get("lookups_per_s")
        am = r.extra.get("inputs_per_s_with_amortized_relayout")
        lines.append(
            f"| {r.bench} | {r.K:,} | {r.selectivity:.1%} | {r.measured_selectivity:.2%} | {r.method} | "
            f"{r.p or ''} | {r.inputs_per_s:,.0f} | {(f'{am:,.0f}' if am else '')} | {rate(r) / pn:.1f}x | "
            f"{(f'{rate(r) / bn:.1f}x' if bn else '')} | {(f'{lps:,.0f}' if lps else '')} |"
        )
    return "\n".join(lines)


def plots(runs: list[Run], outdir: Path, ps: list[int]) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    outdir.mkdir(parents=True, exist_ok=True)
    made = []
    for bench, fname, title in (
        ("p", "ci_count_vs_p.png", "CI-COUNT + post-check vs p (cf. Figure 12), 5,000 keys"),
        ("sum", "ci_sum_vs_p.png", "CI-SUM + post-check vs p, 5,000 keys, share volumes"),
    ):
        rs = [r for r in runs if r.bench == bench]
        if not rs:
            continue
        fig, ax = plt.subplots(figsize=(6.4, 4))
        ci = sorted((r for r in rs if r.method == "ci"), key=lambda r: r.p)
        ax.plot([r.p for r in ci], [rate(r) for r in ci], "o-", label="CI + exact post-check")
        for r in rs:
            if r.method != "ci":
                ax.axhline(r.inputs_per_s, ls="--", color="gray" if r.method == "paper-naive" or r.method == "naive" else "C1",
                           label=r.method)  # fmt: skip
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("p (sub-levels per level; eps ~ 2/p)")
        ax.set_ylabel("inputs/s (updates + lookups)")
        ax.set_title(title, fontsize=9)
        ax.legend(fontsize=8)
        ax.grid(True, which="both", alpha=0.3)
        fig.tight_layout()
        path = outdir / fname
        fig.savefig(path, dpi=110)
        plt.close(fig)
        made.append(path)
    rs = [r for r in runs if r.bench == "scale"]
    if rs:
        Ks = sorted({r.K for r in rs})
        sels = sorted({r.selectivity for r in rs}, reverse=True)
        styles = (("paper-naive", "s--"), ("best-naive", "^-."), ("ci", "o-"))
        fig, axes = plt.subplots(2, max(len(Ks), len(sels)), figsize=(4.2 * max(len(Ks), len(sels)), 7.6),
                                 sharey=True, squeeze=False)  # fmt: skip
        for ax, K in zip(axes[0], Ks, strict=False):
            for meth, style in styles:
                pts = sorted((r.selectivity, rate(r)) for r in rs if r.K == K and r.method == meth)
                if pts:
                    ax.plot([100 * s for s, _ in pts], [v for _, v in pts], style, label=meth)
            ax.set_xscale("log")
            ax.invert_xaxis()
            ax.set_title(f"{K:,} keys", fontsize=9)
            ax.set_xlabel("selectivity (%)")
        for ax, sel in zip(axes[1], sels, strict=False):
            for meth, style in styles:
                pts = sorted((r.K, rate(r)) for r in rs if r.selectivity == sel and r.method == meth)
                if pts:
                    ax.plot([k for k, _ in pts], [v for _, v in pts], style, label=meth)
            ax.set_xscale("log")
            ax.set_title(f"selectivity {sel:.1%}", fontsize=9)
            ax.set_xlabel("keys")
        for row in axes:
            row[0].set_ylabel("inputs/s (updates + lookups)")
            row[0].legend(fontsize=8)
            for ax in row:
                ax.set_yscale("log")
                ax.grid(True, which="both", alpha=0.3)
        fig.suptitle(f"COUNT rules, p = 8 (CI incl. amortized relayouts): keys {', '.join(f'{k:,}' for k in Ks)}; "
                     f"selectivity {', '.join(f'{s:.1%}' for s in sels)}", fontsize=9)  # fmt: skip
        fig.tight_layout()
        path = outdir / "ci_count_scale.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        made.append(path)
    return made


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="smoke run (< 1 minute), no figures")
    ap.add_argument("--budget", type=float, default=None, help="seconds per method and configuration")
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "img", help="directory of the PNG plots")
    ap.add_argument("--json", type=Path, default=None, help="write all measurements as JSON here")
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--wall", action="store_true", help="measure wall-clock instead of process CPU time")
    ap.add_argument("--ablation", action="store_true", help="only the ablation of relayout / batched check")
    ap.add_argument(
        "--only-heavy", action="store_true", help="only the 500,000-key / 0.1%% section with p = 8, 16, 32"
    )
    args = ap.parse_args(argv)
    quick = args.quick
    budget = args.budget if args.budget is not None else (0.4 if quick else 2.5)
    bench = Bench(budget, chunk=16_384, wall=args.wall)
    cmd = (
        "python bench/ci_index_bench.py"
        + (" --quick" if quick else "")
        + (" --only-heavy" if args.only_heavy else "")
        + (" --ablation" if args.ablation else "")
    )
    clock = "wall-clock" if args.wall else "process CPU time"
    print(f"# {cmd}  (budget {budget}s {clock} per run; {platform.machine()}, numba {nb.__version__})")
    t_start = time.perf_counter()

    if args.ablation:
        ablation(bench, args.seed, quick)
        return 0
    n5k = 300_000 if quick else 2_000_000
    ps = [1, 8] if quick else [1, 2, 4, 8, 16, 32, 64]
    absolute: dict = {}
    if not args.only_heavy:
        wl = make_workload(5000, n5k, 0.04, 64, args.seed)
        print(
            f"\n## CI-COUNT vs p: 5,000 keys, {n5k:,} events, 4% selectivity (paper section 6.3, Figure 12)"
        )
        bench.count_runs(wl, ps, [PAPER_NAIVE, BEST_NAIVE, CI], label="p")
        print("\n## CI-SUM vs p: 5,000 keys, share volumes, 4% selectivity")
        bench.sum_runs(wl, [8] if quick else [1, 2, 4, 8, 16, 32])
        absolute = bench.absolute(wl)
        print("\n## absolute (5,000 keys, p = 8)")
        for k, v in absolute.items():
            print(f"  {k}: {v:,.1f}")

    if not quick:
        for first_seen, hps in ((False, [8, 16, 32]), (True, [8])):
            order = "ids in first-seen order" if first_seen else "hot keys scattered over the ids"
            print(f"\n## heavy hitters: 500,000 keys, 0.1% selectivity, {order}, p = {hps}")
            w2 = make_workload(500_000, 8_000_000, 0.001, 32, args.seed + 500_000, first_seen=first_seen)
            bench.count_runs(
                w2, hps, [PAPER_NAIVE, BEST_NAIVE, CI], label="heavy-1st" if first_seen else "heavy"
            )
            del w2

    if not quick and not args.only_heavy:
        print("\n## scale: keys x selectivity, p = 8")
        for K, n in ((5000, 2_000_000), (50_000, 4_000_000), (500_000, 8_000_000)):
            for sel in (0.05, 0.01, 0.001):
                w2 = make_workload(K, n, sel, 32, args.seed + K)
                bench.count_runs(w2, [8], [PAPER_NAIVE, BEST_NAIVE, CI], label="scale")
                del w2

    print("\n## table\n")
    print(table(bench.runs))
    print(f"\ntotal {time.perf_counter() - t_start:.0f}s")
    if not quick and not args.only_heavy:
        for p in plots(bench.runs, args.out, ps):
            print(f"wrote {p}")
    if args.json:
        args.json.write_text(
            json.dumps(
                {"command": cmd, "runs": [asdict(r) for r in bench.runs], "absolute": absolute}, indent=1
            )
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
