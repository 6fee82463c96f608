"""drift.drifted_fields: the API server's defaulting is no drift (else the operator would
re-apply forever); a hand edit of what the operator owns is."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from typing import Any

import pytest

from mtp_operator import builders
from mtp_operator.api.v1alpha1 import MTPInferenceSpec
from mtp_operator.drift import drifted_fields
from mtp_operator.planning import plan_pool
from mtp_runtime.pool_config import ENV_VAR, PoolConfig

H100 = "NVIDIA-H100-80GB-HBM3"


def _desired(**fields: Any) -> dict[str, Any]:
    spec = MTPInferenceSpec.model_validate(
        {
            "model": "org/model",
            "tensorParallelSize": 4,
            "modelSource": "modelscope",
            "resources": {"limits": {"memory": "64Gi"}, "requests": {"cpu": "4"}},
            **fields,
        }
    )
    plan = plan_pool(spec, H100)
    return builders.pool_deployment("res", "ns", "uid-1", spec, plan, "img:1")


def _server_copy(desired: dict[str, Any]) -> dict[str, Any]:
    """`desired` as the API server returns it after apply: defaulted, with metadata and status
    of its own. (Field values the operator sets come back as written.)"""
    obj = json.loads(json.dumps(desired))
    meta = obj["metadata"]
    meta.update(
        uid="7d6c-...",
        resourceVersion="4711",
        generation=3,
        creationTimestamp="2026-01-01T00:00:00Z",
        managedFields=[{"manager": "mtp-operator", "operation": "Apply", "fieldsV1": {}}],
    )
    meta["annotations"]["deployment.kubernetes.io/revision"] = "3"
    spec = obj["spec"]
    spec.update(progressDeadlineSeconds=600, revisionHistoryLimit=10)
    spec["strategy"]["rollingUpdate"]["maxUnavailable"] = 1
    template = spec["template"]
    template["metadata"]["creationTimestamp"] = None
    pod = template["spec"]
    pod.update(
        dnsPolicy="ClusterFirst",
        restartPolicy="Always",
        schedulerName="default-scheduler",
        securityContext={},
    )
    for container in pod["containers"]:
        container.update(
            terminationMessagePath="/dev/termination-log",
            terminationMessagePolicy="File",
            imagePullPolicy="IfNotPresent",
        )
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            container[probe].update(timeoutSeconds=1, successThreshold=1)
            container[probe]["httpGet"]["scheme"] = "HTTP"
            container[probe].setdefault("failureThreshold", 3)
        for port in container["ports"]:
            port.setdefault("protocol", "TCP")
    for volume in pod["volumes"]:
        volume["emptyDir"].setdefault("sizeLimit", None)
        volume["emptyDir"] = {k: v for k, v in volume["emptyDir"].items() if v is not None}
    obj["status"] = {
        "observedGeneration": 3,
        "replicas": 1,
        "updatedReplicas": 1,
        "readyReplicas": 1,
        "availableReplicas": 1,
        "conditions": [{"type": "Available", "status": "True"}],
    }
    return obj


def test_desired_against_itself() -> None:
    desired = _desired()
    assert drifted_fields(desired, desired) == []
    assert drifted_fields(desired, copy.deepcopy(desired)) == []


def test_server_defaulting_is_no_drift() -> None:
    desired = _desired()
    observed = _server_copy(desired)
    assert observed != desired
    assert drifted_fields(desired, observed) == []


def test_other_managers_fields_are_no_drift() -> None:
    observed = _server_copy(_desired())
    observed["metadata"]["labels"]["team"] = "ml"
    observed["metadata"]["annotations"]["argocd.argoproj.io/tracking-id"] = "x"
    observed["spec"]["template"]["metadata"]["annotations"]["kubectl.kubernetes.io/restartedAt"] = (
        "2026-01-01T00:00:00Z"
    )
    assert drifted_fields(_desired(), observed) == []


ADDITIONS: list[tuple[str, Callable[[dict[str, Any]], Any], str]] = [
    ("env entry", lambda o: _container(o)["env"].append({"name": "X", "value": "1"}),
     "added container vllm env[X]"),
    ("args", lambda o: _container(o).update(args=["--enforce-eager"]), "added container vllm args"),
    ("sidecar", lambda o: o["spec"]["template"]["spec"]["containers"].append(
        {"name": "sidecar", "image": "busybox"}), "added containers[sidecar]"),
    ("init container", lambda o: o["spec"]["template"]["spec"].update(
        initContainers=[{"name": "init", "image": "busybox"}]), "added initContainers[init]"),
    ("volume", lambda o: o["spec"]["template"]["spec"]["volumes"].append(
        {"name": "extra", "emptyDir": {}}), "added volumes[extra]"),
    ("volume mount", lambda o: _container(o)["volumeMounts"].append(
        {"name": "dshm", "mountPath": "/cache"}), "added container vllm volumeMounts[/cache]"),
    ("privileged", lambda o: _container(o).update(securityContext={"privileged": True}),
     "added container vllm securityContext"),
    ("hostNetwork", lambda o: o["spec"]["template"]["spec"].update(hostNetwork=True),
     "added pod hostNetwork"),
    ("pod securityContext", lambda o: o["spec"]["template"]["spec"].update(
        securityContext={"runAsUser": 0}), "added pod securityContext"),
    ("paused", lambda o: o["spec"].update(paused=True), "added spec.paused"),
    ("revision limit", lambda o: o["spec"].update(revisionHistoryLimit=1),
     "added spec.revisionHistoryLimit"),
    ("memory limit", lambda o: _container(o)["resources"]["limits"].update(cpu="1"),
     "added container vllm resources.limits[cpu]"),
]  # fmt: skip


@pytest.mark.parametrize(("edit", "field"), [e[1:] for e in ADDITIONS],
                         ids=[e[0] for e in ADDITIONS])
def test_hand_added_fields_are_drift(edit: Callable[[dict[str, Any]], Any], field: str) -> None:
    desired = _desired()
    observed = _server_copy(desired)
    edit(observed)
    assert drifted_fields(desired, observed) == [field]


def _container(obj: dict[str, Any]) -> dict[str, Any]:
    return obj["spec"]["template"]["spec"]["containers"][0]


def _env(obj: dict[str, Any], name: str) -> dict[str, Any]:
    return next(e for e in _container(obj)["env"] if e["name"] == name)


def _edit_runtime_config(obj: dict[str, Any]) -> None:
    entry = next(e for e in _container(obj)["env"] if e["name"] == ENV_VAR)
    config = PoolConfig.from_json(entry["value"])
    data = json.loads(config.to_json())
    data["serve"]["num_speculative_tokens"] = 2
    entry["value"] = json.dumps(data, sort_keys=True, separators=(",", ":"))


EDITS: list[tuple[str, Callable[[dict[str, Any]], Any], str]] = [
    ("scale", lambda o: o["spec"].update(replicas=3), "replicas"),
    ("image", lambda o: _container(o).update(image="img:evil"), "image"),
    ("command", lambda o: _container(o).update(command=["vllm", "serve", "m"]), "command"),
    ("runtime config", _edit_runtime_config, "runtime config"),
    ("runtime config removed",
     lambda o: _container(o).update(env=[e for e in _container(o)["env"] if e["name"] != ENV_VAR]),
     "runtime config"),
    ("env value", lambda o: _env(o, "VLLM_USE_MODELSCOPE").update(value="false"), "env"),
    ("env removed", lambda o: _container(o).update(
        env=[e for e in _container(o)["env"] if e["name"] != "VLLM_USE_MODELSCOPE"]), "env"),
    ("GPU limit", lambda o: _container(o)["resources"]["limits"].update({"nvidia.com/gpu": "1"}),
     "GPU limit"),
    ("GPU limit removed", lambda o: _container(o)["resources"]["limits"].pop("nvidia.com/gpu"),
     "GPU limit"),
    ("affinity", lambda o: o["spec"]["template"]["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0][
        "matchExpressions"][0].update(values=["NVIDIA-L40S"]), "node affinity"),
    ("affinity removed", lambda o: o["spec"]["template"]["spec"].pop("affinity"), "node affinity"),
    ("hash annotation", lambda o: o["metadata"]["annotations"].pop(
        "mtp-operator.io/settings-hash"), "settings-hash annotation"),
    ("command annotation", lambda o: o["metadata"]["annotations"].update(
        {"mtp-operator.io/vllm-command": "[]"}), "vllm-command annotation"),
    ("template hash", lambda o: o["spec"]["template"]["metadata"]["annotations"].update(
        {"mtp-operator.io/settings-hash": "0"}), "pod template settings-hash"),
]  # fmt: skip


@pytest.mark.parametrize(("edit", "field"), [e[1:] for e in EDITS], ids=[e[0] for e in EDITS])
def test_hand_edits_are_drift(edit: Callable[[dict[str, Any]], Any], field: str) -> None:
    desired = _desired()
    observed = _server_copy(desired)
    edit(observed)
    assert drifted_fields(desired, observed) == [field]


def test_a_spec_change_is_drift_of_every_derived_field() -> None:
    old = _server_copy(_desired())
    new = _desired(speculative={"numSpeculativeTokens": 3})
    assert drifted_fields(new, old) == [
        "settings-hash annotation",
        "vllm-command annotation",
        "pod template settings-hash",
        "runtime config",
    ]
    assert drifted_fields(_desired(replicas=2), old) == ["settings-hash annotation", "replicas"]


def test_an_unrecognisable_object_is_drift() -> None:
    desired = _desired()
    assert "image" in drifted_fields(desired, {"metadata": {}, "spec": {}})
    assert len(drifted_fields(desired, {})) == 11  # 10 fields (the name among them) and the env
    no_containers = _server_copy(desired)
    no_containers["spec"]["template"]["spec"]["containers"] = []
    assert {"image", "command", "runtime config", "GPU limit"} <= set(
        drifted_fields(desired, no_containers)
    )


def test_env_as_the_server_keeps_it_is_no_drift_but_another_value_is() -> None:
    env = [
        {"name": "EMPTY", "value": ""},
        {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
    ]
    desired = _desired(env=env)
    observed = _server_copy(desired)
    _env(observed, "EMPTY").pop("value")  # an empty value is not stored
    _env(observed, "POD")["valueFrom"]["fieldRef"]["apiVersion"] = "v1"  # defaulted
    assert drifted_fields(desired, observed) == []
    _env(observed, "POD").update(value="x")
    _env(observed, "POD").pop("valueFrom")
    assert drifted_fields(desired, observed) == ["env"]
