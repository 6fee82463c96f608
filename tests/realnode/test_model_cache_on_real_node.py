"""The model cache in a real pod: a pool on the sandbox's real node with `modelCache.hostPath`
downloads the model once, and the restart a change of K causes reads it from the node's folder
without asking the hub anything.

The pool pod runs the CPU runtime image that test_runtime_on_real_node.py runs too (the tiny
model baked in at /models/tiny-mimo, which this pool never names: one import of the 6.7 GB
image into the node's containerd serves both tests, not two): this pool's model is a hub
repository served by the loopback hub stand-in (tests/support/hub_standin.py, the one double:
no real hub is reachable), which the pod reaches through `HF_ENDPOINT` (hostNetwork: the pod
shares this machine's loopback). The node folder is the operator's allowed host path; it is
made writable for the image's user (2000:0), as docs/operations.md asks of a cache volume.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import pytest
import yaml

import support.mtpi as mtpi
from realnode import LABEL, TOLERATION
from support.cache_proof import HUB_ID, model_files
from support.cluster_fixtures import get_json, wait_for
from support.cpu_node import PRODUCT
from support.hub_standin import HubStandIn
from support.images import build, readable_copy, tiny_model, with_model

pytestmark = pytest.mark.runtime_image

BAKED_MODEL_PATH = "/models/tiny-mimo"  # as test_runtime_on_real_node.py's MODEL_PATH

NAME = "cached"


def _pool_pods(kubectl, namespace: str) -> list[dict]:
    return get_json(kubectl, "pods", "-n", namespace, "-l",
                    f"mtp-operator.io/mtpinference={NAME}")["items"]


def _ready_pod(kubectl, namespace: str, k: int):
    """The one pool pod, Ready and launched with K, or None."""
    pods = [p for p in _pool_pods(kubectl, namespace)
            if not p["metadata"].get("deletionTimestamp")]
    if len(pods) != 1:
        return None
    (status,) = pods[0]["status"].get("containerStatuses") or [{}]
    return pods[0] if status.get("ready") and _pool_k(pods[0]) == k else None


def _pool_k(pod: dict) -> int | None:
    env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0].get("env", [])}
    raw = env.get("MTP_RUNTIME_CONFIG")
    return json.loads(raw)["serve"]["num_speculative_tokens"] if raw else None


def _events(node, namespace: str, pod: dict) -> list[dict]:
    """The runtime's JSON log lines of the pod (kubelet's log files on the real node)."""
    out = []
    for line in node.pod_log(namespace, pod["metadata"]["name"]).splitlines():
        if '"event": ' in line and "{" in line:
            try:
                out.append(json.loads(line[line.index("{"):]))
            except json.JSONDecodeError:
                continue  # a vLLM line that mentions an event
    return out


def _apply(kubectl, namespace: str, node, cache: Path, endpoint: str, image: str, k: int):
    mtpi.apply(kubectl, namespace, NAME, model=HUB_ID, image=image, hostNetwork=True,
               gpuProducts=[PRODUCT], nodeSelector={LABEL: "true"}, tolerations=[TOLERATION],
               maxModelLen=96, resources={"requests": {"cpu": "100m", "memory": "512Mi"}},
               extraArgs=["--host", node.ip],
               env=[{"name": "HF_ENDPOINT", "value": endpoint}],
               modelCache={"hostPath": {"path": str(cache)}},
               speculative={"numSpeculativeTokens": k, "mtpLayers": 1})


def test_a_new_k_reads_the_weights_from_the_nodes_cache(cpu_gpu_node, kubectl, namespace,
                                                         start_operator, tmp_path) -> None:
    image = with_model(build("runtime-cpu"), tiny_model(), BAKED_MODEL_PATH)
    cpu_gpu_node.load_image(image)
    model = readable_copy(tiny_model(), tmp_path / "model")
    files = model_files(model)
    cache = Path(tempfile.mkdtemp(prefix="mtp-node-cache-", dir="/tmp"))
    try:
        cache.chmod(0o777)  # the image's user 2000:0 writes the hub cache and its marker
        settings = tmp_path / "settings.yaml"
        settings.write_text(yaml.safe_dump({"modelCache": {"allowedHostPaths": [str(cache)]}}))
        with HubStandIn({HUB_ID: model}).start() as hub:
            start_operator("--namespace", namespace, "--no-evaluator", "--settings",
                           str(settings))
            _apply(kubectl, namespace, cpu_gpu_node, cache, hub.endpoint, image, k=2)
            first = wait_for(lambda: _ready_pod(kubectl, namespace, 2), 600,
                             message="the first pool pod Ready with K=2")
            assert first["spec"]["nodeName"] == cpu_gpu_node.name
            mounts = {v["name"]: v for v in first["spec"]["volumes"]}
            assert any((v.get("hostPath") or {}).get("path") == str(cache)
                       for v in mounts.values()), mounts
            # the first start downloaded every file of the model exactly once, into the cache
            assert hub.downloads() == dict.fromkeys(files, 1), hub.downloads()
            # in the namespace's own folder of the node folder (issue 36), which kubelet made
            # for the pod's subPath; nothing beside it
            assert any(p.is_file() for p in (cache / namespace).rglob("*.safetensors"))
            assert [p.name for p in cache.iterdir()] == [namespace]
            loaded = [e for e in _events(cpu_gpu_node, namespace, first)
                      if e["event"] == "model_loaded"]
            assert loaded and loaded[-1]["origin"] == "download", loaded
            first_load = loaded[-1]
            asked = len(hub.snapshot())

            # a change of K restarts the pool (vLLM cannot change K while it runs)
            _apply(kubectl, namespace, cpu_gpu_node, cache, hub.endpoint, image, k=1)
            second = wait_for(lambda: _ready_pod(kubectl, namespace, 1), 600,
                              message="the restarted pool pod Ready with K=1")
            assert second["metadata"]["uid"] != first["metadata"]["uid"]
            events = _events(cpu_gpu_node, namespace, second)
            launch = next(e for e in events if e["event"] == "launch")
            assert launch["k"]["k"] == 1
            loaded = [e for e in events if e["event"] == "model_loaded"]
            assert loaded and loaded[-1]["origin"] == "cache", loaded
            assert loaded[-1]["downloaded_bytes"] == 0, loaded
            # not one request to the hub for the restart
            assert len(hub.snapshot()) == asked, hub.snapshot()[asked:]
            print(f"model cache on the real node: first start {first_load['seconds']} s "
                  f"({first_load['downloaded_files']} files downloaded), restart with K=1 "
                  f"{loaded[-1]['seconds']} s from the cache, 0 hub requests")

        kubectl("delete", "mtpi", NAME, "-n", namespace)
        wait_for(lambda: not _pool_pods(kubectl, namespace), 150, message="the pool pod gone")
    finally:
        shutil.rmtree(cache, ignore_errors=True)



def test_a_link_under_the_allowed_folder_that_leads_out_is_not_mounted(
        cpu_gpu_node, kubectl, namespace, start_operator, tmp_path) -> None:
    """issue 36: a symbolic link planted under an allowed folder (by any pod that could write
    there) must not take a pool's cache elsewhere on the node. The resource names the link
    as its path, which the lexical allow-list check accepts; the volume is the allowed folder
    and the rest a subPath, which the real kubelet resolves inside the volume and refuses: the
    container is never created and nothing is written where the link leads."""
    image = with_model(build("runtime-cpu"), tiny_model(), BAKED_MODEL_PATH)
    cpu_gpu_node.load_image(image)
    allowed = Path(tempfile.mkdtemp(prefix="mtp-node-cache-", dir="/tmp"))
    outside = Path(tempfile.mkdtemp(prefix="mtp-outside-", dir="/tmp"))
    try:
        allowed.chmod(0o777)
        outside.chmod(0o777)
        (allowed / "planted").symlink_to(outside)
        settings = tmp_path / "settings.yaml"
        settings.write_text(yaml.safe_dump({"modelCache": {"allowedHostPaths": [str(allowed)]}}))
        start_operator("--namespace", namespace, "--no-evaluator", "--settings", str(settings))
        _apply(kubectl, namespace, cpu_gpu_node, allowed / "planted", "http://127.0.0.1:9",
               image, k=2)

        def refused():
            for pod in _pool_pods(kubectl, namespace):
                for status in pod["status"].get("containerStatuses") or []:
                    waiting = (status.get("state") or {}).get("waiting") or {}
                    if waiting.get("reason") == "CreateContainerConfigError":
                        return pod, waiting
                    assert not (status.get("state") or {}).get("running"), status
            return None

        pod, waiting = wait_for(refused, 300, message="kubelet refusing the pool pod's subPath")
        print(f"kubelet: {waiting.get('message')}")
        assert "subpath" in (waiting.get("message") or "").lower(), waiting
        mount = next(m for m in pod["spec"]["containers"][0]["volumeMounts"]
                     if m["name"] == "model-cache")
        assert mount["subPath"] == f"planted/{namespace}"
        assert list(outside.iterdir()) == []  # nothing made where the link leads

        kubectl("delete", "mtpi", NAME, "-n", namespace)
        wait_for(lambda: not _pool_pods(kubectl, namespace), 150, message="the pool pod gone")
    finally:
        shutil.rmtree(allowed, ignore_errors=True)  # the link itself, not where it leads
        shutil.rmtree(outside, ignore_errors=True)
