"""The shipped Prometheus rules: syntax, drift from render_rules(), and behaviour under promtool.

promtool comes from Debian's `prometheus` package (tests/sandbox/install_monitoring.sh in CI).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from mtp_operator.rollback import rules

REPO = Path(__file__).resolve().parents[3]
SHIPPED = REPO / "charts" / "mtp-operator" / "files" / "prometheus-rules.yaml"
PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"

NS, MTPI = "ml", "dsv3"
H100 = "NVIDIA-H100-80GB-HBM3"


def _promtool(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    if not Path(PROMTOOL).exists():
        pytest.fail("promtool not found: run tests/sandbox/install_monitoring.sh")
    return subprocess.run(
        [PROMTOOL, *args], cwd=cwd, capture_output=True, text=True, timeout=120, check=False
    )


def test_shipped_file_is_render_rules_defaults() -> None:
    assert SHIPPED.read_text() == rules.render_rules(), (
        "regenerate: python -m mtp_operator.rollback.rules > " + str(SHIPPED.relative_to(REPO))
    )


def test_shipped_file_passes_promtool_check() -> None:
    out = _promtool("check", "rules", str(SHIPPED))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS: 13 rules found" in out.stdout


def test_alerts_carry_contract_labels_and_annotations() -> None:
    doc = yaml.safe_load(SHIPPED.read_text())
    alerts = {r["alert"]: r for g in doc["groups"] for r in g["rules"] if "alert" in r}
    assert set(alerts) == {"MTPHitRateLow", "MTPErrorPropagationHigh"}
    assert alerts["MTPHitRateLow"]["annotations"]["threshold"] == "0.88"
    assert alerts["MTPErrorPropagationHigh"]["annotations"]["threshold"] == "0.4"
    for rule in alerts.values():
        assert rule["for"] == "5m"
        assert rule["labels"]["severity"] == "warning"
        assert {"summary", "description", "value", "threshold"} <= set(rule["annotations"])
        assert "on (namespace, mtpinference, gpu_product, traffic_class)" in rule["expr"]


# ---- promtool test rules --------------------------------------------------------------------


def _pool_series(
    per_minute: tuple[float, float, float, tuple[float, ...]],
    minutes: int = 30,
    *,
    mtpinference: str = MTPI,
    gpu: str = H100,
    pod: str = "p0",
    start: float = 0.0,
    traffic_class: str | None = None,
) -> list[dict[str, str]]:
    """Input series of one vLLM pod whose counters grow by (D, T, A, c) every minute."""
    d, t, a, c = per_minute
    labels = (
        f'namespace="{NS}", mtpinference="{mtpinference}", gpu_product="{gpu}", '
        f'pod="{pod}", engine="0", model_name="m"'
    )
    if traffic_class is not None:
        labels += f', traffic_class="{traffic_class}"'

    def series(metric: str, step: float, extra: str = "") -> dict[str, str]:
        return {
            "series": f"{metric}{{{labels}{extra}}}",
            "values": f"{start:g}+{step:g}x{minutes}",
        }

    out = [
        series(rules.DRAFTS, d),
        series(rules.DRAFT_TOKENS, t),
        series(rules.ACCEPTED, a),
    ]
    out += [series(rules.ACCEPTED_PER_POS, cj, f', position="{j}"') for j, cj in enumerate(c)]
    return out


def _sample(name: str, value: float, mtpinference: str = MTPI) -> dict[str, object]:
    """An expected sample of a recorded series for one pool."""
    labels = f'gpu_product="{H100}", mtpinference="{mtpinference}", namespace="{NS}"'
    return {"labels": f"{name}{{{labels}}}", "value": value}


def _run_promtool_test(tmp_path: Path, rules_text: str, tests: list[dict[str, object]]) -> None:
    (tmp_path / "rules.yaml").write_text(rules_text)
    out = _promtool("check", "rules", "rules.yaml", cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    (tmp_path / "test.yaml").write_text(
        yaml.safe_dump(
            {"rule_files": ["rules.yaml"], "evaluation_interval": "1m", "tests": tests},
            sort_keys=False,
        )
    )
    out = _promtool("test", "rules", "test.yaml", cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr


# The worked example of mtp-metrics.md: K = 4, drafts with 4, 2 and 0 accepted.
WORKED = (3.0, 12.0, 6.0, (2.0, 2.0, 1.0, 1.0))


def test_recording_rules_match_the_worked_example(tmp_path: Path) -> None:
    # 1-minute window over counters that grow by the worked example each minute: the
    # increases are exactly D=3, T=12, A=6, c=[2,2,1,1]. Split over two pods of one pool
    # (drafts with 4 and 2 accepted on one, 0 on the other) to check the per-pool sum.
    series = _pool_series((2, 8, 6, (2, 2, 1, 1)), pod="a") + _pool_series(
        (1, 4, 0, (0, 0, 0, 0)), pod="b"
    )
    want = {
        rules.R_DRAFTS: 3,
        rules.R_DRAFT_TOKENS: 12,
        rules.R_ACCEPTED: 6,
        rules.R_K: 4,
        rules.R_LAST_POS: 1,
        rules.R_HIT_RATE: 2 / 3,
        rules.R_ACCEPTANCE_RATE: 0.5,
        rules.R_MEAN_ACCEPTANCE_LENGTH: 3.0,
        rules.R_AVG_K_USED: 2.0,
        rules.R_ERROR_PROPAGATION: 4 / 12,
    }
    exprs = [
        {"expr": name, "eval_time": "10m", "exp_samples": [_sample(name, value)]}
        for name, value in want.items()
    ]
    exprs += [
        {
            "expr": f'{rules.R_PER_POS}{{position="{j}"}}',
            "eval_time": "10m",
            "exp_samples": [
                {
                    "labels": f'{rules.R_PER_POS}{{gpu_product="{H100}", '
                    f'mtpinference="{MTPI}", namespace="{NS}", position="{j}"}}',
                    "value": cj,
                }
            ],
        }
        for j, cj in enumerate(WORKED[3])
    ]
    _run_promtool_test(
        tmp_path,
        rules.render_rules(window="1m", for_="1m", min_drafts=1),
        [{"interval": "1m", "input_series": series, "promql_expr_test": exprs}],
    )


def test_recording_rules_over_five_minutes(tmp_path: Path) -> None:
    # the shipped 5 m window over the same traffic: increases x5, the ratios unchanged
    want = {
        rules.R_DRAFTS: 15,
        rules.R_DRAFT_TOKENS: 60,
        rules.R_ACCEPTED: 30,
        rules.R_HIT_RATE: 2 / 3,
        rules.R_ACCEPTANCE_RATE: 0.5,
        rules.R_MEAN_ACCEPTANCE_LENGTH: 3.0,
        rules.R_AVG_K_USED: 2.0,
        rules.R_ERROR_PROPAGATION: 1 / 3,
    }
    exprs = [
        {"expr": name, "eval_time": "20m", "exp_samples": [_sample(name, value)]}
        for name, value in want.items()
    ]
    _run_promtool_test(
        tmp_path,
        rules.render_rules(),
        [{"interval": "1m", "input_series": _pool_series(WORKED), "promql_expr_test": exprs}],
    )


def _alert(
    name: str, value: str, threshold: str, mtpinference: str = MTPI,
    traffic_class: str | None = None,
) -> dict[str, object]:
    doc = yaml.safe_load(rules.render_rules(window="2m", for_="5m"))
    rule = next(r for r in doc["groups"][0]["rules"] if r.get("alert") == name)
    # the pool as the operator names it: `product`, or `product/class` for a class pool
    pool = f"{NS}/{mtpinference} pool {H100}" + (f"/{traffic_class}" if traffic_class else "")
    summary = rule["annotations"]["summary"].replace(
        "{{ $labels.namespace }}/{{ $labels.mtpinference }} pool {{ $labels.gpu_product }}"
        "{{ with $labels.traffic_class }}/{{ . }}{{ end }}",
        pool,
    )
    labels = {"severity": "warning", "namespace": NS, "mtpinference": mtpinference,
              "gpu_product": H100}
    if traffic_class:
        labels["traffic_class"] = traffic_class
    return {
        "exp_labels": labels,
        "exp_annotations": {
            "summary": summary,
            "description": rule["annotations"]["description"].replace(
                "{{ $value | humanizePercentage }}", value
            ),
            "value": value_raw[value],
            "threshold": threshold,
        },
    }


# humanizePercentage rendering → the raw {{ $value }} rendering of the same value
value_raw = {"70%": "0.7", "52.83%": "0.5283333333333333", "50%": "0.5"}


def test_alerts_fire_only_when_they_should(tmp_path: Path) -> None:
    series = (
        # K=2, hit rate 0.7 (c0 = 70 of 100 drafts): MTPHitRateLow; error propagation
        # (200-100-120+50)/200 = 0.15 stays quiet
        _pool_series((100, 200, 120, (70, 50)), mtpinference="bad-hit")
        # K=6 with a deep chain mostly thrown away: hit 0.9, error propagation
        # (600-100-186+3)/600 = 0.528 → MTPErrorPropagationHigh only
        + _pool_series((100, 600, 186, (90, 50, 25, 12, 6, 3)), mtpinference="deep")
        # healthy K=4: hit 0.95, error propagation (400-100-300+60)/400 = 0.15
        + _pool_series((100, 400, 300, (95, 85, 60, 60)), mtpinference="healthy")
        # K=1 with a poor hit rate 0.5: error propagation is 0 by definition
        + _pool_series((100, 100, 50, (50,)), mtpinference="k1")
        # idle: counters present but flat (D = 0): no sample, no alert
        + _pool_series((0, 0, 0, (0, 0)), mtpinference="idle", start=500)
        # low traffic: hit rate 0.5 but 10 drafts per 2 m window < min_drafts 50
        + _pool_series((5, 10, 4, (2.5, 1.5)), mtpinference="trickle")
    )
    # a vLLM the operator does not run (no mtpinference label) is left out
    series.append(
        {
            "series": f'{rules.DRAFTS}{{namespace="{NS}", pod="x", engine="0"}}',
            "values": "0+100x30",
        }
    )
    exprs = [
        {"expr": rules.R_HIT_RATE + '{mtpinference="idle"}', "eval_time": "15m", "exp_samples": []},
        {
            "expr": rules.R_ERROR_PROPAGATION + '{mtpinference="idle"}',
            "eval_time": "15m",
            "exp_samples": [],
        },
        {
            "expr": f'{rules.R_ERROR_PROPAGATION}{{mtpinference="k1"}}',
            "eval_time": "15m",
            "exp_samples": [_sample(rules.R_ERROR_PROPAGATION, 0, "k1")],
        },
        {
            "expr": f'{rules.R_HIT_RATE}{{mtpinference="trickle"}}',
            "eval_time": "15m",
            "exp_samples": [_sample(rules.R_HIT_RATE, 0.5, "trickle")],
        },
        {
            "expr": f"count({rules.R_DRAFTS})",
            "eval_time": "15m",
            "exp_samples": [{"labels": "{}", "value": 6}],
        },
    ]
    alerts = [
        # pending from 1 m (first window with two samples), not yet firing at 5 m
        {"alertname": "MTPHitRateLow", "eval_time": "5m", "exp_alerts": []},
        {"alertname": "MTPErrorPropagationHigh", "eval_time": "5m", "exp_alerts": []},
        {
            "alertname": "MTPHitRateLow",
            "eval_time": "10m",
            "exp_alerts": [
                _alert("MTPHitRateLow", "70%", "0.88", "bad-hit"),
                _alert("MTPHitRateLow", "50%", "0.88", "k1"),
            ],
        },
        {
            "alertname": "MTPErrorPropagationHigh",
            "eval_time": "10m",
            "exp_alerts": [_alert("MTPErrorPropagationHigh", "52.83%", "0.4", "deep")],
        },
    ]
    _run_promtool_test(
        tmp_path,
        rules.render_rules(window="2m", for_="5m"),
        [
            {
                "interval": "1m",
                "input_series": series,
                "promql_expr_test": exprs,
                "alert_rule_test": alerts,
            }
        ],
    )


def test_class_pools_of_one_product_are_two_pools(tmp_path: Path) -> None:
    # traffic classes (issue 39): two class pools on one GPU product, told apart only by
    # `traffic_class` (the PodMonitor relabels mtp-operator.io/traffic-class to it). Each has
    # its own figures and its own alert; summed together (rules by gpu_product alone) the
    # hit rate would be (95+70)/200 = 0.825 and the alert would name no pool the operator has.
    series = (
        # short: K=4, hit rate 0.95, healthy
        _pool_series((100, 400, 300, (95, 85, 60, 60)), pod="s", traffic_class="short")
        # long: K=2, hit rate 0.7 → MTPHitRateLow for H100/long only
        + _pool_series((100, 200, 120, (70, 50)), pod="l", traffic_class="long")
    )

    def sample(name: str, value: float, traffic_class: str) -> dict[str, object]:
        labels = (f'gpu_product="{H100}", mtpinference="{MTPI}", namespace="{NS}", '
                  f'traffic_class="{traffic_class}"')
        return {"labels": f"{name}{{{labels}}}", "value": value}

    exprs = [
        {"expr": rules.R_HIT_RATE, "eval_time": "10m",
         "exp_samples": [sample(rules.R_HIT_RATE, 0.95, "short"),
                         sample(rules.R_HIT_RATE, 0.7, "long")]},
        {"expr": rules.R_K, "eval_time": "10m",
         "exp_samples": [sample(rules.R_K, 4, "short"), sample(rules.R_K, 2, "long")]},
        # per class: (400-100-300+60)/400 and (200-100-120+50)/200
        {"expr": rules.R_ERROR_PROPAGATION, "eval_time": "10m",
         "exp_samples": [sample(rules.R_ERROR_PROPAGATION, 60 / 400, "short"),
                         sample(rules.R_ERROR_PROPAGATION, 30 / 200, "long")]},
    ]
    alerts = [
        {"alertname": "MTPHitRateLow", "eval_time": "10m",
         "exp_alerts": [_alert("MTPHitRateLow", "70%", "0.88", traffic_class="long")]},
        {"alertname": "MTPErrorPropagationHigh", "eval_time": "10m", "exp_alerts": []},
    ]
    _run_promtool_test(
        tmp_path,
        rules.render_rules(window="2m", for_="5m"),
        [{"interval": "1m", "input_series": series, "promql_expr_test": exprs,
          "alert_rule_test": alerts}],
    )


def test_no_alert_while_the_pool_goes_idle(tmp_path: Path) -> None:
    # hit rate 0.7 for 3 minutes, then traffic stops: the pool drops out of the recording
    # rules (no data) before `for` is reached, and no alert fires on the idle pool
    def busy_then_idle(step: int) -> str:
        return f"0+{step}x3 " + f"{3 * step}+0x20"

    series = [
        {"series": f"{metric}{_pod_labels(**extra)}", "values": busy_then_idle(step)}
        for metric, step, extra in (
            (rules.DRAFTS, 100, {}),
            (rules.DRAFT_TOKENS, 200, {}),
            (rules.ACCEPTED, 120, {}),
            (rules.ACCEPTED_PER_POS, 70, {"position": "0"}),
            (rules.ACCEPTED_PER_POS, 50, {"position": "1"}),
        )
    ]
    _run_promtool_test(
        tmp_path,
        rules.render_rules(window="2m", for_="5m"),
        [
            {
                "interval": "1m",
                "input_series": series,
                "promql_expr_test": [
                    {
                        "expr": rules.R_HIT_RATE,
                        "eval_time": "3m",
                        "exp_samples": [_sample(rules.R_HIT_RATE, 0.7)],
                    },
                    {"expr": rules.R_HIT_RATE, "eval_time": "20m", "exp_samples": []},
                ],
                "alert_rule_test": [
                    {"alertname": "MTPHitRateLow", "eval_time": t, "exp_alerts": []}
                    for t in ("5m", "8m", "12m", "20m")
                ],
            }
        ],
    )


def _pod_labels(**extra: str) -> str:
    labels = {
        "namespace": NS,
        "mtpinference": MTPI,
        "gpu_product": H100,
        "pod": "p0",
        "engine": "0",
        **extra,
    }
    return "{" + ", ".join(f'{k}="{v}"' for k, v in labels.items()) + "}"


def test_a_change_of_k_inside_the_window_gives_no_error_propagation(tmp_path: Path) -> None:
    # K=4 for 10 minutes, then K=2 (same pod series for simplicity): while the 5 m window
    # holds both, T/D is not whole and c_{K-1} is undefined, as in mtp_runtime.figures
    def steps(first: float, second: float) -> str:
        return f"0+{first:g}x10 {10 * first + second:g}+{second:g}x10"

    series = [
        {"series": f"{rules.DRAFTS}{_pod_labels()}", "values": steps(10, 10)},
        {"series": f"{rules.DRAFT_TOKENS}{_pod_labels()}", "values": steps(40, 20)},
        {"series": f"{rules.ACCEPTED}{_pod_labels()}", "values": steps(20, 10)},
    ]
    for j, (a, b) in enumerate(((8, 6), (6, 4), (4, 0), (2, 0))):
        series.append(
            {
                "series": f"{rules.ACCEPTED_PER_POS}{_pod_labels(position=str(j))}",
                "values": steps(a, b),
            }
        )
    _run_promtool_test(
        tmp_path,
        rules.render_rules(),
        [
            {
                "interval": "1m",
                "input_series": series,
                "promql_expr_test": [
                    # K=4 only: (40-10-20+2)/40
                    {
                        "expr": rules.R_ERROR_PROPAGATION,
                        "eval_time": "9m",
                        "exp_samples": [_sample(rules.R_ERROR_PROPAGATION, 12 / 40)],
                    },
                    {"expr": rules.R_ERROR_PROPAGATION, "eval_time": "13m", "exp_samples": []},
                    # K=2 only: (20-10-10+4)/20
                    {
                        "expr": rules.R_ERROR_PROPAGATION,
                        "eval_time": "19m",
                        "exp_samples": [_sample(rules.R_ERROR_PROPAGATION, 4 / 20)],
                    },
                ],
            }
        ],
    )
