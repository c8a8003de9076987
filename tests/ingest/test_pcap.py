"""ingest.pcap: captures written by the test (dpkt) and captured live on loopback with tcpdump."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import dpkt
import pytest

from ingest.pcap import PcapError, read_pcap_chunks, tcp_flag_letters
from tidewatch.wire.csv_io import CsvReport


def _l4(proto: str, sp: int, dp: int, flags: int = 0, payload: bytes = b"") -> tuple[int, dpkt.Packet]:
    if proto == "tcp":
        return 6, dpkt.tcp.TCP(sport=sp, dport=dp, flags=flags, data=payload)
    u = dpkt.udp.UDP(sport=sp, dport=dp, data=payload)
    u.ulen = 8 + len(payload)
    return 17, u


def _ip4(
    src: str, dst: str, proto: str, sp: int, dp: int, flags: int = 0, payload: bytes = b""
) -> dpkt.ip.IP:
    p, l4 = _l4(proto, sp, dp, flags, payload)
    ip = dpkt.ip.IP(src=socket.inet_aton(src), dst=socket.inet_aton(dst), p=p, data=l4)
    ip.len = 20 + len(bytes(l4))
    return ip


def _eth(ip: dpkt.Packet, etype: int = dpkt.ethernet.ETH_TYPE_IP) -> bytes:
    return bytes(dpkt.ethernet.Ethernet(src=b"\x02" * 6, dst=b"\x04" * 6, type=etype, data=ip))


def _read(path: Path) -> tuple[list[dict], CsvReport]:
    rep = CsvReport(str(path))
    rows: list[dict] = []
    for ch in read_pcap_chunks(path, report=rep):
        cols = {k: (v.to_numpy().tolist() if hasattr(v, "to_numpy") else v.tolist()) for k, v in ch.items()}
        rows += [dict(zip(cols, vals, strict=True)) for vals in zip(*cols.values(), strict=True)]
    return rows, rep


def test_flag_letters() -> None:
    assert tcp_flag_letters(0x02) == "S"
    assert tcp_flag_letters(0x12) == "SA"
    assert tcp_flag_letters(0x18) == "PA"
    assert tcp_flag_letters(0x11) == "FA"
    assert tcp_flag_letters(0x14) == "RA"
    assert tcp_flag_letters(0) == ""


@pytest.mark.parametrize("fmt", ["pcap", "pcapng"])
def test_ethernet_capture_with_ipv4_ipv6_vlan_arp_and_a_broken_frame(tmp_path: Path, fmt: str) -> None:
    f = tmp_path / f"c.{fmt}"
    ip6 = dpkt.ip6.IP6(
        src=socket.inet_pton(socket.AF_INET6, "2001:db8::1"),
        dst=socket.inet_pton(socket.AF_INET6, "2001:db8::2"),
        nxt=17,
        hlim=64,
    )
    _, u = _l4("udp", 5353, 53, payload=b"q" * 30)
    ip6.data, ip6.plen = u, len(bytes(u))
    vlan = dpkt.ethernet.Ethernet(
        src=b"\x02" * 6,
        dst=b"\x04" * 6,
        type=dpkt.ethernet.ETH_TYPE_IP,
        vlan_tags=[dpkt.ethernet.VLANtag8021Q(id=7)],
        data=_ip4("10.0.0.9", "10.0.0.8", "tcp", 4000, 22, dpkt.tcp.TH_ACK),
    )
    frames = [
        (1_700_000_000.1234, _eth(_ip4("10.0.0.1", "10.0.0.2", "tcp", 40000, 443, dpkt.tcp.TH_SYN))),
        (
            1_700_000_000.2,
            _eth(_ip4("10.0.0.2", "10.0.0.1", "tcp", 443, 40000, dpkt.tcp.TH_SYN | dpkt.tcp.TH_ACK)),
        ),
        (1_700_000_000.3, _eth(ip6, dpkt.ethernet.ETH_TYPE_IP6)),
        (1_700_000_000.4, b"\xff" * 6 + b"\x02" * 6 + b"\x08\x06" + b"\x00" * 28),  # ARP: skipped
        (1_700_000_000.5, b"\x04" * 6 + b"\x02" * 6 + b"\x08\x00" + b"\x45\x00"),  # broken IPv4: bad frame 5
        (1_700_000_000.6, bytes(vlan)),
        (1_700_000_000.7, _eth(_ip4("10.0.0.1", "8.8.8.8", "udp", 5000, 53, payload=b"x" * 100))),
    ]
    with open(f, "wb") as fh:
        w = dpkt.pcap.Writer(fh) if fmt == "pcap" else dpkt.pcapng.Writer(fh)
        for ts, buf in frames:
            w.writepkt(buf, ts=ts)
    rows, rep = _read(f)
    assert rep.rows == 5 and rep.skipped == 1 and [b.line for b in rep.bad_lines] == [5]
    assert rows[0] == {
        "ts": 1_700_000_000_123,
        "src_ip": "10.0.0.1",
        "dst_ip": "10.0.0.2",
        "src_port": 40000,
        "dst_port": 443,
        "protocol": "TCP",
        "length": 40,
        "tcp_flags": "S",
    }
    assert rows[1]["tcp_flags"] == "SA"
    assert rows[2] == {
        "ts": 1_700_000_000_300,
        "src_ip": "2001:db8::1",
        "dst_ip": "2001:db8::2",
        "src_port": 5353,
        "dst_port": 53,
        "protocol": "UDP",
        "length": 40 + 8 + 30,
        "tcp_flags": "",
    }
    assert rows[3]["dst_port"] == 22 and rows[3]["tcp_flags"] == "A"
    assert rows[4]["length"] == 20 + 8 + 100 and rows[4]["protocol"] == "UDP"


def test_linux_cooked_capture_and_truncated_file(tmp_path: Path) -> None:
    f = tmp_path / "sll.pcap"
    with open(f, "wb") as fh:
        w = dpkt.pcap.Writer(fh, linktype=dpkt.pcap.DLT_LINUX_SLL)
        for i in range(3):
            sll = dpkt.sll.SLL(
                type=3,
                hrd=1,
                hlen=6,
                hdr=b"\x02" * 6 + b"\x00\x00",
                ethtype=0x0800,
                data=_ip4("192.168.1.5", "192.168.1.1", "udp", 123, 123, payload=b"n" * 48),
            )
            w.writepkt(bytes(sll), ts=1000.0 + i)
    data = f.read_bytes()
    f.write_bytes(data[:-10])  # cut the last frame short
    rows, rep = _read(f)
    assert [r["ts"] for r in rows] == [1_000_000, 1_001_000]
    assert rows[0]["src_ip"] == "192.168.1.5" and rows[0]["length"] == 76
    assert rep.bad == 1 and rep.bad_lines[0].line == 3


def test_not_a_capture(tmp_path: Path) -> None:
    f = tmp_path / "x.pcap"
    f.write_bytes(b"this is not a capture at all")
    with pytest.raises(PcapError):
        list(read_pcap_chunks(f))


@pytest.mark.skipif(
    shutil.which("tcpdump") is None or os.geteuid() != 0,
    reason="needs tcpdump (apt install tcpdump) and root",
)
def test_live_loopback_capture_with_tcpdump(tmp_path: Path) -> None:
    f = tmp_path / "lo.pcap"
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()
    tport = srv.getsockname()[1]
    usock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    usock.bind(("127.0.0.1", 0))
    uport = usock.getsockname()[1]
    proc = subprocess.Popen(
        [
            "tcpdump",
            "-Z",
            "root",
            "--immediate-mode",
            "-i",
            "lo",
            "-U",
            "-n",
            "-w",
            str(f),
            f"(tcp port {tport}) or (udp port {uport})",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline().decode()  # "tcpdump: listening on lo ..."
        assert "listening" in line, line
        time.sleep(1.0)
        sender = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        for i in range(5):
            sender.sendto(b"p" * (10 + i), ("127.0.0.1", uport))
        c = socket.create_connection(("127.0.0.1", tport))
        conn, _ = srv.accept()
        c.sendall(b"hello tidewatch")
        conn.recv(100)
        c.close()
        conn.close()
        time.sleep(0.5)
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=10)
        srv.close()
        usock.close()
    rows, rep = _read(f)
    assert rep.bad == 0
    udp = [r for r in rows if r["protocol"] == "UDP"]
    assert [r["length"] for r in udp] == [20 + 8 + 10 + i for i in range(5)]
    assert all(r["dst_port"] == uport and r["src_ip"] == "127.0.0.1" for r in udp)
    tcp = [r for r in rows if r["protocol"] == "TCP"]
    assert [r["tcp_flags"] for r in tcp[:3]] == ["S", "SA", "A"]
    assert tcp[0]["dst_port"] == tport and tcp[1]["src_port"] == tport
    assert any(r["tcp_flags"] == "PA" for r in tcp) and any("F" in r["tcp_flags"] for r in tcp)


def test_numba_scanner_and_dpkt_agree_on_generated_traffic(tmp_path: Path) -> None:
    """pcap goes through the Numba scanner, pcapng through dpkt: same frames, same columns."""
    from ingest.packets_gen import PacketConfig, PacketGenerator, demo_attacks
    from tidewatch.wire.csv_io import columns_to_frame

    gen = PacketGenerator(PacketConfig(rate=2000), seed=4, attacks=demo_attacks(500, every_ms=500, count=3))
    df = columns_to_frame(gen.chunk(0, 2000), "packets").astype(object)
    frames = []
    for r in df.itertuples(index=False):
        pad = b"z" * max(0, int(r.length) - 40)
        if r.protocol == "ICMP":
            ip = dpkt.ip.IP(
                src=socket.inet_aton(r.src_ip),
                dst=socket.inet_aton(r.dst_ip),
                p=1,
                data=dpkt.icmp.ICMP(type=8, data=dpkt.icmp.ICMP.Echo(id=1, seq=1, data=b"p" * 56)),
            )
        else:
            flags = sum(
                bit for bit, ch in [(1, "F"), (2, "S"), (4, "R"), (8, "P"), (16, "A")] if ch in r.tcp_flags
            )
            ip = _ip4(
                r.src_ip, r.dst_ip, r.protocol.lower(), int(r.src_port), int(r.dst_port), flags, pad[:64]
            )
        frames.append((int(r.ts) / 1000 + 1_700_000_000, _eth(ip)))
    out = {}
    for fmt in ("pcap", "pcapng"):
        f = tmp_path / f"g.{fmt}"
        with open(f, "wb") as fh:
            w = dpkt.pcap.Writer(fh) if fmt == "pcap" else dpkt.pcapng.Writer(fh)
            for ts, buf in frames:
                w.writepkt(buf, ts=ts)
        out[fmt], rep = _read(f)
        assert rep.bad == 0 and rep.rows == len(df)
    assert out["pcap"] == out["pcapng"]
    # the same packets as generated (float capture times may move a packet by 1 ms: compare as multisets;
    # lengths are dpkt's, since it recomputes the IP length of the frames built here)
    fields = ["src_ip", "dst_ip", "src_port", "dst_port", "protocol", "tcp_flags"]
    want = sorted(tuple(x) for x in df[fields].itertuples(index=False))
    got = sorted(tuple(r[f] for f in fields) for r in out["pcap"])
    assert got == want
