"""The Dockerfile, checked without a Docker engine: a small parser reads its stages and
instructions, and the tests hold it to pyproject.toml, mtp_runtime.VLLM_VERSION, the chart and
the Kubernetes objects the operator builds."""

from __future__ import annotations

import importlib
import json
import re
import shlex
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

import mtp_runtime

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[3]
DOCKERFILE = REPO / "Dockerfile"
DOCKERIGNORE = REPO / ".dockerignore"
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
VERSION = PYPROJECT["project"]["version"]
CHART = REPO / "charts" / "mtp-operator"


# ---- a tiny Dockerfile parser -----------------------------------------------------------------


@dataclass
class Instruction:
    cmd: str  # upper case
    args: str  # raw text after the command, continuation lines joined
    line: int

    def exec_form(self) -> list[str] | None:
        """The JSON array of ENTRYPOINT/CMD in exec form, else None."""
        text = self.args.strip()
        if text.startswith("["):
            value = json.loads(text)
            assert isinstance(value, list)
            return [str(v) for v in value]
        return None


@dataclass
class Stage:
    base: str  # as written, before ARG substitution
    name: str | None
    line: int
    instructions: list[Instruction] = field(default_factory=list)

    def all(self, cmd: str) -> list[Instruction]:
        return [i for i in self.instructions if i.cmd == cmd]

    def last(self, cmd: str) -> Instruction | None:
        found = self.all(cmd)
        return found[-1] if found else None


@dataclass
class Dockerfile:
    global_args: dict[str, str | None]
    stages: list[Stage]

    def stage(self, name: str) -> Stage:
        for stage in self.stages:
            if stage.name == name:
                return stage
        raise KeyError(name)

    def resolve(self, text: str) -> str:
        """Substitute global ARG defaults (${X} and $X), as Docker does in FROM lines."""

        def sub(m: re.Match[str]) -> str:
            key = m.group(1) or m.group(2)
            value = self.global_args.get(key)
            assert value is not None, f"ARG {key} has no default"
            return value

        return re.sub(r"\$\{(\w+)\}|\$(\w+)", sub, text)


def parse_dockerfile(text: str) -> Dockerfile:
    """Logical lines (backslash continuations joined, comments dropped), split into stages."""
    logical: list[tuple[int, str]] = []
    buf, start = "", 0
    for number, raw in enumerate(text.splitlines(), 1):
        stripped = raw.strip()
        if not buf and (not stripped or stripped.startswith("#")):
            continue  # blank line, comment or parser directive
        if buf and stripped.startswith("#"):
            continue  # comment inside a continued instruction
        if not buf:
            start = number
        if stripped.endswith("\\"):
            buf += stripped[:-1].rstrip() + " "
            continue
        logical.append((start, buf + stripped))
        buf = ""
    assert not buf, "Dockerfile ends inside a continued line"

    global_args: dict[str, str | None] = {}
    stages: list[Stage] = []
    for number, line in logical:
        cmd, _, args = line.partition(" ")
        cmd = cmd.upper()
        if cmd == "FROM":
            words = args.split()
            words = [w for w in words if not w.startswith("--platform")]
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else None
            assert len(words) in (1, 3), f"line {number}: FROM {args}"
            stages.append(Stage(base=words[0], name=name, line=number))
        elif not stages:
            assert cmd == "ARG", f"line {number}: only ARG may come before the first FROM"
            key, _, default = args.strip().partition("=")
            global_args[key] = default or None
        else:
            stages[-1].instructions.append(Instruction(cmd, args.strip(), number))
    return Dockerfile(global_args, stages)


@pytest.fixture(scope="module")
def dockerfile() -> Dockerfile:
    return parse_dockerfile(DOCKERFILE.read_text())


# ---- the parser itself -----------------------------------------------------------------------


def test_parser_on_a_small_example() -> None:
    parsed = parse_dockerfile(
        "# syntax=docker/dockerfile:1\nARG V=1.2\nFROM base:${V} AS a\n"
        "RUN one \\\n  # a comment\n  two\nUSER 10\nFROM --platform=$X a\n"
        'ENTRYPOINT ["x", "y"]\n'
    )
    assert parsed.global_args == {"V": "1.2"}
    assert [(s.base, s.name) for s in parsed.stages] == [("base:${V}", "a"), ("a", None)]
    assert parsed.resolve(parsed.stages[0].base) == "base:1.2"
    assert parsed.stages[0].all("RUN")[0].args == "one two"
    assert parsed.stages[1].last("ENTRYPOINT").exec_form() == ["x", "y"]


# ---- the checks ------------------------------------------------------------------------------


def test_both_targets_exist(dockerfile: Dockerfile) -> None:
    names = [s.name for s in dockerfile.stages]
    assert "runtime" in names and "operator" in names
    assert len(names) == len(set(names))


def test_versions_match_pyproject_and_vllm(dockerfile: Dockerfile) -> None:
    assert dockerfile.global_args["VERSION"] == VERSION == mtp_runtime.__version__
    assert dockerfile.global_args["VLLM_VERSION"] == mtp_runtime.VLLM_VERSION
    runtime = dockerfile.stage("runtime")
    assert dockerfile.resolve(runtime.base) == f"vllm/vllm-openai:v{mtp_runtime.VLLM_VERSION}"


def test_operator_base_is_slim_python_311(dockerfile: Dockerfile) -> None:
    base = dockerfile.resolve(dockerfile.stage("operator").base)
    assert re.fullmatch(r"python:3\.11(\.\d+)?-slim(-\w+)?", base), base
    assert PYPROJECT["project"]["requires-python"] == ">=3.11"


def test_entrypoints_are_console_scripts(dockerfile: Dockerfile) -> None:
    scripts = PYPROJECT["project"]["scripts"]
    runtime_ep = dockerfile.stage("runtime").last("ENTRYPOINT").exec_form()
    operator_ep = dockerfile.stage("operator").last("ENTRYPOINT").exec_form()
    assert runtime_ep == ["mtp-runtime"]
    assert operator_ep == ["mtp-operator", "run"]
    for ep in (runtime_ep, operator_ep):
        assert ep[0] in scripts, f"{ep[0]} is not a [project.scripts] entry"
        module, _, func = scripts[ep[0]].partition(":")
        assert module and func
        path = REPO / ("operator" if module.startswith("mtp_operator") else "runtime")
        assert (path / (module.replace(".", "/") + ".py")).exists(), module
        assert callable(getattr(importlib.import_module(module), func, None)), scripts[ep[0]]


def test_runtime_installs_our_package_with_runtime_extra(dockerfile: Dockerfile) -> None:
    assert "runtime" in PYPROJECT["project"]["optional-dependencies"]
    runs = " ".join(i.args for i in dockerfile.stage("runtime").all("RUN"))
    assert re.search(r"pip install .*mtp_operator-\$\{VERSION\}-\*\.whl\)\[runtime\]", runs)
    # constrained to what the vLLM image already has
    assert "pip freeze" in runs and "-c /tmp/vllm-constraints.txt" in runs


def test_operator_installs_the_wheel_with_deps(dockerfile: Dockerfile) -> None:
    runs = " ".join(i.args for i in dockerfile.stage("operator-build").all("RUN"))
    assert "pip install" in runs and "--no-deps" not in runs
    copies = [i.args for i in dockerfile.stage("operator").all("COPY")]
    assert any("--from=operator-build" in c for c in copies)


def _user(stage: Stage) -> tuple[int, int | None]:
    user = stage.last("USER")
    assert user is not None, f"stage {stage.name} sets no USER"
    uid, _, gid = user.args.partition(":")
    # numeric, so the kubelet can enforce runAsNonRoot without looking into /etc/passwd
    return int(uid), int(gid) if gid else None


def test_operator_runs_as_65532(dockerfile: Dockerfile) -> None:
    assert _user(dockerfile.stage("operator")) == (65532, 65532)
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values["podSecurityContext"]["runAsUser"] == 65532
    assert values["podSecurityContext"]["runAsNonRoot"] is True
    assert values["securityContext"]["readOnlyRootFilesystem"] is True


def test_runtime_runs_as_non_root(dockerfile: Dockerfile) -> None:
    uid, gid = _user(dockerfile.stage("runtime"))
    assert uid != 0 and gid == 0  # group 0 so arbitrary UIDs can write the caches
    env = " ".join(i.args for i in dockerfile.stage("runtime").all("ENV"))
    for var in ("HOME=/home/vllm", "HF_HOME=", "VLLM_CACHE_ROOT="):
        assert var in env


def test_ports_match_the_operator_contract(dockerfile: Dockerfile) -> None:
    def expose(stage: Stage) -> set[int]:
        return {int(p.split("/")[0]) for i in stage.all("EXPOSE") for p in i.args.split()}

    assert expose(dockerfile.stage("runtime")) == {8000, 9400}
    assert expose(dockerfile.stage("operator")) == {8443, 8080}


def test_chart_default_images_match_the_version() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert chart["version"] == chart["appVersion"] == VERSION
    assert values["image"] == {
        "repository": "ghcr.io/mtp-operator/mtp-operator",
        "tag": VERSION,
        "pullPolicy": "IfNotPresent",
    }
    assert values["defaultRuntimeImage"] == f"ghcr.io/mtp-operator/mtp-runtime:{VERSION}"


def test_build_instructions_in_comments_match() -> None:
    text = DOCKERFILE.read_text()
    assert f"--target runtime  -t ghcr.io/mtp-operator/mtp-runtime:{VERSION}" in text
    assert f"--target operator -t ghcr.io/mtp-operator/mtp-operator:{VERSION}" in text


def test_dockerignore_keeps_what_the_build_copies(dockerfile: Dockerfile) -> None:
    """Every COPY source from the build context is re-included after the `*` in .dockerignore
    (README.md too: pyproject.toml names it as the package readme)."""
    rules = [r.strip() for r in DOCKERIGNORE.read_text().splitlines()
             if r.strip() and not r.startswith("#")]
    assert rules[0] == "*"
    kept = {r[1:].rstrip("/") for r in rules if r.startswith("!")}
    for stage in dockerfile.stages:
        for copy in stage.all("COPY"):
            words = shlex.split(copy.args)
            if any(w.startswith("--from") for w in words):
                continue
            sources = [w for w in words[:-1] if not w.startswith("--")]
            for src in sources:
                assert src.rstrip("/") in kept, f"line {copy.line}: {src} is dockerignored"
    assert PYPROJECT["project"]["readme"] in kept
