"""A real runtime pod: an MTPInference pool pinned to the sandbox's real node runs the CPU
runtime image (`make images`, plus the tiny MTP model in one more layer), starts real vLLM,
turns Ready through the readiness probe the operator sets (GET /ready on `metrics`), serves
completions, and the operator's built-in evaluator scrapes it.

The real node stands in for a GPU node the way the operator sees one: a `nvidia.com/gpu.product`
label and `nvidia.com/gpu` capacity, advertised through the node's status as an extended
resource (no device plugin). The image sets MTP_RUNTIME_DEVICE=cpu, so the runtime takes the
GPU from the pool configuration and runs the CPU engine.
"""

from __future__ import annotations

import json
import urllib.request

import pytest

import support.mtpi as mtpi
from realnode import LABEL, TOLERATION
from support.cluster_fixtures import get_json, wait_for
from support.cpu_node import PORTS, PRODUCT
from support.exposition import sample_sum
from support.images import build, tiny_model, with_model
from support.mtpi import metric

pytestmark = pytest.mark.runtime_image

MODEL_PATH = "/models/tiny-mimo"


def test_pool_on_the_real_node_runs_real_vllm(cpu_gpu_node, kubectl, namespace,
                                              start_operator) -> None:
    from engine import traffic  # tests/engine/traffic.py

    image = with_model(build("runtime-cpu"), tiny_model(), MODEL_PATH)
    cpu_gpu_node.load_image(image)
    op = start_operator("--namespace", namespace, "--evaluator", "--evaluator-interval", "2")
    # hostNetwork pods share this machine's loopback with everything else on it: vLLM listens
    # on the node's IP (the pod IP), not on 0.0.0.0, which would also claim port 8000 of every
    # other loopback address
    mtpi.apply(kubectl, namespace, "tiny", model=MODEL_PATH, image=image, hostNetwork=True,
               gpuProducts=[PRODUCT], nodeSelector={LABEL: "true"}, tolerations=[TOLERATION],
               maxModelLen=96, resources={"requests": {"cpu": "100m", "memory": "512Mi"}},
               extraArgs=["--host", cpu_gpu_node.ip],
               speculative={"numSpeculativeTokens": 2, "mtpLayers": 1})
    obj = mtpi.wait_ready(kubectl, namespace, "tiny", timeout=420)
    (pool,) = obj["status"]["pools"]
    assert (pool["gpuProduct"], pool["numSpeculativeTokens"], pool["readyReplicas"]) == (
        PRODUCT, 2, 1)
    (pod,) = get_json(kubectl, "pods", "-n", namespace, "-l",
                      "mtp-operator.io/mtpinference=tiny")["items"]
    assert pod["spec"]["nodeName"] == cpu_gpu_node.name
    (status,) = pod["status"]["containerStatuses"]
    assert status["ready"] and status["restartCount"] == 0, status
    probe = pod["spec"]["containers"][0]["readinessProbe"]["httpGet"]
    # the runtime's /ready (vLLM's /health while not draining, issue 37)
    assert (probe["path"], probe["port"]) == ("/ready", "metrics")

    base = f"http://{pod['status']['podIP']}:{PORTS[0]}"
    with urllib.request.urlopen(base + "/v1/models", timeout=10) as r:
        served = json.loads(r.read())["data"][0]["id"]
    for prompt in traffic.prompts("predictable", 4, seed=2):
        req = urllib.request.Request(
            base + "/v1/completions", data=json.dumps(traffic.request_body(prompt, served))
            .encode(), headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=120) as r:
            assert json.loads(r.read())["choices"]
    # vLLM in the pod ran with the pool's K: two draft tokens per draft
    with urllib.request.urlopen(base + "/metrics", timeout=10) as r:
        text = r.read().decode()
    drafts = sample_sum(text, "vllm:spec_decode_num_drafts_total")
    assert drafts > 0 and sample_sum(text, "vllm:spec_decode_num_draft_tokens_total") == 2 * drafts
    # the built-in evaluator scrapes the pod's /metrics
    wait_for(lambda: metric(op, "mtp_operator_evaluator_scrapes_total", namespace=namespace,
                            gpu_product=PRODUCT, result="ok") >= 2, 30,
             message="the evaluator's scrapes of the pool pod")
    # the container's own log (kubelet's files): mtp-runtime launched vLLM with K=2
    launches = [e for e in cpu_gpu_node.runtime_events(namespace, pod["metadata"]["name"])
                if e.get("event") == "launch"]
    assert launches and launches[0]["k"]["k"] == 2, launches

    kubectl("delete", "mtpi", "tiny", "-n", namespace)
    wait_for(lambda: not get_json(kubectl, "pods", "-n", namespace)["items"], 150,
             message="the pool pod gone")
    wait_for(lambda: not cpu_gpu_node.ctr("tasks", "ls", "-q").stdout.split(), 60,
             message="no container left on the real node")

