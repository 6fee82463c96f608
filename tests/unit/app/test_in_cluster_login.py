"""The operator's in-cluster login: kopf's connection goes where lightkube's does."""

from __future__ import annotations

import kopf
import pytest

from mtp_operator.app.main import in_cluster_server

pytestmark = pytest.mark.unit

SA = kopf.ConnectionInfo(server="https://kubernetes.default.svc", token="t", ca_path="/ca.crt",
                         default_namespace="mtp-system")


def test_kubelets_service_env_wins_over_the_dns_name() -> None:
    info = in_cluster_server(SA, {"KUBERNETES_SERVICE_HOST": "10.96.0.1",
                                  "KUBERNETES_SERVICE_PORT": "443"})
    assert info.server == "https://10.96.0.1:443"
    # everything else from the ServiceAccount login is kept
    assert (info.token, info.ca_path, info.default_namespace) == ("t", "/ca.crt", "mtp-system")


def test_ipv6_host_in_brackets() -> None:
    info = in_cluster_server(SA, {"KUBERNETES_SERVICE_HOST": "fd00::1",
                                  "KUBERNETES_SERVICE_PORT": "6443"})
    assert info.server == "https://[fd00::1]:6443"


@pytest.mark.parametrize("env", [{}, {"KUBERNETES_SERVICE_HOST": "10.96.0.1"},
                                 {"KUBERNETES_SERVICE_PORT": "443"}])
def test_without_both_variables_kopfs_default_stays(env: dict[str, str]) -> None:
    assert in_cluster_server(SA, env) is SA
