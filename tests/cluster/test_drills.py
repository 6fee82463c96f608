"""Failure drills (issue 7): the real operator, as processes, against a real control plane.

All drills share one private sandbox (module scope) with more GPU nodes than the shared one
(6 nodes of 8 GPUs per product), so batches fit, and so that stopping its kube-apiserver or
etcd disturbs no other test. Every wait is a poll with a deadline.

  a. SIGKILL mid-batch, restart: converges, one Deployment per pool, no orphans, history kept.
  b. kube-apiserver + etcd crash and restart: the same operator process reconnects and acts.
  c. Two replicas with leader election: only the leader writes; the follower takes over.
  d. Hand edits of a pool (replicas, image, env, command) are reverted and reported.
(The Alertmanager burst drill lives in tests/e2e/test_alert_webhook_cluster.py.)
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from support.cluster_fixtures import wait_crd_established, wait_for
from support.operator_proc import OperatorProcess, free_port

REPO = Path(__file__).resolve().parents[2]
CRD = REPO / "crds" / "mtp-operator.io_mtpinferences.yaml"
NODES_PER_PRODUCT = 6
PRODUCTS = (
    "NVIDIA-A100-SXM4-80GB",
    "NVIDIA-H100-80GB-HBM3",
    "NVIDIA-H200",
    "NVIDIA-L40S",
)
LEASE_SECONDS = 15  # leader.LeaderElector's default
RENEW_SECONDS = 5


# ---- a private sandbox for the drills ---------------------------------------------------------


class Cluster:
    """The private sandbox plus the helpers the drills use."""

    def __init__(self, sb: Any, log_dir: Path) -> None:
        self.sb = sb
        self.log_dir = log_dir
        self.operators: list[OperatorProcess] = []

    def kubectl(self, *args: str, input: str | None = None, check: bool = True,
                timeout: float = 60) -> subprocess.CompletedProcess[str]:
        p = self.sb.kubectl(*map(str, args), input=input, check=False, timeout=timeout)
        if check and p.returncode:
            raise AssertionError(f"kubectl {' '.join(args)}: {p.stderr.strip()}")
        return p

    def get(self, *args: str) -> Any:
        return json.loads(self.kubectl("get", *args, "-o", "json").stdout)

    def items(self, kind: str, namespace: str) -> list[dict]:
        return self.get(kind, "-n", namespace)["items"]

    def operator(self, *args: str, ready: bool = True) -> OperatorProcess:
        op = OperatorProcess(self.sb.kubeconfig, self.log_dir, args)
        self.operators.append(op)
        return op.start(timeout=60, ready=ready)

    def namespace(self) -> str:
        name = f"drill-{uuid.uuid4().hex[:6]}"
        self.kubectl("create", "namespace", name)
        self.kubectl("label", "namespace", name, "mtp-operator.io/alert-rollback=enabled")
        wait_for(lambda: self.kubectl("get", "sa", "default", "-n", name, check=False)
                 .returncode == 0, 30, message="default ServiceAccount")
        return name

    def delete_namespace(self, name: str) -> None:
        """Free the simulated GPUs for the next drill: pods go at once, the rest in time."""
        self.kubectl("delete", "namespace", name, "--wait=false", check=False)
        self.kubectl("delete", "pods", "--all", "-n", name, "--grace-period=0", "--force",
                     "--wait=false", check=False)
        wait_for(lambda: not self.kubectl("get", "pods", "-n", name, "-o", "name",
                                          check=False).stdout.strip(), 60,
                 message=f"pods of {name} gone")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> Iterator[Cluster]:
    from sandbox import NODES_YAML, Sandbox

    spec = yaml.safe_load(NODES_YAML.read_text())
    for pool in spec["pools"]:
        if pool.get("product"):
            pool["count"] = NODES_PER_PRODUCT
    assert {p["product"] for p in spec["pools"] if p.get("product")} == set(PRODUCTS)
    work = tmp_path_factory.mktemp("drills")
    nodes = work / "nodes.yaml"
    nodes.write_text(yaml.safe_dump(spec))
    sb = Sandbox(work / "sandbox", nodes_file=nodes)
    sb.up(timeout=180)
    c = Cluster(sb, work / "operators")
    try:
        c.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CRD))
        wait_crd_established(c.kubectl)
        yield c
    finally:
        for op in c.operators:
            op.stop()
        sb.down()


@pytest.fixture
def ns(cluster: Cluster) -> Iterator[str]:
    name = cluster.namespace()
    started = len(cluster.operators)
    try:
        yield name
    finally:
        for op in cluster.operators[started:]:
            op.stop()
        cluster.delete_namespace(name)


# ---- helpers ----------------------------------------------------------------------------------


def mtpi(name: str, **spec: Any) -> dict:
    spec.setdefault("model", "deepseek-ai/DeepSeek-V3")
    spec.setdefault("tensorParallelSize", 1)
    return {"apiVersion": "mtp-operator.io/v1alpha1", "kind": "MTPInference",
            "metadata": {"name": name}, "spec": spec}


def apply(c: Cluster, namespace: str, *docs: dict) -> None:
    c.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump_all(docs))


def condition(obj: dict, ctype: str) -> dict:
    return next((x for x in (obj.get("status") or {}).get("conditions") or []
                 if x["type"] == ctype), {})


def is_ready(obj: dict) -> bool:
    st = obj.get("status") or {}
    return st.get("phase") == "Ready" and st.get("observedGeneration") == \
        obj["metadata"]["generation"]


def wait_all_ready(c: Cluster, namespace: str, names: set[str], timeout: float = 90) -> dict:
    def ready() -> dict | None:
        objs = {o["metadata"]["name"]: o for o in c.items("mtpi", namespace)}
        if names <= set(objs) and all(is_ready(objs[n]) for n in names):
            return objs
        return None

    def pending() -> str:
        objs = {o["metadata"]["name"]: o for o in c.items("mtpi", namespace)}
        return ", ".join(f"{n}={(objs.get(n, {}).get('status') or {}).get('phase')}"
                         for n in sorted(names) if not is_ready(objs.get(n, {"metadata": {}})))

    try:
        return wait_for(ready, timeout, interval=0.5, message=f"{len(names)} resources Ready")
    except TimeoutError as err:
        raise TimeoutError(f"{err}; not Ready: {pending()}") from None


def pool_product(dep: dict) -> str:
    return dep["metadata"]["annotations"]["mtp-operator.io/gpu-product"]


def owner_name(obj: dict) -> str | None:
    refs = [r for r in obj["metadata"].get("ownerReferences") or []
            if r["kind"] == "MTPInference" and r.get("controller")]
    return refs[0]["name"] if len(refs) == 1 else None


def container(dep: dict) -> dict:
    return dep["spec"]["template"]["spec"]["containers"][0]


def events(c: Cluster, namespace: str, reason: str) -> list[str]:
    return [e["message"] for e in c.items("events", namespace) if e["reason"] == reason]


def new_events(c: Cluster, namespace: str, reason: str, seen: set[str]) -> dict[str, str]:
    """Events of `reason` whose names are not in `seen` (listings are not in time order)."""
    return {e["metadata"]["name"]: e["message"] for e in c.items("events", namespace)
            if e["reason"] == reason and e["metadata"]["name"] not in seen}


def post_alert(port: int, namespace: str, name: str, product: str, value: float) -> dict:
    payload = {"version": "4", "status": "firing", "alerts": [{
        "status": "firing",
        "labels": {"alertname": "MTPHitRateLow", "namespace": namespace,
                   "mtpinference": name, "gpu_product": product},
        "annotations": {"value": str(value)},
        # now: the receiver ignores alerts that began over maxAlertAgeSeconds ago
        "startsAt": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "fingerprint": uuid.uuid4().hex[:16],
    }]}
    req = urllib.request.Request(f"http://127.0.0.1:{port}/alerts",
                                 data=json.dumps(payload).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.loads(r.read())


def counters(op: OperatorProcess) -> dict[str, float]:
    return {n: op.metric(f"mtp_operator_{n}_total")
            for n in ("reconciles", "deployment_writes", "status_writes")}


def settled(read: Callable[[], Any], quiet: float = 3.0, timeout: float = 60) -> Any:
    """Wait until read() returns the same value for `quiet` seconds; return it."""
    deadline = time.monotonic() + timeout
    last, since = read(), time.monotonic()
    while time.monotonic() < deadline:
        time.sleep(0.5)
        now = read()
        if now != last:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= quiet:
            return now
    raise TimeoutError(f"still changing after {timeout}s: {last}")


# ---- a. SIGKILL in the middle of a batch ------------------------------------------------------


BATCH = 20


def test_sigkill_mid_batch_then_restart_converges(cluster: Cluster, ns: str):
    c = cluster
    alerts_port = free_port()
    args = ("--namespace", ns, "--no-evaluator", "--alerts-address", f"127.0.0.1:{alerts_port}")
    first = c.operator(*args)

    # History worth keeping: a real rollback through the webhook on one pool.
    apply(c, ns, mtpi("hist", speculative={"numSpeculativeTokens": 3}))
    wait_all_ready(c, ns, {"hist"})
    h100 = "NVIDIA-H100-80GB-HBM3"
    assert post_alert(alerts_port, ns, "hist", h100, 0.01)["status"] == "ok"
    hist = wait_for(lambda: (o := c.get("mtpi", "hist", "-n", ns))["status"].get("rollbacks")
                    and is_ready(o) and o, 60, message="rollback recorded and rolled out")
    before = hist["status"]
    assert [r["gpuProduct"] for r in before["rollbacks"]] == [h100]

    # The batch: the operator is killed as soon as the first of its pools appear.
    names = {f"batch-{i:02d}" for i in range(BATCH)}
    path = f"/apis/apps/v1/namespaces/{ns}/deployments"
    t0 = time.monotonic()
    apply(c, ns, *(mtpi(n) for n in sorted(names)))
    wait_for(lambda: first.metric("mtp_operator_deployment_writes_total") >= 4 + 3, 30,
             interval=0.01, message="the first pools of the batch")
    first.kill()
    killed_after = time.monotonic() - t0
    time.sleep(1)  # requests the dead process had already sent may still land
    at_kill = len(c.sb.api("GET", path)["items"])
    want = 4 * (BATCH + 1)
    objs = {o["metadata"]["name"]: o for o in c.items("mtpi", ns)}
    assert at_kill < want, f"all {want} pools existed before the kill: the drill missed the batch"
    assert not all(is_ready(objs[n]) for n in names)

    second = c.operator(*args)
    t1 = time.monotonic()
    objs = wait_all_ready(c, ns, names | {"hist"}, timeout=120)
    converged = time.monotonic() - t1

    # exactly one Deployment per (resource, product), each owned by a live resource
    uids = {n: o["metadata"]["uid"] for n, o in objs.items()}
    deps = c.items("deployments", ns)
    per_pool = Counter((owner_name(d), pool_product(d)) for d in deps)
    assert len(deps) == want, sorted(per_pool)
    assert set(per_pool) == {(n, p) for n in uids for p in PRODUCTS}
    assert set(per_pool.values()) == {1}
    for d in deps:
        ref = d["metadata"]["ownerReferences"][0]
        assert ref["uid"] == uids[ref["name"]], f"orphan {d['metadata']['name']}"
    services = c.items("services", ns)
    assert sorted(owner_name(s) for s in services) == sorted(uids)
    # one live ReplicaSet and one pod per pool: no duplicates were started (the rolled-back
    # pool also keeps its old ReplicaSet, scaled to 0)
    rs = Counter(r["metadata"]["ownerReferences"][0]["name"] for r in c.items("replicasets", ns)
                 if r["spec"]["replicas"] > 0)
    assert set(rs.values()) == {1} and len(rs) == want
    pods = wait_for(lambda: len(p := c.items("pods", ns)) == want and p, 30,
                    message=f"{want} pods")
    assert all(condition(p, "Ready").get("status") == "True" for p in pods)

    # the restarted operator wrote only the pools that were missing, nothing twice
    assert second.metric("mtp_operator_deployment_writes_total") == want - at_kill
    created = Counter(d for m in events(c, ns, "PoolCreated")  # one Event names its pools
                      for d in re.findall(r"deployment ([a-z0-9-]+),", m))
    assert max(created.values()) == 1, [d for d, n in created.items() if n > 1]

    # status history survived: the rollback record, the pinned K and condition times
    after = objs["hist"]["status"]
    assert after["rollbacks"] == before["rollbacks"]
    pinned = {p["gpuProduct"]: p for p in after["pools"]}[h100]
    assert (pinned["numSpeculativeTokens"], pinned["source"]) == (
        before["rollbacks"][0]["toK"], "rollback")
    for ctype in ("Ready", "SpeculationRolledBack"):
        assert condition(objs["hist"], ctype) == condition(hist, ctype), ctype

    # One more restart with nothing to do: it starts (more than 64 objects per kind: kopf
    # issue #1243's deadlock with a worker limit), sees every resource, and writes nothing;
    # its lists come in pages of 7 objects (listPageSize), so a pool Deployment on a page
    # after the first that went unseen would be created again (a write).
    second.stop()
    paged = c.log_dir / "paged-settings.yaml"
    paged.write_text("listPageSize: 7\n")
    t2 = time.monotonic()
    third = c.operator(*args, "--settings", str(paged))
    wait_for(lambda: third.metric("mtp_operator_reconciles_total") >= BATCH + 1, 60,
             message="every resource reconciled after the restart")
    resync = time.monotonic() - t2
    idle = settled(lambda: counters(third), quiet=3)
    assert (idle["deployment_writes"], idle["status_writes"]) == (0, 0), idle
    print(f"\ndrill a: killed {killed_after:.1f}s after the apply with {at_kill}/{want} pools; "
          f"restarted operator converged in {converged:.1f}s writing {want - at_kill}; "
          f"idle restart resynced in {resync:.1f}s with 0 writes")


# ---- b. kube-apiserver and etcd crash and come back -------------------------------------------


def pool_k(dep: dict) -> int:
    command = json.loads(dep["metadata"]["annotations"]["mtp-operator.io/vllm-command"])
    return json.loads(command[-1])["num_speculative_tokens"]


def test_apiserver_and_etcd_restart_same_operator_reconnects(cluster: Cluster, ns: str):
    c = cluster
    op = c.operator("--namespace", ns, "--no-evaluator", "--leader-election",
                    "--lease-namespace", ns, "--lease-name", "drill-b")
    pid = op.proc.pid
    apply(c, ns, mtpi("before", speculative={"numSpeculativeTokens": 2}))
    wait_all_ready(c, ns, {"before"})

    t0 = time.monotonic()
    c.sb.stop_component("kube-apiserver", sig=signal.SIGKILL)  # a crash, not a clean stop
    c.sb.stop_component("etcd", sig=signal.SIGKILL)
    # longer than the leader's renew interval: a renewal fails on a refused connection
    time.sleep(RENEW_SECONDS + 1)
    with urllib.request.urlopen(op.url("/healthz"), timeout=5) as r:  # alive through it
        assert r.status == 200
    c.sb.start_component("etcd")
    c.sb.start_component("kube-apiserver")
    outage = time.monotonic() - t0

    # A spec change and a new resource right after: both must arrive through the operator's
    # re-established watch (the resync timer only re-reads its cache, every 30 s).
    t1 = time.monotonic()
    apply(c, ns, mtpi("before", speculative={"numSpeculativeTokens": 1}), mtpi("after"))
    objs = wait_all_ready(c, ns, {"before", "after"}, timeout=90)
    recovered = time.monotonic() - t1
    assert op.proc.poll() is None and op.proc.pid == pid, op.log_tail()
    deps = c.items("deployments", ns)
    assert {pool_k(d) for d in deps if owner_name(d) == "before"} == {1}
    assert Counter(owner_name(d) for d in deps) == {"before": 4, "after": 4}
    assert {p["numSpeculativeTokens"] for p in objs["before"]["status"]["pools"]} == {1}
    # still the leader (an outage must not cost the lease) and still acting
    lease = c.get("lease", "drill-b", "-n", ns)
    assert lease["spec"]["holderIdentity"].endswith(f"-{pid}")
    print(f"\ndrill b: {outage:.1f}s outage; change reconciled {recovered:.1f}s after the "
          f"restart by the same process (pid {pid})")


# ---- c. two replicas, one lease ---------------------------------------------------------------


def ready_status(op: OperatorProcess) -> int:
    try:
        with urllib.request.urlopen(op.url("/readyz"), timeout=2) as r:
            return r.status
    except urllib.error.HTTPError as err:
        return err.code


def test_two_replicas_only_the_leader_acts_and_the_follower_takes_over(cluster: Cluster,
                                                                      ns: str):
    c = cluster
    args = ("--namespace", ns, "--no-evaluator", "--leader-election",
            "--lease-namespace", ns, "--lease-name", "drill-c")
    leader = c.operator(*args)
    follower = c.operator(*args, ready=False)
    assert ready_status(follower) == 503

    names = {f"two-{i}" for i in range(3)}
    apply(c, ns, *(mtpi(n) for n in sorted(names)))
    wait_all_ready(c, ns, names)
    settled(lambda: counters(leader))
    assert leader.metric("mtp_operator_deployment_writes_total") == 4 * len(names)
    assert counters(follower) == dict.fromkeys(counters(follower), 0.0)
    lease = c.get("lease", "drill-c", "-n", ns)
    assert lease["spec"]["holderIdentity"].endswith(f"-{leader.proc.pid}")

    t0 = time.monotonic()
    leader.kill()
    wait_for(lambda: ready_status(follower) == 200, LEASE_SECONDS + RENEW_SECONDS + 10,
             message="the follower leading")
    takeover = time.monotonic() - t0
    assert takeover <= LEASE_SECONDS + RENEW_SECONDS + 2, takeover
    apply(c, ns, mtpi("late"))
    wait_all_ready(c, ns, names | {"late"})
    acted = time.monotonic() - t0
    settled(lambda: counters(follower))
    # the new leader wrote the new resource's pools and rewrote nothing of the old leader's
    assert follower.metric("mtp_operator_deployment_writes_total") == 4
    assert Counter(owner_name(d) for d in c.items("deployments", ns)) == \
        dict.fromkeys(names | {"late"}, 4)
    lease = c.get("lease", "drill-c", "-n", ns)
    assert lease["spec"]["holderIdentity"].endswith(f"-{follower.proc.pid}")
    assert lease["spec"]["leaseTransitions"] >= 1
    print(f"\ndrill c: follower led {takeover:.1f}s after the leader's SIGKILL (lease "
          f"{LEASE_SECONDS}s, renew {RENEW_SECONDS}s); new resource Ready {acted:.1f}s after")


# ---- d. conflicting writes: hand edits of a pool ----------------------------------------------


def test_hand_edits_of_a_pool_are_reverted_and_reported(cluster: Cluster, ns: str):
    c = cluster
    op = c.operator("--namespace", ns, "--no-evaluator")
    apply(c, ns, mtpi("edit", modelSource="modelscope", env=[{"name": "HF_HOME",
                                                              "value": "/models"}],
                      speculative={"numSpeculativeTokens": 2}))
    wait_all_ready(c, ns, {"edit"})
    product = "NVIDIA-L40S"
    dep = next(d for d in c.items("deployments", ns) if pool_product(d) == product)
    name = dep["metadata"]["name"]
    want = (dep["spec"]["replicas"], container(dep)["image"], container(dep)["command"],
            {e["name"]: e.get("value") for e in container(dep)["env"]})
    assert {"HF_HOME", "VLLM_USE_MODELSCOPE", "MTP_RUNTIME_CONFIG"} <= set(want[3])

    def current() -> tuple:
        d = c.get("deployment", name, "-n", ns)
        return (d["spec"]["replicas"], container(d)["image"], container(d)["command"],
                {e["name"]: e.get("value") for e in container(d).get("env") or []})

    patch_command = json.dumps([{"op": "replace",
                                 "path": "/spec/template/spec/containers/0/command",
                                 "value": ["sh", "-c", "sleep infinity"]}])
    edits = [
        ("replicas", ("scale", f"deployment/{name}", "--replicas=3")),
        ("image", ("set", "image", f"deployment/{name}", "vllm=example.com/other:1")),
        ("command", ("patch", "deployment", name, "--type=json", "-p", patch_command)),
        ("runtime config", ("set", "env", f"deployment/{name}", "MTP_RUNTIME_CONFIG={}")),
        ("env", ("set", "env", f"deployment/{name}", "HF_HOME=/elsewhere")),
        ("env", ("set", "env", f"deployment/{name}", "VLLM_USE_MODELSCOPE-")),
    ]
    times = []
    for field, cmd in edits:
        seen = set(new_events(c, ns, "ManualChangeReverted", set()))
        t0 = time.monotonic()
        c.kubectl(*cmd, "-n", ns)
        wait_for(lambda: current() == want, 30, interval=0.1,
                 message=f"{field} edit reverted")
        times.append((field, time.monotonic() - t0))
        reported = wait_for(lambda s=seen: new_events(c, ns, "ManualChangeReverted", s), 10,
                            message=f"ManualChangeReverted for {field}")
        assert len(reported) == 1, reported  # one edit, one revert, one Event
        assert f"pool {product}: {field} edited" in next(iter(reported.values())), reported

    # the operator put its settings back and then left the pool alone: no tug of war
    quiet = settled(lambda: (current(), counters(op)), quiet=3)
    assert quiet[0] == want
    assert quiet[1]["deployment_writes"] == 4 + len(edits)
    print("\ndrill d: reverted in " + ", ".join(f"{f} {t:.1f}s" for f, t in times))
