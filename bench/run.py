#!/usr/bin/env python3
"""Scale benchmark of the operator on a dedicated local sandbox (`make bench`).

A sandbox of its own (state in $MTP_BENCH_SANDBOX_DIR, default <tmp>/mtp-bench-sandbox) with
--nodes-per-product simulated 8-GPU nodes for each of the 4 sandbox GPU products (default 40,
so 160 nodes and 320 GPUs per product) from a generated nodes file. Then, in this order:

floor       A plain client (lightkube, server-side apply, --concurrency requests in flight)
            creates the objects the operator would create for --resources MTPInferences
            (`mtp-operator render`: one Service and one pool Deployment per GPU product each,
            owner references removed) in namespace bench-floor, and waits until every
            Deployment has all replicas ready. No operator runs.
baseline    --window seconds with those objects in place and nobody acting: the API requests
            the controllers, scheduler and kwok make on their own (subtracted below).
operator    bench-floor is deleted (its pods gone); the operator (`mtp-operator run`,
            cluster-wide, evaluator off) is started, the same client applies --resources
            MTPInferences (TP=1, replicas 1) to bench-op, and waits until each reports
            status.phase Ready for its generation. Ratio: operator time / floor time.
steady      --window seconds with nothing changing: the operator's write counters and the
            API server's write requests (target: 0 from the operator).
restart     The operator is stopped (SIGTERM) and started again with nothing changed: time
            until /readyz, until every resource was reconciled, until its reconcile counter
            stops moving; writes meanwhile (target: 0).
            floor and operator run --rounds times (default 2), alternating; the ratio is of
            their medians (the machine is shared: single runs vary by tens of percent).
reaction    bench/reaction.py's main() if that file exists (alert -> patch timing), on the
            same sandbox after bench-op is deleted.

Measured: wall times; the operator's CPU seconds (utime+stime) and peak RSS (VmHWM) from
/proc; CPU seconds of each sandbox component; API requests by verb from the kube-apiserver's
own /metrics (apiserver_request_total, all clients, deltas per phase; server-side apply
counts as verb APPLY), and the operator's own requests exactly from the API server's audit
log (the sandbox audits ServiceAccount requests; the operator runs as one, cluster-admin).
The kube-controller-manager gets --kube-api-qps --kcm-qps (default 200): at its default of
20 the controller manager, not the operator or the client, paces both runs.

Results: bench/results/scale.json and bench/results/README.md (table, machine, date).

    python bench/run.py                     # full size: 160 nodes, 300 resources
    python bench/run.py --resources 20 --nodes-per-product 3 --window 10   # quick try
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import copy
import importlib.util
import json
import os
import re
import shutil
import signal
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "tests"), str(REPO / "tests" / "sandbox")]

import httpx  # noqa: E402
import yaml  # noqa: E402
from lightkube import ApiError, AsyncClient, KubeConfig, codecs  # noqa: E402
from lightkube.resources.apps_v1 import Deployment  # noqa: E402
from machine_info import machine  # noqa: E402  (bench/ is sys.path[0])

from mtp_operator.adapters.kube import MTPInferenceResource  # noqa: E402  (registers the kind)
from mtp_operator.render import DEFAULT_PRODUCTS, render_resource  # noqa: E402
from support.operator_proc import OperatorProcess  # noqa: E402

CRD = REPO / "crds" / "mtp-operator.io_mtpinferences.yaml"
FLOOR_NS, OP_NS = "bench-floor", "bench-op"
SA_NS, SA_NAME = "mtp-system", "mtp-operator"
FIELD_MANAGER = "mtp-bench"
WRITE_VERBS = ("APPLY", "PATCH", "UPDATE", "CREATE", "POST", "PUT", "DELETE", "DELETECOLLECTION")
OPERATOR_COUNTERS = ("reconciles", "deployment_writes", "status_writes")
WRITE_COUNTERS = ("deployment_writes", "status_writes")
AUDIT_WRITE_VERBS = ("create", "update", "patch", "delete", "deletecollection")
SAMPLE = re.compile(r"^apiserver_request_total\{(?P<labels>[^}]*)\} (?P<value>\S+)$")
LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", flush=True)


# ---- measuring ------------------------------------------------------------------------------


class Requests:
    """apiserver_request_total from the kube-apiserver's /metrics, by (verb, resource)."""

    def __init__(self, sb: Any) -> None:
        self.sb = sb

    def snapshot(self) -> Counter[tuple[str, str]]:
        text = self.sb.api("GET", "/metrics", timeout=30)
        out: Counter[tuple[str, str]] = Counter()
        for line in text.splitlines():
            m = SAMPLE.match(line)
            if not m:
                continue
            labels = dict(LABEL.findall(m["labels"]))
            resource = labels.get("resource", "")
            if labels.get("subresource"):
                resource += "/" + labels["subresource"]
            out[(labels.get("verb", "?"), resource)] += int(float(m["value"]))
        return out


class Audit:
    """The operator's own requests, from the kube-apiserver's audit log: the operator runs as
    a ServiceAccount, and the sandbox audits ServiceAccount requests (Metadata level)."""

    def __init__(self, path: Path, user: str) -> None:
        self.path, self.user = path, user

    def offset(self) -> int:
        try:
            return self.path.stat().st_size
        except OSError:
            return 0

    def since(self, offset: int) -> Counter[tuple[str, str]]:
        out: Counter[tuple[str, str]] = Counter()
        with contextlib.suppress(OSError), self.path.open("rb") as f:
            f.seek(offset)
            for raw in f:
                try:
                    ev = json.loads(raw)
                except ValueError:
                    continue
                if (ev.get("user") or {}).get("username") != self.user:
                    continue
                verb = ev.get("verb", "?")
                # a watch is counted when it starts; everything else when it completes
                if ev.get("stage") != (
                    "ResponseStarted" if verb == "watch" else "ResponseComplete"
                ):
                    continue
                ref = ev.get("objectRef") or {}
                resource = ref.get("resource", "")
                if ref.get("subresource"):
                    resource += "/" + ref["subresource"]
                out[(verb, resource)] += 1
        return out


def writes_only(verbs: Mapping[str, int]) -> dict[str, int]:
    return {v: n for v, n in verbs.items() if v in AUDIT_WRITE_VERBS and n}


def by_verb(delta: Mapping[tuple[str, str], int]) -> dict[str, int]:
    out: Counter[str] = Counter()
    for (verb, _), n in delta.items():
        out[verb] += n
    return dict(sorted(out.items()))


def diff(after: Counter, before: Counter) -> Counter:
    out = Counter(after)
    out.subtract(before)
    return Counter({k: v for k, v in out.items() if v})


def writes_by_resource(delta: Mapping[tuple[str, str], int]) -> dict[str, int]:
    return {f"{v} {r}": n for (v, r), n in sorted(delta.items()) if v in WRITE_VERBS and n}


def cpu_seconds(pid: int | None) -> float:
    if not pid:
        return 0.0
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def machine_busy_seconds() -> float:
    """CPU-seconds the whole machine has been busy (all CPUs, /proc/stat)."""
    fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields[:8])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def peak_rss_mib(pid: int | None) -> float:
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return 0.0


class Phase:
    """Wall time, API requests and CPU seconds (operator and sandbox components) of a phase."""

    def __init__(self, bench: Bench, name: str) -> None:
        self.bench, self.name = bench, name

    def __enter__(self) -> Phase:
        self.requests0 = self.bench.requests.snapshot()
        self.audit0 = self.bench.audit.offset()
        self.cpu0 = self.bench.cpu()
        self.busy0 = machine_busy_seconds()
        self.t0 = time.monotonic()
        return self

    def __exit__(self, *exc: object) -> None:
        self.seconds = time.monotonic() - self.t0
        self.delta = diff(self.bench.requests.snapshot(), self.requests0)
        self.operator_requests = self.bench.audit.since(self.audit0)
        cpu1 = self.bench.cpu()
        self.cpu = {k: round(cpu1.get(k, 0) - self.cpu0.get(k, 0), 2) for k in cpu1}
        # everything else on the machine meanwhile (other people's work on a shared machine)
        busy = machine_busy_seconds() - self.busy0
        self.cpu["machine_total"] = round(busy, 2)
        self.cpu["other_processes"] = round(
            busy - sum(v for k, v in self.cpu.items() if k not in ("machine_total",)), 2
        )

    def summary(self) -> dict[str, Any]:
        return {
            "seconds": round(self.seconds, 2),
            "requests_by_verb": by_verb(self.delta),
            "writes_by_resource": writes_by_resource(self.delta),
            "operator_requests_by_verb": by_verb(self.operator_requests),
            "operator_requests": {
                f"{v} {r}": n for (v, r), n in sorted(self.operator_requests.items())
            },
            "cpu_seconds": self.cpu,
        }


# ---- the cluster side -----------------------------------------------------------------------


def nodes_file(path: Path, per_product: int) -> Path:
    from sandbox import NODES_YAML

    spec = yaml.safe_load(NODES_YAML.read_text())
    spec["pools"] = [p for p in spec["pools"] if p.get("product")]  # GPU nodes only
    for pool in spec["pools"]:
        pool["count"] = per_product
        pool["gpus"] = 8
    assert {p["product"] for p in spec["pools"]} == set(DEFAULT_PRODUCTS)
    path.write_text(yaml.safe_dump(spec))
    return path


def resource_doc(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "mtp-operator.io/v1alpha1",
        "kind": "MTPInference",
        "metadata": {"name": name, "namespace": OP_NS},
        "spec": {"model": "deepseek-ai/DeepSeek-V3", "tensorParallelSize": 1, "replicas": 1},
    }


def floor_objects(names: Iterable[str]) -> list[dict[str, Any]]:
    """What the operator would create, pre-rendered; no owner (the GC would delete them)."""
    out = []
    for name in names:
        for obj in render_resource(resource_doc(name), DEFAULT_PRODUCTS):
            obj = copy.deepcopy(obj)
            obj["metadata"]["namespace"] = FLOOR_NS
            obj["metadata"].pop("ownerReferences", None)
            out.append(obj)
    return out


def as_dict(obj: Any) -> dict[str, Any]:
    return obj.to_dict() if hasattr(obj, "to_dict") else dict(obj)


def mtpi_ready(d: Mapping[str, Any]) -> bool:
    st = d.get("status") or {}
    return st.get("phase") == "Ready" and st.get("observedGeneration") == (
        d.get("metadata") or {}
    ).get("generation")


def deployment_ready(d: Mapping[str, Any]) -> bool:
    spec, st = d.get("spec") or {}, d.get("status") or {}
    want = spec.get("replicas", 1)
    return (
        st.get("observedGeneration", 0) >= (d.get("metadata") or {}).get("generation", 1)
        and st.get("readyReplicas", 0) >= want
        and st.get("updatedReplicas", 0) >= want
    )


class Tracker:
    """Readiness of every object of one kind in a namespace, kept by one watch."""

    def __init__(self, ready: Callable[[Mapping[str, Any]], bool]) -> None:
        self.is_ready = ready
        self.ready: dict[str, float] = {}  # name -> first time seen ready (monotonic)
        self.seen: set[str] = set()
        self.changed = asyncio.Event()

    async def run(self, client: AsyncClient, kind: Any, namespace: str) -> None:
        while True:
            try:
                async for typ, obj in client.watch(kind, namespace=namespace):
                    d = as_dict(obj)
                    name = d["metadata"]["name"]
                    if typ == "DELETED":
                        self.seen.discard(name)
                        self.ready.pop(name, None)
                    else:
                        self.seen.add(name)
                        if self.is_ready(d):
                            self.ready.setdefault(name, time.monotonic())
                    self.changed.set()
            except (ApiError, httpx.HTTPError) as err:
                log(f"watch {namespace}: {err}; again")
                await asyncio.sleep(1)

    async def wait(self, names: set[str], limit: float, what: str) -> None:
        deadline = time.monotonic() + limit
        last_report = time.monotonic()
        while not names <= set(self.ready):
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(
                    f"{what}: {len(names & set(self.ready))}/{len(names)} ready after {limit}s"
                )
            self.changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.changed.wait(), min(left, 5))
            if time.monotonic() - last_report > 15:
                log(f"  {what}: {len(names & set(self.ready))}/{len(names)} ready")
                last_report = time.monotonic()


async def apply_all(client: AsyncClient, docs: Sequence[dict[str, Any]], concurrency: int) -> None:
    sem = asyncio.Semaphore(concurrency)

    async def one(doc: dict[str, Any]) -> None:
        res = codecs.from_dict(doc)
        async with sem:
            for attempt in range(5):
                try:
                    await client.apply(res, field_manager=FIELD_MANAGER, force=True)
                    return
                except (ApiError, httpx.HTTPError) as err:
                    if attempt == 4:
                        raise
                    log(f"apply {doc['metadata']['name']}: {err}; retrying")
                    await asyncio.sleep(0.5 * (attempt + 1))

    await asyncio.gather(*(one(d) for d in docs))


def quantiles(values: Sequence[float]) -> dict[str, float]:
    if not values:
        return {}
    v = sorted(values)

    def q(p: float) -> float:
        return round(v[min(len(v) - 1, int(p * (len(v) - 1) + 0.5))], 2)

    return {"p50": q(0.5), "p90": q(0.9), "max": round(v[-1], 2)}


# ---- the benchmark --------------------------------------------------------------------------


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        from sandbox import Sandbox

        self.args = args
        self.work = Path(tempfile.mkdtemp(prefix="mtp-bench-"))
        state = Path(args.sandbox_dir)
        extra = {}
        if args.kcm_qps:
            extra["kube-controller-manager"] = [
                f"--kube-api-qps={args.kcm_qps}",
                f"--kube-api-burst={2 * args.kcm_qps}",
            ]
        self.sb = Sandbox(
            state,
            nodes_file=nodes_file(self.work / "nodes.yaml", args.nodes_per_product),
            extra_args=extra,
        )
        self.requests = Requests(self.sb)
        self.audit = Audit(self.sb.audit_log, f"system:serviceaccount:{SA_NS}:{SA_NAME}")
        self.sa_kubeconfig = self.work / "operator.kubeconfig"
        self.operator: OperatorProcess | None = None
        self.result: dict[str, Any] = {}

    # -- helpers
    def kubectl(self, *args: str, check: bool = True, input: str | None = None) -> str:
        p = self.sb.kubectl(*args, check=False, input=input, timeout=600)
        if check and p.returncode:
            raise RuntimeError(f"kubectl {' '.join(args)}: {p.stderr.strip()}")
        return p.stdout

    def cpu(self) -> dict[str, float]:
        out = {c: cpu_seconds(info.get("pid")) for c, info in self.sb.state()["pids"].items()}
        out["bench_client"] = cpu_seconds(os.getpid())
        if self.operator and self.operator.proc and self.operator.proc.poll() is None:
            out["operator"] = cpu_seconds(self.operator.proc.pid)
        return out

    def operator_identity(self) -> None:
        """A ServiceAccount (cluster-admin) for the operator, so the audit log shows its
        requests apart from everyone else's, and a kubeconfig with its token."""
        self.kubectl("create", "namespace", SA_NS)
        self.kubectl("create", "serviceaccount", SA_NAME, "-n", SA_NS)
        self.kubectl(
            "create",
            "clusterrolebinding",
            "mtp-bench-operator",
            "--clusterrole=cluster-admin",
            f"--serviceaccount={SA_NS}:{SA_NAME}",
        )
        token = self.kubectl("create", "token", SA_NAME, "-n", SA_NS, "--duration=4h").strip()
        self.sa_kubeconfig.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "sa",
            "clusters": [{"name": "bench", "cluster": {
                "server": self.sb.apiserver_url,
                "certificate-authority": str(self.sb.pki / "ca.crt")}}],
            "users": [{"name": SA_NAME, "user": {"token": token}}],
            "contexts": [{"name": "sa", "context": {"cluster": "bench", "user": SA_NAME}}],
        }))  # fmt: skip

    def start_operator(self) -> OperatorProcess:
        op = OperatorProcess(self.sa_kubeconfig, self.work / "operator", ["--no-evaluator"])
        self.operator = op
        return op.start(timeout=300)

    def counters(self) -> dict[str, float]:
        assert self.operator is not None
        return {n: self.operator.metric(f"mtp_operator_{n}_total") for n in OPERATOR_COUNTERS}

    def delete_namespace(self, ns: str, timeout: float = 600) -> float:
        """Collections first (one request each; pods at once, so their GPUs are free), then
        the namespace; the namespace and garbage collectors would take minutes at their
        client rate limits."""
        t0 = time.monotonic()
        now = {
            "kind": "DeleteOptions",
            "apiVersion": "v1",
            "gracePeriodSeconds": 0,
            "propagationPolicy": "Background",
        }
        for path in (
            f"/apis/apps/v1/namespaces/{ns}/deployments",
            f"/apis/apps/v1/namespaces/{ns}/replicasets",
            f"/api/v1/namespaces/{ns}/pods",
            f"/api/v1/namespaces/{ns}/services",
        ):
            with contextlib.suppress(OSError):
                self.sb.api("DELETE", path, now, timeout=300)
        self.kubectl("delete", "namespace", ns, "--wait=false", "--ignore-not-found")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            p = self.sb.kubectl("get", "namespace", ns, check=False)
            if p.returncode and "NotFound" in p.stderr:
                return time.monotonic() - t0
            time.sleep(1)
        raise TimeoutError(f"namespace {ns} still there after {timeout}s")

    def operator_events(self) -> set[str]:
        """Names of the Events the operator posted in the operator's namespace."""
        items = json.loads(self.kubectl("get", "events", "-n", OP_NS, "-o", "json"))["items"]
        return {
            e["metadata"]["name"]
            for e in items
            if (e.get("source") or {}).get("component") == "mtp-operator"
            or e.get("reportingComponent") == "mtp-operator"
        }

    # -- phases
    async def floor(self, client: AsyncClient, names: list[str]) -> None:
        objs = floor_objects(names)
        deployments = {o["metadata"]["name"] for o in objs if o["kind"] == "Deployment"}
        self.kubectl("create", "namespace", FLOOR_NS)
        tracker = Tracker(deployment_ready)
        watch = asyncio.create_task(tracker.run(client, Deployment, FLOOR_NS))
        log(f"floor: applying {len(objs)} objects ({len(deployments)} Deployments)")
        with Phase(self, "floor") as ph:
            t0 = time.monotonic()
            await apply_all(client, objs, self.args.concurrency)
            applied = time.monotonic() - t0
            await tracker.wait(deployments, self.args.timeout, "floor Deployments")
        watch.cancel()
        self.result["floor"] = {
            **ph.summary(),
            "objects": len(objs),
            "deployments": len(deployments),
            "client_requests": {"APPLY": len(objs)},
            "apply_seconds": round(applied, 2),
            "ready_after_seconds": quantiles([t - t0 for t in tracker.ready.values()]),
        }
        self.floor_phase = ph
        log(
            f"floor: {len(deployments)} Deployments ready in {ph.seconds:.1f}s "
            f"(client apply {applied:.1f}s)"
        )

    def baseline(self) -> None:
        log(f"baseline: {self.args.window:.0f}s with nobody acting")
        with Phase(self, "baseline") as ph:
            time.sleep(self.args.window)
        self.baseline_phase = ph
        self.result["baseline"] = ph.summary()

    async def operator_phase(self, client: AsyncClient, names: list[str]) -> None:
        self.kubectl("create", "namespace", OP_NS)
        t0 = time.monotonic()
        op = self.start_operator()
        self.result["operator_start_seconds"] = round(time.monotonic() - t0, 2)
        tracker = Tracker(mtpi_ready)
        watch = asyncio.create_task(tracker.run(client, MTPInferenceResource, OP_NS))
        docs = [resource_doc(n) for n in names]
        log(f"operator: applying {len(docs)} MTPInferences")
        with Phase(self, "operator") as ph:
            t0 = time.monotonic()
            await apply_all(client, docs, self.args.concurrency)
            applied = time.monotonic() - t0
            await tracker.wait(set(names), self.args.timeout, "MTPInferences Ready")
        watch.cancel()
        deps = json.loads(self.kubectl("get", "deployments", "-n", OP_NS, "-o", "json"))["items"]
        per_owner = Counter(d["metadata"]["ownerReferences"][0]["name"] for d in deps)
        self.op_phase = ph
        self.result["operator"] = {
            **ph.summary(),
            "resources": len(names),
            "deployments": len(deps),
            "deployments_per_resource": sorted(set(per_owner.values())),
            "client_requests": {"APPLY": len(docs)},
            "apply_seconds": round(applied, 2),
            "ready_after_seconds": quantiles([t - t0 for t in tracker.ready.values()]),
            "operator_counters": self.counters(),
            "operator_cpu_seconds": ph.cpu.get("operator"),
            "operator_peak_rss_mib": round(peak_rss_mib(op.proc.pid), 1),
        }
        log(
            f"operator: {len(names)} resources Ready in {ph.seconds:.1f}s; "
            f"{len(deps)} Deployments; operator CPU {ph.cpu.get('operator')}s, "
            f"peak RSS {self.result['operator']['operator_peak_rss_mib']} MiB"
        )

    def steady(self) -> None:
        time.sleep(5)  # the last status events of the phase before
        before = self.counters()
        events = self.operator_events()
        log(f"steady: {self.args.window:.0f}s with nothing changing")
        with Phase(self, "steady") as ph:
            time.sleep(self.args.window)
        after = self.counters()
        self.steady_phase = ph
        self.result["steady"] = {
            **ph.summary(),
            "operator_counter_deltas": {k: after[k] - before[k] for k in after},
            "operator_events_posted": len(self.operator_events() - events),
            "operator_cpu_seconds": ph.cpu.get("operator"),
        }

    def restart(self, expected: int) -> None:
        assert self.operator is not None
        self.operator.stop(signal.SIGTERM)
        events = self.operator_events()
        log("restart: operator stopped; starting it again with nothing changed")
        with Phase(self, "restart") as ph:
            t0 = time.monotonic()
            op = self.start_operator()
            ready = time.monotonic() - t0
            seen_all = None
            last, last_change = self.counters(), time.monotonic()
            deadline = time.monotonic() + self.args.timeout
            while time.monotonic() < deadline:
                time.sleep(0.25)
                now = self.counters()
                if now != last:
                    last, last_change = now, time.monotonic()
                if seen_all is None and now["reconciles"] >= expected:
                    seen_all = time.monotonic() - t0
                if seen_all is not None and time.monotonic() - last_change >= 10:
                    break
            settled = last_change - t0
        self.result["restart"] = {
            **ph.summary(),
            "ready_seconds": round(ready, 2),
            "all_resources_reconciled_seconds": None if seen_all is None else round(seen_all, 2),
            "reconcile_counter_settled_seconds": round(settled, 2),
            "operator_counters": last,
            "operator_events_posted": len(self.operator_events() - events),
            "operator_cpu_seconds": round(cpu_seconds(op.proc.pid), 2),
            "operator_peak_rss_mib": round(peak_rss_mib(op.proc.pid), 1),
        }
        log(
            f"restart: ready {ready:.1f}s, all reconciled {seen_all}s, counters settled "
            f"{settled:.1f}s; counters {last}"
        )

    def reaction(self) -> None:
        path = REPO / "bench" / "reaction.py"
        if not path.exists():
            self.result["reaction"] = "bench/reaction.py not present"
            return
        log("reaction: running bench/reaction.py on the same sandbox")
        old = os.environ.get("MTP_SANDBOX_DIR")
        os.environ["MTP_SANDBOX_DIR"] = str(self.sb.state_dir)
        try:
            spec = importlib.util.spec_from_file_location("bench_reaction", path)
            assert spec and spec.loader
            module = importlib.util.module_from_spec(spec)
            sys.modules["bench_reaction"] = module  # its dataclasses look themselves up there
            spec.loader.exec_module(module)
            rc = module.main(["--out", str(self.args.out)])
        except Exception as err:  # its failure must not lose the scale figures
            log(f"reaction: failed: {err!r}")
            rc = f"failed: {err!r}"
        finally:
            if old is None:
                os.environ.pop("MTP_SANDBOX_DIR", None)
            else:
                os.environ["MTP_SANDBOX_DIR"] = old
        self.result["reaction"] = {"exit": rc, "results": "reaction.json / reaction.md"}

    async def run_async(self) -> None:
        names = [f"r-{i:03d}" for i in range(self.args.resources)]
        config = KubeConfig.from_file(str(self.sb.kubeconfig))
        client = AsyncClient(config=config, field_manager=FIELD_MANAGER, timeout=60)
        rounds = []
        try:
            for i in range(self.args.rounds):
                await self.floor(client, names)
                if i == 0:
                    self.baseline()
                log(f"floor namespace deleted in {self.delete_namespace(FLOOR_NS):.0f}s")
                await self.operator_phase(client, names)
                rounds.append(
                    {"floor_seconds": self.result["floor"]["seconds"],
                     "operator_seconds": self.result["operator"]["seconds"],
                     "operator_cpu_seconds": self.result["operator"]["operator_cpu_seconds"],
                     "other_load_cpu_seconds": {
                         "floor": self.result["floor"]["cpu_seconds"]["other_processes"],
                         "operator": self.result["operator"]["cpu_seconds"]["other_processes"]}}
                )  # fmt: skip
                if i < self.args.rounds - 1:
                    assert self.operator is not None
                    self.operator.stop()
                    log(f"operator namespace deleted in {self.delete_namespace(OP_NS):.0f}s")
        finally:
            await client.close()
        self.result["rounds"] = rounds

    def run(self) -> dict[str, Any]:
        a = self.args
        self.result.update(
            started=datetime.now(UTC).isoformat(timespec="seconds"),
            settings={
                "nodes": a.nodes_per_product * len(DEFAULT_PRODUCTS),
                "gpu_products": list(DEFAULT_PRODUCTS),
                "gpus_per_node": 8,
                "resources": a.resources,
                "pools": a.resources * len(DEFAULT_PRODUCTS),
                "tensor_parallel_size": 1,
                "replicas": 1,
                "client_concurrency": a.concurrency,
                "window_seconds": a.window,
                "kube_controller_manager_qps": a.kcm_qps or "sandbox default (20, burst 30)",
            },
        )
        log(f"sandbox: {a.nodes_per_product * 4} nodes, state {self.sb.state_dir}")
        if self.sb.is_running():
            self.sb.down()
        t0 = time.monotonic()
        self.sb.up(timeout=600, started_by="bench")
        self.result["sandbox_up_seconds"] = round(time.monotonic() - t0, 1)
        self.result["machine"] = machine(self.sb)
        try:
            self.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CRD))
            self.operator_identity()
            self.kubectl(
                "wait",
                "--for=condition=Established",
                "crd/mtpinferences.mtp-operator.io",
                "--timeout=60s",
            )
            asyncio.run(self.run_async())
            self.steady()
            self.restart(a.resources)
            rounds = self.result["rounds"]
            op = statistics.median(r["operator_seconds"] for r in rounds)
            fl = statistics.median(r["floor_seconds"] for r in rounds)
            self.result["ratio_operator_to_floor"] = round(op / fl, 2)
            self.result["median_seconds"] = {"operator": round(op, 2), "floor": round(fl, 2)}
            if self.operator:
                self.operator.stop()
            self.result["finished"] = datetime.now(UTC).isoformat(timespec="seconds")
            write_results(self.result, a.out)
            if not a.skip_reaction:
                self.delete_namespace(OP_NS)
                self.reaction()
                write_results(self.result, a.out)
        finally:
            if self.operator:
                self.operator.stop()
                with contextlib.suppress(OSError):
                    shutil.copy(self.operator.log_path, self.work / "last-operator.log")
            if not a.keep:
                self.sb.down()
            log(f"operator logs in {self.work / 'operator'}")
        return self.result


# ---- results --------------------------------------------------------------------------------

TARGET_RATIO = 1.5
NOTES = [
    "Everything shares the machine's CPUs: etcd, kube-apiserver, controller manager, "
    "scheduler, kwok, the operator and the benchmark client. The operator's CPU (and the "
    "API server's work for its requests) directly slows the controllers it waits for.",
    "The machine is shared with other work; single runs of the same phase varied by tens of "
    "percent (a floor run took 42 s in one run and 74 s in the next), hence rounds and "
    "medians.",
    "kube-controller-manager runs with --kube-api-qps 200 (burst 400). At the sandbox "
    "default (20, burst 30) the controller manager's client rate limit paces both runs: in "
    "a first attempt at the default, 30 of the floor's 1,200 Deployments were ready after "
    "3 minutes.",
    "The operator's requests come from the audit log, exact; apiserver_request_total has no "
    "client label. Watch events the operator receives are not requests and are not counted; "
    "they cost it CPU (kopf handles every Deployment and pod event of every pool).",
]


def write_results(r: dict[str, Any], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "scale.json").write_text(json.dumps(r, indent=1, sort_keys=False) + "\n")
    (out / "README.md").write_text(markdown(r))
    log(f"wrote {out / 'scale.json'} and {out / 'README.md'}")


def _verbs(d: Mapping[str, int]) -> str:
    return ", ".join(f"{v} {n}" for v, n in d.items() if n) or "none"


def _mark(ok: bool) -> str:
    return "met" if ok else "**MISSED**"


def markdown(r: dict[str, Any]) -> str:
    s, m = r["settings"], r["machine"]
    fl, op, st, rs = r["floor"], r["operator"], r["steady"], r["restart"]
    ratio = r["ratio_operator_to_floor"]
    steady_counted = sum(st["operator_counter_deltas"][k] for k in WRITE_COUNTERS)
    steady_api = writes_only(st["operator_requests_by_verb"])
    restart_counted = sum(rs["operator_counters"][k] for k in WRITE_COUNTERS)
    restart_api = writes_only(rs["operator_requests_by_verb"])
    counters = op["operator_counters"]
    lines = [
        "# Benchmarks",
        "",
        f"Scale run of {r['started'][:10]} (`make bench` = `python bench/run.py`; raw figures in "
        "[scale.json](scale.json)). Alert -> patch timing: [reaction.md](reaction.md) "
        "(bench/reaction.py, run by bench/run.py when present).",
        "",
        f"Sandbox: {s['nodes']} kwok nodes ({s['nodes'] // len(s['gpu_products'])} per GPU "
        f"product x {len(s['gpu_products'])} products, {s['gpus_per_node']} GPUs each); "
        f"kube-controller-manager --kube-api-qps {s['kube_controller_manager_qps']}. "
        f"{s['resources']} MTPInferences (TP={s['tensor_parallel_size']}, replicas "
        f"{s['replicas']}) -> {op['deployments']} pool Deployments + {s['resources']} Services. "
        f"Client for both runs: lightkube server-side apply, {s['client_concurrency']} requests "
        "in flight. The operator runs cluster-wide, evaluator off, as a ServiceAccount, so the "
        "API server's audit log gives its requests exactly.",
        "",
        "| measure | figure | target |",
        "|---|---|---|",
        f"| time to Ready, operator (last round): apply {s['resources']} MTPInferences -> "
        f"every status.phase Ready | {op['seconds']:.1f} s "
        f"(p50 {op['ready_after_seconds'].get('p50')} s) | |",
        f"| time to Ready, floor (last round): apply {fl['objects']} pre-rendered objects -> every "
        f"Deployment ready | {fl['seconds']:.1f} s (p50 {fl['ready_after_seconds'].get('p50')} "
        "s) | |",
        f"| ratio operator / floor, median of {len(r['rounds'])} rounds each ("
        + ", ".join(
            f"{x['operator_seconds']:.1f} s / {x['floor_seconds']:.1f} s" for x in r["rounds"]
        )
        + f") | {ratio:.2f}x | <= {TARGET_RATIO}x: {_mark(ratio <= TARGET_RATIO)} |",
        "| CPU-s taken by other work on the machine meanwhile, per round (operator / floor) | "
        + ", ".join(
            f"{x['other_load_cpu_seconds']['operator']:.0f} / "
            f"{x['other_load_cpu_seconds']['floor']:.0f}"
            for x in r["rounds"]
            if "other_load_cpu_seconds" in x
        )
        + " | |",
        f"| operator CPU during the run | {op['operator_cpu_seconds']} s | |",
        f"| operator peak RSS (VmHWM, whole life so far) | {op['operator_peak_rss_mib']} MiB | |",
        f"| operator's own counters during the run | {counters['reconciles']:.0f} reconcile "
        f"passes, {counters['deployment_writes']:.0f} Deployment applies, "
        f"{counters['status_writes']:.0f} status patches | |",
        f"| operator's API requests during the run (audit) | "
        f"{_verbs(op['operator_requests_by_verb'])} | |",
        f"| steady state ({s['window_seconds']:.0f} s): operator writes, its counters | "
        f"{steady_counted:.0f} | 0: {_mark(steady_counted == 0)} |",
        f"| steady state: operator's API writes (audit) | {_verbs(steady_api)} | "
        f"0: {_mark(not steady_api)} |",
        f"| steady state: operator's API requests, all (audit) | "
        f"{_verbs(st['operator_requests_by_verb'])} | |",
        f"| steady state: operator CPU | {st['operator_cpu_seconds']} s | |",
        f"| restart, nothing changed: until /readyz | {rs['ready_seconds']:.1f} s | |",
        f"| restart: until every resource was reconciled | "
        f"{rs['all_resources_reconciled_seconds']} s | |",
        f"| restart: until the reconcile counter stopped moving | "
        f"{rs['reconcile_counter_settled_seconds']:.1f} s "
        f"({rs['operator_counters']['reconciles']:.0f} passes) | |",
        f"| restart: operator writes, its counters | {restart_counted:.0f} | 0: "
        f"{_mark(restart_counted == 0)} |",
        f"| restart: operator's API writes (audit) | {_verbs(restart_api)} | "
        f"0: {_mark(not restart_api)} |",
        f"| restart: operator's API requests, all (audit) | "
        f"{_verbs(rs['operator_requests_by_verb'])} | |",
        f"| restart: operator CPU / peak RSS | {rs['operator_cpu_seconds']} s / "
        f"{rs['operator_peak_rss_mib']} MiB | |",
        "",
        "## API requests by verb (kube-apiserver's apiserver_request_total, all clients)",
        "",
        "Server-side apply counts as APPLY. The operator's share is from the audit log (its "
        "verbs are the audit log's: create = POST, patch = PATCH and APPLY).",
        "",
        "| phase | seconds | all clients | of which the operator |",
        "|---|---|---|---|",
        f"| floor: client + controllers + scheduler + kwok | {fl['seconds']:.1f} | "
        f"{_verbs(fl['requests_by_verb'])} | (not running) |",
        f"| baseline: nobody acting | {r['baseline']['seconds']:.1f} | "
        f"{_verbs(r['baseline']['requests_by_verb'])} | (not running) |",
        f"| operator: client + operator + controllers + ... | {op['seconds']:.1f} | "
        f"{_verbs(op['requests_by_verb'])} | {_verbs(op['operator_requests_by_verb'])} |",
        f"| steady | {st['seconds']:.1f} | {_verbs(st['requests_by_verb'])} | "
        f"{_verbs(st['operator_requests_by_verb'])} |",
        f"| restart | {rs['seconds']:.1f} | {_verbs(rs['requests_by_verb'])} | "
        f"{_verbs(rs['operator_requests_by_verb'])} |",
        "",
        f"The operator's requests in the run by resource: {_verbs(op['operator_requests'])}.",
        "",
        "CPU seconds by process in the operator run: "
        + ", ".join(f"{k} {v}" for k, v in op["cpu_seconds"].items())
        + "; in the floor run: "
        + ", ".join(f"{k} {v}" for k, v in fl["cpu_seconds"].items())
        + ".",
        "",
    ]
    lines += ["## Notes", "", *[f"- {n}" for n in r.get("notes") or NOTES], ""]
    lines += [
        "## Machine",
        "",
        f"{m['nproc']} CPUs ({m['cpu']}), {m['memory_gib']} GiB RAM, Linux {m['kernel']}, "
        f"Python {m['python']}, kube-apiserver {m['kube_apiserver']} (sandbox: etcd, "
        "kube-apiserver, kube-controller-manager, kube-scheduler and kwok on the same machine "
        "as the operator and the client), "
        + ", ".join(f"{k} {v}" for k, v in m["packages"].items())
        + f". Run {r['started']} to {r.get('finished', '?')}.",
        "",
    ]
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--resources", type=int, default=300)
    p.add_argument("--nodes-per-product", type=int, default=40)
    p.add_argument("--concurrency", type=int, default=16, help="client requests in flight")
    p.add_argument("--window", type=float, default=60, help="baseline/steady seconds")
    p.add_argument(
        "--rounds", type=int, default=2, help="floor + operator runs (the ratio uses medians)"
    )
    p.add_argument(
        "--kcm-qps",
        type=int,
        default=200,
        help="kube-controller-manager --kube-api-qps (burst twice that); 0: its default 20",
    )
    p.add_argument("--timeout", type=float, default=900, help="per wait, seconds")
    p.add_argument(
        "--sandbox-dir",
        default=os.environ.get("MTP_BENCH_SANDBOX_DIR")
        or str(Path(tempfile.gettempdir()) / "mtp-bench-sandbox"),
    )
    p.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    p.add_argument("--keep", action="store_true", help="leave the sandbox running")
    p.add_argument("--skip-reaction", action="store_true")
    p.add_argument("--rewrite", action="store_true", help="only rewrite README.md from scale.json")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.rewrite:  # README.md again from scale.json (after editing the text here)
        write_results(json.loads((args.out / "scale.json").read_text()), args.out)
        return 0
    # stop cleanly (sandbox down, operator stopped) however we are told to stop
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    signal.signal(signal.SIGINT, signal.default_int_handler)
    result = Bench(args).run()
    print(markdown(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
