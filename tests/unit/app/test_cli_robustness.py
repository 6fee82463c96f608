"""The CLI under mistakes users make: one clear line on stderr and a non-zero exit, never a
traceback (each case runs a real `python -m mtp_operator.cli` process)."""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from mtp_operator import cli

REPO = Path(__file__).resolve().parents[3]


def _run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mtp_operator.cli", *args],
        capture_output=True, text=True, timeout=60, cwd=REPO,
        env={**os.environ, **(env or {})},
    )


def _one_clear_line(p: subprocess.CompletedProcess[str], *words: str) -> None:
    assert p.returncode != 0, p
    lines = [line for line in p.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, p.stderr
    assert lines[0].startswith("error: ") and "Traceback" not in p.stderr
    for w in words:
        assert w in lines[0], lines[0]


@pytest.mark.parametrize(
    ("content", "words"),
    [
        (b"", ("empty",)),
        (b"\n---\n---\n", ("empty",)),
        (b"- a\n- b\n", ("document 1 is a list",)),
        (b"just a string\n", ("document 1 is a str",)),
        (b"\xff\xfe\x00bad: [", ("not UTF-8", "0xff")),
    ],
    ids=["empty", "only-separators", "yaml-list", "scalar", "non-utf8"],
)
def test_render_refuses_what_is_no_resource(tmp_path: Path, content: bytes, words) -> None:
    f = tmp_path / "in.yaml"
    f.write_bytes(content)
    _one_clear_line(_run("render", "-f", str(f)), *words)


@pytest.fixture
def kubeconfig(tmp_path: Path) -> Path:
    """A well-formed kubeconfig for an API server that is never reached by these tests."""
    path = tmp_path / "kubeconfig"
    path.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: x\n"
        "clusters: [{name: x, cluster: {server: 'https://127.0.0.1:9'}}]\n"
        "users: [{name: x, user: {token: t}}]\n"
        "contexts: [{name: x, context: {cluster: x, user: x}}]\n"
    )
    return path


def test_run_on_a_taken_port(kubeconfig: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        p = _run("run", "--metrics-address", f"127.0.0.1:{port}",
                 env={"KUBECONFIG": str(kubeconfig)})
    _one_clear_line(p, "metrics", f"127.0.0.1:{port}")


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (("--metrics-address", "localhost"), ("--metrics-address", "HOST:PORT")),
        (("--alerts-address", "nowhere:http"), ("--alerts-address", "HOST:PORT")),
        (("--alerts-address", ":0", "--alerts-token-file", "/nonexistent/token"),
         ("--alerts-token-file", "/nonexistent/token")),
        (("--alerts-address", ":0", "--alerts-tls-cert", __file__),
         ("--alerts-tls-key",)),
    ],
    ids=["bad-metrics-address", "bad-alerts-address", "missing-token-file", "tls-half"],
)
def test_run_with_bad_options(kubeconfig: Path, args: tuple[str, ...], words) -> None:
    _one_clear_line(_run("run", *args, env={"KUBECONFIG": str(kubeconfig)}), *words)


def test_run_without_kubeconfig(tmp_path: Path) -> None:
    env = {"KUBECONFIG": str(tmp_path / "missing"), "HOME": str(tmp_path),
           "KUBERNETES_SERVICE_HOST": ""}
    _one_clear_line(_run("run", "--metrics-address", "127.0.0.1:0", env=env),
                    "Kubernetes configuration")


def test_every_run_option_has_help() -> None:
    parser = cli._parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    run = sub.choices["run"]
    missing = [a.option_strings for a in run._actions
               if a.option_strings and a.dest != "help" and not a.help]
    assert not missing, missing
