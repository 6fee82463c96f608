"""Blank the GPU code a Hopper (sm_90) GPU never loads from an ELF shared object's fat binaries.

A CUDA extension carries one `.nv_fatbin` section: a series of fat binaries, each a header
(magic 0xBA55ED50, version, header size, size of its entries) followed by entries — an ELF
cubin (kind 2) for one SM architecture or PTX (kind 1) for one virtual architecture. The driver
loads the cubin whose architecture matches the GPU, or JIT-compiles PTX of an architecture not
above it. Cubins for other SM majors (sm_80, sm_100, ...) and PTX above the target can never be
used on that GPU: overwriting their payloads with zeros keeps every offset and size (the file
stays loadable, nothing is relinked) and makes them compress to nothing.

Stdlib only; run at bundle build time, never on the GPU machine.
"""

from __future__ import annotations

import struct
from collections import Counter
from pathlib import Path

FATBIN_MAGIC = 0xBA55ED50
KIND_PTX, KIND_ELF = 1, 2


def _section(data: bytes | bytearray, name: bytes) -> tuple[int, int] | None:
    """(offset, size) of the named section of a 64-bit little-endian ELF file."""
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise ValueError("not a 64-bit little-endian ELF file")
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    def header(i: int) -> tuple[int, int, int]:
        base = shoff + i * shentsize
        name_off, = struct.unpack_from("<I", data, base)
        off, size = struct.unpack_from("<QQ", data, base + 0x18)
        return name_off, off, size
    _, str_off, _ = header(shstrndx)
    for i in range(shnum):
        name_off, off, size = header(i)
        end = data.index(b"\0", str_off + name_off)
        if bytes(data[str_off + name_off:end]) == name:
            return off, size
    return None


def _cubin_fits(arch: int, target: int) -> bool:
    # SASS runs only on its own major, at a minor not below its own (sm_90 code on sm_90)
    return arch // 10 == target // 10 and arch <= target


def _keep(kind: int, arch: int, target: int, entries: list[tuple[int, int, int, int]]) -> bool:
    """Would the driver ever load this entry of this fat binary on a GPU of SM `target`?

    It takes a fitting cubin when there is one; otherwise it JIT-compiles the newest PTX not
    above the target. Everything else in the fat binary is dead weight for that GPU."""
    if kind == KIND_ELF:
        return _cubin_fits(arch, target)
    if kind != KIND_PTX:
        return True  # unknown kind: leave it alone
    if any(k == KIND_ELF and _cubin_fits(a, target) for k, a, _, _ in entries):
        return False
    usable = [a for k, a, _, _ in entries if k == KIND_PTX and a <= target]
    return bool(usable) and arch == max(usable)


def prune(path: Path, target: int = 90) -> dict[str, object]:
    """Zero the payloads of entries a GPU of SM `target` cannot load; rewrite `path` in place.

    Returns what was found: bytes kept and blanked per (kind, arch). Raises ValueError (and
    leaves the file untouched) when the section does not parse as expected."""
    data = bytearray(path.read_bytes())
    sec = _section(data, b".nv_fatbin")
    if sec is None:
        return {"fatbins": 0, "kept": {}, "blanked": {}, "blanked_bytes": 0}
    start, size = sec
    end = start + size
    kept: Counter[str] = Counter()
    blanked: Counter[str] = Counter()
    zero_ranges: list[tuple[int, int]] = []
    pos, fatbins = start, 0
    while pos + 16 <= end:
        magic, _version, hsize, fsize = struct.unpack_from("<IHHQ", data, pos)
        if magic != FATBIN_MAGIC:
            pos += 8  # fat binaries are 8-byte aligned; skip padding
            continue
        fatbins += 1
        entry, stop = pos + hsize, pos + hsize + fsize
        if stop > end:
            raise ValueError(f"{path}: fat binary at {pos:#x} runs past its section")
        entries = []  # (kind, arch, payload offset, payload size)
        while entry < stop:
            kind, _ev, ehsize, payload = struct.unpack_from("<HHIQ", data, entry)
            arch, = struct.unpack_from("<I", data, entry + 28)
            if ehsize < 32 or entry + ehsize + payload > stop:
                raise ValueError(f"{path}: bad fat binary entry at {entry:#x}")
            entries.append((kind, arch, entry + ehsize, payload))
            entry += ehsize + payload
        for kind, arch, off, payload in entries:
            key = f"{'ptx' if kind == KIND_PTX else 'elf' if kind == KIND_ELF else kind}:{arch}"
            if _keep(kind, arch, target, entries):
                kept[key] += payload
            else:
                blanked[key] += payload
                zero_ranges.append((off, payload))
        pos = stop
    for off, n in zero_ranges:
        data[off:off + n] = bytes(n)
    if zero_ranges:
        path.write_bytes(bytes(data))
    return {"fatbins": fatbins, "kept": dict(kept), "blanked": dict(blanked),
            "blanked_bytes": sum(n for _, n in zero_ranges)}


if __name__ == "__main__":
    import json
    import sys

    for name in sys.argv[1:]:
        print(name, json.dumps(prune(Path(name))))
