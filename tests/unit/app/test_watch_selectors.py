"""The watches ask the API server for the operator's own objects (and Running pods only):
kopf's `labels=` filter alone would receive every Deployment, Service and pod of the
cluster and drop the others on the client."""

from __future__ import annotations

import kopf

from mtp_operator.api.v1alpha1 import GROUP, PLURAL, VERSION
from mtp_operator.app import handlers


def resource(group: str, plural: str, version: str = "v1") -> kopf.Resource:
    return kopf.Resource(group=group, version=version, plural=plural, namespaced=True)


def test_owned_kinds_are_selected_by_label_on_the_server() -> None:
    settings = kopf.OperatorSettings()
    handlers.configure(settings)
    owned = ["app.kubernetes.io/managed-by=mtp-operator"]
    for group, plural in (("apps", "deployments"), ("", "services"), ("", "pods")):
        assert settings.watching.label_selectors.collect(resource(group, plural)) == owned
    pods = resource("", "pods")
    assert settings.watching.field_selectors.collect(pods) == ["status.phase=Running"]
    # every MTPInference, node and claim is watched: none of them carries our label
    for res in (resource(GROUP, PLURAL, VERSION), resource("", "nodes"),
                resource("", "persistentvolumeclaims")):
        assert settings.watching.label_selectors.collect(res) == []
        assert settings.watching.field_selectors.collect(res) == []
    assert settings.watching.field_selectors.collect(resource("apps", "deployments")) == []
