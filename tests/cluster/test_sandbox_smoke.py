"""The sandbox itself: real control plane, simulated GPU nodes, real scheduling decisions."""

from __future__ import annotations

import ipaddress
import json
import signal
import time

import pytest

GPU_MEMORY_MIB = {
    "NVIDIA-A100-SXM4-80GB": "81920",
    "NVIDIA-H100-80GB-HBM3": "81559",
    "NVIDIA-L40S": "46068",
    "NVIDIA-H200": "143771",
}
MIN_NODES = {
    "NVIDIA-A100-SXM4-80GB": 2,
    "NVIDIA-H100-80GB-HBM3": 2,
    "NVIDIA-L40S": 2,
    "NVIDIA-H200": 1,
}


def _json(kubectl, *args: str):
    return json.loads(kubectl(*args, "-o", "json").stdout)


def _wait(pred, timeout: float, what: str, interval: float = 0.2):
    deadline = time.monotonic() + timeout
    while True:
        got = pred()
        if got:
            return got
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


def test_version_is_pinned(sandbox, kubectl):
    assert sandbox.version()["gitVersion"] == "v1.36.3"
    out = json.loads(kubectl("version", "-o", "json").stdout)
    assert out["serverVersion"]["gitVersion"] == "v1.36.3"
    assert out["clientVersion"]["gitVersion"] == "v1.36.3"


def test_nodes_ready_with_gpu_labels(kubectl):
    nodes = _json(kubectl, "get", "nodes")["items"]
    per_product: dict[str, int] = {}
    cpu_only = 0
    for n in nodes:
        labels = n["metadata"]["labels"]
        conds = {c["type"]: c["status"] for c in n["status"]["conditions"]}
        assert conds.get("Ready") == "True", n["metadata"]["name"]
        assert labels["type"] == "kwok"
        assert labels["kubernetes.io/hostname"] == n["metadata"]["name"]
        product = labels.get("nvidia.com/gpu.product")
        if product is None:
            cpu_only += 1
            assert "nvidia.com/gpu" not in n["status"]["capacity"]
            continue
        per_product[product] = per_product.get(product, 0) + 1
        assert n["status"]["capacity"]["nvidia.com/gpu"] == "8"
        assert n["status"]["allocatable"]["nvidia.com/gpu"] == "8"
        assert labels["nvidia.com/gpu.count"] == "8"
        assert labels["nvidia.com/gpu.memory"] == GPU_MEMORY_MIB[product]
        assert labels["nvidia.com/gpu.family"] in ("ampere", "hopper", "ada-lovelace")
    for product, count in MIN_NODES.items():
        assert per_product.get(product, 0) >= count, per_product
    assert cpu_only >= 1


def test_gpu_deployment_lands_on_h100_and_becomes_ready(sandbox, kubectl, namespace):
    manifest = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "gpu-8", "namespace": namespace},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": "gpu-8"}},
            "template": {
                "metadata": {"labels": {"app": "gpu-8"}},
                "spec": {
                    "affinity": {
                        "nodeAffinity": {
                            "requiredDuringSchedulingIgnoredDuringExecution": {
                                "nodeSelectorTerms": [
                                    {
                                        "matchExpressions": [
                                            {
                                                "key": "nvidia.com/gpu.product",
                                                "operator": "In",
                                                "values": ["NVIDIA-H100-80GB-HBM3"],
                                            }
                                        ]
                                    }
                                ]
                            }
                        }
                    },
                    "containers": [
                        {
                            "name": "vllm",
                            "image": "vllm/vllm-openai:v0.33.0",
                            "resources": {"limits": {"nvidia.com/gpu": "8"}},
                        }
                    ],
                },
            },
        },
    }
    kubectl("apply", "-f", "-", input=json.dumps(manifest))
    kubectl("rollout", "status", "deployment/gpu-8", "-n", namespace, "--timeout=60s")
    pods = _json(kubectl, "get", "pods", "-n", namespace, "-l", "app=gpu-8")["items"]
    assert len(pods) == 1
    pod = pods[0]
    node = _json(kubectl, "get", "node", pod["spec"]["nodeName"])
    assert node["metadata"]["labels"]["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"
    conds = {c["type"]: c["status"] for c in pod["status"]["conditions"]}
    assert conds["Ready"] == "True"
    assert pod["status"]["phase"] == "Running"
    assert ipaddress.ip_address(pod["status"]["podIP"]) in ipaddress.ip_network(sandbox.pod_cidr)


def test_pod_asking_for_nine_gpus_stays_pending(kubectl, namespace):
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "gpu-9", "namespace": namespace},
        "spec": {
            "containers": [
                {
                    "name": "c",
                    "image": "busybox",
                    "resources": {"limits": {"nvidia.com/gpu": "9"}},
                }
            ]
        },
    }
    kubectl("apply", "-f", "-", input=json.dumps(pod))

    def failed_scheduling():
        events = _json(
            kubectl,
            "get",
            "events",
            "-n",
            namespace,
            "--field-selector",
            "involvedObject.name=gpu-9",
        )["items"]
        return [e for e in events if e["reason"] == "FailedScheduling"]

    events = _wait(failed_scheduling, 30, "a FailedScheduling event")
    assert "nvidia.com/gpu" in events[0]["message"]
    src = events[0].get("reportingComponent") or events[0].get("source", {}).get("component")
    assert src == "default-scheduler"
    got = _json(kubectl, "get", "pod", "gpu-9", "-n", namespace)
    assert got["status"]["phase"] == "Pending"
    assert not got["spec"].get("nodeName")


@pytest.fixture
def private_sandbox(tmp_path_factory):
    """A second, private sandbox: the restart below must not disturb the shared one, which
    other test sessions may be using."""
    from sandbox import Sandbox

    sb = Sandbox(tmp_path_factory.mktemp("private-sandbox"))
    sb.up()
    try:
        yield sb
    finally:
        sb.down()
        assert not sb.leftover_processes()


def test_apiserver_and_etcd_restart_keep_state(private_sandbox):
    """stop_component/start_component (for the outage drills): same ports, certs and data."""
    sb = private_sandbox
    sb.kubectl("create", "namespace", "drill")
    sb.kubectl("create", "configmap", "survivor", "-n", "drill", "--from-literal=a=1")
    t0 = time.monotonic()
    sb.stop_component("kube-apiserver", sig=signal.SIGKILL)
    sb.stop_component("etcd", sig=signal.SIGKILL)  # a crash, not a clean stop
    assert sb.kubectl("get", "namespaces", "--request-timeout=2s", check=False).returncode != 0
    sb.start_component("etcd")
    sb.start_component("kube-apiserver")
    assert time.monotonic() - t0 < 30
    got = sb.kubectl("get", "configmap", "survivor", "-n", "drill", "-o", "jsonpath={.data.a}")
    assert got.stdout == "1"
    assert sb.is_running()
    # controllers, scheduler and kwok reconnected: a Deployment still rolls out
    _wait(
        lambda: sb.kubectl("get", "sa", "default", "-n", "drill", check=False).returncode == 0,
        60,
        "default ServiceAccount",
    )
    sb.kubectl("create", "deployment", "after-restart", "-n", "drill", "--image=busybox")
    sb.kubectl("rollout", "status", "deployment/after-restart", "-n", "drill", "--timeout=90s")
    assert sb.nodes_ready()[0]
