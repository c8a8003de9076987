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
(1-based), like bad CSV lines.

Classic pcap files are scanned by a Numba kernel in blocks (IPv4 decoded in
place); IPv6 frames and odd link layers in them, and pcapng files, are decoded
frame by frame with dpkt, far slower (rates: docs/feeds.md, "Packet captures").
Both paths give the same columns (tested).
"""

from __future__ import annotations

import socket
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import dpkt
import numba as nb
import numpy as np

from ingest.errors import IngestError
from ingest.packets_gen import ip_str
from tidewatch.wire.avro import Coded
from tidewatch.wire.csv_io import BadLine, CsvReport

_FLAG_BITS = [
    (dpkt.tcp.TH_FIN, "F"),
    (dpkt.tcp.TH_SYN, "S"),
    (dpkt.tcp.TH_RST, "R"),
    (dpkt.tcp.TH_PUSH, "P"),
    (dpkt.tcp.TH_ACK, "A"),
    (dpkt.tcp.TH_URG, "U"),
    (dpkt.tcp.TH_ECE, "E"),
    (dpkt.tcp.TH_CWR, "C"),
]
_FLAGS = ["".join(ch for bit, ch in _FLAG_BITS if v & bit) for v in range(256)]
_PROTO = {6: "TCP", 17: "UDP", 1: "ICMP", 58: "ICMPv6"}
_PROTO_NAMES = [_PROTO.get(p, f"IP-{p}") for p in range(256)]


class PcapError(IngestError, ValueError):
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


class _Truncated(IngestError):
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


def _decode_frame(datalink: int, buf: bytes) -> tuple[str, str, int, int, int, int, int] | None:
    """``(src, dst, sport, dport, ip protocol number, length, tcp flag byte)`` of a frame with dpkt;
    None if it is not IP; raises on an undecodable frame."""
    try:
        ip = _ip_of(datalink, buf)
        if ip is None:
            return None
        if isinstance(ip, dpkt.ip.IP):
            fam, plen, pnum = socket.AF_INET, ip.len, ip.p
        else:
            fam, plen, pnum = socket.AF_INET6, ip.plen + 40, ip.nxt
        src, dst = socket.inet_ntop(fam, ip.src), socket.inet_ntop(fam, ip.dst)
        l4 = ip.data
        sp = dp = fl = 0
        if pnum in (6, 17) and not isinstance(l4, bytes):
            sp, dp = l4.sport, l4.dport
            if pnum == 6:
                fl = l4.flags & 0xFF
        return src, dst, sp, dp, pnum, plen, fl
    except (
        dpkt.dpkt.UnpackError,
        dpkt.dpkt.NeedData,
        AttributeError,
        ValueError,
        IndexError,
        struct.error,
    ) as exc:
        raise ValueError(f"frame not decodable: {type(exc).__name__}: {exc}") from exc


# status of a scanned frame
_OK, _SKIP, _SLOW, _BAD = 0, 1, 2, 3
#: link types the Numba scanner decodes (IPv4); others (and IPv6 frames) go through dpkt
_FAST_LINKS = (1, 113, 276, 101, 12, 228, 0, 108)
_MAX_FRAME = 16 << 20


@nb.njit(cache=True, nogil=True)
def _u16(a, i):  # pragma: no cover - compiled
    return (np.int64(a[i]) << 8) | np.int64(a[i + 1])


@nb.njit(cache=True, nogil=True)
def _scan_kernel(
    a, pos, big, div, link, maxn, ts, src, dst, sp, dp, proto, length, flags, status, fst, fln
):  # pragma: no cover
    n = 0
    end = a.shape[0]
    while n < maxn and pos + 16 <= end:
        h = pos
        if big:
            sec = (
                (np.int64(a[h]) << 24)
                | (np.int64(a[h + 1]) << 16)
                | (np.int64(a[h + 2]) << 8)
                | np.int64(a[h + 3])
            )
            frac = (
                (np.int64(a[h + 4]) << 24)
                | (np.int64(a[h + 5]) << 16)
                | (np.int64(a[h + 6]) << 8)
                | np.int64(a[h + 7])
            )
            cap = (
                (np.int64(a[h + 8]) << 24)
                | (np.int64(a[h + 9]) << 16)
                | (np.int64(a[h + 10]) << 8)
                | np.int64(a[h + 11])
            )
        else:
            sec = (
                (np.int64(a[h + 3]) << 24)
                | (np.int64(a[h + 2]) << 16)
                | (np.int64(a[h + 1]) << 8)
                | np.int64(a[h])
            )
            frac = (
                (np.int64(a[h + 7]) << 24)
                | (np.int64(a[h + 6]) << 16)
                | (np.int64(a[h + 5]) << 8)
                | np.int64(a[h + 4])
            )
            cap = (
                (np.int64(a[h + 11]) << 24)
                | (np.int64(a[h + 10]) << 16)
                | (np.int64(a[h + 9]) << 8)
                | np.int64(a[h + 8])
            )
        if pos + 16 + cap > end:
            break
        f = pos + 16
        fe = f + cap
        ts[n] = sec * 1000 + frac // div
        fst[n] = f
        fln[n] = cap
        sp[n] = 0
        dp[n] = 0
        flags[n] = 0
        st = _OK
        l3 = -1
        if link == 1:  # Ethernet, up to two VLAN tags
            if cap < 14:
                st = _BAD
            else:
                o = f + 12
                et = _u16(a, o)
                tags = 0
                while (et == 0x8100 or et == 0x88A8) and tags < 2 and o + 6 <= fe:
                    o += 4
                    et = _u16(a, o)
                    tags += 1
                if et == 0x0800:
                    l3 = o + 2
                elif et == 0x86DD:
                    st = _SLOW
                else:
                    st = _SKIP
        elif link == 113 or link == 276:  # Linux cooked v1 / v2
            o = f + 14 if link == 113 else f
            if cap < (16 if link == 113 else 20):
                st = _BAD
            else:
                et = _u16(a, o)
                if et == 0x0800:
                    l3 = f + (16 if link == 113 else 20)
                elif et == 0x86DD:
                    st = _SLOW
                else:
                    st = _SKIP
        elif link == 0 or link == 108:  # BSD loopback: 4-byte family
            st = _SLOW
            if cap >= 5 and (a[f + 4] >> 4) == 4:
                l3 = f + 4
                st = _OK
        else:  # raw IP
            if cap >= 1 and (a[f] >> 4) == 4:
                l3 = f
            elif cap >= 1 and (a[f] >> 4) == 6:
                st = _SLOW
            else:
                st = _BAD
        if st == _OK:
            if l3 + 20 > fe or (a[l3] >> 4) != 4 or (a[l3] & 15) < 5:
                st = _BAD
            else:
                ihl = np.int64(a[l3] & 15) * 4
                length[n] = _u16(a, l3 + 2)
                p = np.int64(a[l3 + 9])
                proto[n] = p
                src[n] = (
                    (np.uint32(a[l3 + 12]) << 24)
                    | (np.uint32(a[l3 + 13]) << 16)
                    | (np.uint32(a[l3 + 14]) << 8)
                    | np.uint32(a[l3 + 15])
                )
                dst[n] = (
                    (np.uint32(a[l3 + 16]) << 24)
                    | (np.uint32(a[l3 + 17]) << 16)
                    | (np.uint32(a[l3 + 18]) << 8)
                    | np.uint32(a[l3 + 19])
                )
                frag = _u16(a, l3 + 6) & 0x1FFF
                l4 = l3 + ihl
                if frag == 0 and (p == 6 or p == 17):
                    need = 20 if p == 6 else 8
                    if l4 + need <= fe:
                        sp[n] = _u16(a, l4)
                        dp[n] = _u16(a, l4 + 2)
                        if p == 6:
                            flags[n] = a[l4 + 13]
        status[n] = st
        n += 1
        pos = fe
    return n, pos


def _read_classic(fh: IO[bytes], rd: _ClassicPcap, rep: CsvReport, chunk: int) -> Iterator[dict[str, Any]]:
    """Classic pcap, scanned by the Numba kernel in blocks; IPv6 and odd frames decoded with dpkt."""
    block = max(chunk, 1) * 200
    carry = b""
    frame0 = 0
    z = {
        k: np.zeros(chunk, t)
        for k, t in (
            ("ts", np.int64),
            ("src", np.uint32),
            ("dst", np.uint32),
            ("sp", np.int64),
            ("dp", np.int64),
            ("proto", np.int64),
            ("len", np.int64),
            ("flags", np.int64),
            ("status", np.int8),
            ("fst", np.int64),
            ("fln", np.int64),
        )
    }
    eof = False
    while True:
        more = b"" if eof else fh.read(block)
        eof = eof or not more
        data = np.frombuffer(carry + more, np.uint8)
        pos = 0
        while True:
            n, pos = _scan_kernel(
                data,
                pos,
                rd.endian == ">",
                rd.div,
                rd.datalink(),
                chunk,
                z["ts"],
                z["src"],
                z["dst"],
                z["sp"],
                z["dp"],
                z["proto"],
                z["len"],
                z["flags"],
                z["status"],
                z["fst"],
                z["fln"],
            )
            if n == 0:
                break
            cols = _frames_to_columns({k: v[:n] for k, v in z.items()}, data, rd.datalink(), frame0, rep)
            frame0 += n
            if cols is not None:
                yield cols
        carry = data[pos:].tobytes()
        if len(carry) >= 16:
            cap = struct.unpack(rd.endian + "I", carry[8:12])[0]
            if cap > _MAX_FRAME:  # a corrupt record header: do not buffer the rest of the file
                rep.add_bad([BadLine(frame0 + 1, f"corrupt record header (frame length {cap})")])
                return
        if eof:
            if carry:
                rep.add_bad(
                    [BadLine(frame0 + 1, f"capture truncated: {len(carry)} bytes of an incomplete frame")]
                )
            return


def _frames_to_columns(
    z: dict[str, np.ndarray], data: np.ndarray, datalink: int, frame0: int, rep: CsvReport
) -> dict[str, Any] | None:
    st = z["status"]
    rep.skipped += int(np.sum(st == _SKIP))
    bad = [
        BadLine(frame0 + int(i) + 1, "frame not decodable: malformed IPv4 header")
        for i in np.flatnonzero(st == _BAD)
    ]
    slow_src: dict[int, tuple[str, str]] = {}
    for i in np.flatnonzero(st == _SLOW):
        a, b = int(z["fst"][i]), int(z["fln"][i])
        try:
            got = _decode_frame(datalink, data[a : a + b].tobytes())
        except (ValueError, PcapError) as exc:
            bad.append(BadLine(frame0 + int(i) + 1, str(exc)))
            st[i] = _BAD
            continue
        if got is None:
            rep.skipped += 1
            st[i] = _SKIP
            continue
        s_, d_, z["sp"][i], z["dp"][i], z["proto"][i], z["len"][i], z["flags"][i] = got
        slow_src[int(i)] = (s_, d_)
        st[i] = _OK
    if bad:
        rep.add_bad(sorted(bad, key=lambda b_: b_.line))
    keep = np.flatnonzero(st == _OK)
    if len(keep) == 0:
        return None
    n = len(keep)
    uniq, inv = np.unique(np.concatenate([z["src"][keep], z["dst"][keep]]), return_inverse=True)
    names = np.asarray(ip_str(uniq), dtype=object)
    srcs, dsts = names[inv[:n]], names[inv[n:]]
    if slow_src:
        pos_of = {int(r): j for j, r in enumerate(keep)}
        for r, (s_, d_) in slow_src.items():
            srcs[pos_of[r]], dsts[pos_of[r]] = s_, d_
    ts = z["ts"][keep]
    order = np.argsort(ts, kind="stable")  # captures are nearly sorted; make it exact
    src_c, dst_c = Coded.of(srcs[order]), Coded.of(dsts[order])
    rep.rows += n
    return {
        "ts": ts[order],
        "src_ip": src_c,
        "dst_ip": dst_c,
        "src_port": z["sp"][keep][order].copy(),
        "dst_port": z["dp"][keep][order].copy(),
        "protocol": Coded(z["proto"][keep][order].astype(np.int32), _PROTO_NAMES),
        "length": z["len"][keep][order].copy(),
        "tcp_flags": Coded(z["flags"][keep][order].astype(np.int32), _FLAGS),
    }


def read_pcap_chunks(
    path: str | Path, *, report: CsvReport | None = None, chunk: int = 100_000
) -> Iterator[dict[str, Any]]:
    """Yield ``packets`` column chunks from a capture; bad frames go to ``report`` by frame number."""
    rep = report if report is not None else CsvReport(str(path))
    with open(path, "rb") as fh:
        reader = _open_reader(fh)
        datalink = reader.datalink()
        if isinstance(reader, _ClassicPcap) and datalink in _FAST_LINKS:
            yield from _read_classic(fh, reader, rep, chunk)
            return
        cols: dict[str, list[Any]] = {
            k: [] for k in ("ts", "src", "dst", "sp", "dp", "proto", "len", "flags")
        }
        frame = 0
        try:
            for ts, buf in reader:
                frame += 1
                try:
                    got = _decode_frame(datalink, buf)
                except (ValueError, PcapError) as exc:
                    rep.add_bad([BadLine(frame, str(exc))])
                    continue
                if got is None:
                    rep.skipped += 1
                    continue
                cols["ts"].append(ts)
                for k, v in zip(("src", "dst", "sp", "dp", "proto", "len", "flags"), got, strict=True):
                    cols[k].append(v)
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
        "protocol": Coded(np.asarray(c["proto"], np.int32)[order], _PROTO_NAMES),
        "length": np.asarray(c["len"], np.int64)[order],
        "tcp_flags": Coded(np.asarray(c["flags"], np.int32)[order], _FLAGS),
    }


def _coded(values: list[str], order: np.ndarray) -> Coded:
    col = Coded.of(values)
    return Coded(col.codes[order], col.values)
