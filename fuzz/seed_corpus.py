#!/usr/bin/env python3
"""Builds the seed corpora of the fuzz targets from the golden captures.

    python3 fuzz/seed_corpus.py [GOLDEN_DIR]    # default: ../shared/golden from the project root

Writes fuzz/corpus/<target>/<sha1> files (fuzz/corpus is git-ignored; do not commit it):

- roce_packet: RoCEv2 transport packets (UDP payloads), a few of each opcode, smallest first;
- ip_frames:   the Ethernet frames of those packets, and their IP packets;
- cm_mad:      every CM MAD (UD SEND to QP1: BTH + DETH + 256-byte MAD);
- pcap_file:   the small captures whole, the first records of the big one, and big-endian
               and nanosecond variants.
"""

import hashlib
import os
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
GOLDEN = sys.argv[1] if len(sys.argv) > 1 else os.path.join(HERE, "..", "..", "shared", "golden")
CORPUS = os.path.join(HERE, "corpus")
FILES = [
    "rxe_cm_req_no_listener.pcap",
    "rxe_two_vm.pcap",
    "synthetic_cm_messages.pcap",
    "synthetic_mixed_one_bad_icrc.pcap",
]
PER_OPCODE = 6


def records(data):
    """(ts_sec, frac, data) of a little-endian classic pcap."""
    assert struct.unpack_from("<I", data)[0] in (0xA1B2C3D4, 0xA1B23C4D)
    at = 24
    while at + 16 <= len(data):
        ts, frac, incl, _orig = struct.unpack_from("<IIII", data, at)
        yield ts, frac, data[at + 16 : at + 16 + incl]
        at += 16 + incl


def udp_payload(frame):
    """The UDP payload and IP packet of an Ethernet IPv4/IPv6 UDP frame, else None."""
    ethertype = struct.unpack_from(">H", frame, 12)[0]
    ip = frame[14:]
    if ethertype == 0x0800 and ip[9] == 17:
        hl = (ip[0] & 0x0F) * 4
        total = struct.unpack_from(">H", ip, 2)[0]
        ip = ip[:total]
    elif ethertype == 0x86DD and ip[6] == 17:
        hl = 40
        ip = ip[: 40 + struct.unpack_from(">H", ip, 4)[0]]
    else:
        return None
    udp_len = struct.unpack_from(">H", ip, hl + 4)[0]
    return ip[hl + 8 : hl + udp_len], ip


def write(target, blob):
    d = os.path.join(CORPUS, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, hashlib.sha1(blob).hexdigest()), "wb") as f:
        f.write(blob)


def pcap_variant(data, big_endian, nanos):
    """Rewrites a little-endian microsecond pcap in another byte order / resolution."""
    e = ">" if big_endian else "<"
    magic = 0xA1B23C4D if nanos else 0xA1B2C3D4
    _m, vmaj, vmin, tz, sig, snap, link = struct.unpack_from("<IHHiIII", data)
    out = bytearray(struct.pack(e + "IHHiIII", magic, vmaj, vmin, tz, sig, snap, link))
    for ts, frac, rec in records(data):
        out += struct.pack(e + "IIII", ts, frac * 1000 if nanos else frac, len(rec), len(rec))
        out += rec
    return bytes(out)


def main():
    by_opcode = {}
    for name in FILES:
        path = os.path.join(GOLDEN, name)
        if not os.path.exists(path):
            sys.exit(f"golden capture {path} is missing; pass the golden directory")
        data = open(path, "rb").read()
        for _ts, _frac, frame in records(data):
            got = udp_payload(frame)
            if got is None or len(got[0]) < 12:
                continue
            payload, ip = got
            by_opcode.setdefault(payload[0], []).append((len(payload), frame, ip, payload))
            # UD SEND_ONLY to QP1: BTH (12) + DETH (8) + MAD (256) + ICRC.
            dest_qp = int.from_bytes(payload[5:8], "big")
            if payload[0] == 0x64 and dest_qp == 1 and len(payload) >= 20 + 256:
                write("cm_mad", payload[20 : 20 + 256])
        if len(data) < 8192:
            write("pcap_file", data)
            write("pcap_file", pcap_variant(data, True, False))
            write("pcap_file", pcap_variant(data, False, True))
        else:
            head, at = data[:24], 24
            for _ in range(8):
                incl = struct.unpack_from("<I", data, at + 8)[0]
                at += 16 + incl
            write("pcap_file", head + data[24:at])
            write("pcap_file", pcap_variant(head + data[24:at], True, True))

    for _op, pkts in sorted(by_opcode.items()):
        seen = set()
        for _len, frame, ip, payload in sorted(pkts, key=lambda p: p[0]):
            if payload in seen:
                continue
            seen.add(payload)
            write("roce_packet", payload)
            write("ip_frames", frame)
            write("ip_frames", ip)
            if len(seen) >= PER_OPCODE:
                break

    for target in sorted(os.listdir(CORPUS)):
        files = os.listdir(os.path.join(CORPUS, target))
        size = sum(os.path.getsize(os.path.join(CORPUS, target, f)) for f in files)
        print(f"{target}: {len(files)} files, {size} bytes")


if __name__ == "__main__":
    main()
