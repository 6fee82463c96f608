"""The sandbox's real node: a kubelet with containerd and runc that runs real containers,
beside the kwok nodes, labelled and tainted so only pods that ask land there."""

from __future__ import annotations

import json

import yaml

from realnode import LABEL, TAINT, TOLERATION
from support.cluster_fixtures import get_json, wait_for
from support.images import build


def _pod(name: str, image: str, command: list[str], tolerate: bool) -> str:
    spec = {
        "restartPolicy": "Never",
        "hostNetwork": True,
        "nodeSelector": {LABEL: "true"},
        "containers": [{"name": "main", "image": image, "imagePullPolicy": "Never",
                        "command": command}],
    }
    if tolerate:
        spec["tolerations"] = [TOLERATION]
    return yaml.safe_dump({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
                           "spec": spec})


def test_real_node_registers_with_its_label_and_taint(real_node, kubectl) -> None:
    node = get_json(kubectl, "node", real_node.name)
    assert node["metadata"]["labels"][LABEL] == "true"
    assert TAINT in [{k: t[k] for k in ("key", "value", "effect")}
                     for t in node["spec"].get("taints", [])]
    info = node["status"]["nodeInfo"]
    # reported by a real kubelet and container runtime, not by kwok
    assert info["kubeletVersion"] == "v1.36.3"
    assert info["containerRuntimeVersion"].startswith("containerd://1.")
    assert any(c["type"] == "Ready" and c["status"] == "True"
               for c in node["status"]["conditions"])


def test_real_container_runs_only_when_the_pod_asks(real_node, kubectl, namespace) -> None:
    image = build("operator")  # a small image with python3 in it
    real_node.load_image(image)
    script = "import os, socket; print('real', os.getuid(), socket.gethostname())"
    kubectl("apply", "-n", namespace, "-f", "-",
            input=_pod("hello", image, ["python3", "-c", script], tolerate=True))
    pod = wait_for(lambda: (p := get_json(kubectl, "pod", "hello", "-n", namespace))
                   ["status"].get("phase") in ("Succeeded", "Failed") and p, 120,
                   message="the pod on the real node to finish")
    assert pod["spec"]["nodeName"] == real_node.name
    assert pod["status"]["phase"] == "Succeeded", json.dumps(pod["status"])[-2000:]
    log = real_node.pod_log(namespace, "hello")
    # the image's own user (65532), and the host's name: a hostNetwork container on this host
    assert "real 65532 " in log, log
    # without the toleration the scheduler keeps it off the real node (and no kwok node
    # carries the label): it stays Pending, unscheduled
    kubectl("apply", "-n", namespace, "-f", "-",
            input=_pod("untolerated", image, ["true"], tolerate=False))
    event = wait_for(lambda: [e for e in get_json(kubectl, "events", "-n", namespace)["items"]
                              if e["involvedObject"]["name"] == "untolerated"
                              and e["reason"] == "FailedScheduling"], 60,
                     message="FailedScheduling for the pod without the toleration")
    assert "untolerated taint" in event[0]["message"], event[0]["message"]
    assert not get_json(kubectl, "pod", "untolerated", "-n", namespace)["spec"].get("nodeName")
