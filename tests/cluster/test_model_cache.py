"""spec.modelCache on the real sandbox: the API server's CEL rules, and the operator's checks of
what the schema can't see (the claim exists, the node folder is allowed) — reported as
InvalidSpec naming the field, with the serving pools left exactly as they were."""

from __future__ import annotations

import pytest
import yaml

import support.mtpi as mtpi_helpers
from support.cluster_fixtures import wait_for

mtpi = mtpi_helpers.manifest
resource = mtpi_helpers.resource
condition = mtpi_helpers.condition
pools = mtpi_helpers.deployments
wait_ready = mtpi_helpers.wait_ready

PVC = {"persistentVolumeClaim": {"claimName": "weights"}}
ALLOWED = "/var/lib/mtp-models"


def apply(kubectl, namespace: str, manifest: str, check: bool = True):
    return kubectl("apply", "-n", namespace, "-f", "-", input=manifest, check=check)


REFUSED = [
    ({}, "exactly one of persistentVolumeClaim, hostPath and none"),
    ({"readOnly": True}, "exactly one of"),
    ({**PVC, "hostPath": {"path": "/x"}}, "exactly one of"),
    ({"none": {}, "readOnly": True}, "readOnly needs a cache volume"),
    ({"hostPath": {"path": "/var/../etc"}}, "must not contain `..`"),
    ({"hostPath": {"path": "relative/dir"}}, "spec.modelCache.hostPath.path"),
    ({"persistentVolumeClaim": {"claimName": "Not_A_Name"}},
     "spec.modelCache.persistentVolumeClaim.claimName"),
]


@pytest.mark.parametrize(("cache", "words"), REFUSED, ids=[w for _, w in REFUSED])
def test_api_server_refuses_bad_caches(kubectl, namespace, crd_installed, cache, words):
    p = apply(kubectl, namespace, mtpi("bad", modelCache=cache) , check=False)
    assert p.returncode != 0, f"accepted: {cache}"
    assert words in p.stderr, p.stderr


def test_api_server_accepts_good_caches(kubectl, namespace, crd_installed):
    for cache in (PVC, {"hostPath": {"path": f"{ALLOWED}/x"}, "readOnly": True}, {"none": {}}):
        out = kubectl("apply", "-n", namespace, "--dry-run=server", "-o", "yaml", "-f", "-",
                      input=mtpi("good", modelCache=cache))
        assert yaml.safe_load(out.stdout)["spec"]["modelCache"] == {"readOnly": False, **cache}


def _invalid(kubectl, namespace: str, name: str, field: str):
    def reported():
        obj = resource(kubectl, namespace, name)
        st = obj.get("status") or {}
        deg = condition(obj, "Degraded")
        return obj if (st.get("observedGeneration") == obj["metadata"]["generation"]
                       and st.get("phase") == "Invalid" and deg.get("reason") == "InvalidSpec"
                       and field in deg.get("message", "")) else None

    return wait_for(reported, 30, message=f"Invalid naming {field}")


def _claim(name: str) -> str:
    return yaml.safe_dump({
        "apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": name},
        "spec": {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "1Gi"}}},
    })


def test_missing_claim_and_forbidden_folder_keep_the_serving_pools(
    kubectl, namespace, start_operator, tmp_path
):
    settings = tmp_path / "settings.yaml"
    settings.write_text(yaml.safe_dump({"modelCache": {"allowedHostPaths": [ALLOWED]}}))
    start_operator("--namespace", namespace, "--no-evaluator", "--settings", str(settings))
    apply(kubectl, namespace, mtpi("cached"))
    wait_ready(kubectl, namespace, "cached")
    serving = pools(kubectl, namespace)
    before = {p: (d["metadata"]["uid"], d["metadata"]["resourceVersion"])
              for p, d in serving.items()}
    assert len(before) == 4

    # a claim that does not exist: Invalid, field named, pools untouched
    apply(kubectl, namespace, mtpi("cached", modelCache=PVC))
    obj = _invalid(kubectl, namespace, "cached", "modelCache.persistentVolumeClaim.claimName")
    message = condition(obj, "Degraded")["message"]
    assert f"PersistentVolumeClaim weights does not exist in namespace {namespace}" in message
    assert {p: (d["metadata"]["uid"], d["metadata"]["resourceVersion"])
            for p, d in pools(kubectl, namespace).items()} == before

    # a node folder the operator does not allow: the same
    apply(kubectl, namespace, mtpi("cached", modelCache={"hostPath": {"path": "/etc/models"}}))
    obj = _invalid(kubectl, namespace, "cached", "modelCache.hostPath.path")
    assert "/etc/models is not allowed" in condition(obj, "Degraded")["message"]
    assert f"only under {ALLOWED}" in condition(obj, "Degraded")["message"]
    assert {p: (d["metadata"]["uid"], d["metadata"]["resourceVersion"])
            for p, d in pools(kubectl, namespace).items()} == before

    # back to the claim, then the claim appears: the operator sees it without any edit of the
    # resource and the pools get the cache
    apply(kubectl, namespace, mtpi("cached", modelCache=PVC))
    _invalid(kubectl, namespace, "cached", "modelCache.persistentVolumeClaim.claimName")
    apply(kubectl, namespace, _claim("weights"))

    def with_cache():
        # (the sandbox has no storage provisioner: the claim stays Pending, and so do the new
        # pods; what matters here is that the operator took the claim and rolled the pools)
        obj = resource(kubectl, namespace, "cached")
        if obj["status"].get("phase") in (None, "Invalid"):
            return None
        deps = pools(kubectl, namespace)
        ok = all(
            {"name": "model-cache", "persistentVolumeClaim": {"claimName": "weights"}}
            in d["spec"]["template"]["spec"]["volumes"] for d in deps.values()
        )
        return deps if ok and len(deps) == 4 else None

    deps = wait_for(with_cache, 30, message="pools with the claim mounted")
    for d in deps.values():
        (container,) = d["spec"]["template"]["spec"]["containers"]
        assert {"name": "model-cache", "mountPath": "/model-cache"} in container["volumeMounts"]
    assert {p: d["metadata"]["uid"] for p, d in deps.items()} == {
        p: uid for p, (uid, _) in before.items()}  # the same Deployments, rolled

    # an allowed node folder is served
    path = f"{ALLOWED}/deepseek"
    apply(kubectl, namespace, mtpi("cached", modelCache={"hostPath": {"path": path}}))
    wait_ready(kubectl, namespace, "cached", timeout=180)
    served = pools(kubectl, namespace).values()
    volumes = [v for d in served
               for v in d["spec"]["template"]["spec"]["volumes"] if v["name"] == "model-cache"]
    # the volume is the allowed folder; each pod mounts only <path>/<namespace> of it (issue 36)
    assert volumes == [{"name": "model-cache",
                        "hostPath": {"path": ALLOWED, "type": "DirectoryOrCreate"}}] * 4
    mounts = [m for d in served for m in d["spec"]["template"]["spec"]["containers"][0]
              ["volumeMounts"] if m["name"] == "model-cache"]
    assert mounts == [{"name": "model-cache", "mountPath": "/model-cache",
                       "subPath": f"deepseek/{namespace}"}] * 4
