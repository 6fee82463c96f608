"""mtp_runtime.model_cache, cache_files and model_load: where the hub client stores the model,
whether the weights came from the cache, when vLLM may run offline, and what the exporter shows.
(The real engine and hub client run against the cache in tests/engine/test_model_cache.py.)"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from mtp_runtime import cli
from mtp_runtime.cache_files import (
    CacheEscapeError,
    inventory,
    plan_cache,
    read_marker,
    write_marker,
)
from mtp_runtime.exporter import ExporterState, MTPExporter
from mtp_runtime.model_cache import (
    ModelCache,
    cache_env,
    compare,
    compile_cache_env,
    hub_cache_dir,
    marker_path,
    model_dir,
)
from mtp_runtime.model_load import ModelLoad, finish_load
from mtp_runtime.pool_config import PoolConfig
from mtp_runtime.vllm_command import ServeSettings

MODEL = "org/tiny"


def _fill(cache: ModelCache, files: dict[str, bytes]) -> Path:
    """Lay files out the way huggingface_hub does: blobs, plus snapshot links to them."""
    folder = Path(cache.path) / "huggingface" / "hub" / "models--org--tiny"
    (folder / "refs").mkdir(parents=True, exist_ok=True)
    (folder / "refs" / "main").write_text("c" * 40)
    for name, data in files.items():
        blob = folder / "blobs" / f"sha-{name}"
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_bytes(data)
        link = folder / "snapshots" / ("c" * 40) / name
        link.parent.mkdir(parents=True, exist_ok=True)
        if not link.exists():
            link.symlink_to(os.path.relpath(blob, link.parent))
    return folder


def test_hub_cache_dir_follows_the_clients_own_rules(tmp_path) -> None:
    cache = ModelCache(str(tmp_path), "persistentVolumeClaim")
    assert hub_cache_dir("huggingface", cache, {}) == tmp_path / "huggingface" / "hub"
    assert hub_cache_dir("modelscope", cache, {}) == tmp_path / "modelscope"
    home = {"HOME": "/home/vllm"}
    assert hub_cache_dir("huggingface", None, home) == Path("/home/vllm/.cache/huggingface/hub")
    assert hub_cache_dir("huggingface", None, {**home, "HF_HOME": "/h"}) == Path("/h/hub")
    assert hub_cache_dir("huggingface", None, {**home, "HF_HOME": "/h", "HF_HUB_CACHE": "/c"}) \
        == Path("/c")
    assert hub_cache_dir("huggingface", None, {**home, "XDG_CACHE_HOME": "/x"}) \
        == Path("/x/huggingface/hub")
    assert hub_cache_dir("modelscope", None, home) == Path("/home/vllm/.cache/modelscope/hub")
    assert model_dir("huggingface", "org/tiny", Path("/c")) == Path("/c/models--org--tiny")


def test_cache_env() -> None:
    cache = ModelCache("/model-cache", "hostPath")
    assert cache_env("huggingface", None, False) == {}
    assert cache_env("huggingface", cache, False) == {
        "HF_HUB_CACHE": "/model-cache/huggingface/hub",
        "HF_XET_CACHE": "/model-cache/huggingface/xet",
    }
    assert cache_env("modelscope", cache, True) == {
        "MODELSCOPE_CACHE": "/model-cache/modelscope",
        "HF_HUB_OFFLINE": "1",
    }


def test_compile_cache_env_only_for_a_cache_this_pod_can_write() -> None:
    cache = ModelCache("/model-cache", "hostPath")
    kernels = {"VLLM_CACHE_ROOT": "/model-cache/compile/NVIDIA-H100-80GB-HBM3/vllm",
               "TRITON_CACHE_DIR": "/model-cache/compile/NVIDIA-H100-80GB-HBM3/triton"}
    assert compile_cache_env(cache, {}, True, "NVIDIA-H100-80GB-HBM3") == kernels
    # each product its own folder (a claim shared by pools on two GPUs); odd names made safe
    assert compile_cache_env(cache, {}, True, "NVIDIA A100/80GB")["TRITON_CACHE_DIR"] \
        == "/model-cache/compile/NVIDIA-A100-80GB/triton"
    assert compile_cache_env(cache, {}, True)["VLLM_CACHE_ROOT"] == "/model-cache/compile/any/vllm"
    # none, read-only, or not writable by this user: the container's own folders, as before
    assert compile_cache_env(None, {}, writable=True) == {}
    assert compile_cache_env(ModelCache("/model-cache", "hostPath", True), {}, True) == {}
    assert compile_cache_env(cache, {}, writable=False) == {}
    # the pod's own setting wins, an empty one does not count as set
    mine = {"VLLM_CACHE_ROOT": "/mine", "TRITON_CACHE_DIR": ""}
    assert compile_cache_env(cache, mine, writable=True) == {
        "TRITON_CACHE_DIR": "/model-cache/compile/any/triton"}


def test_plan_cache_keeps_compiled_kernels_in_a_writable_cache(tmp_path) -> None:
    writable = plan_cache("huggingface", MODEL, ModelCache(str(tmp_path), "hostPath"), {},
                          "NVIDIA-L40S")
    assert writable.env["VLLM_CACHE_ROOT"] == str(tmp_path / "compile" / "NVIDIA-L40S" / "vllm")
    assert writable.env["TRITON_CACHE_DIR"] == str(tmp_path / "compile" / "NVIDIA-L40S" / "triton")
    ro = plan_cache("huggingface", MODEL, ModelCache(str(tmp_path), "hostPath", True), {})
    assert "VLLM_CACHE_ROOT" not in ro.env and "TRITON_CACHE_DIR" not in ro.env
    own = plan_cache("huggingface", MODEL, ModelCache(str(tmp_path), "hostPath"),
                     {"TRITON_CACHE_DIR": "/pod/triton"})
    assert "TRITON_CACHE_DIR" not in own.env  # the pod's variable reaches vLLM unchanged


def test_inventory_counts_complete_blobs_once(tmp_path) -> None:
    cache = ModelCache(str(tmp_path), "hostPath")
    folder = _fill(cache, {"config.json": b"{}", "model.safetensors": b"x" * 100})
    (folder / "blobs" / "sha-partial.incomplete").write_bytes(b"half")
    (folder / "blobs" / "sha-x.lock").write_bytes(b"")
    (folder / ".no_exist" / "c").mkdir(parents=True)
    (folder / ".no_exist" / "c" / "generation_config.json").write_bytes(b"")
    files = inventory(folder)
    assert files == {
        "refs/main": 40, "blobs/sha-config.json": 2, "blobs/sha-model.safetensors": 100,
    }
    assert inventory(tmp_path / "absent") == {}


def test_compare_decides_cache_or_download() -> None:
    before = {"a": 1, "b": 2}
    assert compare(before, dict(before)).to_dict() == {
        "origin": "cache", "downloaded_files": 0, "downloaded_bytes": 0,
        "cached_files": 2, "cached_bytes": 3,
    }
    got = compare(before, {"a": 1, "b": 5, "c": 10})
    assert (got.origin, got.downloaded_files, got.downloaded_bytes) == ("download", 2, 15)
    assert compare({}, {}, local=True).origin == "local"


def test_marker_round_trip_and_invalidation(tmp_path) -> None:
    cache = ModelCache(str(tmp_path), "persistentVolumeClaim")
    files = {"blobs/a": 3}
    assert not read_marker(cache, "huggingface", MODEL, files)
    path = write_marker(cache, "huggingface", MODEL, files)
    assert path == marker_path(cache, "huggingface", MODEL)
    assert path.parent == tmp_path / ".mtp-runtime" / "complete" / "huggingface"
    assert json.loads(path.read_text())["files"] == files
    assert read_marker(cache, "huggingface", MODEL, {"blobs/a": 3, "blobs/b": 1})
    assert not read_marker(cache, "huggingface", MODEL, {"blobs/a": 2})  # a file changed
    assert not read_marker(cache, "huggingface", MODEL, {})  # the files went away
    assert not read_marker(cache, "modelscope", MODEL, files)  # another source
    path.write_text("{not json")
    assert not read_marker(cache, "huggingface", MODEL, files)


def test_plan_cache_goes_offline_only_when_the_cache_is_known_complete(tmp_path) -> None:
    cache = ModelCache(str(tmp_path), "persistentVolumeClaim")
    empty = plan_cache("huggingface", MODEL, cache, {})
    assert not empty.offline and empty.before == {} and "not in the cache yet" in empty.reason
    folder = _fill(cache, {"model.safetensors": b"w" * 10})
    partial = plan_cache("huggingface", MODEL, cache, {})
    assert not partial.offline and partial.before and "not known to be complete" in partial.reason
    write_marker(cache, "huggingface", MODEL, inventory(folder))
    known = plan_cache("huggingface", MODEL, cache, {})
    assert known.offline and known.env["HF_HUB_OFFLINE"] == "1"
    assert known.env["HF_HUB_CACHE"] == str(tmp_path / "huggingface" / "hub")
    ro = plan_cache("huggingface", "org/other", ModelCache(str(tmp_path), "hostPath", True), {})
    assert ro.offline and "read-only" in ro.reason
    none = plan_cache("huggingface", MODEL, None, {"HF_HOME": str(tmp_path / "pod")})
    assert not none.offline and none.env == {} and none.hub_dir == tmp_path / "pod" / "hub"
    local = plan_cache("huggingface", str(tmp_path), cache, {})
    assert local.local and not local.offline and local.before == {}


def test_finish_load_reports_and_leaves_the_marker(tmp_path) -> None:
    cache = ModelCache(str(tmp_path), "persistentVolumeClaim")
    plan = plan_cache("huggingface", MODEL, cache, {})
    _fill(cache, {"model.safetensors": b"w" * 1000})  # what the hub client downloaded
    report, marker = finish_load(plan, cache, "huggingface", MODEL)
    assert (report.origin, report.downloaded_bytes) == ("download", 1040)  # + refs/main
    assert marker == str(marker_path(cache, "huggingface", MODEL))
    again = plan_cache("huggingface", MODEL, cache, {})
    assert again.offline
    report, marker = finish_load(again, cache, "huggingface", MODEL)
    assert (report.origin, report.downloaded_files, report.cached_bytes) == ("cache", 0, 1040)
    assert marker == "kept"
    ro = ModelCache(str(tmp_path), "persistentVolumeClaim", read_only=True)
    assert finish_load(plan_cache("huggingface", MODEL, ro, {}), ro, "huggingface", MODEL)[1] \
        is None


def test_model_load_reports_once_ready(tmp_path) -> None:
    cache = ModelCache(str(tmp_path), "hostPath")
    lines: list[tuple[str, dict]] = []
    load = ModelLoad(ServeSettings(model=MODEL, num_speculative_tokens=1), cache, {},
                     lambda event, **kw: lines.append((event, kw)))
    assert load.env["HF_HUB_CACHE"] == str(tmp_path / "huggingface" / "hub")
    load.announce()
    assert lines[0][0] == "model_cache" and lines[0][1]["offline"] is False
    _fill(cache, {"model.safetensors": b"w" * 10})  # what vLLM's hub client downloads
    state = ExporterState()
    report = load.ready(12.5, state)
    assert report.origin == "download" and lines[-1][0] == "model_loaded"
    assert lines[-1][1]["seconds"] == 12.5 and lines[-1][1]["cache"] == "hostPath"
    assert (state.model_load_seconds, state.model_origin, state.model_cache) == (
        12.5, "download", "hostPath")
    assert state.model_downloaded_bytes == report.downloaded_bytes == 50  # + refs/main


def test_exporter_shows_the_load_only_once_known() -> None:
    state = ExporterState()
    exporter = MTPExporter("http://127.0.0.1:1/metrics", state=state)
    text = exporter.render()
    assert "# TYPE mtp_runtime_model_load_seconds gauge" in text
    assert "\nmtp_runtime_model_load_seconds " not in text
    assert "\nmtp_runtime_model_origin{" not in text
    state.model_cache, state.model_origin = "hostPath", "cache"
    state.model_downloaded_bytes, state.model_load_seconds = 0, 21.5
    lines = exporter.render().splitlines()
    assert "mtp_runtime_model_load_seconds 21.5" in lines
    assert 'mtp_runtime_model_origin{origin="cache",cache="hostPath"} 1.0' in lines
    assert "mtp_runtime_model_downloaded_bytes 0.0" in lines


def test_print_args_shows_the_cache_variables(capsys, tmp_path) -> None:
    config = PoolConfig(
        serve=ServeSettings(model=MODEL, num_speculative_tokens=2),
        gpu_product="NVIDIA-H200",
        model_cache=ModelCache(str(tmp_path), "persistentVolumeClaim", read_only=True),
    )
    path = tmp_path / "pool.json"
    path.write_text(config.to_json())
    assert PoolConfig.from_json(config.to_json()) == config
    assert cli.main(["print-args", "--config", str(path), "--cpu-dry-run"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) == {"argv", "env", "gpu", "k"}
    assert out["env"] == {
        "HF_HUB_CACHE": str(tmp_path / "huggingface" / "hub"),
        "HF_XET_CACHE": str(tmp_path / "huggingface" / "xet"),
        "HF_HUB_OFFLINE": "1",
    }


@pytest.mark.parametrize("source", ["huggingface", "modelscope"])
def test_pool_config_without_a_cache_keeps_its_old_json(source: str) -> None:
    config = PoolConfig(serve=ServeSettings(model=MODEL, num_speculative_tokens=1,
                                            model_source=source), gpu_product="NVIDIA-H200")
    assert "model_cache" not in json.loads(config.to_json())
    assert PoolConfig.from_json(config.to_json()) == config


# ---- the cache stays inside its root (issue 36: a symbolic link must not lead out) -----------

def _cache_config(tmp_path: Path, root: Path) -> Path:
    config = PoolConfig(
        serve=ServeSettings(model=MODEL, num_speculative_tokens=2),
        gpu_product="NVIDIA-H200",
        model_cache=ModelCache(str(root), "hostPath"),
    )
    path = tmp_path / "pool.json"
    path.write_text(config.to_json())
    return path


def test_a_normal_cache_folder_is_used(tmp_path) -> None:
    root = tmp_path / "root"
    cache = ModelCache(str(root), "hostPath")
    _fill(cache, {"model.safetensors": b"w" * 10})
    plan = plan_cache("huggingface", MODEL, cache, {"MTP_RUNTIME_CACHE_ROOT": str(root)})
    assert plan.before["blobs/sha-model.safetensors"] == 10
    # the root itself may be reached through a link (the mount point is where it is)
    link = tmp_path / "root-link"
    link.symlink_to(root)
    plan_cache("huggingface", MODEL, ModelCache(str(link), "hostPath"),
               {"MTP_RUNTIME_CACHE_ROOT": str(link)})


def test_a_link_under_the_root_leading_out_is_refused(tmp_path) -> None:
    root, outside = tmp_path / "root", tmp_path / "elsewhere"
    root.mkdir()
    (outside / "hub").mkdir(parents=True)
    (root / "huggingface").symlink_to(outside)  # planted by another pod of the cache
    cache = ModelCache(str(root), "hostPath")
    with pytest.raises(CacheEscapeError) as err:
        plan_cache("huggingface", MODEL, cache, {"MTP_RUNTIME_CACHE_ROOT": str(root)})
    message = str(err.value)
    assert str(root / "huggingface" / "hub") in message  # the path
    assert str(outside / "hub") in message  # where it leads
    assert f"outside the cache root {root}" in message
    assert "MTP_RUNTIME_CACHE_ROOT" in message


def test_a_link_inside_the_models_folder_leading_out_is_refused(tmp_path) -> None:
    root = tmp_path / "root"
    cache = ModelCache(str(root), "hostPath")
    folder = _fill(cache, {"model.safetensors": b"w"})
    secret = tmp_path / "secret"
    secret.write_text("not weights")
    (folder / "snapshots" / ("c" * 40) / "config.json").symlink_to(secret)
    with pytest.raises(CacheEscapeError, match=f"resolves to {secret}, outside the cache root"):
        plan_cache("huggingface", MODEL, cache, {"MTP_RUNTIME_CACHE_ROOT": str(root)})


def test_without_the_variable_the_mount_path_is_the_root(tmp_path) -> None:
    root, outside = tmp_path / "root", tmp_path / "elsewhere"
    root.mkdir()
    outside.mkdir()
    (root / ".mtp-runtime").symlink_to(outside)  # the marker folder
    with pytest.raises(CacheEscapeError, match="outside the cache root"):
        plan_cache("huggingface", MODEL, ModelCache(str(root), "persistentVolumeClaim"), {})


def test_serve_refuses_a_cache_that_leads_out_before_vllm_starts(tmp_path, capsys,
                                                                  monkeypatch) -> None:
    root, outside = tmp_path / "root", tmp_path / "elsewhere"
    root.mkdir()
    outside.mkdir()
    (root / "huggingface").symlink_to(outside)
    monkeypatch.setenv("MTP_RUNTIME_CACHE_ROOT", str(root))
    code = cli.main(["print-args", "--config", str(_cache_config(tmp_path, root)),
                     "--cpu-dry-run"])
    assert code == 2
    err = capsys.readouterr().err
    assert "model_cache_unsafe" in err
    assert f"outside the cache root {root}" in err and str(outside) in err
