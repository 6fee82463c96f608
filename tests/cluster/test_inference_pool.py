"""Traffic classes on the real API server (issue 39): the Gateway API Inference Extension's own
InferencePool CRD (v1.6.2's config/crd/bases, cached by tests/sandbox/build.sh) accepts the
InferencePool the operator renders and refuses a broken one; the class list's CEL refuses what
the operator's validation refuses, naming the field."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from mtp_operator.render import render_documents

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "traffic-classes.yaml"
CRD_NAME = "inferencepools.inference.networking.k8s.io"


def _rendered() -> list[dict]:
    return list(yaml.safe_load_all(render_documents(EXAMPLE.read_text())))


def _apply(kubectl, namespace: str, obj: dict, dry_run: bool = True):
    obj = {**obj, "metadata": {k: v for k, v in obj["metadata"].items()
                               if k not in ("ownerReferences", "namespace")}}  # here: no owner
    args = ["apply", "--server-side", "-n", namespace, "-f", "-"]
    if dry_run:
        args.insert(1, "--dry-run=server")
    return kubectl(*args, input=yaml.safe_dump(obj), check=False)


def test_the_operators_inference_pool_is_accepted_by_the_real_crd(kubectl, namespace,
                                                                   inference_pool_crd):
    docs = _rendered()
    (pool,) = [d for d in docs if d["kind"] == "InferencePool"]
    p = _apply(kubectl, namespace, pool, dry_run=False)
    assert p.returncode == 0, p.stderr
    got = yaml.safe_load(kubectl("get", "inferencepool", pool["metadata"]["name"], "-n",
                                 namespace, "-o", "yaml").stdout)
    assert got["spec"]["selector"] == pool["spec"]["selector"]
    assert got["spec"]["targetPorts"] == [{"number": 8000}]
    # the CRD's defaults filled in, as the Inference Extension reads it
    assert got["spec"]["endpointPickerRef"]["kind"] == "Service"
    assert got["spec"]["endpointPickerRef"]["failureMode"] == "FailClose"
    # the routing objects beside it are valid too
    for other in (d for d in docs if d["kind"] in ("ConfigMap", "Service")):
        p = _apply(kubectl, namespace, other)
        assert p.returncode == 0, (other["metadata"]["name"], p.stderr)
    # a real schema: no target port, or a picker on a Service without its port, is refused
    broken = {**pool, "spec": {**pool["spec"], "targetPorts": []}}
    p = _apply(kubectl, namespace, broken)
    assert p.returncode != 0 and "targetPorts" in p.stderr, p.stderr
    ref = {k: v for k, v in pool["spec"]["endpointPickerRef"].items() if k != "port"}
    broken = {**pool, "spec": {**pool["spec"], "endpointPickerRef": ref}}
    p = _apply(kubectl, namespace, broken)
    assert p.returncode != 0 and "port is required" in p.stderr, p.stderr


def _mtpi(kubectl, namespace: str, classes: list[dict], **speculative):
    doc = {"apiVersion": "mtp-operator.io/v1alpha1", "kind": "MTPInference",
           "metadata": {"name": "probe"},
           "spec": {"model": "org/model", "speculative": {"classes": classes, **speculative}}}
    return kubectl("apply", "--dry-run=server", "-n", namespace, "-f", "-",
                   input=yaml.safe_dump(doc), check=False)


SHORT = {"name": "short", "promptTokens": {"max": 127}, "numSpeculativeTokens": 4}
LONG = {"name": "long", "promptTokens": {"min": 128}, "numSpeculativeTokens": 2}
REFUSED = [
    ([SHORT, {**LONG, "promptTokens": {"min": 100}}], "must not overlap"),
    ([SHORT, {**LONG, "promptTokens": {"min": 200}}], "no gap"),
    ([SHORT], "cover every prompt length"),
    ([{"name": "a"}, {"name": "b"}], "at most one default class"),
    ([SHORT, LONG, {**LONG}], "Duplicate value"),
    ([{"name": "a", "header": {"name": "x class", "value": "v"}}], "spec.speculative.classes[0]"
     ".header.name"),
    ([{"name": "a", "header": {"name": "x", "value": "1"}},
      {"name": "b", "header": {"name": "X", "value": "1"}}], "same header value"),
    ([{"name": f"c{i}", "header": {"name": "x", "value": str(i)}} for i in range(9)],
     "must have at most 8 items"),
    ([{"name": "a", "promptTokens": {"min": 9, "max": 3}}], "min must not be above max"),
]


@pytest.mark.parametrize(("classes", "says"), REFUSED, ids=[s for _, s in REFUSED])
def test_bad_class_lists_are_refused_by_the_api_server(kubectl, namespace, crd_installed,
                                                        classes, says):
    p = _mtpi(kubectl, namespace, classes)
    assert p.returncode != 0, f"{classes} was accepted"
    assert "spec.speculative.classes" in p.stderr and says in p.stderr, p.stderr


def test_good_class_lists_are_accepted_by_the_api_server(kubectl, namespace, crd_installed):
    example = yaml.safe_load(EXAMPLE.read_text())["spec"]["speculative"]["classes"]
    for classes in (example, [SHORT, LONG], [SHORT, {"name": "rest"}]):
        p = _mtpi(kubectl, namespace, classes)
        assert p.returncode == 0, (classes, p.stderr)
    p = _mtpi(kubectl, namespace, [{**SHORT, "numSpeculativeTokens": 5}, LONG],
              maxSpeculativeTokens=4)
    assert p.returncode != 0 and "spec.speculative.classes" in p.stderr, p.stderr
