"""The MTP metrics exporter: scrapes vLLM's /metrics, serves the MTP figures on its own port.

Runs as a thread inside `mtp-runtime serve` (or alone: `mtp-runtime exporter`). Every
`interval_s` it scrapes vLLM's spec-decode counters into a sliding window
(figures.CounterWindow, default 5 minutes); each GET /metrics on the exporter's port computes
the figures over that window with figures.figures_from_increase, so they are exactly the
shared/mtp-metrics.md definitions. A figure with no drafts in the window is left out (no
sample), never written as 0. When vLLM cannot be scraped, `mtp_runtime_vllm_up` is 0 and the
exporter keeps serving. Standard library only (no prometheus_client needed).
"""

from __future__ import annotations

import threading
import time
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from mtp_runtime import __version__, figures, spec_decode
from mtp_runtime.gpu_detect import GPUInfo
from mtp_runtime.vllm_command import EXPORTER_PORT

DEFAULT_PORT = EXPORTER_PORT  # the pool pod's `metrics` port (vllm_command)
DEFAULT_WINDOW_S = 300.0
DEFAULT_INTERVAL_S = 15.0

# name → (type, help); the documentation of every family the exporter writes
FAMILIES: dict[str, tuple[str, str]] = {
    "mtp_hit_rate": ("gauge", "c0/D over the window: share of drafts whose first token was "
                     "accepted. Absent when there were no drafts."),
    "mtp_acceptance_rate": ("gauge", "A/T over the window: share of draft tokens accepted."),
    "mtp_mean_acceptance_length": ("gauge", "1 + A/D over the window: tokens emitted per "
                                   "verification step (vLLM's own figure)."),
    "mtp_avg_k_used": ("gauge", "A/D over the window: draft tokens actually used per step."),
    "mtp_error_propagation_rate": ("gauge", "(D*(K-1) - A + c_{K-1})/T over the window, K = "
                                   "T/D: share of draft tokens wasted because an earlier "
                                   "token of the same draft was rejected."),
    "mtp_position_acceptance_rate": ("gauge", "c_j/D over the window: share of drafts whose "
                                     "first j+1 tokens were all accepted."),
    "mtp_num_speculative_tokens": ("gauge", "K this runtime launched vLLM with (0 = off)."),
    "mtp_observed_num_speculative_tokens": ("gauge", "T/D over the window: K as vLLM's "
                                            "counters show it."),
    "mtp_window_drafts": ("gauge", "D: drafts in the window (0 means the figures are absent)."),
    "mtp_window_seconds": ("gauge", "Length of the sliding window the figures cover."),
    "mtp_gpu_info": ("gauge", "The GPU this pod detected (always 1; labels carry the data)."),
    "mtp_runtime_gpu_mismatch": ("gauge", "1 when the detected GPU is not the product the "
                                 "pool was planned for."),
    "mtp_k_info": ("gauge", "Where the running K came from (always 1)."),
    "mtp_runtime_vllm_up": ("gauge", "1 when the last scrape of vLLM's /metrics succeeded."),
    "mtp_runtime_scrapes_total": ("counter", "Scrapes of vLLM's /metrics attempted."),
    "mtp_runtime_scrape_errors_total": ("counter", "Scrapes of vLLM's /metrics that failed."),
    "mtp_runtime_info": ("gauge", "mtp-runtime build information (always 1)."),
    "mtp_runtime_model_load_seconds": ("gauge", "Seconds from vLLM's start to its first "
                                       "healthy /health: engine start plus reading or "
                                       "downloading the weights. Absent until then."),
    "mtp_runtime_model_origin": ("gauge", "Where this pod's weights came from (always 1): "
                                 "origin cache, download or local (a path); cache "
                                 "persistentVolumeClaim, hostPath or none."),
    "mtp_runtime_model_downloaded_bytes": ("gauge", "Bytes of model files that appeared in "
                                           "the hub cache while vLLM loaded (0: all from "
                                           "the cache)."),
}

FIGURE_GAUGES = {
    "hit_rate": "mtp_hit_rate",
    "acceptance_rate": "mtp_acceptance_rate",
    "mean_acceptance_length": "mtp_mean_acceptance_length",
    "avg_k_used": "mtp_avg_k_used",
    "error_propagation_rate": "mtp_error_propagation_rate",
    "num_speculative_tokens": "mtp_observed_num_speculative_tokens",
}


def _escape(value: object) -> str:
    return str(value).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(labels: Mapping[str, object]) -> str:
    if not labels:
        return ""
    return "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items()) + "}"


def _num(v: float) -> str:
    return repr(float(v))


def fetch_text(url: str, timeout: float = 5.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return resp.read().decode("utf-8", "replace")


@dataclass
class ExporterState:
    """What the exporter knows besides the window: the launch facts for the info gauges."""

    configured_k: int | None = None
    gpu: GPUInfo | None = None
    expected_product: str | None = None
    gpu_mismatch: bool = False
    k_source: str | None = None
    k_mode: str | None = None
    extra_info: dict[str, str] = field(default_factory=dict)
    # set once vLLM is Ready (LoadWatch): how long loading took and where the weights came from
    model_load_seconds: float | None = None
    model_origin: str | None = None
    model_cache: str = "none"
    model_downloaded_bytes: int | None = None


class MTPExporter:
    def __init__(
        self,
        vllm_metrics_url: str,
        *,
        window_s: float = DEFAULT_WINDOW_S,
        interval_s: float = DEFAULT_INTERVAL_S,
        state: ExporterState | None = None,
        match: Mapping[str, str] | None = None,
        clock: Callable[[], float] = time.monotonic,
        fetch: Callable[[str], str] = fetch_text,
        on_event: Callable[..., None] | None = None,
    ) -> None:
        self.url = vllm_metrics_url
        self.window = figures.CounterWindow(window_s)
        self.interval_s = interval_s
        self.state = state or ExporterState()
        self.match = match
        self.clock = clock
        self.fetch = fetch
        self.on_event = on_event
        self.vllm_up = False
        self.scrapes = 0
        self.scrape_errors = 0
        self.last_error: str | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._server: ThreadingHTTPServer | None = None
        self._threads: list[threading.Thread] = []
        # GET /ready: (HTTP status, text) from this, set by `mtp-runtime serve` (the pod's
        # readiness: vLLM's /health while not draining); None: /ready is not served
        self.readiness: Callable[[], tuple[int, str]] | None = None

    # -- scraping ---------------------------------------------------------------------------
    def scrape_once(self) -> bool:
        """Scrape vLLM once into the window; returns whether vLLM answered."""
        now = self.clock()
        try:
            text = self.fetch(self.url)
            snapshot = spec_decode.spec_snapshot(text, self.match)
        except Exception as exc:  # any failure to get or read the page: vLLM is not up
            with self._lock:
                was_up = self.vllm_up
                self.scrapes += 1
                self.scrape_errors += 1
                self.vllm_up = False
                self.last_error = str(exc)
            if was_up and self.on_event:
                self.on_event("vllm_scrape_failed", error=str(exc), url=self.url)
            return False
        with self._lock:
            self.scrapes += 1
            self.vllm_up = True
            self.last_error = None
            self.window.add(now, snapshot)
        return True

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.scrape_once()
            self._stop.wait(self.interval_s)

    # -- exposition -------------------------------------------------------------------------
    def render(self) -> str:
        with self._lock:
            fig = self.window.figures(self.clock())
            up, scrapes, errors = self.vllm_up, self.scrapes, self.scrape_errors
        st = self.state
        rows: dict[str, list[tuple[dict[str, object], float]]] = {n: [] for n in FAMILIES}
        for key, name in FIGURE_GAUGES.items():
            value = fig[key]
            if isinstance(value, int | float):
                rows[name].append(({}, float(value)))
        for j, rate in enumerate(fig.position_acceptance_rate):
            rows["mtp_position_acceptance_rate"].append(({"position": str(j)}, rate))
        rows["mtp_window_drafts"].append(({}, fig.drafts))
        rows["mtp_window_seconds"].append(({}, float(self.window.span_s)))
        if st.configured_k is not None:
            rows["mtp_num_speculative_tokens"].append(({}, float(st.configured_k)))
        if st.gpu is not None:
            info = {
                "gpu_product": st.gpu.product,
                "gpu_family": st.gpu.family or "",
                "gpu_name": st.gpu.name,
                "gpu_count": str(st.gpu.count),
                "memory_mib": "" if st.gpu.memory_mib is None else str(st.gpu.memory_mib),
                "source": st.gpu.source,
            }
            rows["mtp_gpu_info"].append((info, 1.0))
            if st.expected_product:
                rows["mtp_runtime_gpu_mismatch"].append(
                    ({"expected": st.expected_product, "detected": st.gpu.product},
                     1.0 if st.gpu_mismatch else 0.0)
                )
        if st.k_source is not None:
            rows["mtp_k_info"].append(({"source": st.k_source, "k_mode": st.k_mode or ""}, 1.0))
        rows["mtp_runtime_vllm_up"].append(({}, 1.0 if up else 0.0))
        rows["mtp_runtime_scrapes_total"].append(({}, float(scrapes)))
        rows["mtp_runtime_scrape_errors_total"].append(({}, float(errors)))
        rows["mtp_runtime_info"].append(({"version": __version__, **st.extra_info}, 1.0))
        if st.model_load_seconds is not None:
            rows["mtp_runtime_model_load_seconds"].append(({}, st.model_load_seconds))
        if st.model_origin is not None:
            rows["mtp_runtime_model_origin"].append(
                ({"origin": st.model_origin, "cache": st.model_cache}, 1.0)
            )
        if st.model_downloaded_bytes is not None:
            rows["mtp_runtime_model_downloaded_bytes"].append(
                ({}, float(st.model_downloaded_bytes))
            )

        lines: list[str] = []
        for name, (kind, help_) in FAMILIES.items():
            lines.append(f"# HELP {name} {help_}")
            lines.append(f"# TYPE {name} {kind}")
            lines.extend(f"{name}{_labels(lab)} {_num(v)}" for lab, v in rows[name])
        return "\n".join(lines) + "\n"

    # -- HTTP -------------------------------------------------------------------------------
    def start(self, host: str = "0.0.0.0", port: int = DEFAULT_PORT, scrape: bool = True
              ) -> MTPExporter:
        exporter = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                path = self.path.split("?", 1)[0]
                if path == "/metrics":
                    body, code = exporter.render().encode(), 200
                    ctype = "text/plain; version=0.0.4; charset=utf-8"
                elif path in ("/healthz", "/"):
                    body, code, ctype = b"ok\n", 200, "text/plain"
                elif path == "/ready" and exporter.readiness is not None:
                    code, text = exporter.readiness()
                    body, ctype = (text + "\n").encode(), "text/plain"
                else:
                    body, code, ctype = b"not found\n", 404, "text/plain"
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self._server = ThreadingHTTPServer((host, port), Handler)
        self._server.daemon_threads = True
        t = threading.Thread(target=self._server.serve_forever, daemon=True,
                             name="mtp-exporter-http")
        t.start()
        self._threads.append(t)
        if scrape:
            s = threading.Thread(target=self._loop, daemon=True, name="mtp-exporter-scrape")
            s.start()
            self._threads.append(s)
        return self

    @property
    def port(self) -> int | None:
        return None if self._server is None else self._server.server_address[1]

    def stop(self) -> None:
        self._stop.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        for t in self._threads:
            t.join(timeout=5)
        self._threads.clear()
