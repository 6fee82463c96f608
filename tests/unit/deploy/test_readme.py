"""README.md and docs/ can't drift from what they document: the CRD's fields, the GPU profile
table, the chart values, the alert and recording-rule names, the quickstart and the Makefile
targets, and the metric names, examples and paths they mention."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from mtp_runtime.gpu_profiles import DEFAULT_K, DEFAULT_PROFILES, MEASURED_HYBRID_PROFILES

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[3]
README = (REPO / "README.md").read_text()
DOCS = {p.stem: p.read_text() for p in sorted((REPO / "docs").glob("*.md"))}
EVERYTHING = "\n".join([README, *DOCS.values()])  # the README and every page of docs/
CRD = yaml.safe_load((REPO / "crds" / "mtp-operator.io_mtpinferences.yaml").read_text())
SCHEMA = CRD["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]
VALUES = yaml.safe_load((REPO / "charts" / "mtp-operator" / "values.yaml").read_text())
RULES = REPO / "charts" / "mtp-operator" / "files" / "prometheus-rules.yaml"


def _section(title: str, doc: str | None = None) -> str:
    """The text of a `## title` section of the README (or of docs/<doc>.md), up to the next
    `## ` heading."""
    text = README if doc is None else DOCS[doc]
    m = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", text, re.M | re.S)
    assert m, f"{doc or 'README'} has no section '## {title}'"
    return m.group(1)


def _subsection(section: str, title: str) -> str:
    m = re.search(rf"^### {re.escape(title)}\n(.*?)(?=^### |\Z)", section, re.M | re.S)
    assert m, f"README has no subsection '### {title}'"
    return m.group(1)


def _table_rows(text: str) -> list[list[str]]:
    rows = []
    for line in text.splitlines():
        if line.startswith("|") and not re.match(r"^\|[-| ]+\|$", line):
            rows.append([c.strip() for c in line.strip().strip("|").split(" | ")])
    return rows


def _paths(props: dict[str, Any], prefix: str = "") -> list[str]:
    out = []
    for name, schema in props.items():
        out.append(prefix + name)
        if schema.get("type") == "object" and "properties" in schema:
            out += _paths(schema["properties"], prefix + name + ".")
    return out


def test_every_spec_field_is_in_the_reference_table() -> None:
    table = _subsection(_section("MTPInference reference", "reference"), "spec")
    documented = {row[0].strip("`") for row in _table_rows(table)[1:]}
    fields = set(_paths(SCHEMA["spec"]["properties"]))
    assert fields - documented == set(), "fields missing from the README's spec table"
    assert documented - fields == set(), "README documents fields the CRD doesn't have"


def test_spec_defaults_in_the_table_match_the_crd() -> None:
    table = _subsection(_section("MTPInference reference", "reference"), "spec")
    rows = {row[0].strip("`"): row for row in _table_rows(table)[1:]}

    def walk(props: dict[str, Any], prefix: str = "") -> None:
        for name, schema in props.items():
            if "default" in schema and not isinstance(schema["default"], dict):
                default = schema["default"]
                shown = rows[prefix + name][2].strip("`")
                want = str(default).lower() if isinstance(default, bool) else str(default)
                if isinstance(default, list):  # written as YAML's flow sequence: [a, b]
                    want = "[" + ", ".join(map(str, default)) + "]"
                assert shown in (want, f"{default:.2f}" if isinstance(default, float) else want), (
                    f"{prefix}{name}: README says {shown}, CRD default {default}")
            if schema.get("type") == "object" and "properties" in schema:
                walk(schema["properties"], prefix + name + ".")

    walk(SCHEMA["spec"]["properties"])


def test_every_status_field_is_in_the_status_table() -> None:
    table = _subsection(_section("MTPInference reference", "reference"), "status")
    documented = {row[0].strip("`") for row in _table_rows(table)[1:]}
    assert set(SCHEMA["status"]["properties"]) == documented


def test_gpu_profile_table_is_the_default_table() -> None:
    rows = _table_rows(_section("GPU profiles"))
    assert rows[0] == ["family", "K", "reason"]
    split = rows.index(["family", "model", "K", "measured"])
    want = [[p.family, str(p.k), p.reason] for p in DEFAULT_PROFILES]
    want.append(["any other GPU", str(DEFAULT_K), "default"])
    assert rows[1:split] == want
    # the measured rows: family and K as the code has them, one row each
    measured = [(r[0], r[2]) for r in rows[split + 1:]]
    assert measured == [(p.family, str(p.k)) for p in MEASURED_HYBRID_PROFILES]


def test_chart_values_table_names_real_values() -> None:
    section = _section("Install with Helm", "operations")
    rows = [r for r in _table_rows(section) if r and r[0].startswith("`")]
    assert rows, "no chart values table"
    for row in rows:
        for path in re.findall(r"`([a-zA-Z.]+)`", row[0]):
            node: Any = VALUES
            for key in path.split("."):
                assert isinstance(node, dict) and key in node, f"README names unknown value {path}"
                node = node[key]


def test_quickstart_is_exactly_two_commands() -> None:
    blocks = re.findall(r"```sh\n(.*?)```", _section("Quickstart"), re.S)
    assert blocks and blocks[0].split("\n")[:-1] == ["make demo", "make test"]
    makefile = (REPO / "Makefile").read_text()
    for target in ("demo", "test"):
        assert re.search(rf"^{target}:", makefile, re.M), f"Makefile has no {target} target"


def test_alert_and_rule_names_exist() -> None:
    doc = yaml.safe_load(RULES.read_text())
    rules = [r for g in doc["groups"] for r in g["rules"]]
    records = {r["record"] for r in rules if "record" in r}
    alerts = {r["alert"] for r in rules if "alert" in r}
    for name in set(re.findall(r"`(mtp:[a-z_:]+)`", EVERYTHING)):
        assert name in records, f"docs name recording rule {name}, not in the rules file"
    assert alerts == {"MTPHitRateLow", "MTPErrorPropagationHigh"}
    for alert in alerts:
        assert f"`{alert}`" in _section("When K is rolled back")
        assert f"`{alert}`" in DOCS["rollback"]


def test_exporter_and_operator_metric_names_exist() -> None:
    exporter = (REPO / "runtime" / "mtp_runtime" / "exporter.py").read_text()
    operator = (REPO / "operator" / "mtp_operator" / "adapters" / "telemetry.py").read_text()
    not_metrics = {"mtp_num_hidden_layers", "mtp_operator", "mtp_runtime"}  # a field, packages
    for name in set(re.findall(r"`(mtp_[a-z_]+)`", EVERYTHING)) - not_metrics:
        assert f'"{name}"' in exporter + operator, f"docs name unknown metric {name}"
    for name in set(re.findall(r"`(mtp_operator_[a-z_]+)", EVERYTHING)):
        assert f'"{name}"' in operator, name


def test_examples_named_in_the_readme_exist() -> None:
    for name in set(re.findall(r"examples/([\w.-]+\.yaml)", EVERYTHING)):
        assert (REPO / "examples" / name).exists(), name


def test_paths_named_in_the_readme_exist() -> None:
    found = set(re.findall(r"`((?:charts|tests|operator|runtime|crds|docs|bench)/[\w./-]+)`",
                           EVERYTHING))
    assert found
    for path in found:
        assert (REPO / path).exists(), f"docs name {path}, which doesn't exist"


def test_no_unfinished_parts() -> None:
    """The README and docs/ describe what exists: no TODO markers left."""
    assert "TODO" not in EVERYTHING


def test_docs_pages_the_readme_links_exist() -> None:
    linked = set(re.findall(r"\]\((docs/[\w.-]+\.md)", README))
    assert {f"docs/{name}.md" for name in DOCS} == linked, "README's index and docs/ differ"
    for name, text in DOCS.items():
        for target in re.findall(r"\]\(((?:\.\./)?[\w./-]+\.md)", text):
            assert ((REPO / "docs" / target).resolve()).exists(), f"docs/{name}.md links {target}"


def test_relative_links_in_markdown_lead_to_files() -> None:
    """Every relative link of the Markdown we ship (README, docs/, bench/ and its results,
    charts/, examples/) names a file or folder that exists, seen from the linking file."""
    pages = [REPO / "README.md"] + [
        p for top in ("docs", "bench", "charts", "examples") for p in (REPO / top).rglob("*.md")
    ]
    broken = []
    for page in pages:
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
            if re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
                continue  # a URL or an anchor of the page itself
            if not (page.parent / target.split("#")[0]).exists():
                broken.append(f"{page.relative_to(REPO)} -> {target}")
    assert not broken, broken
