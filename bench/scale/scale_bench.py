"""Scale benchmark: the phases in order (floor, baseline, operator, steady, restart, reaction)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import json
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml
from lightkube import AsyncClient, KubeConfig
from lightkube.resources.apps_v1 import Deployment

# isort: split
from machine_info import machine
from profiling import PhaseProfile
from scale_cluster import (
    Tracker,
    apply_all,
    deployment_ready,
    floor_objects,
    mtpi_ready,
    nodes_file,
    quantiles,
    resource_doc,
    sandbox_products,
)
from scale_common import (
    CRD,
    FIELD_MANAGER,
    FLOOR_NS,
    OP_NS,
    OPERATOR_COUNTERS,
    REPO,
    SA_NAME,
    SA_NS,
    log,
)
from scale_measure import Audit, Phase, Requests, cpu_seconds, peak_rss_mib, rollout_writes
from scale_results import write_results

from mtp_operator.adapters.kube import MTPInferenceResource
from support.operator_proc import OperatorProcess


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
        self.profiles: dict[str, Any] = {}  # --profile DIR: py-spy of the operator per round

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

    def start_operator(self, ready: bool = True) -> OperatorProcess:
        """The operator started; waited for until /readyz (ready=False: /healthz, alive)."""
        op = OperatorProcess(self.sa_kubeconfig, self.work / "operator", ["--no-evaluator"])
        self.operator = op
        return op.start(timeout=300, ready=ready)

    def gc_seconds(self) -> dict[str, float]:
        """The operator's garbage-collector CPU seconds so far (mtp_operator_gc_seconds_total):
        all generations, and the full passes (generation 2)."""
        assert self.operator is not None
        name = "mtp_operator_gc_seconds_total"
        return {
            "all": round(self.operator.metric(name), 2),
            "full": round(self.operator.metric(f'{name}{{generation="2"}}'), 2),
        }

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

    async def operator_phase(self, client: AsyncClient, names: list[str], round_no: int) -> None:
        self.kubectl("create", "namespace", OP_NS)
        t0 = time.monotonic()
        op = self.start_operator()
        self.result["operator_start_seconds"] = round(time.monotonic() - t0, 2)
        tracker = Tracker(mtpi_ready)
        watch = asyncio.create_task(tracker.run(client, MTPInferenceResource, OP_NS))
        docs = [resource_doc(n) for n in names]
        log(f"operator: applying {len(docs)} MTPInferences")
        profile = self.args.profile
        raw = profile / f"rollout-round{round_no}.collapsed" if profile else None
        spy = PhaseProfile(op.proc.pid, raw) if raw else contextlib.nullcontext()
        with spy, Phase(self, "operator") as ph:
            t0 = time.monotonic()
            await apply_all(client, docs, self.args.concurrency)
            applied = time.monotonic() - t0
            await tracker.wait(set(names), self.args.timeout, "MTPInferences Ready")
        watch.cancel()
        if isinstance(spy, PhaseProfile):
            self.profiles[f"round{round_no}"] = spy.result
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
            "writes": rollout_writes(ph.operator_requests, len(deps), len(names)),
            "operator_cpu_seconds": ph.cpu.get("operator"),
            "operator_gc_seconds": self.gc_seconds(),
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
        profile = self.args.profile
        with contextlib.ExitStack() as stack, Phase(self, "restart") as ph:
            t0 = time.monotonic()
            if profile:  # py-spy attached once the process is alive, before it lists
                op = self.start_operator(ready=False)
                spy = stack.enter_context(
                    PhaseProfile(op.proc.pid, profile / "restart.collapsed"))
                op.wait_for("/readyz", 300)
            else:
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
        if profile:
            self.profiles["restart"] = spy.result
        self.result["restart"] = {
            **ph.summary(),
            "ready_seconds": round(ready, 2),
            "all_resources_reconciled_seconds": None if seen_all is None else round(seen_all, 2),
            "reconcile_counter_settled_seconds": round(settled, 2),
            "operator_counters": last,
            "operator_events_posted": len(self.operator_events() - events),
            "operator_cpu_seconds": round(cpu_seconds(op.proc.pid), 2),
            "operator_gc_seconds": self.gc_seconds(),
            "operator_peak_rss_mib": round(peak_rss_mib(op.proc.pid), 1),
        }
        log(
            f"restart: ready {ready:.1f}s, all reconciled {seen_all}s, counters settled "
            f"{settled:.1f}s; counters {last}"
        )

    def reaction(self) -> None:
        path = REPO / "bench" / "reaction" / "reaction.py"
        if not path.exists():
            self.result["reaction"] = "bench/reaction/reaction.py not present"
            return
        log("reaction: running bench/reaction/reaction.py on the same sandbox")
        old = os.environ.get("MTP_SANDBOX_DIR")
        os.environ["MTP_SANDBOX_DIR"] = str(self.sb.state_dir)
        try:
            spec = importlib.util.spec_from_file_location("bench_reaction", path)
            assert spec and spec.loader
            module = importlib.util.module_from_spec(spec)
            sys.modules["bench_reaction"] = module  # its dataclasses look themselves up there
            spec.loader.exec_module(module)
            rc = module.main(["--out", str(self.args.out), *self.args.reaction_args.split()])
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
                await self.operator_phase(client, names, i + 1)
                rounds.append(
                    {"floor_seconds": self.result["floor"]["seconds"],
                     "operator_seconds": self.result["operator"]["seconds"],
                     "operator_writes": self.result["operator"]["writes"],
                     "operator_peak_rss_mib": self.result["operator"]["operator_peak_rss_mib"],
                     "operator_cpu_seconds": self.result["operator"]["operator_cpu_seconds"],
                     # by process, so a round that differs shows where (not only the last's)
                     "cpu_seconds": {"floor": self.result["floor"]["cpu_seconds"],
                                     "operator": self.result["operator"]["cpu_seconds"]},
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
        if self.profiles:
            self.result["rollout_profiles"] = self.profiles

    def run(self) -> dict[str, Any]:
        a = self.args
        self.result.update(
            started=datetime.now(UTC).isoformat(timespec="seconds"),
            settings={
                "nodes": a.nodes_per_product * len(sandbox_products()),
                "gpu_products": sandbox_products(),
                "gpus_per_node": 8,
                "resources": a.resources,
                "pools": a.resources * len(sandbox_products()),
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
