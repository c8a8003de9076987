"""A synthetic network packet stream (seeded, vectorized) with injectable attacks.

Model (see docs/feeds.md, "Packet generator"):

* **Hosts.** ``n_clients`` internal clients (10.1.0.0/16), ``n_internal_servers``
  internal servers (10.0.0.0/24: web, databases), a few DNS resolvers and
  ``n_external`` Internet servers whose popularity is Zipf(``zipf_s``).
* **Flows.** Flows start as a Poisson process (rate = packet rate / mean flow
  length) with a service mix: HTTPS, HTTP, SSH, database (TCP), DNS, QUIC, NTP
  (UDP), ping (ICMP).  A TCP flow is a handshake ``S`` → ``SA`` → ``A``, then
  data segments (``PA`` / ``A``, downloads mostly server → client, 1500-byte
  MTU segments and 52-66-byte ACKs) and a closing ``FA``; packets per flow are
  log-normal (heavy-tailed), inter-packet gaps exponential.  Clients use fresh
  ephemeral ports (32768-60999).
* **Attacks** (:class:`Attack`): ``syn_flood`` (spoofed sources, ``S`` to one
  victim), ``port_scan`` (one source, ``S`` to many ports of one target, which
  answers ``RA``/``SA``), ``heavy_hitter`` (one host uploading MTU segments at a
  high byte rate).  :func:`demo_attacks` schedules attacks that make the packet
  examples of RULES.md fire, while the normal mix at the default rate stays
  below their thresholds.

Flows that outlast a chunk carry over, so chunks are in ``ts`` order and
consecutive chunks join up.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tidewatch.wire.avro import Coded

PROTOCOLS = ("TCP", "UDP", "ICMP")
TCP, UDP, ICMP = 0, 1, 2
FLAGS = ("", "S", "SA", "A", "PA", "FA", "RA", "R")
F_NONE, F_S, F_SA, F_A, F_PA, F_FA, F_RA, F_R = range(8)
K_SYN_FLOOD, K_PORT_SCAN, K_HEAVY_HITTER = "syn_flood", "port_scan", "heavy_hitter"

# service mix: (protocol, server port, share, server pool, median packets, sigma)
#   pool: 0 external web, 1 internal servers, 2 dns resolvers
_SERVICES = [
    (TCP, 443, 0.52, 0, 12.0, 1.3),
    (TCP, 80, 0.10, 0, 10.0, 1.2),
    (TCP, 22, 0.02, 1, 40.0, 1.0),
    (TCP, 5432, 0.06, 1, 14.0, 0.8),
    (UDP, 53, 0.12, 2, 2.0, 0.0),
    (UDP, 443, 0.10, 0, 20.0, 1.2),
    (UDP, 123, 0.03, 0, 2.0, 0.0),
    (ICMP, 0, 0.05, 0, 4.0, 0.5),
]


def ip_str(ips: np.ndarray) -> list[str]:
    """Dotted quads of uint32 addresses (call on distinct addresses: one string each)."""
    a = np.asarray(ips, dtype=np.uint64)
    o = [((a >> np.uint64(s)) & np.uint64(255)).tolist() for s in (24, 16, 8, 0)]
    return [f"{w}.{x}.{y}.{z}" for w, x, y, z in zip(*o, strict=True)]


def ip_int(s: str) -> int:
    """uint32 of a dotted quad."""
    a, b, c, d = (int(x) for x in s.split("."))
    return (a << 24) | (b << 16) | (c << 8) | d


@dataclass
class PacketConfig:
    rate: float = 1000.0  # mean packets/s of normal traffic
    n_clients: int = 2000
    n_internal_servers: int = 20
    n_dns: int = 4
    n_external: int = 3000
    zipf_s: float = 0.6
    flow_seconds_median: float = 2.0


@dataclass
class Attack:
    """An injected attack over ``[start_ms, start_ms + duration_ms)``."""

    kind: str  # syn_flood | port_scan | heavy_hitter
    src: str  # attacker (ignored for syn_flood: spoofed sources)
    dst: str  # victim / target / upload destination
    start_ms: int
    duration_ms: int
    rate: float  # packets/s (syn_flood, port_scan: probes/s, heavy_hitter: MTU segments/s)

    @property
    def end_ms(self) -> int:
        return self.start_ms + self.duration_ms


@dataclass
class PacketGenerator:
    config: PacketConfig = field(default_factory=PacketConfig)
    seed: int = 0
    attacks: list[Attack] = field(default_factory=list)

    def __post_init__(self) -> None:
        c = self.config
        self.rng = rng = np.random.default_rng(self.seed)
        self.clients = (ip_int("10.1.0.0") + 1 + rng.choice(65000, c.n_clients, replace=False)).astype(
            np.uint32
        )
        self.internal = (ip_int("10.0.0.0") + 10 + np.arange(c.n_internal_servers)).astype(np.uint32)
        self.dns = np.array(
            [ip_int("10.0.0.53"), ip_int("10.0.0.54"), ip_int("8.8.8.8"), ip_int("1.1.1.1")][: c.n_dns],
            np.uint32,
        )
        ext = rng.integers(ip_int("11.0.0.0"), ip_int("223.255.255.0"), c.n_external * 2, dtype=np.int64)
        ext = ext[((ext >> 24) != 127) & ((ext >> 24) != 172) & ((ext >> 24) != 192)]
        self.external = np.unique(ext)[: c.n_external].astype(np.uint32)
        rng.shuffle(self.external)
        w = np.arange(1, len(self.external) + 1, dtype=np.float64) ** -c.zipf_s
        self.ext_cum = np.cumsum(w / w.sum())
        shares = np.array([s[2] for s in _SERVICES])
        self.svc_cum = np.cumsum(shares / shares.sum())
        med = np.array([s[4] for s in _SERVICES])
        sig = np.array([s[5] for s in _SERVICES])
        mean_pk = float(
            np.sum(
                shares
                / shares.sum()
                * (np.where(np.array([s[0] for s in _SERVICES]) == TCP, 4, 0) + med * np.exp(sig**2 / 2))
            )
        )
        self.flow_rate = c.rate / mean_pk
        self._pending: dict[str, np.ndarray] | None = None

    # ----------------------------------------------------------------- normal traffic
    def _flows(self, start_ms: int, end_ms: int) -> dict[str, np.ndarray]:
        c, rng = self.config, self.rng
        span = end_ms - start_ms
        nf = int(rng.poisson(self.flow_rate * span / 1000.0))
        svc = np.minimum(np.searchsorted(self.svc_cum, rng.random(nf)), len(_SERVICES) - 1)
        proto = np.array([s[0] for s in _SERVICES], np.int8)[svc]
        sport_srv = np.array([s[1] for s in _SERVICES], np.int32)[svc]
        pool = np.array([s[3] for s in _SERVICES])[svc]
        med = np.array([s[4] for s in _SERVICES])[svc]
        sig = np.array([s[5] for s in _SERVICES])[svc]
        npk = np.maximum(1, np.rint(med * np.exp(sig * rng.standard_normal(nf)))).astype(np.int64)
        npk = np.minimum(npk + np.where(proto == TCP, 4, 0), 5000)
        client = self.clients[rng.integers(0, len(self.clients), nf)]
        ext = self.external[np.minimum(np.searchsorted(self.ext_cum, rng.random(nf)), len(self.external) - 1)]
        server = np.where(
            pool == 0,
            ext,
            np.where(
                pool == 1,
                self.internal[rng.integers(0, len(self.internal), nf)],
                self.dns[rng.integers(0, len(self.dns), nf)],
            ),
        ).astype(np.uint32)
        cport = rng.integers(32768, 61000, nf).astype(np.int32)
        fstart = start_ms + rng.integers(0, max(span, 1), nf)
        dur = c.flow_seconds_median * 1000.0 * np.exp(0.8 * rng.standard_normal(nf))
        # expand flows into packets
        P = int(npk.sum())
        fi = np.repeat(np.arange(nf), npk)
        first = np.zeros(P, bool)
        starts = np.cumsum(npk) - npk
        first[starts] = True
        j = np.arange(P) - np.repeat(starts, npk)
        last = j == np.repeat(npk - 1, npk)
        gap = rng.exponential(1.0, P) * np.repeat(dur / np.maximum(npk, 1), npk)
        gap[first] = 0.0
        cs = np.cumsum(gap)
        ts = (np.repeat(fstart, npk) + (cs - np.repeat(cs[starts], npk))).astype(np.int64)
        p = proto[fi]
        tcp = p == TCP
        # direction: True = client -> server
        c2s = np.where(j % 2 == 0, True, False)
        mid = tcp & (j >= 3) & ~last
        down = rng.random(P) < 0.65
        c2s = np.where(mid, ~down, c2s)
        c2s = np.where(tcp & (j == 2), True, c2s)
        c2s = np.where(tcp & last & (j >= 3), True, c2s)
        flags = np.full(P, F_NONE, np.int8)
        flags[tcp & (j == 0)] = F_S
        flags[tcp & (j == 1)] = F_SA
        flags[tcp & (j == 2)] = F_A
        is_data = rng.random(P) < np.where(c2s, 0.2, 0.35)
        flags[mid] = np.where(is_data[mid], F_PA, F_A)
        flags[tcp & last & (j >= 3)] = F_FA
        length = np.where(tcp, 66, 0).astype(np.int32)
        big = rng.random(P) < 0.6
        data_len = np.where(c2s, rng.integers(100, 700, P), np.where(big, 1500, rng.integers(200, 1500, P)))
        length = np.where(tcp & (flags == F_PA), data_len, length)
        length = np.where(tcp & (flags == F_A) & mid & ~c2s & big, 1500, length)
        length = np.where(tcp & (j == 0), 74, length)
        sp = sport_srv[fi]
        udp_len = np.where(
            sp == 53, np.where(c2s, 74, 190), np.where(sp == 123, 90, rng.integers(80, 1300, P))
        )
        length = np.where(p == UDP, udp_len, length)
        length = np.where(p == ICMP, 98, length).astype(np.int32)
        cli, srv, cp = client[fi], server[fi], cport[fi]
        icmp = p == ICMP
        return {
            "ts": ts,
            "src": np.where(c2s, cli, srv).astype(np.uint32),
            "dst": np.where(c2s, srv, cli).astype(np.uint32),
            "sport": np.where(icmp, 0, np.where(c2s, cp, sp)).astype(np.int32),
            "dport": np.where(icmp, 0, np.where(c2s, sp, cp)).astype(np.int32),
            "proto": p.astype(np.int8),
            "length": length,
            "flags": flags,
        }

    # ----------------------------------------------------------------- attacks
    def _attack(self, a: Attack, lo: int, hi: int) -> dict[str, np.ndarray]:
        rng = self.rng
        k = int(rng.poisson(a.rate * (hi - lo) / 1000.0))
        ts = np.sort(rng.integers(lo, hi, k)).astype(np.int64)
        dst = np.full(k, ip_int(a.dst), np.uint32)
        if a.kind == K_SYN_FLOOD:
            src = rng.integers(ip_int("11.0.0.0"), ip_int("223.0.0.0"), k).astype(np.uint32)
            return _cols(ts, src, dst, rng.integers(1024, 65536, k), np.full(k, 80), TCP, np.full(k, 60), F_S)
        src = np.full(k, ip_int(a.src), np.uint32)
        if a.kind == K_PORT_SCAN:
            # probe number i of the attack -> port (a fixed permutation of 1..65535 per attack)
            first = int(round((lo - a.start_ms) * a.rate / 1000.0))
            perm = np.random.default_rng(abs(hash((a.src, a.dst, a.start_ms))) % 2**32).permutation(65535) + 1
            ports = perm[(first + np.arange(k)) % 65535]
            probe = _cols(ts, src, dst, np.full(k, 45678), ports, TCP, np.full(k, 58), F_S)
            reply = _cols(ts + 1, dst, src, ports, np.full(k, 45678), TCP, np.full(k, 54), F_RA)
            reply["flags"][rng.random(k) < 0.02] = F_SA
            return _concat([probe, reply])
        if a.kind == K_HEAVY_HITTER:
            data = _cols(ts, src, dst, np.full(k, 51515), np.full(k, 443), TCP, np.full(k, 1500), F_PA)
            m = k // 2
            acks = _cols(
                ts[::2][:m] + 1,
                dst[:m],
                src[:m],
                np.full(m, 443),
                np.full(m, 51515),
                TCP,
                np.full(m, 66),
                F_A,
            )
            return _concat([data, acks])
        raise ValueError(f"unknown attack kind {a.kind!r}")

    # ----------------------------------------------------------------- chunks
    def chunk(self, start_ms: int, end_ms: int) -> dict[str, Any]:
        """All packets with ``start_ms <= ts < end_ms`` in ``ts`` order, as columns
        (``ts, src_ip, dst_ip, src_port, dst_port, protocol, length, tcp_flags``)."""
        parts = [self._flows(start_ms, end_ms)]
        if self._pending is not None:
            parts.append(self._pending)
        for a in self.attacks:
            lo, hi = max(start_ms, a.start_ms), min(end_ms, a.end_ms)
            if lo < hi:
                parts.append(self._attack(a, lo, hi))
        self.attacks = [a for a in self.attacks if a.end_ms > end_ms]
        allp = _concat(parts)
        later = allp["ts"] >= end_ms
        self._pending = {k: v[later] for k, v in allp.items()}
        now = {k: v[~later] for k, v in allp.items()}
        order = np.argsort(now["ts"], kind="stable")
        now = {k: v[order] for k, v in now.items()}
        return to_columns(now)

    def chunks(
        self, start_ms: int, end_ms: int | None = None, chunk_ms: int = 1000
    ) -> Iterator[dict[str, Any]]:
        t = start_ms
        while end_ms is None or t < end_ms:
            hi = t + chunk_ms if end_ms is None else min(t + chunk_ms, end_ms)
            yield self.chunk(t, hi)
            t = hi


def _cols(ts, src, dst, sport, dport, proto: int, length, flags: int) -> dict[str, np.ndarray]:  # type: ignore[no-untyped-def]
    k = len(ts)
    return {
        "ts": np.asarray(ts, np.int64),
        "src": np.asarray(src, np.uint32),
        "dst": np.asarray(dst, np.uint32),
        "sport": np.asarray(sport, np.int32),
        "dport": np.asarray(dport, np.int32),
        "proto": np.full(k, proto, np.int8),
        "length": np.asarray(length, np.int32),
        "flags": np.full(k, flags, np.int8),
    }


def _concat(parts: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}


def to_columns(p: dict[str, np.ndarray]) -> dict[str, Any]:
    """Internal integer arrays -> the packets schema's columns (IPs dictionary-coded)."""
    ips, inv = np.unique(np.concatenate([p["src"], p["dst"]]), return_inverse=True)
    names = ip_str(ips)
    n = len(p["ts"])
    return {
        "ts": p["ts"],
        "src_ip": Coded(inv[:n].astype(np.int32), names),
        "dst_ip": Coded(inv[n:].astype(np.int32), names),
        "src_port": p["sport"].astype(np.int64),
        "dst_port": p["dport"].astype(np.int64),
        "protocol": Coded(p["proto"].astype(np.int32), PROTOCOLS),
        "length": p["length"].astype(np.int64),
        "tcp_flags": Coded(p["flags"].astype(np.int32), FLAGS),
    }


def demo_attacks(first_ms: int, *, every_ms: int = 60_000, count: int = 9, seed: int = 0) -> list[Attack]:
    """Attacks that make the packet examples of RULES.md fire, from ``first_ms`` on.

    Cycles SYN flood (300 SYN/s for 20 s: > 500 SYN in 10 s after ~2 s), port
    scan (25 probes/s for 30 s: > 100 distinct ports in 60 s after ~4 s) and
    heavy hitter (500 MTU segments/s for 40 s: > 10 MB in a minute after ~14 s),
    each against a different victim.
    """
    rng = np.random.default_rng(seed)
    out = []
    for i in range(count):
        t = first_ms + i * every_ms
        victim = f"10.0.0.{10 + i % 20}"
        outsider = (
            f"{rng.integers(11, 100)}.{rng.integers(0, 256)}.{rng.integers(0, 256)}.{rng.integers(1, 255)}"
        )
        kind = (K_SYN_FLOOD, K_PORT_SCAN, K_HEAVY_HITTER)[i % 3]
        if kind == K_SYN_FLOOD:
            out.append(Attack(kind, "", victim, t, 20_000, 300.0))
        elif kind == K_PORT_SCAN:
            out.append(Attack(kind, outsider, victim, t, 30_000, 25.0))
        else:
            insider = f"10.1.{rng.integers(200, 250)}.{rng.integers(1, 255)}"
            out.append(Attack(kind, insider, outsider, t, 40_000, 500.0))
    return out


def mean_flow_packets(cfg: PacketConfig | None = None) -> float:
    """Mean packets per flow of the service mix (for sizing)."""
    g = PacketGenerator(cfg or PacketConfig())
    return (cfg or PacketConfig()).rate / g.flow_rate if g.flow_rate else math.nan
