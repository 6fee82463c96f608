"""The real API server refuses, with the operator's own message and the user's field path,
what the operator would refuse anyway: every spelling of a reserved extraArgs flag, values out
of bounds, and pod parts that would make an invalid pool Deployment (server-side dry runs
against the generated CRD)."""

from __future__ import annotations

import pytest
import yaml

from support.spellings import EXTRA_ARGS_ACCEPTED, EXTRA_ARGS_REFUSED


def _dry_run(kubectl, namespace: str, **spec):
    doc = {"apiVersion": "mtp-operator.io/v1alpha1", "kind": "MTPInference",
           "metadata": {"name": "probe"}, "spec": {"model": "org/model", **spec}}
    return kubectl("apply", "--dry-run=server", "-n", namespace, "-f", "-",
                   input=yaml.safe_dump(doc), check=False)


def test_every_reserved_spelling_is_refused_by_the_api_server(kubectl, namespace,
                                                              crd_installed):
    for arg in EXTRA_ARGS_REFUSED:
        p = _dry_run(kubectl, namespace, extraArgs=["--enforce-eager", arg])
        assert p.returncode != 0, f"{arg!r} was accepted"
        assert "spec.extraArgs" in p.stderr and "must not set flags" in p.stderr, p.stderr
    for arg in EXTRA_ARGS_ACCEPTED:
        p = _dry_run(kubectl, namespace, extraArgs=[arg])
        assert p.returncode == 0, f"{arg!r}: {p.stderr}"


REFUSED = [
    ({"replicas": 2**31}, "spec.replicas"),
    ({"speculative": {"numSpeculativeTokens": 17}}, "spec.speculative.numSpeculativeTokens"),
    ({"speculative": {"maxSpeculativeTokens": 17}}, "spec.speculative.maxSpeculativeTokens"),
    ({"speculative": {"profiles": {"H100": 17}}}, "spec.speculative.profiles"),
    ({"speculative": {"mtpLayers": 65}}, "spec.speculative.mtpLayers"),
    ({"rollback": {"cooldownSeconds": 10**9}}, "spec.rollback.cooldownSeconds"),
    ({"rollback": {"minDrafts": 2**31}}, "spec.rollback.minDrafts"),
    # which alerts may roll the resource back (issue 36): the two rules, once each
    ({"rollback": {"alertNames": ["HighLatency"]}}, "spec.rollback.alertNames[0]"),
    ({"rollback": {"alertNames": []}}, "spec.rollback.alertNames"),
    ({"rollback": {"alertNames": ["MTPHitRateLow", "MTPHitRateLow"]}},
     "spec.rollback.alertNames[1]"),
    ({"rollback": {"alertMatchers": {"team-name": "ml"}}}, "spec.rollback.alertMatchers"),
    ({"rollback": {"alertMatchers": {f"l{i}": "" for i in range(17)}}},
     "spec.rollback.alertMatchers"),
    ({"rollback": {"alertMatchers": {"cluster": "x" * 1025}}}, "spec.rollback.alertMatchers"),
    ({"maxModelLen": 2**31}, "spec.maxModelLen"),
    ({"env": [{"value": "x"}]}, "spec.env[0].name"),
    ({"env": [{"name": "A", "value": "1"}, {"name": "A", "value": "2"}]}, "spec.env[1]"),
    ({"env": [{"name": "MTP_RUNTIME_CONFIG", "value": "{}"}]}, "spec.env[0].name"),
    ({"env": [{"name": "A", "value": "1", "valueFrom": {"fieldRef": {}}}]}, "spec.env[0]"),
    ({"resources": {"limits": {"memory": "lots"}}}, "spec.resources.limits.memory"),
    ({"resources": {"requests": {"cpu": "1.5.2"}}}, "spec.resources.requests.cpu"),
    ({"tolerations": [{"key": "k", "operator": "In"}]}, "spec.tolerations[0].operator"),
    ({"tolerations": [{"key": "k", "effect": "Never"}]}, "spec.tolerations[0].effect"),
    ({"tolerations": [{"value": "v"}]}, "spec.tolerations[0]"),
    ({"tolerations": [{"key": "k", "effect": "NoSchedule", "tolerationSeconds": 5}]},
     "spec.tolerations[0]"),
]


@pytest.mark.parametrize(("spec", "field"), REFUSED, ids=[f for _, f in REFUSED])
def test_bounds_and_pod_parts_are_refused_naming_the_field(kubectl, namespace, crd_installed,
                                                           spec, field):
    p = _dry_run(kubectl, namespace, **spec)
    assert p.returncode != 0, f"{spec} was accepted"
    assert field in p.stderr, p.stderr


def test_good_pod_parts_are_accepted(kubectl, namespace, crd_installed):
    p = _dry_run(
        kubectl, namespace,
        env=[{"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "s", "key": "t"}}}],
        resources={"limits": {"memory": "512Gi", "cpu": 32}, "requests": {"cpu": "500m"}},
        tolerations=[{"operator": "Exists"},
                     {"key": "a", "value": "b", "effect": "NoExecute", "tolerationSeconds": 3}],
        replicas=2**31 - 1, speculative={"numSpeculativeTokens": 16},
        rollback={"alertNames": ["MTPHitRateLow"],
                  "alertMatchers": {"cluster": "prod", "_shard": "", "x" * 300: "y" * 1024}},
    )
    assert p.returncode == 0, p.stderr
