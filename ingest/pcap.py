"""Packet captures (pcap and pcapng, via dpkt) → packets columns.

Each captured frame becomes one ``packets`` event:

* ``ts``: capture time, epoch ms (truncated);
* ``src_ip`` / ``dst_ip``: IPv4 or IPv6 addresses (text form);
* ``protocol``: TCP, UDP, ICMP, ICMPv6, or ``IP-<n>`` for other IP protocols;
* ``src_port`` / ``dst_port``: TCP/UDP ports, 0 otherwise;
* ``length``: the IP packet's length from its header (IPv4 total length, IPv6
  payload length + 40), so it is right even when the capture was truncated by
  a snap length;
* ``tcp_flags``: TCP flag letters in the order ``FSRPAUEC`` (``S``, ``SA``,
  ``PA``, ``FA``, ``RA``, ...), ``''`` for none and for non-TCP packets.

Link types: Ethernet (with VLAN tags), Linux cooked v1/v2, raw IP, BSD
loopback.  Frames that are not IP (ARP, LLDP, ...) are counted as skipped;
frames that cannot be decoded are reported as bad with their frame number
(1-based), like bad CSV lines.  dpkt decodes a frame at a time in Python
(≈ 100-200 k frames/s); the columns are built per chunk.
"""

from __future__ import annotations

import socket
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import dpkt
import numpy as np

from ingest.avro import Coded
from ingest.csv_io import BadLine, CsvReport

_FLAG_BITS = [(dpkt.tcp.TH_FIN, "F"), (dpkt.tcp.TH_SYN, "S"), (dpkt.tcp.TH_RST, "R"), (dpkt.tcp.TH_PUSH, "P"),
              (dpkt.tcp.TH_ACK, "A"), (dpkt.tcp.TH_URG, "U"), (dpkt.tcp.TH_ECE, "E"), (dpkt.tcp.TH_CWR, "C")]
_FLAGS = ["".join(ch for bit, ch in _FLAG_BITS if v & bit) for v in range(256)]
_PROTO = {6: "TCP", 17: "UDP", 1: "ICMP", 58: "ICMPv6"}


class PcapError(ValueError):
    """A file that is not a readable pcap / pcapng capture."""


def tcp_flag_letters(flags: int) -> str:
    """``0x12`` → ``'SA'``."""
    return _FLAGS[flags & 0xFF]


_PCAP_MAGIC = {
    b"\xd4\xc3\xb2\xa1": ("<", 1000),  # little-endian, microseconds
    b"\xa1\xb2\xc3\xd4": (">", 1000),
    b"\x4d\x3c\xb2\xa1": ("<", 1_000_000),  # nanoseconds
    b"\xa1\xb2\x3c\x4d": (">", 1_000_000),
}


class _ClassicPcap:
    """Classic pcap records as ``(ts_ms, frame)``; raises :class:`_Truncated` on a short record."""

    def __init__(self, fh: IO[bytes]) -> None:
        head = fh.read(24)
        if len(head) < 24 or head[:4] not in _PCAP_MAGIC:
            raise PcapError("not a pcap/pcapng capture (bad magic)")
        self.endian, self.div = _PCAP_MAGIC[head[:4]]
        self._dl = struct.unpack(self.endian + "I", head[20:24])[0] & 0x0FFFFFFF
        self.fh = fh

    def datalink(self) -> int:
        return int(self._dl)

    def __iter__(self) -> Iterator[tuple[int, bytes]]:
        rec = struct.Struct(self.endian + "IIII")
        read = self.fh.read
        while True:
            h = read(16)
            if not h:
                return
            if len(h) < 16:
                raise _Truncated("record header cut short")
            sec, frac, caplen, _ = rec.unpack(h)
            buf = read(caplen)
            if len(buf) < caplen:
                raise _Truncated(f"frame cut short ({len(buf)} of {caplen} bytes)")
            yield sec * 1000 + frac // self.div, buf


class _Truncated(Exception):
    pass


class _PcapNg:
    def __init__(self, fh: IO[bytes]) -> None:
        try:
            self.r = dpkt.pcapng.Reader(fh)
        except (ValueError, dpkt.dpkt.NeedData, dpkt.dpkt.UnpackError) as exc:
            raise PcapError(f"not a pcapng capture: {exc}") from exc

    def datalink(self) -> int:
        return int(self.r.datalink())

    def __iter__(self) -> Iterator[tuple[int, bytes]]:
        it = iter(self.r)
        while True:
            try:
                ts, buf = next(it)
            except StopIteration:
                return
            except (dpkt.dpkt.NeedData, dpkt.dpkt.UnpackError, ValueError, struct.error) as exc:
                raise _Truncated(str(exc)) from exc
            yield int(float(ts) * 1000 + 1e-4), buf


def _open_reader(fh: IO[bytes]) -> Any:
    magic = fh.read(4)
    fh.seek(0)
    if magic == b"\x0a\x0d\x0d\x0a":
        return _PcapNg(fh)
    return _ClassicPcap(fh)


def _ip_of(datalink: int, buf: bytes) -> Any:
    """The IP (v4 or v6) layer of a frame, or None if the frame is not IP."""
    if datalink == dpkt.pcap.DLT_EN10MB:
        eth = dpkt.ethernet.Ethernet(buf)
        ip = eth.data
        if eth.type in (dpkt.ethernet.ETH_TYPE_IP, dpkt.ethernet.ETH_TYPE_IP6) and isinstance(ip, bytes):
            raise ValueError(f"malformed IP packet ({len(ip)} bytes)")
    elif datalink == dpkt.pcap.DLT_LINUX_SLL:
        ip = dpkt.sll.SLL(buf).data
    elif datalink == 276:  # LINUX_SLL2
        ip = dpkt.sll2.SLL2(buf).data
    elif datalink in (dpkt.pcap.DLT_RAW, 12, 14, 228, 229):  # raw IP / IPv4 / IPv6
        v = buf[0] >> 4 if buf else 0
        ip = dpkt.ip.IP(buf) if v == 4 else dpkt.ip6.IP6(buf) if v == 6 else None
    elif datalink in (dpkt.pcap.DLT_NULL, dpkt.pcap.DLT_LOOP):
        ip = dpkt.loopback.Loopback(buf).data
    else:
        raise PcapError(f"unsupported link type {datalink}")
    return ip if isinstance(ip, dpkt.ip.IP | dpkt.ip6.IP6) else None


def read_pcap_chunks(
    path: str | Path, *, report: CsvReport | None = None, chunk: int = 100_000
) -> Iterator[dict[str, Any]]:
    """Yield ``packets`` column chunks from a capture; bad frames go to ``report`` by frame number."""
    rep = report if report is not None else CsvReport(str(path))
    with open(path, "rb") as fh:
        reader = _open_reader(fh)
        datalink = reader.datalink()
        cols: dict[str, list[Any]] = {k: [] for k in ("ts", "src", "dst", "sp", "dp", "proto", "len", "flags")}
        frame = 0
        try:
            for ts, buf in reader:
                frame += 1
                try:
                    ip = _ip_of(datalink, buf)
                    if ip is None:
                        rep.skipped += 1
                        continue
                    if isinstance(ip, dpkt.ip.IP):
                        src, dst = socket.inet_ntop(socket.AF_INET, ip.src), socket.inet_ntop(socket.AF_INET, ip.dst)
                        plen, pnum = ip.len, ip.p
                    else:
                        src, dst = socket.inet_ntop(socket.AF_INET6, ip.src), socket.inet_ntop(socket.AF_INET6, ip.dst)
                        plen, pnum = ip.plen + 40, ip.nxt
                    l4 = ip.data
                    sp = dp = 0
                    flags = ""
                    if pnum in (6, 17) and not isinstance(l4, bytes):
                        sp, dp = l4.sport, l4.dport
                        if pnum == 6:
                            flags = _FLAGS[l4.flags & 0xFF]
                except (dpkt.dpkt.UnpackError, dpkt.dpkt.NeedData, AttributeError, ValueError, IndexError) as exc:
                    rep.add_bad([BadLine(frame, f"frame not decodable: {type(exc).__name__}: {exc}")])
                    continue
                cols["ts"].append(ts)
                cols["src"].append(src)
                cols["dst"].append(dst)
                cols["sp"].append(sp)
                cols["dp"].append(dp)
                cols["proto"].append(_PROTO.get(pnum, f"IP-{pnum}"))
                cols["len"].append(plen)
                cols["flags"].append(flags)
                if len(cols["ts"]) >= chunk:
                    rep.rows += len(cols["ts"])
                    yield _columns(cols)
                    cols = {k: [] for k in cols}
        except _Truncated as exc:  # truncated file: keep what was read, report the cut frame
            rep.add_bad([BadLine(frame + 1, f"capture truncated: {exc}")])
        if cols["ts"]:
            rep.rows += len(cols["ts"])
            yield _columns(cols)


def _columns(c: dict[str, list[Any]]) -> dict[str, Any]:
    ts = np.asarray(c["ts"], np.int64)
    order = np.argsort(ts, kind="stable")  # captures are nearly sorted; make it exact
    return {
        "ts": ts[order],
        "src_ip": _coded(c["src"], order),
        "dst_ip": _coded(c["dst"], order),
        "src_port": np.asarray(c["sp"], np.int64)[order],
        "dst_port": np.asarray(c["dp"], np.int64)[order],
        "protocol": _coded(c["proto"], order),
        "length": np.asarray(c["len"], np.int64)[order],
        "tcp_flags": _coded(c["flags"], order),
    }


def _coded(values: list[str], order: np.ndarray) -> Coded:
    col = Coded.of(values)
    return Coded(col.codes[order], col.values)
