"""How long vLLM took to load, and where its weights came from.

`ModelLoad` is one start's model cache: the variables for vLLM, the `model_cache` log line
before the start, and — when vLLM's `/health` first answers (the runtime's health watch,
`engine.HealthWatch`, calls `ready()` with the seconds since the start; vLLM answers only once
the engine and the weights are loaded) — the `model_loaded` line and the exporter's figures.
`finish_load()` turns the cache's files before and after into that report and leaves the
"loaded completely" marker in a writable cache. Standard library only.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from mtp_runtime.cache_files import CachePlan, inventory, plan_cache, writable, write_marker
from mtp_runtime.exporter import ExporterState
from mtp_runtime.model_cache import LoadReport, ModelCache, compare
from mtp_runtime.vllm_command import ServeSettings


def finish_load(
    cache_plan: CachePlan, cache: ModelCache | None, source: str, model: str
) -> tuple[LoadReport, str | None]:
    """The load report, and the marker written (or why not), once vLLM is Ready."""
    after = {} if cache_plan.local else inventory(cache_plan.model_dir)
    report = compare(cache_plan.before, after, cache_plan.local)
    marker: str | None = None
    if cache is not None and not cache.read_only and not cache_plan.local and after:
        if cache_plan.offline:
            marker = "kept"  # the marker that made this start offline still holds
        elif os.access(cache.path, os.W_OK):
            try:
                marker = str(write_marker(cache, source, model, after))
            except OSError as exc:
                marker = f"not written: {exc}"
        else:
            marker = f"not written: {cache.path} is not writable"
    return report, marker


class ModelLoad:
    """One start of vLLM and its model cache (`log(event, level=..., **fields)` writes)."""

    def __init__(
        self,
        settings: ServeSettings,
        volume: ModelCache | None,
        environ: dict[str, str] | os._Environ[str],
        log: Callable[..., None],
        device: str = "",
    ) -> None:
        self.settings = settings
        self.volume = volume
        self.log = log
        self.plan = plan_cache(settings.model_source, settings.model, volume, environ, device)
        self.report: LoadReport | None = None

    @property
    def env(self) -> dict[str, str]:
        return self.plan.env

    @property
    def kind(self) -> str:
        return self.volume.kind if self.volume else "none"

    def announce(self) -> None:
        """The `model_cache` line: which cache, offline or not and why, what it holds."""
        self.log("model_cache", **self.plan.to_dict(self.volume))
        v = self.volume
        if v is not None and not v.read_only and not writable(v.path):
            self.log("model_cache_not_writable", level="warning", path=v.path,
                     uid=os.getuid(), gid=os.getgid(),
                     message="the hub client cannot store the model in the cache; make the "
                     "volume writable by this user or group, or set readOnly")

    def ready(self, seconds: float, state: ExporterState | None = None) -> LoadReport:
        """vLLM answered /health `seconds` after its start: report where the weights came
        from (log and exporter) and leave the marker for the next pod."""
        s = self.settings
        report, marker = finish_load(self.plan, self.volume, s.model_source, s.model)
        self.report = report
        self.log("model_loaded", seconds=round(seconds, 3), cache=self.kind,
                 offline=self.plan.offline, marker=marker, **report.to_dict())
        if state is not None:
            state.model_cache = self.kind
            state.model_origin = report.origin
            state.model_downloaded_bytes = report.downloaded_bytes
            state.model_load_seconds = seconds  # last: the figures appear together
        return report
