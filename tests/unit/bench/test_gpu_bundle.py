"""The GPU carry bundle's pieces that run without a GPU: fat-binary pruning and the installer."""

from __future__ import annotations

import io
import json
import struct
import subprocess
import tarfile
from pathlib import Path

import pytest

from support.scripts import load

REPO = Path(__file__).resolve().parents[3]
fatbin = load("bench/gpu/fatbin.py")
install_bundle = load("bench/gpu/install_bundle.py")

pytestmark = pytest.mark.unit


def entry(kind: int, arch: int, payload: bytes) -> bytes:
    """One fat binary entry: a 64-byte header (kind, version, header size, payload size, ...,
    arch at offset 28) and its payload."""
    head = bytearray(64)
    struct.pack_into("<HHIQ", head, 0, kind, 0x101, 64, len(payload))
    struct.pack_into("<I", head, 28, arch)
    return bytes(head) + payload


def fat_binary(*entries: bytes) -> bytes:
    body = b"".join(entries)
    return struct.pack("<IHHQ", fatbin.FATBIN_MAGIC, 1, 16, len(body)) + body


def elf_with(section: bytes) -> bytes:
    """A minimal 64-bit little-endian ELF: sections null, .shstrtab, .nv_fatbin."""
    names = b"\0.shstrtab\0.nv_fatbin\0"
    data_off = 64
    strtab_off = data_off + len(section)
    shoff = (strtab_off + len(names) + 7) // 8 * 8
    head = bytearray(64)
    head[:6] = b"\x7fELF\x02\x01"
    struct.pack_into("<Q", head, 0x28, shoff)
    struct.pack_into("<HHH", head, 0x3A, 64, 3, 1)

    def sh(name: int, off: int, size: int) -> bytes:
        s = bytearray(64)
        struct.pack_into("<I", s, 0, name)
        struct.pack_into("<QQ", s, 0x18, off, size)
        return bytes(s)

    body = bytes(head) + section + names
    body += bytes(shoff - len(body))
    return body + sh(0, 0, 0) + sh(1, strtab_off, len(names)) + sh(11, data_off, len(section))


def test_prune_keeps_only_what_an_sm90_gpu_loads(tmp_path: Path) -> None:
    a80, a90, p90 = b"A" * 40, b"B" * 48, b"C" * 24  # fat binary 1: has an sm_90 cubin
    a75, p80, p86 = b"D" * 16, b"E" * 32, b"F" * 8  # fat binary 2: PTX only for sm_90
    a100 = b"G" * 24
    section = (fat_binary(entry(2, 80, a80), entry(2, 90, a90), entry(1, 90, p90))
               + fat_binary(entry(2, 75, a75), entry(1, 80, p80), entry(1, 86, p86),
                            entry(2, 100, a100)))
    so = tmp_path / "x.so"
    original = elf_with(section)
    so.write_bytes(original)
    report = fatbin.prune(so, 90)
    data = so.read_bytes()
    assert len(data) == len(original)
    assert data.count(a90) == 1 and data.count(p86) == 1  # the two entries the GPU can load
    for gone in (a80, p90, a75, p80, a100):
        assert data.count(gone) == 0
    assert report["fatbins"] == 2
    assert report["kept"] == {"elf:90": 48, "ptx:86": 8}
    assert report["blanked_bytes"] == 40 + 24 + 16 + 32 + 24
    # only payload bytes changed: every header is intact
    changed = [i for i, (x, y) in enumerate(zip(original, data, strict=False)) if x != y]
    assert len(changed) == report["blanked_bytes"]


def test_prune_refuses_a_corrupt_fat_binary(tmp_path: Path) -> None:
    broken = fat_binary(entry(2, 80, b"A" * 40))[:-8]  # entry runs past the fat binary
    section = struct.pack("<IHHQ", fatbin.FATBIN_MAGIC, 1, 16, len(broken) - 16) + broken[16:]
    so = tmp_path / "y.so"
    so.write_bytes(elf_with(section))
    before = so.read_bytes()
    with pytest.raises(ValueError, match="fat binary"):
        fatbin.prune(so, 90)
    assert so.read_bytes() == before


def _bundle(path: Path, dists: dict[str, dict[str, bytes]]) -> None:
    with tarfile.open(path, "w:xz") as tar:
        def add(name: str, data: bytes, mode: int = 0o644) -> None:
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), mode
            tar.addfile(info, io.BytesIO(data))
        add("manifest.json", json.dumps({"vllm": "9.9"}).encode())
        for dist, files in dists.items():
            for rel, data in files.items():
                add(f"dists/{dist}/{rel}", data)


def test_installer_skips_what_the_machine_has_and_writes_scripts(tmp_path: Path) -> None:
    bundle = tmp_path / "b.tar.xz"
    _bundle(bundle, {
        "tinypkg": {
            # like `vllm serve`: the console script's process starts a child with "spawn",
            # which re-imports the script as __mp_main__
            "tinypkg/__init__.py": (
                b"import multiprocessing as mp\n\n"
                b"def child():\n    print('child ran', flush=True)\n\n"
                b"def main():\n    p = mp.get_context('spawn').Process(target=child)\n"
                b"    p.start()\n    p.join()\n    print('tiny ran')\n    return p.exitcode\n"),
            "tinypkg-1.0.dist-info/METADATA": b"Name: tinypkg\nVersion: 1.0\n",
            "tinypkg-1.0.dist-info/entry_points.txt":
                b"[console_scripts]\ntiny = tinypkg:main\n",
            "tinypkg-1.0.data/purelib/tinyextra.py": b"X = 1\n",
        },
        # pytest is installed where this test runs: the installer must keep that one
        "pytest": {"pytest/__init__.py": b"raise SystemExit('the bundled copy was used')\n"},
    })
    target = tmp_path / "site"
    result = install_bundle.install(bundle, target)
    assert result["installed"] == ["tinypkg"]
    assert "pytest" in result["kept_from_machine"]
    assert not (target / "pytest").exists()
    assert (target / "tinyextra.py").read_text() == "X = 1\n"
    assert result["scripts"] == ["tiny"]
    out = subprocess.run([str(target / "bin" / "tiny")], capture_output=True, text=True,
                         env={"PYTHONPATH": str(target)}, check=True)
    assert out.stdout == "child ran\ntiny ran\n"
    assert json.loads((target / "bundle-install.json").read_text())["vllm"] == "9.9"


def test_installer_refuses_paths_that_escape(tmp_path: Path) -> None:
    bundle = tmp_path / "evil.tar.xz"
    _bundle(bundle, {"evil": {"../../outside.py": b"x = 1\n"}})
    with pytest.raises(SystemExit, match="escapes"):
        install_bundle.install(bundle, tmp_path / "site")
    assert not (tmp_path / "outside.py").exists()
