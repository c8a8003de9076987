"""CI-COUNT: the collective index for many COUNT threshold rules over all keys
(Arasu & Widom 2004, section 4.1, Figure 7; parameterized by p as in section 4.1.2).

One index answers every SSF operator ``{k | COUNT(S_k(now - T, now]) in R}`` over one
(filtered) stream, for any window T and any range R: ``candidates`` returns, in
O(K / 64 + |K_ao|), a superset of the exact answer whose members all satisfy the relaxed
range (eps = 2 / (p + 2), see :mod:`engine.algorithms._levels`). Exact results come from
post-checking the candidates with R-INT (:func:`post_check_count`): ``COUNT >= u`` exactly when
the key's u-th newest timestamp is later than ``now - T``.

Batches of ``(key, ts, mult)`` rows serve raw events (mult = 1) and pane rows (mult = the
pane's count) alike; a row of multiplicity a costs O(p log a), not O(a) (section 4.2).
Precondition of a lookup: every applied timestamp is ``<= now``.

Internally keys live at *positions* of the index (first-seen order, periodically renumbered by
decreasing activity, see :func:`engine.algorithms._levels.relayout`), so that the busy keys a
threshold lookup returns share a few blocks of the search index; the arrays ``TS``, ``m``,
``act`` are indexed by position (``pos_of`` / ``key_of`` map ids and positions). Every public
method takes and returns key ids.
"""

from __future__ import annotations

from collections.abc import Callable

import numba as nb
import numpy as np

from ._levels import (
    BLOCK2_SHIFT,
    BLOCK_SHIFT,
    LookupPlan,
    SlotTable,
    assign_positions,
    batch_max_units,
    build_plan,
    check_count,
    count_range,
    eps_of,
    eps_upper_of,
    groups_needed,
    levels_lookup,
    levels_update,
    rebuild_act_blocks,
    recompute_blocks,
    relayout,
    relayout_due,
    reset_expired,
    touch,
)
from ._pool import INT64_MIN, Packing, as_keys, order_batch, unpack
from ._spare import SPARE_AT, Spares, adopt, spare_array, wants_spare
from .rint import RInt, count_filter

_MISSING = object()
_NO_AUX = np.zeros(0, np.float64)


def groups_allocated(L: int) -> int:
    """Groups to allocate for ``L`` in use: ``L + max(2, L / 2)``, so that a count's growth copies
    the tables only O(log log m) times.  The rows of groups not in use are address space only
    (np.empty, never touched until they come into use), so a restored index gets the same room
    rather than growing at its first larger count."""
    return L + max(2, L // 2)


class CICount:
    """CI-COUNT over all keys of one substream family, with p sub-levels per level.

    ``relayout_every``: rows between two renumberings of the key positions by activity (None:
    max(65536, 4 K); 0: never)."""

    _kind = "cicount"
    TS: np.ndarray  # int64[La * p, Kcap]: slot timestamps by position, slot-major; rows >= L * p unused
    BM: np.ndarray  # int64[La * p, Kcap / 16]: slot maxima over blocks of 16 positions
    BM2: np.ndarray  # int64[La * p, Kcap / 256]: slot maxima over blocks of 256 positions
    m: np.ndarray  # int64[Kcap]: units (events) per position so far
    act: np.ndarray  # int64[Kcap]: newest event timestamp per position
    bma: np.ndarray  # block maxima of act (16 positions)
    bma2: np.ndarray  # block maxima of act (256 positions)
    score: np.ndarray  # int64[Kcap]: recent activity per position (units, halved at each relayout)
    pos_of: np.ndarray  # int64[Kcap]: key id -> position (-1: not seen)
    key_of: np.ndarray  # int64[Kcap]: position -> key id

    def __init__(self, p: int = 8, relayout_every: int | None = None) -> None:
        if p < 1:
            raise ValueError("p must be >= 1")
        self.p = int(p)
        self.L = 1  # groups in use
        self.relayout_every = -1 if relayout_every is None else max(0, int(relayout_every))
        self._K = 0  # positions in use (keys seen)
        self._nid = 0  # largest key id seen + 1
        self._since = 0  # rows since the last relayout
        self._plans: dict[tuple, LookupPlan | None] = {}
        #: the slot tables of the next key growth, made ahead (:mod:`engine.algorithms._spare`):
        #: TS, BM and BM2 for twice the positions and the groups allocated now
        self._spares = Spares()
        self._alloc(64, 1)

    # ----------------------------------------------------------------- storage
    @property
    def La(self) -> int:
        """Groups allocated (>= L): rows of groups not yet in use are reserved, never touched."""
        return self.TS.shape[0] // self.p

    def _alloc(self, kcap: int, La: int) -> None:
        """(Re)allocate for kcap positions and La groups; the groups in use (self.L) are copied
        or initialized, the rest of the rows stay untouched (np.empty: no memory committed)."""
        S, Su = La * self.p, self.L * self.p
        spare = self._spares.spend()
        if spare and spare["TS"].shape[0] == S and spare["TS"].shape[1] >= kcap:
            TS, BM, BM2 = (adopt(spare[n]) for n in ("TS", "BM", "BM2"))  # a key growth takes them
            kcap = TS.shape[1]
        else:
            nb1 = (kcap >> BLOCK_SHIFT) + 1
            nb2 = (kcap >> BLOCK2_SHIFT) + 1
            TS = np.empty((S, kcap), np.int64)
            BM = np.empty((S, nb1), np.int64)
            BM2 = np.empty((S, nb2), np.int64)
        nb1, nb2 = BM.shape[1], BM2.shape[1]
        m = np.zeros(kcap, np.int64)
        act = np.full(kcap, INT64_MIN, np.int64)
        bma = np.full(nb1, INT64_MIN, np.int64)
        bma2 = np.full(nb2, INT64_MIN, np.int64)
        score = np.zeros(kcap, np.int64)
        pos_of = np.full(kcap, -1, np.int64)
        key_of = np.full(kcap, -1, np.int64)
        if hasattr(self, "TS"):
            k0 = self.TS.shape[1]
            TS[:Su, :k0] = self.TS[:Su]
            TS[:Su, k0:] = INT64_MIN
            BM[:Su, : self.BM.shape[1]] = self.BM[:Su]
            BM[:Su, self.BM.shape[1] :] = INT64_MIN
            BM2[:Su, : self.BM2.shape[1]] = self.BM2[:Su]
            BM2[:Su, self.BM2.shape[1] :] = INT64_MIN
            for new, old in ((m, self.m), (act, self.act), (score, self.score), (pos_of, self.pos_of),
                             (key_of, self.key_of), (bma, self.bma), (bma2, self.bma2)):  # fmt: skip
                new[: old.shape[0]] = old
        else:
            TS[:Su] = INT64_MIN
            BM[:Su] = INT64_MIN
            BM2[:Su] = INT64_MIN
        self.TS, self.BM, self.BM2, self.m, self.act, self.bma, self.bma2 = TS, BM, BM2, m, act, bma, bma2
        self.score, self.pos_of, self.key_of = score, pos_of, key_of
        self._out = np.empty(kcap, np.int64)
        self._sure = np.empty(kcap, np.bool_)
        self._scr = (np.empty(kcap, np.int64), np.empty(kcap, np.int64), np.empty(kcap, np.int64))
        self._tab: SlotTable | None = None

    def _use_levels(self, L: int) -> None:
        """Bring groups self.L..L-1 into use (rows already allocated): fill them empty."""
        a, b = self.L * self.p, L * self.p
        self.TS[a:b] = INT64_MIN
        self.BM[a:b] = INT64_MIN
        self.BM2[a:b] = INT64_MIN
        self.L = L
        self._tab = None

    def _grow(self, nkeys: int, max_m: int) -> None:
        """Room for key ids < nkeys and max_m units per key. Both dimensions grow geometrically
        (keys x2; groups: L needed + max(2, L / 2) allocated), so a table is copied only
        O(log K + log log m) times; groups are only filled when they come into use."""
        kcap = self.TS.shape[1]
        L = max(self.L, groups_needed(self.p, max_m))
        La = self.La
        if nkeys > kcap or L > La:
            new_cap = max(kcap, nkeys, 2 * kcap if nkeys > kcap else 0)
            self._alloc(new_cap, max(La, groups_allocated(L)) if L > La else La)
        if L > self.L:
            self._use_levels(L)

    def reserve_keys(self, n_ids: int) -> None:
        """Capacity hint: key ids ``< n_ids`` will come.  Allocates room for them at once (at
        least doubling), so a caller that knows its key domain (the backtest interns a whole
        file's keys first) pays one allocation instead of log K table copies."""
        kcap = self.TS.shape[1]
        if n_ids > kcap:
            self._alloc(max(int(n_ids), 2 * kcap), self.La)
        self._plan_spare(int(n_ids))

    def _plan_spare(self, n_ids: int) -> None:
        """Make the slot tables of the next key growth ahead once key ids reach :data:`SPARE_AT`
        of the positions allocated (``n_ids``: the key ids known now) and the tables' rows in use
        want one (:func:`engine.algorithms._spare.wants_spare`): twice the positions, the groups
        allocated now.  Only the rows of the groups in use are handed to :meth:`take_spares` to be
        faulted in (the rows of later groups are never touched until they come into use, as in
        :meth:`_alloc`).
        A growth of the groups (``La``) cannot use them: it lets them go."""
        kcap = self.TS.shape[1]
        if self._spares or n_ids < SPARE_AT * kcap or not wants_spare(self.L * self.p * kcap * 8):
            return
        S, Su, k2 = self.TS.shape[0], self.L * self.p, 2 * kcap
        tables = {
            "TS": spare_array((S, k2), np.int64),
            "BM": spare_array((S, (k2 >> BLOCK_SHIFT) + 1), np.int64),
            "BM2": spare_array((S, (k2 >> BLOCK2_SHIFT) + 1), np.int64),
        }
        self._spares.hold(tables, warm=[t[:Su] for t in tables.values()])

    def take_spares(self) -> list[np.ndarray]:
        """The slot tables' rows made ahead since the last call (:meth:`_plan_spare`), for the
        runtime to fault in off the batch (:class:`engine.runtime.prefault.SpareWarmer`); each
        is handed out once."""
        return self._spares.take_new()

    @property
    def eps(self) -> float:
        """Relative error of lower-bounded lookups: candidates of ``count > v`` have
        ``count > v (1 - eps)`` (3/4 for p = 1, 2 / (p + 2) otherwise)."""
        return eps_of(self.p)

    @property
    def eps_upper(self) -> float:
        """Relative error of upper-bounded lookups: candidates of ``count < v`` have
        ``count < v (1 + eps_upper)`` (3 for p = 1, 2 / p otherwise)."""
        return eps_upper_of(self.p)

    @property
    def n_keys(self) -> int:
        """Largest key id seen + 1."""
        return self._nid

    def units(self, key_ids: np.ndarray) -> np.ndarray:
        """Units (events for CI-COUNT) applied per key since it was last forgotten by expire."""
        keys = as_keys(key_ids)
        out = np.zeros(keys.shape[0], np.int64)
        ok = keys < self._nid
        q = self.pos_of[keys[ok]]
        out[ok] = np.where(q >= 0, self.m[np.maximum(q, 0)], 0)
        return out

    def _aux(self) -> np.ndarray:
        """Per-position float64 state of subclasses, permuted by relayouts."""
        return _NO_AUX

    # ----------------------------------------------------------------- update
    def _positions(self, keys: np.ndarray) -> np.ndarray:
        """Positions of the keys of a batch (new keys get the next free ones)."""
        nkeys = int(keys.max()) + 1
        if nkeys > self.TS.shape[1]:
            self._grow(nkeys, 0)
        self._nid = max(self._nid, nkeys)
        pos, self._K = assign_positions(keys, self.pos_of, self.key_of, self._K)
        self._plan_spare(self._nid)
        return pos

    def _apply(self, pos: np.ndarray, ts: np.ndarray, units: np.ndarray, ordered: bool = False) -> None:
        """Apply rows given by position (ordered: already in per-key ts order and validated)."""
        n = pos.shape[0]
        if n == 0:
            return
        if ts.shape[0] != n or units.shape[0] != n:
            raise ValueError("key_ids, ts and mult must have the same length")
        if units.min() < 0:
            raise ValueError("multiplicities must be >= 0")
        if not ordered:
            order = order_batch(pos, ts, self.act)
            if order is not None:
                pos, ts, units = pos[order], ts[order], units[order]
        self._grow(0, int(batch_max_units(pos, units, self.m)))
        levels_update(pos, ts, units, self.m, self.TS, self.BM, self.BM2, self.p, self.L)
        touch(pos, ts, units, self.act, self.bma, self.bma2, self.score)
        self._since += n
        if relayout_due(self._since, self._K, self.relayout_every):
            self.relayout()

    def relayout(self) -> None:
        """Renumber the key positions by decreasing recent activity (see
        :func:`engine.algorithms._levels.relayout`); answers are unchanged."""
        relayout(self._K, self.L * self.p, self.score, self.TS, self.BM, self.BM2, self.m, self.act, self.bma,
                 self.bma2, self.key_of, self.pos_of, self._aux())  # fmt: skip
        self._since = 0

    def update(self, key_ids: np.ndarray, ts: np.ndarray, mult: np.ndarray | None = None) -> None:
        """Apply a batch of rows; each stands for ``mult`` events (default 1) at its ts."""
        keys = as_keys(key_ids)
        if keys.shape[0] == 0:
            return
        t = np.ascontiguousarray(ts, dtype=np.int64)
        mu = np.ones(keys.shape[0], np.int64) if mult is None else np.ascontiguousarray(mult, dtype=np.int64)
        if t.shape[0] != keys.shape[0] or mu.shape[0] != keys.shape[0]:
            raise ValueError("key_ids, ts and mult must have the same length")
        self._apply(self._positions(keys), t, mu)

    def expire(self, before_ts: int) -> None:
        """Forget keys with no event after before_ts (their state restarts empty)."""
        S = self.L * self.p
        blocks = reset_expired(np.int64(before_ts), self._K, self.m, self.TS, self.act, S)
        if blocks.shape[0]:
            recompute_blocks(self.TS, self.BM, self.BM2, blocks, self._K, S)

    # ----------------------------------------------------------------- lookup
    def _table(self) -> SlotTable:
        tab = self._tab
        if tab is None or tab.L != self.L:
            tab = self._tab = SlotTable(self.p, self.L)
        return tab

    def plan(
        self, lo: float | None, hi: float | None, lo_strict: bool = True, hi_strict: bool = True
    ) -> LookupPlan | None:
        """Slots of a lookup of ``COUNT in (lo, hi)`` (SUM for CI-SUM; None: the answer is empty)."""
        key = (self.L, lo, hi, lo_strict, hi_strict)
        pl = self._plans.get(key, _MISSING)
        if pl is _MISSING:
            if len(self._plans) > 4096:
                self._plans.clear()
            pl = self._plans[key] = self._make_plan(lo, hi, lo_strict, hi_strict)
        return pl  # type: ignore[return-value]

    def _ranges(
        self, lo: float | None, hi: float | None, lo_strict: bool, hi_strict: bool
    ) -> tuple[int | None, int | None, int | None, int | None, int]:
        """(u, w, u_sure, w_sure, min_units) of :func:`engine.algorithms._levels.build_plan`."""
        u, w = count_range(lo, hi, lo_strict, hi_strict)
        return u, w, u, w, 1

    def _make_plan(
        self, lo: float | None, hi: float | None, lo_strict: bool, hi_strict: bool
    ) -> LookupPlan | None:
        return build_plan(self._table(), *self._ranges(lo, hi, lo_strict, hi_strict))

    def lookup(
        self,
        T: int,
        now: int,
        lo: float | None,
        hi: float | None,
        lo_strict: bool = True,
        hi_strict: bool = True,
    ) -> tuple[np.ndarray, np.ndarray]:
        """(candidates, sure): the candidates of :meth:`candidates` in key order and a mask of
        those the index alone proves to be in the exact answer (the rest needs the post-check)."""
        pl = self.plan(lo, hi, lo_strict, hi_strict)
        if pl is None:
            return np.empty(0, np.int64), np.empty(0, bool)
        return self._run(pl, np.int64(now) - np.int64(T))

    def _run(self, pl: LookupPlan, t: np.int64) -> tuple[np.ndarray, np.ndarray]:
        n = levels_lookup(
            pl.s_lo, pl.s_up, pl.sure_lo, pl.sure_up, t, self._K, self.TS, self.BM, self.BM2, self.act, self.bma,
            self.bma2, self._out, self._sure,
        )  # fmt: skip
        keys = self.key_of[self._out[:n]]
        order = np.argsort(keys)
        return keys[order], self._sure[:n][order]

    def candidates(
        self,
        T: int,
        now: int,
        lo: float | None,
        hi: float | None,
        lo_strict: bool = True,
        hi_strict: bool = True,
    ) -> np.ndarray:
        """Key ids whose COUNT (SUM for CI-SUM) over (now - T, now] may lie in the range (lo, hi).

        A superset of the exact answer in key order; every returned key has at least one event
        in the window and a value within the relaxed range (see :meth:`guarantee`)."""
        return self.lookup(T, now, lo, hi, lo_strict, hi_strict)[0]

    def guarantee(
        self, lo: float | None, hi: float | None, lo_strict: bool = True, hi_strict: bool = True
    ) -> tuple[float, float | None]:
        """(min, max) count every candidate is guaranteed to have (max None: unbounded)."""
        pl = self.plan(lo, hi, lo_strict, hi_strict)
        if pl is None:
            return 0, None
        return pl.gmin, pl.gmax

    # ----------------------------------------------------------------- state
    @property
    def nbytes(self) -> int:
        """Bytes of state in use: the rows of the groups in use (rows reserved for later groups
        are address space only) and the per-position arrays."""
        S = self.L * self.p
        n = S * (self.TS.shape[1] + self.BM.shape[1] + self.BM2.shape[1]) * 8
        arrays = (self.m, self.act, self.bma, self.bma2, self.score, self.pos_of, self.key_of)
        return int(n + sum(a.nbytes for a in arrays))

    def bytes_per_key(self) -> float:
        """Index state per key in use: the L p slot timestamps with their share of the block
        summaries (1/16 + 1/256), and count, newest ts, activity, pos_of, key_of."""
        if not self._K:
            return 0.0
        S = self.L * self.p
        return S * 8 * (1 + 1 / (1 << BLOCK_SHIFT) + 1 / (1 << BLOCK2_SHIFT)) + 5 * 8

    def to_bytes(self) -> bytes:
        return self._packing().to_bytes()

    def capture_bytes(self) -> Callable[[], bytes]:
        """:meth:`to_bytes` of now, made by the callable returned whenever it is called (it holds
        copies of the arrays)."""
        return self._packing().later()

    def _packing(self) -> Packing:
        K = self._K
        arrays = {"TS": self.TS[: self.L * self.p, :K], "m": self.m[:K], "act": self.act[:K],
                  "key_of": self.key_of[:K], "score": self.score[:K]}  # fmt: skip
        meta: dict[str, int | float] = {
            "p": self.p,
            "L": self.L,
            "K": K,
            "nid": self._nid,
            "since": self._since,
            "every": self.relayout_every,
        }
        return Packing(self._kind, arrays, meta)

    @classmethod
    def from_bytes(cls, b: bytes) -> CICount:
        kind, _, rest = b.partition(b"\x00")
        if kind.decode() != cls._kind:
            raise ValueError(f"bytes hold a {kind.decode()!r}, not a {cls._kind!r}")
        arrays, meta = unpack(rest)
        obj = cls(int(meta["p"]))
        K = int(meta["K"])
        key_of = arrays["key_of"] if "key_of" in arrays else np.arange(K, dtype=np.int64)  # older format
        nid = int(meta["nid"]) if "nid" in meta else K
        obj.relayout_every = int(meta["every"]) if "every" in meta else -1
        obj._since = int(meta["since"]) if "since" in meta else 0
        obj._alloc(max(64, K, nid), groups_allocated(int(meta["L"])))  # room to grow, as _grow leaves
        obj._use_levels(int(meta["L"]))
        obj._K, obj._nid = K, nid
        obj.TS[: obj.L * obj.p, :K] = arrays["TS"]
        obj.m[:K] = arrays["m"]
        obj.act[:K] = arrays["act"]
        obj.key_of[:K] = key_of
        obj.pos_of[key_of] = np.arange(K, dtype=np.int64)
        if "score" in arrays:
            obj.score[:K] = arrays["score"]
        obj._restore_extra(arrays)
        blocks = np.arange((K >> BLOCK_SHIFT) + 1, dtype=np.int64) if K else np.zeros(0, np.int64)
        recompute_blocks(obj.TS, obj.BM, obj.BM2, blocks, K, obj.L * obj.p)
        rebuild_act_blocks(obj.act, obj.bma, obj.bma2, K)
        return obj

    def _restore_extra(self, arrays: dict[str, np.ndarray]) -> None:
        """Hook for subclasses."""


def post_check_count(
    rint: RInt,
    cand: np.ndarray,
    T: int,
    now: int,
    lo: float | None,
    hi: float | None,
    lo_strict: bool = True,
    hi_strict: bool = True,
) -> np.ndarray:
    """Exact filter of candidates with R-INT: ``COUNT >= u <=> kth_newest_ts(u) > now - T``.

    The R-INT must hold the same rows (with the same multiplicities) as the index."""
    cand = as_keys(cand).copy()
    u, w = count_range(lo, hi, lo_strict, hi_strict)
    if w is not None and w < 0:
        return cand[:0]
    kc = rint._kcols
    n = count_filter(
        cand, cand.shape[0], -1 if u is None else u, -1 if w is None else w, np.int64(now) - np.int64(T),
        rint._pool.head, rint._pool.end, kc["base_cnt"], kc["tot"], kc["unit"], rint._cols["ts"], rint._cols["cnt"],
    )  # fmt: skip
    return cand[:n]


@nb.njit(cache=True, nogil=True)
def exact_count_kernel(s_lo, s_up, sure_lo, sure_up, u, w, t, K, TS, BM, BM2, act, bma, bma2, key_of, out, sure,
                       scr_i, scr_j, scr_t, head, end, base_cnt, tot, unit, c_ts, c_cnt):  # fmt: skip
    """One exact lookup: index candidates (positions), the unproven ones checked with R-INT;
    out[:n] = the answer's key ids (in position order), returns n."""
    n = levels_lookup(s_lo, s_up, sure_lo, sure_up, t, K, TS, BM, BM2, act, bma, bma2, out, sure)
    return check_count(out, sure, n, key_of, u, w, t, head, end, base_cnt, tot, unit, c_ts, c_cnt, scr_i, scr_j,
                       scr_t)  # fmt: skip


def exact_count(
    ci: CICount,
    rint: RInt,
    T: int,
    now: int,
    lo: float | None,
    hi: float | None,
    lo_strict: bool = True,
    hi_strict: bool = True,
) -> np.ndarray:
    """Exact answer ``{k | COUNT(now - T, now] in (lo, hi), COUNT >= 1}`` in key order:
    CI-COUNT candidates, the ones the index cannot prove post-checked with R-INT (which must
    hold the same rows with the same multiplicities). One Numba call."""
    pl = ci.plan(lo, hi, lo_strict, hi_strict)
    if pl is None:
        return np.empty(0, np.int64)
    kc = rint._kcols
    n = exact_count_kernel(
        pl.s_lo, pl.s_up, pl.sure_lo, pl.sure_up, -1 if pl.u is None else pl.u, -1 if pl.w is None else pl.w,
        np.int64(now) - np.int64(T), ci._K, ci.TS, ci.BM, ci.BM2, ci.act, ci.bma, ci.bma2, ci.key_of, ci._out,
        ci._sure, *ci._scr, rint._pool.head, rint._pool.end, kc["base_cnt"], kc["tot"], kc["unit"], rint._cols["ts"],
        rint._cols["cnt"],
    )  # fmt: skip
    return np.sort(ci._out[:n])
