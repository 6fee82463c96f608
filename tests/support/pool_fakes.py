"""Stand-ins for the vLLM servers of an operator's pool pods in the sandbox.

kwok runs no containers, but gives pods IPs on loopback (a /16 of 127.64.0.0/10).
`PoolFakes` follows the pool pods of one namespace (labels `mtp-operator.io/mtpinference`,
`mtp-operator.io/gpu-product`, Ready, with a pod IP) and keeps one `FakeVLLM` (vLLM 0.33.0's
exact /metrics) bound on each pod's IP at port 8000, with the pod's own K (read from its
`MTP_RUNTIME_CONFIG`): when a pool rolls to a new K, kwok replaces the pod, the old fake stops
and a fresh one with the new K and zeroed counters starts, as a restarted vLLM would. A driver
thread advances every fake's counters (`drafts_per_second`, per-position acceptance p set per
GPU product), so Prometheus and the operator's evaluator see live rates.

    with PoolFakes(kubeconfig, namespace, acceptance={"NVIDIA-H100-80GB-HBM3": 0.6}) as fakes:
        fakes.wait_serving({"NVIDIA-H100-80GB-HBM3": 6, ...})
        fakes.set_acceptance("NVIDIA-H100-80GB-HBM3", 0.95)
        fakes.set_rate("NVIDIA-L40S", 0)        # idle: counters stop moving (no data)
        fakes.set_serving("NVIDIA-L40S", False) # vLLM down: /metrics refused

Knobs are keyed by GPU product, or by (resource name, GPU product) for one resource's pool.

With `file_sd=PATH` it also writes a Prometheus file_sd target list of the namespace's pool
pods carrying the `__meta_kubernetes_*` labels Prometheus' Kubernetes pod discovery would give
(namespace, pod name, pod labels, container port name, readiness), one target per container
port, so a scrape config can apply a PodMonitor's own relabelings. (Debian's Prometheus has no
Kubernetes discovery built in.)

`PoolWatch` watches the namespace's pool Deployments and records each change of a pool's
settings (K, settings hash, vllm command) with its time, for "only this pool changed" checks
and reaction-time measurements.

Standard library, lightkube and FakeVLLM only; usable from tests and bench scripts alike.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lightkube import Client, KubeConfig
from lightkube.resources.core_v1 import Pod

from support.fake_vllm import FakeVLLM

log = logging.getLogger(__name__)

LABEL_RESOURCE = "mtp-operator.io/mtpinference"
LABEL_GPU_PRODUCT = "mtp-operator.io/gpu-product"
VLLM_PORT = 8000
RUNTIME_CONFIG_ENV = "MTP_RUNTIME_CONFIG"
ANNOTATION_COMMAND = "mtp-operator.io/vllm-command"
ANNOTATION_SETTINGS_HASH = "mtp-operator.io/settings-hash"
ANNOTATION_GPU_PRODUCT = "mtp-operator.io/gpu-product"

Key = str | tuple[str, str]  # GPU product, or (resource name, GPU product)


def pod_k(pod: Any) -> int | None:
    """The K a pool pod runs, from the MTP_RUNTIME_CONFIG the operator gave it."""
    for container in pod.spec.containers or []:
        for env in container.env or []:
            if env.name == RUNTIME_CONFIG_ENV and env.value:
                return int(json.loads(env.value)["serve"]["num_speculative_tokens"])
    return None


def sanitize_label(label: str) -> str:
    """A Kubernetes label key as a Prometheus label name part (as Kubernetes SD does)."""
    return "".join(c if c.isalnum() or c == "_" else "_" for c in label)


def _ready(pod: Any) -> bool:
    conds = (pod.status.conditions if pod.status else None) or []
    return any(c.type == "Ready" and c.status == "True" for c in conds)


@dataclass
class Served:
    pod: str
    resource: str
    product: str
    ip: str
    k: int
    fake: FakeVLLM


class PoolFakes:
    def __init__(
        self,
        kubeconfig: str | Path,
        namespace: str,
        acceptance: Mapping[Key, float] | None = None,
        *,
        default_acceptance: float = 0.95,
        drafts_per_second: float = 100.0,
        tick: float = 0.2,
        poll: float = 0.3,
        seed: int = 0,
        model_name: str = "fake-model",
        file_sd: str | Path | None = None,
    ) -> None:
        self.client = Client(KubeConfig.from_file(str(kubeconfig)))
        self.namespace = namespace
        self.acceptance: dict[Key, float] = dict(acceptance or {})
        self.default_acceptance = default_acceptance
        self.rates: dict[Key, float] = {}
        self.default_rate = drafts_per_second
        self.serving_off: set[Key] = set()
        self.tick = tick
        self.poll = poll
        self.seed = seed
        self.model_name = model_name
        self.file_sd = Path(file_sd) if file_sd else None
        self._sd_text: str | None = None
        self.served: dict[str, Served] = {}  # by pod name
        self.errors: list[str] = []
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._carry: dict[str, float] = {}
        self._n = 0

    # -- knobs (key: GPU product, or (resource name, GPU product)) -------------------------
    def set_acceptance(self, key: Key, p: float) -> None:
        with self._lock:
            self.acceptance[key] = p

    def set_rate(self, key: Key, drafts_per_second: float | Callable[[int], float]) -> None:
        """Drafts per second of each fake of the pool, or a function of the fake's K."""
        with self._lock:
            self.rates[key] = drafts_per_second

    def set_serving(self, key: Key, on: bool) -> None:
        """Off: the pool's fakes are stopped (connection refused) until turned on again."""
        with self._lock:
            if on:
                self.serving_off.discard(key)
            else:
                self.serving_off.add(key)
        self.sync()

    @staticmethod
    def _lookup(table: Mapping[Key, Any], resource: str, product: str, default: Any) -> Any:
        if (resource, product) in table:
            return table[(resource, product)]
        return table.get(product, default)

    def _off(self, resource: str, product: str) -> bool:
        return (resource, product) in self.serving_off or product in self.serving_off

    # -- following pods -----------------------------------------------------------------
    def _pods(self) -> dict[str, tuple[str, str, str, int]]:
        out = {}
        pods = list(self.client.list(Pod, namespace=self.namespace, labels={LABEL_RESOURCE: None}))
        if self.file_sd is not None:
            self._write_file_sd(pods)
        for pod in pods:
            meta, status = pod.metadata, pod.status
            if meta.deletionTimestamp or not status or not status.podIP or not _ready(pod):
                continue
            k = pod_k(pod)
            if k is None:
                continue
            labels = meta.labels or {}
            out[meta.name] = (labels[LABEL_RESOURCE], labels[LABEL_GPU_PRODUCT], status.podIP, k)
        return out

    def _write_file_sd(self, pods: list[Any]) -> None:
        groups = []
        for pod in sorted(pods, key=lambda p: p.metadata.name):
            meta, status = pod.metadata, pod.status
            if not status or not status.podIP or meta.deletionTimestamp:
                continue
            labels = {
                "__meta_kubernetes_namespace": meta.namespace,
                "__meta_kubernetes_pod_name": meta.name,
                "__meta_kubernetes_pod_ip": status.podIP,
                "__meta_kubernetes_pod_ready": "true" if _ready(pod) else "false",
                "__meta_kubernetes_pod_node_name": (pod.spec.nodeName or ""),
            }
            for key, value in (meta.labels or {}).items():
                labels[f"__meta_kubernetes_pod_label_{sanitize_label(key)}"] = value
                labels[f"__meta_kubernetes_pod_labelpresent_{sanitize_label(key)}"] = "true"
            for container in pod.spec.containers or []:
                for port in container.ports or []:
                    groups.append({
                        "targets": [f"{status.podIP}:{port.containerPort}"],
                        "labels": {
                            **labels,
                            "__meta_kubernetes_pod_container_name": container.name,
                            "__meta_kubernetes_pod_container_port_name": port.name or "",
                            "__meta_kubernetes_pod_container_port_number":
                                str(port.containerPort),
                        },
                    })
        text = json.dumps(groups, indent=1)
        if text == self._sd_text:
            return
        assert self.file_sd is not None
        tmp = self.file_sd.with_suffix(".tmp")
        tmp.write_text(text)
        tmp.replace(self.file_sd)  # atomic: Prometheus never reads half a file
        self._sd_text = text

    def sync(self) -> None:
        """Bring the fakes in line with the namespace's Ready pool pods (also run by a thread)."""
        pods = self._pods()
        with self._lock:
            for name, s in list(self.served.items()):
                want = pods.get(name)
                if (
                    want is None
                    or want[2] != s.ip
                    or want[3] != s.k
                    or self._off(s.resource, s.product)
                ):
                    s.fake.stop()
                    del self.served[name]
            for name, (resource, product, ip, k) in pods.items():
                if name in self.served or self._off(resource, product):
                    continue
                self._n += 1
                fake = FakeVLLM(
                    k=k, model_name=self.model_name, host=ip, port=VLLM_PORT,
                    seed=self.seed + self._n,
                )
                try:
                    fake.start()
                except OSError as err:  # the IP:port is still taken (another fake, a race)
                    self.errors.append(f"{name} {ip}:{VLLM_PORT}: {err}")
                    continue
                self.served[name] = Served(name, resource, product, ip, k, fake)

    def _follow(self) -> None:
        while not self._stop.wait(self.poll):
            try:
                self.sync()
            except Exception as err:  # the API server may be briefly away; keep following
                log.debug("pool fakes sync failed: %s", err)

    def _drive(self) -> None:
        last = time.monotonic()
        while not self._stop.wait(self.tick):
            now = time.monotonic()
            dt, last = now - last, now
            with self._lock:
                for s in self.served.values():
                    if s.k <= 0:
                        continue
                    rate = self._lookup(self.rates, s.resource, s.product, self.default_rate)
                    if callable(rate):  # a rate per K (a step cost): set_rate(key, f)
                        rate = rate(s.k)
                    p = self._lookup(
                        self.acceptance, s.resource, s.product, self.default_acceptance
                    )
                    carry = self._carry.get(s.pod, 0.0) + rate * dt
                    n = int(carry)
                    self._carry[s.pod] = carry - n
                    if n:
                        s.fake.advance_random(n, p)

    # -- lifecycle ----------------------------------------------------------------------
    def start(self) -> PoolFakes:
        self.sync()
        for target in (self._follow, self._drive):
            t = threading.Thread(target=target, daemon=True, name=f"pool-fakes-{target.__name__}")
            t.start()
            self._threads.append(t)
        return self

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=5)
        with self._lock:
            for s in self.served.values():
                with contextlib.suppress(Exception):
                    s.fake.stop()
            self.served.clear()
        with contextlib.suppress(Exception):
            self.client.close()

    def __enter__(self) -> PoolFakes:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- reading ------------------------------------------------------------------------
    def serving(self, resource: str | None = None) -> dict[str, list[Served]]:
        """{gpu product: [Served, ...]} of the fakes serving now (of one resource, or all)."""
        out: dict[str, list[Served]] = {}
        with self._lock:
            for s in self.served.values():
                if resource is None or s.resource == resource:
                    out.setdefault(s.product, []).append(s)
        return out

    def scrapes(self, resource: str | None = None, product: str | None = None) -> int:
        """/metrics requests answered so far by the fakes serving now (a scrape clock)."""
        with self._lock:
            return sum(
                s.fake.scrapes
                for s in self.served.values()
                if (resource is None or s.resource == resource)
                and (product is None or s.product == product)
            )

    def wait_serving(
        self, ks: Mapping[str, int], resource: str | None = None, timeout: float = 30
    ) -> dict[str, list[Served]]:
        """Until each product in `ks` has fakes, all with that K; returns serving()."""
        deadline = time.monotonic() + timeout
        while True:
            now = self.serving(resource)
            if all(now.get(p) and all(s.k == want for s in now[p]) for p, want in ks.items()):
                return now
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"fakes not serving {dict(ks)} in {timeout}s; serving {now}; "
                    f"errors {self.errors[-5:]}"
                )
            time.sleep(0.1)


def deployment_k(dep: Mapping[str, Any]) -> int | None:
    """A pool Deployment's K, from its vllm-command annotation (0: no speculative config)."""
    raw = ((dep.get("metadata") or {}).get("annotations") or {}).get(ANNOTATION_COMMAND)
    if not raw:
        return None
    argv = json.loads(raw)
    if "--speculative-config" not in argv:
        return 0
    return int(json.loads(argv[argv.index("--speculative-config") + 1])["num_speculative_tokens"])


@dataclass(frozen=True)
class PoolChange:
    t: float  # time.monotonic() when the watch delivered it
    wall: float  # time.time() likewise
    resource: str
    product: str
    deployment: str
    k: int | None
    settings_hash: str | None
    command: str | None
    initial: bool = False  # listed when the watch started, not a change


class PoolWatch:
    """Watches the namespace's pool Deployments; records every change of a pool's settings.

    changes: PoolChange in delivery order (the initial listing first, `initial=True`).
    """

    def __init__(self, kubeconfig: str | Path, namespace: str) -> None:
        self.kubeconfig = str(kubeconfig)
        self.namespace = namespace
        self.changes: list[PoolChange] = []
        self._last: dict[str, tuple[Any, ...]] = {}
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[None] | None = None
        self._listed = threading.Event()
        self._error: BaseException | None = None

    def _record(self, dep: Mapping[str, Any], initial: bool = False) -> None:
        meta = dep.get("metadata") or {}
        ann = meta.get("annotations") or {}
        product = ann.get(ANNOTATION_GPU_PRODUCT)
        resource = (meta.get("labels") or {}).get(LABEL_RESOURCE)
        if not product or not resource:
            return
        state = (deployment_k(dep), ann.get(ANNOTATION_SETTINGS_HASH), ann.get(ANNOTATION_COMMAND))
        with self._cond:
            if self._last.get(meta["name"]) == state:
                return
            self._last[meta["name"]] = state
            self.changes.append(
                PoolChange(time.monotonic(), time.time(), resource, product, meta["name"],
                           *state, initial=initial)
            )
            self._cond.notify_all()

    # The watch runs in its own thread's event loop and is stopped by cancelling its task in
    # that loop: closing a blocking client from another thread could leave a read pending on
    # a socket number the OS then reuses (e.g. for a subprocess pipe), and steal its data.
    async def _main(self) -> None:
        from lightkube import AsyncClient
        from lightkube.resources.apps_v1 import Deployment

        self._task = asyncio.current_task()
        client = AsyncClient(KubeConfig.from_file(self.kubeconfig))
        labels = {LABEL_RESOURCE: None}
        try:
            try:
                listing = client.list(Deployment, namespace=self.namespace, labels=labels)
                async for dep in listing:
                    self._record(dep.to_dict(), initial=True)
                version = listing.resourceVersion
            except Exception as err:
                self._error = err
                raise
            finally:
                self._listed.set()
            while True:
                try:
                    async for _kind, obj in client.watch(
                        Deployment, namespace=self.namespace, labels=labels,
                        resource_version=version, server_timeout=60,
                    ):
                        version = obj.metadata.resourceVersion
                        self._record(obj.to_dict())
                except asyncio.CancelledError:
                    raise
                except Exception as err:  # the API server went away: watch again
                    log.debug("deployment watch failed, restarting: %s", err)
                    await asyncio.sleep(0.2)
        finally:
            await client.close()

    def _run(self) -> None:
        self._loop = asyncio.new_event_loop()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            self._loop.run_until_complete(self._main())
        self._loop.close()

    def start(self) -> PoolWatch:
        self._thread = threading.Thread(target=self._run, daemon=True, name="pool-watch")
        self._thread.start()
        self._listed.wait(30)
        if self._error is not None:
            raise self._error
        return self

    def stop(self) -> None:
        loop, task = self._loop, self._task
        if loop is not None and task is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(task.cancel)
        if self._thread is not None:
            self._thread.join(timeout=10)

    def __enter__(self) -> PoolWatch:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def current(self) -> dict[tuple[str, str], PoolChange]:
        """{(resource, product): the pool's latest settings}."""
        with self._cond:
            out: dict[tuple[str, str], PoolChange] = {}
            for c in self.changes:
                out[(c.resource, c.product)] = c
            return out

    def since(self, t: float) -> list[PoolChange]:
        """Changes delivered after monotonic time `t`."""
        with self._cond:
            return [c for c in self.changes if c.t > t and not c.initial]

    def wait(self, pred: Any, after: float = 0.0, timeout: float = 30) -> PoolChange:
        """The first change after `after` (monotonic) that satisfies `pred`; waits for it."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                for c in self.changes:
                    if c.t > after and not c.initial and pred(c):
                        return c
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(
                        f"no matching pool change in {timeout}s; latest: {self.current()}"
                    )
                self._cond.wait(left)
