"""The model cache on the sandbox's real node: what a `hostPath` cache may mount.

That a pool with `modelCache.hostPath` downloads the model once and the restart a change of K
causes reads it from the node's folder without asking the hub anything is proven by
tests/realnode/test_k_change_on_real_node.py, in the same two engine starts as its rollback
under traffic. Here: a path the allow-list accepts but which leads out of the allowed folder
through a link is never mounted (issue 36). The pool pod runs the CPU runtime image that the
other real-node tests run (one import of the 6.7 GB image into the node's containerd serves
them all); it never starts: kubelet refuses its volume.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest
import yaml

import support.mtpi as mtpi
from realnode import LABEL, TOLERATION
from support.cache_proof import HUB_ID
from support.cluster_fixtures import get_json, wait_for
from support.cpu_node import PRODUCT
from support.images import build, tiny_model, with_model

pytestmark = pytest.mark.runtime_image

BAKED_MODEL_PATH = "/models/tiny-mimo"  # as test_runtime_on_real_node.py's MODEL_PATH

NAME = "cached"


def _pool_pods(kubectl, namespace: str) -> list[dict]:
    return get_json(kubectl, "pods", "-n", namespace, "-l",
                    f"mtp-operator.io/mtpinference={NAME}")["items"]


def _apply(kubectl, namespace: str, node, cache: Path, endpoint: str, image: str, k: int):
    mtpi.apply(kubectl, namespace, NAME, model=HUB_ID, image=image, hostNetwork=True,
               gpuProducts=[PRODUCT], nodeSelector={LABEL: "true"}, tolerations=[TOLERATION],
               maxModelLen=96, resources={"requests": {"cpu": "100m", "memory": "512Mi"}},
               extraArgs=["--host", node.ip],
               env=[{"name": "HF_ENDPOINT", "value": endpoint}],
               modelCache={"hostPath": {"path": str(cache)}},
               speculative={"numSpeculativeTokens": k, "mtpLayers": 1})


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
