"""Which GPU this pod really got: NVML (nvidia-ml-py), else `nvidia-smi`.

Device names are normalised to the strings NVIDIA GPU Feature Discovery puts in the node label
`nvidia.com/gpu.product` (`NVIDIA H200` → `NVIDIA-H200`), so they compare directly with the
pool's product. Parsing is pure (`parse_nvidia_smi`, `from_nvml_values`) and unit-tested on
recorded output; only `detect*` touch the machine.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from mtp_runtime.gpu_profiles import normalize_product, product_family

NVIDIA_SMI_QUERY = ["--query-gpu=name,memory.total", "--format=csv,noheader"]


class GPUDetectionError(RuntimeError):
    """No GPU could be seen (no driver, no device, no NVML, no nvidia-smi)."""


@dataclass(frozen=True)
class GPUInfo:
    product: str  # GFD label form, e.g. NVIDIA-H200 (of GPU 0)
    name: str  # as the driver reports it, e.g. "NVIDIA H200"
    count: int
    memory_mib: int | None  # of GPU 0
    source: str  # "nvml", "nvidia-smi", or "config" (a CPU dry run: nothing was detected)
    products: tuple[str, ...] = ()  # every visible GPU, when they differ

    @property
    def family(self) -> str | None:
        return product_family(self.product)

    def to_dict(self) -> dict[str, object]:
        d = asdict(self)
        d["products"] = list(self.products)
        d["family"] = self.family
        return d


def _summarise(names: Sequence[str], memories_mib: Sequence[int | None], source: str) -> GPUInfo:
    if not names:
        raise GPUDetectionError(f"{source} reports no GPU")
    products = tuple(normalize_product(n) for n in names)
    return GPUInfo(
        product=products[0],
        name=names[0].strip(),
        count=len(names),
        memory_mib=memories_mib[0] if memories_mib else None,
        source=source,
        products=products if len(set(products)) > 1 else (),
    )


def _memory_mib(field: str) -> int | None:
    """`143771 MiB` → 143771; `[N/A]` / `[Insufficient Permissions]` → None."""
    parts = field.strip().split()
    if not parts:
        return None
    try:
        value = float(parts[0])
    except ValueError:
        return None
    unit = parts[1].lower() if len(parts) > 1 else "mib"
    factor = {"mib": 1, "gib": 1024, "kib": 1 / 1024, "b": 1 / 2**20}.get(unit, 1)
    return round(value * factor)


def parse_nvidia_smi(text: str) -> GPUInfo:
    """Parse `nvidia-smi --query-gpu=name,memory.total --format=csv,noheader` output.

    One line per GPU: `NVIDIA H200, 143771 MiB`. Extra columns are ignored; a header line
    (`name, memory.total [MiB]`) is skipped.
    """
    names: list[str] = []
    memories: list[int | None] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        # GPU names contain no commas; split off the memory column from the right of the name
        fields = [f.strip() for f in line.split(",")]
        if fields[0].lower() == "name":
            continue
        if fields[0].startswith(("NVIDIA-SMI has failed", "No devices were found")):
            raise GPUDetectionError(line.strip())
        names.append(fields[0])
        memories.append(_memory_mib(fields[1]) if len(fields) > 1 else None)
    return _summarise(names, memories, "nvidia-smi")


def from_nvml_values(names: Sequence[str | bytes], memory_bytes: Sequence[int | None]) -> GPUInfo:
    """Build GPUInfo from what NVML returned (names are bytes in old nvidia-ml-py releases)."""
    decoded = [n.decode("utf-8", "replace") if isinstance(n, bytes) else str(n) for n in names]
    mib = [None if b is None else b // 2**20 for b in memory_bytes]
    return _summarise(decoded, mib, "nvml")


def detect_nvml() -> GPUInfo:
    try:
        import pynvml  # nvidia-ml-py
    except ImportError as exc:
        raise GPUDetectionError("nvidia-ml-py (pynvml) is not installed") from exc
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # pynvml.NVMLError and friends: no driver / no device
        raise GPUDetectionError(f"NVML could not start: {exc}") from exc
    try:
        count = pynvml.nvmlDeviceGetCount()
        names: list[str | bytes] = []
        memories: list[int | None] = []
        for i in range(count):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            names.append(pynvml.nvmlDeviceGetName(handle))
            try:
                memories.append(int(pynvml.nvmlDeviceGetMemoryInfo(handle).total))
            except Exception:
                memories.append(None)
        return from_nvml_values(names, memories)
    except GPUDetectionError:
        raise
    except Exception as exc:
        raise GPUDetectionError(f"NVML query failed: {exc}") from exc
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass


def detect_nvidia_smi(binary: str = "nvidia-smi", timeout: float = 30.0) -> GPUInfo:
    path = shutil.which(binary)
    if path is None:
        raise GPUDetectionError(f"{binary} not found on PATH")
    try:
        proc = subprocess.run(
            [path, *NVIDIA_SMI_QUERY], capture_output=True, text=True, timeout=timeout,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise GPUDetectionError(f"{binary} failed: {exc}") from exc
    if proc.returncode != 0:
        msg = (proc.stderr or proc.stdout).strip().splitlines()
        raise GPUDetectionError(
            f"{binary} exited {proc.returncode}: {msg[0] if msg else 'no output'}"
        )
    return parse_nvidia_smi(proc.stdout)


def detect() -> GPUInfo:
    """The GPUs of this machine/pod: NVML first, `nvidia-smi` as the fallback.

    Raises GPUDetectionError saying why both failed when no GPU can be seen.
    """
    errors = []
    for probe in (detect_nvml, detect_nvidia_smi):
        try:
            return probe()
        except GPUDetectionError as exc:
            errors.append(str(exc))
    raise GPUDetectionError(
        "no NVIDIA GPU detected (" + "; ".join(errors) + "). Is the pod scheduled with an "
        "nvidia.com/gpu limit and the NVIDIA container runtime? For a dry run without a GPU "
        "use --cpu-dry-run."
    )


def assumed(product: str) -> GPUInfo:
    """A GPU taken from the configuration instead of the machine (CPU dry runs)."""
    product = normalize_product(product)
    return GPUInfo(product=product, name=product.replace("-", " "), count=0, memory_mib=None,
                   source="config")
