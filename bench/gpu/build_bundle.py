"""Build the GPU carry bundle: vLLM pruned for MTP on Hopper, plus what the GPU machine lacks.

    python3 bench/gpu/build_bundle.py [--vllm 0.26.0] [--out .gpu-carry]

Everything comes from PyPI through `pip` (nothing of vLLM is committed); downloads and the
dependency resolution are cached under ~/.cache/mtp-operator/gpu-bundle/vllm-<version>/.
Output in --out: `vllm-bundle.tar.xz` (one folder per distribution, unpacked), `manifest.json`
(what is in it, what was pruned and why) and `install_bundle.py` (the stdlib-only installer).
bench/gpu/README.md says how to rebuild for another vLLM version.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import re
import shutil
import subprocess
import sys
import tarfile
import time
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import fatbin  # noqa: E402

CACHE = Path.home() / ".cache" / "mtp-operator" / "gpu-bundle"
PY_VERSION = "3.12"
PLATFORMS = ["manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_24_x86_64",
             "manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux_2_5_x86_64",
             "manylinux1_x86_64", "manylinux_2_26_x86_64", "manylinux_2_31_x86_64",
             "manylinux_2_34_x86_64", "manylinux_2_35_x86_64", "any"]
LIMIT = 64 * 1024 * 1024

# vLLM requirements that the bundle does not carry: the GPU machine's own torch stack (never
# replace it: vLLM's .so files are built against exactly that torch), and optional kernels
# an MTP run of a bf16 model with Triton attention never imports.
SKIP_REQUIREMENTS = {
    "torch", "torchaudio", "torchvision", "torchcodec", "pynvvideocodec", "numpy", "numba",
    "setuptools", "opencv-python-headless", "flashinfer-python", "tilelang",
    "nvidia-cudnn-frontend", "fastsafetensors", "nvidia-cutlass-dsl", "quack-kernels",
    "tokenspeed-mla", "humming-kernels",
}
# Resolved dependencies left out: CUDA 12 runtime wheels (the machine has CUDA 13's), the
# FastAPI cloud CLI and its crypto stack, telemetry exporters. (pycountry and truststore look
# optional but are imported: mistral_common and httpcore2 import them when vLLM starts.)
SKIP_DEPENDENCIES = {
    "cryptography", "cffi", "pycparser", "fastapi-cloud-cli", "fastapi-cli", "rich-toolkit",
    "sentry-sdk", "rignore", "fastar", "agent-detector", "detect-installer",
    "supervisor", "googleapis-common-protos", "opentelemetry-proto",
    "opentelemetry-exporter-otlp", "opentelemetry-exporter-otlp-proto-grpc",
    "opentelemetry-exporter-otlp-proto-http", "opentelemetry-exporter-otlp-proto-common",
    "opentelemetry-exporter-otlp-common", "opentelemetry-exporter-http-transport",
}
# Files of the vLLM wheel an MTP run on an sm_90 GPU does not load (path globs, with reasons).
PRUNE = [
    ("vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so", "FlashAttention 2 kernels (sm_80 builds)"),
    ("vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so",
     "FlashAttention 3 (about 100 MB compressed, over the transfer limit): the run uses "
     "--attention-backend TRITON_ATTN"),
    ("vllm/_moe_C_stable_libtorch.abi3.so", "mixture-of-experts kernels (dense model)"),
    ("vllm/_flashmla_C.abi3.so", "FlashMLA (MLA models only)"),
    ("vllm/_flashmla_extension_C.abi3.so", "FlashMLA (MLA models only)"),
    ("vllm/vllm-rs", "the Rust front-end binary (not used by `vllm serve`)"),
    ("vllm/third_party/fmha_sm100/*", "Blackwell (sm_100) attention sources"),
    ("vllm/third_party/deep_gemm/include/*", "DeepGEMM JIT headers (FP8 only)"),
    ("vllm/third_party/deep_gemm/_C.cpython-31[013456789]-*", "DeepGEMM for other Pythons"),
    ("vllm-*.dist-info/RECORD", "install record (not needed to import)"),
]
FATBIN_TARGET = 90  # sm_90: H100, H200, GH200
# Edits to vLLM's own files that the pruning needs: (path, text, replacement, reason).
PATCHES = [
    ("vllm/vllm_flash_attn/__init__.py",
     "if not (FA2_AVAILABLE or FA3_AVAILABLE):\n    raise ImportError(",
     "if False:  # bundle: both extensions pruned; the FlashAttention backend reports itself\n"
     "    # unsupported and the run uses TRITON_ATTN\n    raise ImportError(",
     "vllm.v1.attention.backends.fa_utils imports this package unconditionally on CUDA "
     "(also when another attention backend is chosen); without the FA extensions it would "
     "raise at import"),
]


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def req_name(line: str) -> str:
    return norm(re.split(r"[\s;<>=!~\[(]", line.strip(), maxsplit=1)[0])


def pip(*args: str) -> None:
    cmd = [sys.executable, "-m", "pip", "--disable-pip-version-check", *args]
    print("+", " ".join(cmd[:8]), "...", flush=True)
    subprocess.run(cmd, check=True)


def platform_args() -> list[str]:
    out = ["--python-version", PY_VERSION, "--implementation", "cp", "--abi",
           "cp" + PY_VERSION.replace(".", ""), "--only-binary=:all:"]
    for p in PLATFORMS:
        out += ["--platform", p]
    return out


def vllm_wheel(version: str, wheels: Path) -> Path:
    found = sorted(wheels.glob(f"vllm-{version}-*.whl"))
    if not found:
        pip("download", "--no-deps", "-d", str(wheels), *platform_args(), f"vllm=={version}")
        found = sorted(wheels.glob(f"vllm-{version}-*.whl"))
    return found[0]


def requirements(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        lines = z.read(meta).decode().splitlines()
    reqs = [ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("Requires-Dist:")]
    return [r for r in reqs if "extra ==" not in r and req_name(r) not in SKIP_REQUIREMENTS]


def resolve(reqs: list[str], cache: Path) -> list[tuple[str, str]]:
    """(name, version) of every distribution the requirements pull in, for the GPU's Python."""
    report = cache / "resolve-report.json"
    listed = cache / "requirements.txt"
    if not report.exists() or not listed.exists() or listed.read_text() != "\n".join(reqs) + "\n":
        listed.write_text("\n".join(reqs) + "\n")
        pip("install", "--dry-run", "--ignore-installed", "--quiet", "--report", str(report),
            "--target", str(cache / "unused-target"), *platform_args(), "-r", str(listed))
    data = json.loads(report.read_text())
    return [(norm(i["metadata"]["name"]), i["metadata"]["version"]) for i in data["install"]]


def machine_packages(path: Path) -> set[str]:
    return {norm(ln.strip()) for ln in path.read_text().splitlines()
            if ln.strip() and not ln.startswith("#")}


def download(pins: list[tuple[str, str]], wheels: Path) -> dict[str, Path]:
    def find(name: str, version: str) -> Path | None:
        for w in wheels.glob("*.whl"):
            dist, ver = w.name.split("-")[:2]
            if norm(dist) == name and ver == version:
                return w
        return None
    missing = [f"{n}=={v}" for n, v in pins if find(n, v) is None]
    if missing:
        pip("download", "--no-deps", "-d", str(wheels), *platform_args(), *missing)
    out = {}
    for n, v in pins:
        w = find(n, v)
        if w is None:
            raise SystemExit(f"build_bundle: no wheel for {n}=={v} after download")
        out[n] = w
    return out


def unpack(wheel: Path, dest: Path, prune: list[tuple[str, str]] | None = None
           ) -> list[dict[str, object]]:
    pruned: list[dict[str, object]] = []
    with zipfile.ZipFile(wheel) as z:
        for info in z.infolist():
            if info.is_dir():
                continue
            why = next((r for g, r in (prune or []) if fnmatch.fnmatch(info.filename, g)), None)
            if why:
                pruned.append({"path": info.filename, "bytes": info.file_size, "why": why})
                continue
            target = dest / info.filename
            target.parent.mkdir(parents=True, exist_ok=True)
            with z.open(info) as src, open(target, "wb") as dst:
                shutil.copyfileobj(src, dst)
            if (info.external_attr >> 16) & 0o111:
                target.chmod(0o755)
    return pruned


def apply_patches(tree: Path) -> list[dict[str, str]]:
    done = []
    for rel, old, new, why in PATCHES:
        path = tree / rel
        text = path.read_text()
        if text.count(old) != 1:
            raise SystemExit(f"build_bundle: patch for {rel} does not apply (vLLM changed?)")
        path.write_text(text.replace(old, new))
        done.append({"path": rel, "why": why})
    return done


def build_patches(version: str, out: Path) -> int:
    """extra-vllm-patches.tar.xz: only the patched vLLM files (a quick top-up)."""
    vwheel = vllm_wheel(version, CACHE / "wheels")
    stage = CACHE / "stage-patches"
    shutil.rmtree(stage, ignore_errors=True)
    tree = stage / "dists" / "vllm"
    with zipfile.ZipFile(vwheel) as z:
        for rel, *_ in PATCHES:
            (tree / rel).parent.mkdir(parents=True, exist_ok=True)
            (tree / rel).write_bytes(z.read(rel))
    patches = apply_patches(tree)
    (stage / "manifest.json").write_text(json.dumps({"vllm": version, "patches": patches}))
    out.mkdir(parents=True, exist_ok=True)
    bundle = out / "extra-vllm-patches.tar.xz"
    pack(stage, bundle)
    print(f"patch bundle {bundle} {bundle.stat().st_size} bytes")
    return 0


def pack(stage: Path, bundle: Path) -> None:
    tmp = bundle.with_suffix("")  # .tar
    with tarfile.open(tmp, "w") as tar:
        tar.add(stage / "manifest.json", arcname="manifest.json")
        tar.add(stage / "dists", arcname="dists")
    xz = shutil.which("xz")
    if xz:
        subprocess.run([xz, "-9", "-T0", "-f", str(tmp)], check=True)
    else:  # stdlib fallback, single-threaded
        import lzma
        with open(tmp, "rb") as src, lzma.open(bundle, "wb", preset=9) as dst:
            shutil.copyfileobj(src, dst)
        tmp.unlink()


def build_extra(specs: list[str], out: Path) -> int:
    pins = [(norm(s.split("==")[0]), s.split("==")[1]) for s in specs]
    files = download(pins, CACHE / "wheels")
    stage = CACHE / "stage-extra"
    shutil.rmtree(stage, ignore_errors=True)
    (stage / "dists").mkdir(parents=True)
    for n, w in files.items():
        unpack(w, stage / "dists" / n)
    (stage / "manifest.json").write_text(json.dumps(
        {"vllm": None, "dists": [{"name": n, "version": v} for n, v in pins]}, indent=1))
    out.mkdir(parents=True, exist_ok=True)
    bundle = out / f"extra-{pins[0][0]}.tar.xz"
    pack(stage, bundle)
    print(f"extra bundle {bundle} {bundle.stat().st_size / 2**20:.2f} MiB")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--vllm", default="0.26.0", help="vLLM version (default 0.26.0)")
    ap.add_argument("--out", default=str(HERE.parent.parent / ".gpu-carry"))
    ap.add_argument("--machine-packages", default=str(HERE / "h200-packages.txt"),
                    help="distributions the GPU machine already has (one a line)")
    ap.add_argument("--extra", nargs="+", metavar="NAME==VERSION", default=None,
                    help="only build extra-<first name>.tar.xz with these distributions (a "
                    "quick top-up the installer applies after the main bundle)")
    ap.add_argument("--patches-only", action="store_true",
                    help="only build extra-vllm-patches.tar.xz (the patched vLLM files)")
    args = ap.parse_args()
    t0 = time.time()
    if args.extra:
        return build_extra(args.extra, Path(args.out))
    if args.patches_only:
        return build_patches(args.vllm, Path(args.out))
    cache = CACHE / f"vllm-{args.vllm}"
    wheels = CACHE / "wheels"
    cache.mkdir(parents=True, exist_ok=True)
    wheels.mkdir(parents=True, exist_ok=True)

    vwheel = vllm_wheel(args.vllm, wheels)
    have = machine_packages(Path(args.machine_packages))
    resolved = resolve(requirements(vwheel), cache)
    pins = [(n, v) for n, v in resolved
            if n not in have and n not in SKIP_DEPENDENCIES and not n.startswith("nvidia-")
            and n not in SKIP_REQUIREMENTS]
    skipped = sorted(n for n, _ in resolved if (n, _) not in pins)
    files = download(pins, wheels)

    stage = cache / "stage"
    shutil.rmtree(stage, ignore_errors=True)
    (stage / "dists").mkdir(parents=True)
    pruned = unpack(vwheel, stage / "dists" / "vllm", PRUNE)
    patches = apply_patches(stage / "dists" / "vllm")
    fatbins = {}
    for so in sorted((stage / "dists" / "vllm").rglob("*.so")):
        try:
            fatbins[str(so.relative_to(stage / "dists" / "vllm"))] = fatbin.prune(
                so, FATBIN_TARGET)
        except ValueError as exc:
            fatbins[str(so.relative_to(stage / "dists" / "vllm"))] = {"error": str(exc)}
    for n, w in files.items():
        unpack(w, stage / "dists" / n)
    manifest = {
        "vllm": args.vllm,
        "python": PY_VERSION,
        "dists": [{"name": "vllm", "version": args.vllm, "wheel": vwheel.name}]
        + [{"name": n, "version": v, "wheel": files[n].name} for n, v in pins],
        "not_carried": skipped,
        "pruned": pruned,
        "patches": patches,
        "fatbin_target_sm": FATBIN_TARGET,
        "fatbins": fatbins,
    }
    (stage / "manifest.json").write_text(json.dumps(manifest, indent=1))

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    bundle = out / "vllm-bundle.tar.xz"
    pack(stage, bundle)
    shutil.copy(stage / "manifest.json", out / "manifest.json")
    shutil.copy(HERE / "install_bundle.py", out / "install_bundle.py")
    size = bundle.stat().st_size
    print(f"bundle {bundle} {size / 2**20:.1f} MiB, {len(pins) + 1} distributions, "
          f"{time.time() - t0:.0f} s")
    if size > LIMIT:
        print(f"build_bundle: {size} bytes is over the {LIMIT}-byte transfer limit",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
