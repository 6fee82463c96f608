"""Install the GPU carry bundle (vLLM + the distributions the machine lacks) with no network.

    python3 install_bundle.py vllm-bundle.tar.xz [extra-*.tar.xz ...] --target /tmp/vllm-site

Stdlib only (it runs on the GPU machine, where nothing can be fetched). Each distribution in the
bundle is unpacked into --target unless the running Python already has it, so the machine's
own numpy, numba, torch, transformers, ... are never replaced or downgraded. Console scripts
(`vllm`, `uvicorn`, ...) are written to --target/bin. Afterwards:

    export PYTHONPATH=/tmp/vllm-site PATH=/tmp/vllm-site/bin:$PATH

The last output line is `SITE=<target>`.
"""

from __future__ import annotations

import argparse
import configparser
import importlib.metadata as md
import json
import os
import re
import sys
import tarfile
import time
from pathlib import Path

ALWAYS = {"vllm"}  # the bundle's reason to exist: never taken from the machine


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def installed_here() -> dict[str, str]:
    out = {}
    for dist in md.distributions():
        name = dist.metadata["Name"]
        if name:
            out.setdefault(norm(name), dist.version)
    return out


def placed(rel: str) -> str | None:
    """Where a file of an unpacked wheel goes, relative to the target (None: not installed)."""
    parts = rel.split("/")
    if parts[0].endswith(".data") and len(parts) > 2:
        kind = parts[1]
        if kind in ("purelib", "platlib"):
            return "/".join(parts[2:])
        if kind == "scripts":
            return "bin/" + "/".join(parts[2:])
        return None  # headers, data: not needed to import or run
    return rel


def write_scripts(target: Path, names: list[str]) -> list[str]:
    """Console scripts of the installed distributions, for this Python."""
    made = []
    bindir = target / "bin"
    bindir.mkdir(exist_ok=True)
    for info in sorted(target.glob("*.dist-info")):
        ep = info / "entry_points.txt"
        if not ep.exists() or norm(info.name.split("-")[0]) not in names:
            continue
        cp = configparser.ConfigParser(delimiters=("=",), interpolation=None)
        cp.optionxform = str  # type: ignore[assignment,method-assign]
        cp.read(ep)
        if not cp.has_section("console_scripts"):
            continue
        for script, spec in cp.items("console_scripts"):
            module, _, attr = spec.strip().partition(":")
            attr = attr.split("[")[0].strip()
            path = bindir / script
            # the __main__ guard matters: vLLM starts its engine core with multiprocessing's
            # "spawn", which re-imports the main script in the child
            call = "_entry" + "".join("." + a for a in attr.split(".")[1:])
            path.write_text(
                f"#!{sys.executable}\nimport sys\n"
                f"from {module.strip()} import {attr.split('.')[0]} as _entry\n\n"
                f"if __name__ == \"__main__\":\n    sys.exit({call}())\n")
            path.chmod(0o755)
            made.append(script)
    return made


def install(bundle: Path, target: Path, force: bool = False) -> dict[str, object]:
    t0 = time.time()
    have = {} if force else installed_here()
    target.mkdir(parents=True, exist_ok=True)
    with tarfile.open(bundle, "r:xz") as tar:
        manifest = None
        decided: dict[str, bool] = {}
        installed, kept = [], {}
        for member in tar:
            if member.name == "manifest.json":
                f = tar.extractfile(member)
                manifest = json.loads(f.read()) if f else None
                continue
            parts = member.name.split("/", 2)
            if parts[0] != "dists" or len(parts) < 3 or not member.isfile():
                continue
            dist = parts[1]
            if dist not in decided:
                decided[dist] = dist in ALWAYS or dist not in have
                if decided[dist]:
                    installed.append(dist)
                else:
                    kept[dist] = have[dist]
            if not decided[dist]:
                continue
            rel = placed(parts[2])
            if rel is None:
                continue
            dest = target / rel
            if target.resolve() not in dest.resolve().parents:
                raise SystemExit(f"install_bundle: {member.name!r} escapes the target")
            dest.parent.mkdir(parents=True, exist_ok=True)
            src = tar.extractfile(member)
            if src is None:
                continue
            with src, open(dest, "wb") as out:
                while chunk := src.read(1 << 20):
                    out.write(chunk)
            os.chmod(dest, 0o755 if member.mode & 0o111 else 0o644)
    scripts = write_scripts(target, installed)
    result = {"target": str(target), "installed": installed,
              "kept_from_machine": kept, "scripts": scripts,
              "vllm": (manifest or {}).get("vllm"), "seconds": round(time.time() - t0, 1)}
    (target / "bundle-install.json").write_text(json.dumps(result, indent=1))
    return result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("bundle", type=Path, nargs="+",
                    help="bundles (same layout: manifest.json, dists/<name>/...), in order")
    ap.add_argument("--target", type=Path, required=True)
    ap.add_argument("--force", action="store_true",
                    help="install every distribution, even those the machine has")
    args = ap.parse_args()
    result: dict[str, object] = {}
    for bundle in args.bundle:
        one = install(bundle, args.target, args.force)
        if result:
            earlier = list(result["installed"])  # type: ignore[call-overload]
            one["installed"] = earlier + [d for d in one["installed"]  # type: ignore[attr-defined]
                                          if d not in earlier]
            one["vllm"] = result["vllm"] or one["vllm"]
        result = one
    (args.target / "bundle-install.json").write_text(json.dumps(result, indent=1))
    print(json.dumps({k: v for k, v in result.items() if k != "installed"}, indent=1))
    print(f"installed {len(result['installed'])} distributions: "  # type: ignore[arg-type]
          + " ".join(result["installed"]))  # type: ignore[arg-type]
    print(f"SITE={args.target.resolve()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
