"""ingest.packets_gen: normal traffic mix and the injected attacks, checked against the RULES.md thresholds."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from ingest.packets_gen import (
    K_HEAVY_HITTER,
    K_PORT_SCAN,
    K_SYN_FLOOD,
    Attack,
    PacketConfig,
    PacketGenerator,
    demo_attacks,
)
from tidewatch.wire.csv_io import columns_to_frame


def _frame(gen: PacketGenerator, t0: int, t1: int) -> pd.DataFrame:
    df = pd.concat([columns_to_frame(c, "packets") for c in gen.chunks(t0, t1, 1000)], ignore_index=True)
    return df.astype({c: object for c in ("src_ip", "dst_ip", "protocol", "tcp_flags")})


def _max_window(df: pd.DataFrame, key: str, window_ms: int, how: str) -> pd.Series:
    """Max over event times of a per-key sliding (t - W, t] aggregate, brute force."""
    out = {}
    for k, d in df.groupby(key):
        ts = d["ts"].to_numpy()
        lo = np.searchsorted(ts, ts - window_ms, side="right")
        if how == "count":
            out[k] = int((np.arange(len(ts)) + 1 - lo).max())
        elif how == "sum_length":
            cs = np.concatenate([[0], np.cumsum(d["length"].to_numpy())])
            out[k] = int((cs[1:] - cs[lo]).max())
        else:  # distinct dst_port
            ports = d["dst_port"].to_numpy()
            out[k] = max(len(set(ports[a : i + 1])) for i, a in enumerate(lo))
    return pd.Series(out)


def test_normal_traffic_mix() -> None:
    gen = PacketGenerator(PacketConfig(rate=2000), seed=1)
    df = _frame(gen, 0, 30_000)
    steady = df.ts.between(10_000, 29_999).sum() / 20.0  # flows started before t0 are missing at first
    assert steady == pytest.approx(2000, rel=0.1)
    assert np.all(np.diff(df["ts"].to_numpy()) >= 0)
    share = df["protocol"].value_counts(normalize=True)
    assert share["TCP"] > 0.7 and share["UDP"] > 0.05 and share["ICMP"] > 0.001
    tcp = df[df.protocol == "TCP"]
    assert set(tcp.tcp_flags) <= {"S", "SA", "A", "PA", "FA", "RA"}
    assert (df[df.protocol != "TCP"].tcp_flags == "").all()
    assert tcp.length.between(40, 1500).all()
    # every TCP flow starts with a SYN from a client port to a service port
    syn = tcp[tcp.tcp_flags == "S"]
    assert syn.src_port.between(32768, 60999).all() and set(syn.dst_port) <= {443, 80, 22, 5432}


def test_normal_traffic_stays_below_the_attack_rules() -> None:
    gen = PacketGenerator(PacketConfig(rate=1000), seed=2)
    df = _frame(gen, 0, 120_000)
    syn = df[(df.protocol == "TCP") & (df.tcp_flags == "S")]
    assert _max_window(syn, "dst_ip", 10_000, "count").max() <= 500
    assert _max_window(df, "src_ip", 60_000, "sum_length").max() <= 10_000_000
    assert _max_window(df, "src_ip", 60_000, "distinct").max() <= 100


@pytest.mark.parametrize(
    ("attack", "key", "check"),
    [
        (Attack(K_SYN_FLOOD, "", "10.0.0.10", 5_000, 20_000, 300.0), "dst_ip", "syn"),
        (Attack(K_PORT_SCAN, "45.33.32.156", "10.0.0.11", 5_000, 30_000, 25.0), "src_ip", "scan"),
        (Attack(K_HEAVY_HITTER, "10.1.200.7", "93.184.216.34", 5_000, 40_000, 500.0), "src_ip", "hh"),
    ],
)
def test_each_attack_crosses_its_rules_md_threshold(attack: Attack, key: str, check: str) -> None:
    gen = PacketGenerator(PacketConfig(rate=1000), seed=3, attacks=[attack])
    df = _frame(gen, 0, 60_000)
    if check == "syn":
        syn = df[(df.protocol == "TCP") & (df.tcp_flags == "S")]
        v = _max_window(syn, key, 10_000, "count")
        assert v[attack.dst] > 500 and v.drop(attack.dst).max() <= 500
    elif check == "scan":
        v = _max_window(df, key, 60_000, "distinct")
        assert v[attack.src] > 100 and v.drop(attack.src).max() <= 100
    else:
        v = _max_window(df, key, 60_000, "sum_length")
        assert v[attack.src] > 10_000_000 and v.drop(attack.src).max() <= 10_000_000


def test_demo_attacks_cycle_through_the_three_kinds() -> None:
    kinds = [a.kind for a in demo_attacks(0, count=6)]
    assert kinds == [K_SYN_FLOOD, K_PORT_SCAN, K_HEAVY_HITTER] * 2


def test_packets_reproducible() -> None:
    a = _frame(
        PacketGenerator(PacketConfig(rate=500), seed=9, attacks=demo_attacks(1000, count=2)), 0, 20_000
    )
    b = _frame(
        PacketGenerator(PacketConfig(rate=500), seed=9, attacks=demo_attacks(1000, count=2)), 0, 20_000
    )
    pd.testing.assert_frame_equal(a, b)
