"""The Helm chart, without a cluster: `helm lint`, `helm template` and what it renders.

helm is the sandbox's build (tests/sandbox/build.sh puts it in
~/.cache/mtp-operator/sandbox/current/helm), or $HELM, or helm on PATH.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from mtp_operator import cli, naming
from mtp_operator.settings import OperatorSettings
from support.chart import (
    CHART,
    CLUSTER_RULES,
    KUBE_VERSION,
    LEASE_RULES,
    REPO,
    find,
    helm,
    helm_binary,
    render,
    rule_triples,
    template_args,
)

pytestmark = pytest.mark.unit

MONITORING = "monitoring.coreos.com/v1"
TOKEN = "s3cret-token-0123456789"


@pytest.fixture(autouse=True, scope="module")
def _need_helm() -> None:
    if helm_binary() is None:
        pytest.fail("helm not found: run tests/sandbox/build.sh (or set $HELM)")


@pytest.fixture(scope="module")
def default() -> list[dict[str, Any]]:
    return render()


def _container(objects: list[dict[str, Any]]) -> dict[str, Any]:
    pod = find(objects, "Deployment")["spec"]["template"]["spec"]
    assert len(pod["containers"]) == 1
    return pod["containers"][0]


def _args(objects: list[dict[str, Any]]) -> list[str]:
    return _container(objects)["args"]


# ---- lint and the CRD copy -------------------------------------------------------------------


def test_helm_lint_strict() -> None:
    out = helm("lint", str(CHART), "--strict", "--kube-version", KUBE_VERSION)
    assert out.returncode == 0, out.stdout + out.stderr


def test_plain_helm_template_accepts_the_chart() -> None:
    """A released helm assumes its own client-go's Kubernetes version (>= 1.30) when no cluster
    or --kube-version is given; a helm built without Helm's ldflags assumes v1.20 and refuses
    the chart's kubeVersion. Below the chart's floor it is still refused."""
    out = helm("template", str(CHART))
    assert out.returncode == 0, (
        out.stderr + "\n(an old sandbox helm? rebuild it: bash tests/sandbox/build.sh)")
    assert find([d for d in yaml.safe_load_all(out.stdout) if d], "Deployment")
    out = helm("template", str(CHART), "--kube-version", "1.29.9")
    assert out.returncode != 0
    assert "kube version" in out.stderr.lower() or "kubeversion" in out.stderr.lower(), out.stderr


def test_chart_crd_is_the_generated_crd() -> None:
    chart_copy = CHART / "crds" / "mtp-operator.io_mtpinferences.yaml"
    generated = REPO / "crds" / "mtp-operator.io_mtpinferences.yaml"
    assert chart_copy.read_text() == generated.read_text(), (
        "refresh the chart's copy: cp crds/mtp-operator.io_mtpinferences.yaml "
        "charts/mtp-operator/crds/"
    )
    assert [p.name for p in (CHART / "crds").iterdir()] == [chart_copy.name]


def test_chart_versions() -> None:
    import tomllib

    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    assert chart["version"] == chart["appVersion"] == version
    assert chart["kubeVersion"] == ">=1.30.0-0"


def test_values_are_all_commented() -> None:
    """Every top-level key of values.yaml has a comment right above it (or its block has)."""
    lines = (CHART / "values.yaml").read_text().splitlines()
    for i, line in enumerate(lines):
        if re.match(r"^[a-zA-Z]\w*:", line):
            assert i > 0 and lines[i - 1].lstrip().startswith("#"), f"uncommented: {line}"


# ---- bad values fail at install time ---------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("replicaCount=two", "/replicaCount"),
        ("gpuProfiles.H100=-1", "/gpuProfiles/H100"),
        ("gpuProfiles.H100=lots", "/gpuProfiles/H100"),
        ("monitoring.podMonitor.enabled=yes", "/monitoring/podMonitor/enabled"),
        ("evaluator.intervalSeconds=0", "/evaluator/intervalSeconds"),
        ("image.pullPolicy=Sometimes", "/image/pullPolicy"),
        ("alerts.port=70000", "/alerts/port"),
        ("replicas=2", "additional properties 'replicas' not allowed"),
        ("alerts.tokenSecret.create=true", "/alerts/tokenSecret/token"),
        ("watchNamespaces[0]=Not_A_Namespace", "/watchNamespaces/0"),
    ],
)
def test_bad_values_fail_with_a_message(value: str, message: str) -> None:
    for command in (template_args(values=[value]),
                    ["lint", str(CHART), "--kube-version", KUBE_VERSION, "--set", value]):
        out = helm(*command)
        assert out.returncode != 0, f"helm {command[0]} accepted {value}"
        assert message in out.stdout + out.stderr, out.stdout + out.stderr


def test_two_replicas_need_leader_election() -> None:
    out = helm(*template_args(values=["replicaCount=2", "leaderElection.enabled=false"]))
    assert out.returncode != 0
    assert "replicaCount > 1 needs leaderElection.enabled=true" in out.stderr
    render(values=["replicaCount=2"])  # with the Lease it is fine


# ---- what renders ----------------------------------------------------------------------------


def test_default_objects(default: list[dict[str, Any]]) -> None:
    kinds = sorted(o["kind"] for o in default)
    assert kinds == sorted([
        "ServiceAccount", "ConfigMap", "ConfigMap", "ClusterRole", "ClusterRoleBinding",
        "Role", "RoleBinding", "Service", "Deployment",
    ])
    for obj in default:
        if obj["kind"] not in ("ClusterRole", "ClusterRoleBinding"):
            assert obj["metadata"]["namespace"] == "mtp-system", obj["kind"]


def test_deployment_security_and_probes(default: list[dict[str, Any]]) -> None:
    deployment = find(default, "Deployment")
    assert deployment["spec"]["replicas"] == 1
    pod = deployment["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == 65532
    container = _container(default)
    sc = container["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    # alive while waiting for the lease; ready (and sent alerts) only while leading
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"alerts": 8443, "metrics": 8080}
    assert container["image"] == "ghcr.io/mtp-operator/mtp-operator:0.1.0"
    assert "command" not in container  # the image's entrypoint is `mtp-operator run`
    assert pod["serviceAccountName"] == find(default, "ServiceAccount")["metadata"]["name"]


def test_default_args(default: list[dict[str, Any]]) -> None:
    assert _args(default) == [
        "--settings=/etc/mtp-operator/settings.yaml",
        "--default-image=ghcr.io/mtp-operator/mtp-runtime:0.1.0",
        "--alerts-address=0.0.0.0:8443",
        "--alerts-token-file=/var/run/secrets/mtp-operator/alerts/token",
        "--evaluator",
        "--evaluator-interval=15",
        "--metrics-address=0.0.0.0:8080",
        "--leader-election",
        "--lease-namespace=mtp-system",
        "--lease-name=mtp-operator",
    ]


@pytest.mark.parametrize(
    "values",
    [
        [],
        ["evaluator.enabled=false", "leaderElection.enabled=false", "watchNamespaces={a,b}",
         "alerts.tls.secretName=webhook-tls", "extraArgs={--log-level=DEBUG}"],
    ],
)
def test_args_parse_with_the_operator_cli(values: list[str]) -> None:
    """Every flag the chart passes is one `mtp-operator run` accepts."""
    args = cli._parser().parse_args(["run", *_args(render(values=values))])
    assert args.command == "run"
    if values:
        assert args.evaluator is False and args.leader_election is False
        assert args.namespace == ["a", "b"]
        assert str(args.alerts_tls_cert).endswith("/tls.crt")


def test_mounts_and_volumes(default: list[dict[str, Any]]) -> None:
    pod = find(default, "Deployment")["spec"]["template"]["spec"]
    mounts = {m["name"]: m["mountPath"] for m in _container(default)["volumeMounts"]}
    assert mounts == {"settings": "/etc/mtp-operator",
                      "alerts-token": "/var/run/secrets/mtp-operator/alerts", "tmp": "/tmp"}
    volumes = {v["name"]: v for v in pod["volumes"]}
    settings_cm = find(default, "ConfigMap", "mtp-operator-settings")
    assert volumes["settings"]["configMap"]["name"] == settings_cm["metadata"]["name"]
    assert volumes["alerts-token"]["secret"]["secretName"] == "mtp-operator-alerts-token"
    assert not [o for o in default if o["kind"] == "Secret"]  # bring your own by default


def test_settings_file_is_what_the_operator_reads() -> None:
    objects = render(values=["gpuProfiles.H100=5", "gpuProfiles.NVIDIA-L40S=0",
                             "evaluator.enabled=false", "evaluator.intervalSeconds=45",
                             "defaultRuntimeImage=registry.local/mtp-runtime:dev"])
    text = find(objects, "ConfigMap", "mtp-operator-settings")["data"]["settings.yaml"]
    settings = OperatorSettings.model_validate(yaml.safe_load(text))
    assert settings.default_image == "registry.local/mtp-runtime:dev"
    assert settings.gpu_profiles == {"H100": 5, "NVIDIA-L40S": 0}
    assert settings.evaluator.enabled is False
    assert settings.evaluator.interval_seconds == 45
    assert "--default-image=registry.local/mtp-runtime:dev" in _args(objects)
    assert "--no-evaluator" in _args(objects) and "--evaluator-interval=45" in _args(objects)
    default_text = find(render(), "ConfigMap", "mtp-operator-settings")["data"]["settings.yaml"]
    assert OperatorSettings.model_validate(yaml.safe_load(default_text)).gpu_profiles == {}


def test_namespace_opt_in_is_on_by_default_and_a_value_turns_it_off() -> None:
    """alerts.requireNamespaceOptIn reaches the settings file (issue 36: the webhook acts
    only in namespaces labelled mtp-operator.io/alert-rollback=enabled)."""
    def opt_in(values: list[str]) -> bool:
        text = find(render(values=values), "ConfigMap", "mtp-operator-settings")["data"][
            "settings.yaml"]
        return OperatorSettings.model_validate(yaml.safe_load(text)).alerts.require_namespace_opt_in

    assert opt_in([]) is True
    assert opt_in(["alerts.requireNamespaceOptIn=false"]) is False


def test_settings_change_rolls_the_pods() -> None:
    a = find(render(), "Deployment")["spec"]["template"]["metadata"]["annotations"]
    b = find(render(values=["gpuProfiles.H100=5"]), "Deployment")
    assert a["checksum/settings"] != b["spec"]["template"]["metadata"]["annotations"][
        "checksum/settings"]


def test_token_secret_created_on_request() -> None:
    objects = render(values=["alerts.tokenSecret.create=true", f"alerts.tokenSecret.token={TOKEN}",
                             "alerts.tokenSecret.name=am-token", "alerts.tokenSecret.key=bearer"])
    import base64

    secret = find(objects, "Secret", "am-token")
    assert base64.b64decode(secret["data"]["bearer"]).decode() == TOKEN
    assert "--alerts-token-file=/var/run/secrets/mtp-operator/alerts/bearer" in _args(objects)
    volume = next(v for v in find(objects, "Deployment")["spec"]["template"]["spec"]["volumes"]
                  if v["name"] == "alerts-token")
    assert volume["secret"] == {"secretName": "am-token",
                                "items": [{"key": "bearer", "path": "bearer"}]}


def test_tls_serves_the_webhook_with_the_secret() -> None:
    objects = render(values=["alerts.tls.secretName=webhook-tls"])
    container = _container(objects)
    assert "--alerts-tls-cert=/var/run/secrets/mtp-operator/tls/tls.crt" in container["args"]
    assert "--alerts-tls-key=/var/run/secrets/mtp-operator/tls/tls.key" in container["args"]


def test_service_ports(default: list[dict[str, Any]]) -> None:
    service = find(default, "Service")
    ports = {p["name"]: (p["port"], p["targetPort"]) for p in service["spec"]["ports"]}
    assert ports == {"alerts": (8443, "alerts"), "metrics": (8080, "metrics")}
    labels = find(default, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items()


def test_rbac_is_the_documented_set(default: list[dict[str, Any]]) -> None:
    assert rule_triples(find(default, "ClusterRole")["rules"]) == CLUSTER_RULES
    role = find(default, "Role")
    assert role["metadata"]["namespace"] == "mtp-system"
    assert rule_triples(role["rules"]) == LEASE_RULES
    sa = find(default, "ServiceAccount")["metadata"]["name"]
    for binding in (find(default, "ClusterRoleBinding"), find(default, "RoleBinding")):
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": sa,
                                        "namespace": "mtp-system"}]


# ---- monitoring ------------------------------------------------------------------------------


def test_monitoring_objects_follow_capabilities(default: list[dict[str, Any]]) -> None:
    kinds = {"PodMonitor", "ServiceMonitor", "PrometheusRule"}
    assert not kinds & {o["kind"] for o in default}
    with_crds = render(api_versions=[MONITORING])
    assert kinds <= {o["kind"] for o in with_crds}
    forced = render(values=["monitoring.podMonitor.enabled=true",
                            "monitoring.serviceMonitor.enabled=true"])
    assert {"PodMonitor", "ServiceMonitor"} <= {o["kind"] for o in forced}
    off = render(api_versions=[MONITORING], values=[
        "monitoring.podMonitor.enabled=false", "monitoring.serviceMonitor.enabled=false",
        "monitoring.prometheusRule.enabled=false"])
    assert not kinds & {o["kind"] for o in off}


def _relabel_source(label_key: str) -> str:
    return "__meta_kubernetes_pod_label_" + re.sub(r"[^a-zA-Z0-9_]", "_", label_key)


def test_pod_monitor_matches_the_pool_pods_and_label_contract() -> None:
    monitor = find(render(api_versions=[MONITORING]), "PodMonitor")
    selector = monitor["spec"]["selector"]["matchLabels"]
    pool_labels = naming.pool_labels("qwen", "NVIDIA-H100-80GB-HBM3")
    assert selector.items() <= pool_labels.items()
    assert monitor["spec"]["namespaceSelector"] == {"any": True}
    endpoints = monitor["spec"]["podMetricsEndpoints"]
    assert [e["port"] for e in endpoints] == ["http", "metrics"]
    want = {
        "namespace": "__meta_kubernetes_namespace",
        "mtpinference": _relabel_source(naming.LABEL_RESOURCE),
        "gpu_product": _relabel_source(naming.LABEL_GPU_PRODUCT),
        "traffic_class": _relabel_source(naming.LABEL_TRAFFIC_CLASS),
    }
    for endpoint in endpoints:
        got = {r["targetLabel"]: r["sourceLabels"][0] for r in endpoint["relabelings"]}
        assert want.items() <= got.items()


def test_pool_container_ports_match_the_pod_monitor() -> None:
    from mtp_operator import builders

    text = Path(builders.__file__).read_text()
    assert '"name": "http"' in text and '"name": "metrics"' in text
    assert builders.METRICS_PORT == 9400


def test_service_monitor_keeps_the_pool_namespace_label() -> None:
    monitor = find(render(api_versions=[MONITORING]), "ServiceMonitor")
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] == "metrics" and endpoint["honorLabels"] is True


def test_prometheus_rule_carries_the_rules_file() -> None:
    rules_file = CHART / "files" / "prometheus-rules.yaml"
    rule = find(render(api_versions=[MONITORING],
                       values=["monitoring.prometheusRule.labels.release=kps"]), "PrometheusRule")
    assert rule["spec"]["groups"] == yaml.safe_load(rules_file.read_text())["groups"]
    assert rule["metadata"]["labels"]["release"] == "kps"


def test_grafana_dashboard_configmap(default: list[dict[str, Any]]) -> None:
    cm = find(default, "ConfigMap", "mtp-operator-dashboard")
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    dashboard = json.loads(cm["data"]["mtp-operator.json"])
    assert dashboard == json.loads((CHART / "files" / "grafana-dashboard.json").read_text())
    other = find(render(values=["grafanaDashboard.namespace=monitoring"]), "ConfigMap",
                 "mtp-operator-dashboard")
    assert other["metadata"]["namespace"] == "monitoring"
    assert "mtp-operator-dashboard" not in {
        o["metadata"]["name"] for o in render(values=["grafanaDashboard.enabled=false"])}


def test_names_follow_the_release() -> None:
    objects = render(release="prod-mtp-operator")
    assert find(objects, "Deployment")["metadata"]["name"] == "prod-mtp-operator"
    objects = render(release="prod")
    assert find(objects, "Deployment")["metadata"]["name"] == "prod-mtp-operator"


def test_model_cache_values_reach_the_settings_file(tmp_path) -> None:
    default = yaml.safe_load(
        find(render(), "ConfigMap", "mtp-operator-settings")["data"]["settings.yaml"])
    assert OperatorSettings.model_validate(default).model_cache.default is None
    assert not OperatorSettings.model_validate(default).model_cache \
        .share_host_path_across_namespaces  # keyed by namespace unless the admin says so
    values = tmp_path / "cache.yaml"
    values.write_text(yaml.safe_dump({"modelCache": {
        "default": {"persistentVolumeClaim": {"claimName": "weights"}, "readOnly": True},
        "allowedHostPaths": ["/var/lib/mtp-models"],
        "shareHostPathAcrossNamespaces": True,
    }}))
    objects = render(values=[str(values)])
    text = find(objects, "ConfigMap", "mtp-operator-settings")["data"]["settings.yaml"]
    cache = OperatorSettings.model_validate(yaml.safe_load(text)).model_cache
    assert cache.allowed_host_paths == ["/var/lib/mtp-models"]
    assert cache.share_host_path_across_namespaces
    assert cache.default is not None and cache.default.read_only
    assert cache.default.persistent_volume_claim is not None
    assert cache.default.persistent_volume_claim.claim_name == "weights"


@pytest.mark.parametrize("bad", [
    {"default": {"persistentVolumeClaim": {"claimName": "a"}, "hostPath": {"path": "/x"}}},
    {"default": {"readOnly": True}},
    {"default": {"hostPath": {"path": "relative"}}},
    {"default": {"nfs": {"server": "x"}}},
    {"allowedHostPaths": ["relative"]},
    {"shareHostPathAcrossNamespaces": "yes"},
])
def test_model_cache_values_schema_refuses_bad_values(tmp_path, bad) -> None:
    values = tmp_path / "bad.yaml"
    values.write_text(yaml.safe_dump({"modelCache": bad}))
    out = helm(*template_args(values=[str(values)]))
    assert out.returncode != 0 and "modelCache" in out.stderr, out.stderr
