"""`mtp-operator render` and `mtp-operator crd`: the offline commands, as a user runs them
(a few through a real `python -m mtp_operator.cli` process, the rest through cli.main)."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from mtp_operator import cli
from mtp_operator.api.crd import crd_yaml
from mtp_operator.render import DEFAULT_PRODUCTS, RenderError, render_documents
from mtp_runtime.gpu_profiles import DEFAULT_PROFILES, product_family

REPO = Path(__file__).resolve().parents[3]
SEED = REPO / "examples" / "qwen3.6-27b.yaml"
H100 = "NVIDIA-H100-80GB-HBM3"


def _run(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mtp_operator.cli", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )


def _main(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    rc = cli.main(list(args))
    out = capsys.readouterr()
    return rc, out.out, out.err


# ---- through a process ----------------------------------------------------------------------


def test_render_prints_a_service_and_one_deployment() -> None:
    p = _run("render", "-f", str(SEED), "--gpu-product", H100)
    assert p.returncode == 0, p.stderr
    objs = list(yaml.safe_load_all(p.stdout))
    assert [o["kind"] for o in objs] == ["Service", "Deployment"]
    svc, deploy = objs
    assert svc["metadata"]["name"] == "qwen3-6-27b-openai"
    assert deploy["metadata"]["name"] == "qwen3-6-27b-h100-80gb-hbm3"
    argv = json.loads(deploy["metadata"]["annotations"]["mtp-operator.io/vllm-command"])
    assert argv[-2:] == [
        "--speculative-config",
        '{"method":"qwen3_next_mtp","num_speculative_tokens":2}',
    ]


def test_render_invalid_file_exits_2_naming_the_field(tmp_path: Path) -> None:
    doc = yaml.safe_load(SEED.read_text())
    doc["spec"]["replicas"] = -1
    doc["spec"]["speculative"]["method"] = "eagle"
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(doc))
    p = _run("render", "-f", str(bad))
    assert p.returncode == 2
    assert p.stdout == ""
    assert p.stderr.startswith(f"error: {bad}: ")
    assert "spec.replicas: Input should be greater than or equal to 0" in p.stderr
    assert "Traceback" not in p.stderr


def test_crd_command_prints_the_crds_file() -> None:
    p = _run("crd")
    assert p.returncode == 0, p.stderr
    assert p.stdout == (REPO / "crds" / "mtp-operator.io_mtpinferences.yaml").read_text()


# ---- in process -----------------------------------------------------------------------------


def test_crd_in_process(capsys: pytest.CaptureFixture[str]) -> None:
    assert _main(capsys, "crd") == (0, crd_yaml(), "")


def test_render_the_field_report_gpus_by_default(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = _main(capsys, "render", "-f", str(SEED))
    assert (rc, err) == (0, "")
    objs = list(yaml.safe_load_all(out))
    assert [o["kind"] for o in objs] == ["Service"] + ["Deployment"] * 3
    products = [o["metadata"]["annotations"]["mtp-operator.io/gpu-product"] for o in objs[1:]]
    assert products == list(DEFAULT_PRODUCTS)
    # the cards of the table's field-report rows, nothing the sandbox chose
    assert [product_family(p) for p in products] == ["A100", "H100", "L40S"]
    assert [p.reason for p in DEFAULT_PROFILES[:3]] == ["field report"] * 3


def test_render_follows_gpu_products(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = _main(capsys, "render", "-f", str(REPO / "examples" / "h100-h200-only.yaml"))
    assert rc == 0
    deployments = [o for o in yaml.safe_load_all(out) if o["kind"] == "Deployment"]
    assert [d["metadata"]["annotations"]["mtp-operator.io/gpu-product"] for d in deployments] == [
        H100,
        "NVIDIA-H200",
    ]
    # --gpu-product wins over the resource's list, and repeats
    rc, out, _ = _main(
        capsys,
        "render",
        "-f",
        str(REPO / "examples" / "h100-h200-only.yaml"),
        "--gpu-product",
        "NVIDIA-L40S",
        "--gpu-product",
        "Tesla-T4",
    )
    assert rc == 0 and len([o for o in yaml.safe_load_all(out) if o["kind"] == "Deployment"]) == 2


def test_render_from_stdin_and_lists(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    doc = yaml.safe_load(SEED.read_text())
    other = {**doc, "metadata": {"name": "second", "namespace": "ml"}}
    text = yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": [doc, other]})
    monkeypatch.setattr(sys, "stdin", io.StringIO(text))
    rc, out, _ = _main(capsys, "render", "-f", "-", "--gpu-product", H100)
    assert rc == 0
    objs = list(yaml.safe_load_all(out))
    assert [(o["kind"], o["metadata"]["namespace"]) for o in objs] == [
        ("Service", "default"),
        ("Deployment", "default"),
        ("Service", "ml"),
        ("Deployment", "ml"),
    ]


def test_render_with_a_settings_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    settings = tmp_path / "settings.yaml"
    settings.write_text("defaultImage: registry.example/rt:9\ngpuProfiles: {H100: 5}\n")
    auto = REPO / "examples" / "h100-h200-only.yaml"
    rc, out, _ = _main(capsys, "render", "-f", str(auto), "--settings", str(settings))
    assert rc == 0
    deployments = [o for o in yaml.safe_load_all(out) if o["kind"] == "Deployment"]
    images = {d["spec"]["template"]["spec"]["containers"][0]["image"] for d in deployments}
    assert images == {"registry.example/rt:9"}
    ks = [
        json.loads(json.loads(d["metadata"]["annotations"]["mtp-operator.io/vllm-command"])[-1])[
            "num_speculative_tokens"
        ]
        for d in deployments
    ]
    assert ks == [5, 6]  # H100 from the cluster table, H200 from the built-in one


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("a: [", "not valid YAML"),
        ("kind: Deployment\nmetadata: {name: x}\n", "kind: expected MTPInference"),
        ("kind: MTPInference\nspec: {model: m}\n", "metadata.name: required"),
        ("kind: MTPInference\nmetadata: {name: x}\nspec: [1]\n", "spec: must be an object"),
        ("kind: MTPInference\nmetadata: {name: x}\nspec: {}\n", "spec.model: Field required"),
        (
            "kind: MTPInference\nmetadata: {name: x}\n"
            "spec: {model: m, speculative: {mtpLayers: 2, profiles: {H100: 3}}}\n",
            "spec.speculative.profiles[H100]: 3 is not valid for a model with mtpLayers=2",
        ),
        (
            "kind: MTPInference\nmetadata: {name: x}\nspec: {model: m, extraArgs: [-sc.method]}\n",
            "spec.extraArgs[0]: -sc.method (-sc) is set by the operator",
        ),
    ],
)
def test_render_errors_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, message: str
) -> None:
    path = tmp_path / "in.yaml"
    path.write_text(text)
    rc, out, err = _main(capsys, "render", "-f", str(path))
    assert (rc, out) == (2, "")
    assert err.startswith(f"error: {path}: ") and message in err, err


def test_render_missing_file_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = _main(capsys, "render", "-f", str(tmp_path / "nope.yaml"))
    assert (rc, out) == (2, "")
    assert "No such file" in err


def test_render_bad_settings_file_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    settings = tmp_path / "settings.yaml"
    settings.write_text("gpuProfile: {}\n")  # typo: an unknown key
    rc, _, err = _main(capsys, "render", "-f", str(SEED), "--settings", str(settings))
    assert rc == 2 and "gpuProfile" in err


def test_render_documents_skips_empty_documents() -> None:
    text = "---\n" + SEED.read_text() + "\n---\n"
    assert len(list(yaml.safe_load_all(render_documents(text, [H100])))) == 2
    with pytest.raises(RenderError):
        render_documents("kind: Other\n")
