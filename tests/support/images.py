"""The project's images for tests: built by tests/images/build.sh (buildah, cached by their
inputs) and run with podman the way these machines allow (runc, cgroupfs, rlimits below the
hard limits, the host network: every port stays on loopback)."""

from __future__ import annotations

import shutil
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BUILD = REPO / "tests" / "images" / "build.sh"

PODMAN = ["podman", "--cgroup-manager=cgroupfs", "--runtime", "runc"]
RUN_FLAGS = ["--network", "host", "--ulimit", "nofile=4096:4096", "--ulimit", "nproc=4096:4096"]

# Every container a test starts carries both labels: the first marks it as a test's, the second
# as this pytest process's. A run killed mid-test (a time-out, ^C) leaves its containers behind;
# the next run removes them (remove_stale_containers) and checks only its own for leftovers.
TEST_LABEL = "mtp-operator.io/test"
RUN_LABEL = "mtp-operator.io/test-run"
RUN_ID = uuid.uuid4().hex[:12]
LABEL_FLAGS = ["--label", f"{TEST_LABEL}=images", "--label", f"{RUN_LABEL}={RUN_ID}"]


def build(target: str, timeout: float = 3600) -> str:
    """The image reference of `target` (operator, runtime-cpu), built when its inputs changed."""
    missing = [t for t in ("podman", "buildah", "runc", "debootstrap") if not shutil.which(t)]
    if missing:
        pytest.fail(f"{', '.join(missing)} not installed: run tests/images/install_tools.sh "
                    "(make test does)")
    out = subprocess.run(["bash", str(BUILD), target], capture_output=True, text=True,
                         timeout=timeout)
    if out.returncode != 0:
        raise AssertionError(f"tests/images/build.sh {target} failed:\n{out.stderr[-6000:]}")
    return out.stdout.strip().splitlines()[-1].split("=", 1)[1]


def podman(*args: str, check: bool = True, timeout: float = 300,
           input: str | None = None) -> subprocess.CompletedProcess[str]:
    out = subprocess.run([*PODMAN, *args], capture_output=True, text=True, timeout=timeout,
                         input=input)
    if check and out.returncode != 0:
        raise AssertionError(f"podman {' '.join(args)} exited {out.returncode}:\n"
                             f"{out.stderr[-4000:]}{out.stdout[-2000:]}")
    return out


def _name() -> str:
    return f"mtp-test-{RUN_ID}-{uuid.uuid4().hex[:8]}"


def _containers(label: str) -> list[str]:
    if not shutil.which("podman"):
        return []  # build() says what to install
    out = podman("ps", "-aq", "--filter", f"label={label}", check=False)
    return out.stdout.split()


def remove_stale_containers() -> list[str]:
    """Remove the test containers of earlier pytest runs (any with TEST_LABEL but another
    RUN_LABEL) and return their IDs."""
    ours = set(_containers(f"{RUN_LABEL}={RUN_ID}"))
    stale = [c for c in _containers(TEST_LABEL) if c not in ours]
    if stale:
        podman("rm", "-f", *stale, check=False)
    return stale


def leftover_containers() -> list[str]:
    """This run's containers that still exist."""
    return _containers(f"{RUN_LABEL}={RUN_ID}")


def run(image: str, *args: str, flags: Sequence[str] = (), timeout: float = 300,
        check: bool = True) -> subprocess.CompletedProcess[str]:
    """`podman run --rm` of `image` with `args` (after the entrypoint); on a time-out the
    container is removed before the error propagates."""
    name = _name()
    try:
        return podman("run", "--rm", "--name", name, *LABEL_FLAGS, *RUN_FLAGS, *flags, image,
                      *args, check=check, timeout=timeout)
    except subprocess.TimeoutExpired:
        podman("rm", "-f", name, check=False)
        raise


class Container:
    """A detached container (`podman run -d`) once start() ran, removed by stop(). It is named
    before it is created, so stop() finds it even when `podman run` failed after creating it."""

    def __init__(self, image: str, args: Sequence[str], flags: Sequence[str] = ()) -> None:
        self.id = _name()
        self.argv = ["run", "-d", "--name", self.id, *LABEL_FLAGS, *RUN_FLAGS, *flags, image,
                     *args]

    def start(self) -> Container:
        podman(*self.argv)
        return self

    def running(self) -> bool:
        out = podman("inspect", "--format", "{{.State.Running}}", self.id, check=False)
        return out.stdout.strip() == "true"

    def logs(self) -> str:
        out = podman("logs", self.id, check=False)
        return out.stdout + out.stderr

    def exec(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return podman("exec", self.id, *args, check=check)

    def stop(self, timeout: int = 10) -> None:
        podman("stop", "-t", str(timeout), self.id, check=False)
        podman("rm", "-f", self.id, check=False)


@pytest.fixture
def container() -> Iterator[Callable[..., Container]]:
    """container(image, args, flags) -> a running Container; all are removed after the test."""
    started: list[Container] = []

    def start(image: str, args: Sequence[str] = (), flags: Sequence[str] = ()) -> Container:
        c = Container(image, args, flags)
        started.append(c)  # before it exists: a failed start is still cleaned up
        return c.start()

    yield start
    for c in started:
        c.stop()
    leftover = leftover_containers()
    assert not leftover, f"containers left behind: {leftover}"


def wait_until(predicate: Callable[[], object], timeout: float, what: str,
               log: Callable[[], str] = lambda: "") -> object:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.5)
    raise TimeoutError(f"{what} not within {timeout}s\n{log()[-4000:]}")


def embedded_kubeconfig(source: Path, dest: Path, server: str | None = None) -> Path:
    """`source` (certificate paths) rewritten with the certificates inline, readable by any
    user (0644), so a container gets it as one mounted file."""
    import base64

    import yaml

    config = yaml.safe_load(source.read_text())
    for section, key in (("clusters", "cluster"), ("users", "user")):
        for entry in config.get(section, []):
            body = entry[key]
            for field in ("certificate-authority", "client-certificate", "client-key"):
                if field in body:
                    data = Path(body.pop(field)).read_bytes()
                    body[f"{field}-data"] = base64.b64encode(data).decode()
            if server and key == "cluster":
                body["server"] = server
    dest.write_text(yaml.safe_dump(config))
    dest.chmod(0o644)
    return dest


def tiny_model(timeout: float = 3600) -> Path:
    """The tiny MiMo MTP model folder (`make tiny-model`: trained once, cached by its script's
    hash; its last output line is MODEL=<path>)."""
    out = subprocess.run(["make", "-s", "tiny-model"], cwd=REPO, capture_output=True, text=True,
                         timeout=timeout)
    lines = [line for line in out.stdout.splitlines() if line.startswith("MODEL=")]
    if out.returncode != 0 or not lines:
        raise AssertionError(f"make tiny-model failed ({out.returncode}):\n{out.stderr[-4000:]}")
    return Path(lines[-1].split("=", 1)[1])


def readable_copy(model: Path, dest: Path) -> Path:
    """A copy of the model folder that any user may read (folders 0755, files 0644). The cached
    model's weights are owner-only (safetensors writes 0600) and the images run as non-root
    users, as a pod's volume would need to be readable by the pod's user."""
    shutil.copytree(model, dest)
    dest.chmod(0o755)
    for p in dest.rglob("*"):
        p.chmod(0o755 if p.is_dir() else 0o644)
    return dest


def with_model(image: str, model: Path, path: str = "/models/tiny-mimo") -> str:
    """`image` plus the model folder at `path` (one more layer, readable by any user), tagged by
    both inputs; for a pool pod, which mounts nothing from the host."""
    import hashlib
    import tempfile

    digest = hashlib.sha256(image.encode())
    for f in sorted(p for p in model.rglob("*") if p.is_file()):
        digest.update(str(f.relative_to(model)).encode())
        digest.update(f.read_bytes())
    repository = image.rsplit(":", 1)[0] + "-tiny-model"
    tag = f"{repository}:{digest.hexdigest()[:12]}"
    if podman("image", "exists", tag, check=False).returncode == 0:
        return tag
    with tempfile.TemporaryDirectory() as ctx:
        readable_copy(model, Path(ctx) / "model")
        (Path(ctx) / "Containerfile").write_text(f"FROM {image}\nCOPY model {path}\n")
        out = subprocess.run(
            ["buildah", "bud", "--runtime", "runc", "--cgroup-manager", "cgroupfs",
             "--network", "host", "-t", tag, ctx], capture_output=True, text=True, timeout=1800)
        if out.returncode != 0:
            raise AssertionError(f"buildah bud of {tag} failed:\n{out.stderr[-4000:]}")
    return tag
