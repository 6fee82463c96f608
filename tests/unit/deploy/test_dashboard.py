"""The Grafana dashboard (charts/mtp-operator/files/grafana-dashboard.json).

Every PromQL expression in it (panel targets, annotations, template variable selectors), and the
shipped rules file, goes through `promtool check rules`: the dashboard's expressions are written
into a temporary rules file as recording rules, with Grafana's variables substituted.
promtool comes from Debian's `prometheus` package (tests/sandbox/install_monitoring.sh installs
it; CI: `apt-get install -y prometheus`).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[3]
DASHBOARD = REPO / "charts" / "mtp-operator" / "files" / "grafana-dashboard.json"
RULES = REPO / "charts" / "mtp-operator" / "files" / "prometheus-rules.yaml"
FACTS = REPO / "tests" / "fixtures" / "vllm-0.33.0" / "FACTS.md"
OPERATOR_METRICS = REPO / "operator" / "mtp_operator" / "adapters" / "telemetry.py"
EXPORTER = REPO / "runtime" / "mtp_runtime" / "exporter.py"
PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"

POOL_VARS = ("namespace", "mtpinference", "gpu_product")
# What Grafana puts in place of its variables, for promtool's parser.
SUBSTITUTIONS = {
    "$__rate_interval": "1m",
    "$__interval": "30s",
    "$__range": "6h",
    "${datasource}": "prometheus",
    "$namespace": "ml",
    "$mtpinference": "dsv3",
    "$gpu_product": "NVIDIA-H100-80GB-HBM3",
}
LABEL_VALUES = re.compile(r"^label_values\((?P<selector>.+),\s*(?P<label>[a-zA-Z_]\w*)\)$")
METRIC_NAME = re.compile(r"(?<![\w:\"=~!])([a-zA-Z_:][\w:]*)\s*\{")


def _dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


def _panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for panel in panels:
        yield panel
        yield from _panels(panel.get("panels") or [])


def _expressions(dash: dict[str, Any]) -> list[tuple[str, str]]:
    """(where, PromQL) for every query in the dashboard."""
    found = []
    for panel in _panels(dash["panels"]):
        for target in panel.get("targets") or []:
            found.append((f"panel {panel['title']!r} {target['refId']}", target["expr"]))
    for ann in dash["annotations"]["list"]:
        if ann.get("expr"):
            found.append((f"annotation {ann['name']!r}", ann["expr"]))
    for var in dash["templating"]["list"]:
        if var["type"] != "query":
            continue
        query = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
        m = LABEL_VALUES.match(query)
        assert m, f"variable {var['name']}: expected label_values(selector, label), got {query}"
        found.append((f"variable {var['name']!r}", m["selector"]))
    return found


def _substitute(expr: str) -> str:
    for key in sorted(SUBSTITUTIONS, key=len, reverse=True):
        expr = expr.replace(key, SUBSTITUTIONS[key])
    assert "$" not in expr, f"unknown Grafana variable left in {expr}"
    return expr


def _promtool(*args: str) -> subprocess.CompletedProcess[str]:
    if not Path(PROMTOOL).exists():
        pytest.fail("promtool not found: apt-get install -y prometheus "
                    "(or tests/sandbox/install_monitoring.sh)")
    return subprocess.run([PROMTOOL, *args], capture_output=True, text=True, timeout=120,
                          check=False)


def _recorded_names() -> set[str]:
    if not RULES.exists():
        return set()
    doc = yaml.safe_load(RULES.read_text())
    return {r["record"] for g in doc["groups"] for r in g["rules"] if "record" in r}


def _alert_names() -> set[str]:
    if not RULES.exists():
        return set()
    doc = yaml.safe_load(RULES.read_text())
    return {r["alert"] for g in doc["groups"] for r in g["rules"] if "alert" in r}


def test_every_dashboard_expression_passes_promtool(tmp_path: Path) -> None:
    exprs = _expressions(_dashboard())
    assert len(exprs) >= 15
    rules = {"groups": [{"name": "dashboard", "rules": [
        {"record": f"dashboard:expr_{i}:check", "expr": _substitute(expr)}
        for i, (_, expr) in enumerate(exprs)
    ]}]}
    path = tmp_path / "dashboard-rules.yaml"
    path.write_text(yaml.safe_dump(rules, sort_keys=False))
    out = _promtool("check", "rules", str(path))
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"{len(exprs)} rules found" in out.stdout


def test_promtool_rejects_a_broken_expression(tmp_path: Path) -> None:
    """The check above really parses PromQL (guards against a promtool that accepts anything)."""
    path = tmp_path / "bad.yaml"
    broken = "sum by (gpu_product (rate(x[$__rate_interval]))"
    bad = {"record": "x:y:z", "expr": _substitute(broken)}
    path.write_text(yaml.safe_dump({"groups": [{"name": "bad", "rules": [bad]}]}))
    assert _promtool("check", "rules", str(path)).returncode != 0


def test_shipped_rules_file_passes_promtool() -> None:
    out = _promtool("check", "rules", str(RULES))
    assert out.returncode == 0, out.stdout + out.stderr


def test_every_query_is_per_pool() -> None:
    """Each panel query filters on all three pool variables, so the dashboard is per pool."""
    for where, expr in _expressions(_dashboard()):
        if where.startswith("variable"):
            continue
        for var in POOL_VARS:
            assert f'{var}=~"${var}"' in expr, f"{where}: no {var} filter in {expr}"


def test_metric_names_exist() -> None:
    """Every series the dashboard reads is a recording rule we ship, a vLLM 0.33.0 metric named
    in FACTS.md, an operator metric, an mtp-runtime exporter metric, or ALERTS; alert names
    exist in the rules file."""
    recorded = _recorded_names()
    assert recorded, "files/prometheus-rules.yaml has no recording rules"
    facts = FACTS.read_text() if FACTS.exists() else ""
    operator_src = OPERATOR_METRICS.read_text()
    exporter_src = EXPORTER.read_text()
    for where, expr in _expressions(_dashboard()):
        for name in METRIC_NAME.findall(expr):
            if name in {"ALERTS", "by", "without", "on", "ignoring", "group_left"}:
                continue
            if name.startswith("vllm:"):
                base = re.sub(r"_(bucket|sum|count)$", "", name)
                assert not facts or base in facts, f"{where}: {name} is not a vLLM 0.33.0 metric"
            elif name.startswith("mtp_operator_"):
                assert f'"{name}"' in operator_src, f"{where}: operator has no metric {name}"
            elif name.startswith("mtp_"):
                assert f'"{name}"' in exporter_src, f"{where}: exporter has no metric {name}"
            else:
                assert name in recorded, f"{where}: {name} is not recorded by the rules file"
    for _, expr in _expressions(_dashboard()):
        for m in re.finditer(r'alertname=~"([^"]+)"', expr):
            for alert in m.group(1).split("|"):
                assert alert in _alert_names(), f"no alert {alert} in the rules file"


def test_required_panels_and_variables() -> None:
    dash = _dashboard()
    titles = {p["title"] for p in _panels(dash["panels"])}
    for title in ("Hit rate", "Acceptance rate", "Mean acceptance length",
                  "Avg K used vs configured K", "Error propagation rate", "Rollbacks",
                  "Time to first token", "Inter-token latency", "Generated tokens/s"):
        assert title in titles
    names = [v["name"] for v in dash["templating"]["list"]]
    assert names == ["datasource", "namespace", "mtpinference", "gpu_product"]
    all_exprs = " ".join(e for _, e in _expressions(dash))
    assert "vllm:time_to_first_token_seconds_bucket" in all_exprs
    assert "vllm:inter_token_latency_seconds_bucket" in all_exprs
    assert "rate(vllm:generation_tokens_total" in all_exprs
    assert "mtp_operator_rollbacks_total" in all_exprs


def test_dashboard_structure() -> None:
    dash = _dashboard()
    assert dash["uid"] and len(dash["uid"]) <= 40
    ids = [p["id"] for p in _panels(dash["panels"])]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    for panel in _panels(dash["panels"]):
        pos = panel["gridPos"]
        assert 0 <= pos["x"] and pos["x"] + pos["w"] <= 24, panel["title"]
        if panel["type"] != "row":
            assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
            refs = [t["refId"] for t in panel["targets"]]
            assert len(refs) == len(set(refs))
