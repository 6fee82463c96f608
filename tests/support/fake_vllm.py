"""A fake vLLM 0.33.0 metrics source for tests: /metrics with vLLM's exact spec-decode families.

Standard library only, so any test (or a pod in the sandbox) can run it. It serves:

- `GET /metrics` — the four spec-decode counters exactly as vLLM 0.33.0's Prometheus logger
  writes them (names, HELP, TYPE, labels `engine`, `model_name`, `position`, and the
  `*_created` gauges; see shared/vllm-0.33.0/metrics-sample.prom), plus a few serving
  families (`vllm:num_requests_running`, `vllm:num_requests_waiting`,
  `vllm:kv_cache_usage_perc`, `vllm:generation_tokens_total`). With k=0 (speculation off) the
  spec-decode families are absent, as in vLLM.
- `GET /health` (200, or 503 after `set_healthy(False)`), `GET /v1/models`, `GET /version`.

Driven by a test:

    with FakeVLLM(k=4, model_name="m") as fake:       # port=0 → a free port
        fake.advance([4, 2, 0])                       # three drafts, 4, 2, 0 tokens accepted
        fake.advance_random(100, acceptance=0.8)      # 100 drafts, per-position p = 0.8
        fake.set_counters(drafts=3, draft_tokens=12, accepted=6, per_position=[2, 2, 1, 1])
        fake.restart(k=2)                             # counters back to 0 (new K, new _created)
        fake.metrics_url                              # http://127.0.0.1:PORT/metrics

Or as a CLI that advances its counters by itself every second, so Prometheus sees rates:

    PYTHONPATH=tests python -m support.fake_vllm --port 8000 --k 4 --acceptance 0.9 \
        --drafts-per-second 50
"""

from __future__ import annotations

import argparse
import json
import random
import signal
import threading
import time
from collections.abc import Iterable, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from support import http_thread

SPEC_FAMILIES = (
    ("vllm:spec_decode_num_drafts", "Number of spec decoding drafts."),
    ("vllm:spec_decode_num_draft_tokens", "Number of draft tokens."),
    ("vllm:spec_decode_num_accepted_tokens", "Number of accepted tokens."),
    ("vllm:spec_decode_num_accepted_tokens_per_pos", "Accepted tokens per draft position."),
)


def _fmt(value: float) -> str:
    """Float formatting as prometheus_client's floatToGoString: 3.0, 1.795961330370708e+09."""
    s = repr(float(value))
    dot = s.find(".")
    if value > 0 and dot > 6:
        mantissa = f"{s[0]}.{s[1:dot]}{s[dot + 1:]}".rstrip("0.")
        return f"{mantissa}e+0{dot - 1}"
    return s


class FakeVLLM:
    def __init__(
        self,
        k: int = 4,
        model_name: str = "fake-model",
        engine: str = "0",
        host: str = "127.0.0.1",
        port: int = 0,
        seed: int | None = None,
    ) -> None:
        self.model_name = model_name
        self.engine = engine
        self.host = host
        self._port = port
        self._lock = threading.Lock()
        self._rng = random.Random(seed)
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self.healthy = True
        self.metrics_status = 200  # set to 500/503 to make /metrics fail without stopping
        self.running = 0.0  # vllm:num_requests_running / _waiting as served
        self.waiting = 0.0
        self.scrapes = 0
        self.restart(k)

    # -- counters ---------------------------------------------------------------------------
    def restart(self, k: int | None = None) -> None:
        """Simulate a vLLM restart: all counters back to 0, new `_created` times, maybe new K."""
        with self._lock:
            if k is not None:
                if k < 0:
                    raise ValueError("k must be >= 0")
                self.k = k
            self.drafts = 0.0
            self.draft_tokens = 0.0
            self.accepted = 0.0
            self.per_position = [0.0] * self.k
            self.generation_tokens = 0.0
            self.created = time.time()

    def advance(self, accepted_per_draft: Iterable[int]) -> None:
        """Add drafts, one per item: the number of draft tokens accepted (a prefix, 0..K)."""
        if self.k == 0:
            raise ValueError("speculation is off (k=0): there are no drafts")
        with self._lock:
            for n in accepted_per_draft:
                if not 0 <= n <= self.k:
                    raise ValueError(f"accepted tokens per draft must be within 0..{self.k}")
                self.drafts += 1
                self.draft_tokens += self.k
                self.accepted += n
                for j in range(n):
                    self.per_position[j] += 1
                self.generation_tokens += n + 1

    def draw(self, drafts: int, acceptance: float | Sequence[float]) -> list[int]:
        """Accepted-prefix lengths for `drafts` drafts with per-position acceptance p.

        `acceptance` is one p for every position, or a list of conditional probabilities,
        one per position (a draft reaches position j+1 only if position j was accepted).
        """
        probs = [acceptance] * self.k if isinstance(acceptance, int | float) else list(acceptance)
        if len(probs) < self.k:
            probs += [probs[-1] if probs else 0.0] * (self.k - len(probs))
        out = []
        for _ in range(drafts):
            n = 0
            while n < self.k and self._rng.random() < probs[n]:
                n += 1
            out.append(n)
        return out

    def advance_random(self, drafts: int, acceptance: float | Sequence[float]) -> list[int]:
        accepted = self.draw(drafts, acceptance)
        self.advance(accepted)
        return accepted

    def set_counters(
        self,
        drafts: float,
        draft_tokens: float,
        accepted: float,
        per_position: Sequence[float],
    ) -> None:
        """Set the counters directly (K becomes len(per_position))."""
        with self._lock:
            self.k = len(per_position)
            self.drafts = float(drafts)
            self.draft_tokens = float(draft_tokens)
            self.accepted = float(accepted)
            self.per_position = [float(x) for x in per_position]

    def set_healthy(self, healthy: bool) -> None:
        self.healthy = healthy

    # -- exposition -------------------------------------------------------------------------
    def exposition(self) -> str:
        with self._lock:
            labels = f'engine="{self.engine}",model_name="{self.model_name}"'
            lines: list[str] = []

            def family(name: str, help_: str, kind: str, rows: list[tuple[str, float]]) -> None:
                lines.append(f"# HELP {name} {help_}")
                lines.append(f"# TYPE {name} {kind}")
                lines.extend(f"{name}{{{lab}}} {_fmt(v)}" for lab, v in rows)

            if self.k > 0:
                values = (self.drafts, self.draft_tokens, self.accepted)
                for (base, help_), value in zip(SPEC_FAMILIES[:3], values, strict=True):
                    family(f"{base}_total", help_, "counter", [(labels, value)])
                    family(f"{base}_created", help_, "gauge", [(labels, self.created)])
                base, help_ = SPEC_FAMILIES[3]
                pos = [f'{labels},position="{j}"' for j in range(self.k)]
                family(f"{base}_total", help_, "counter", list(zip(pos, self.per_position,
                                                                      strict=True)))
                family(f"{base}_created", help_, "gauge", [(p, self.created) for p in pos])
            family("vllm:num_requests_running", "Number of requests in model execution "
                   "batches.", "gauge", [(labels, self.running)])
            family("vllm:num_requests_waiting", "Number of requests waiting to be processed.",
                   "gauge", [(labels, self.waiting)])
            family("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.",
                   "gauge", [(labels, 0.0)])
            family("vllm:generation_tokens_total", "Number of generation tokens processed.",
                   "counter", [(labels, self.generation_tokens)])
            family("vllm:generation_tokens_created", "Number of generation tokens processed.",
                   "gauge", [(labels, self.created)])
            return "\n".join(lines) + "\n"

    # -- HTTP -------------------------------------------------------------------------------
    def start(self) -> FakeVLLM:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:  # quiet
                pass

            def _send(self, code: int, body: str, ctype: str) -> None:
                data = body.encode()
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                path = self.path.split("?", 1)[0]
                if path == "/metrics":
                    fake.scrapes += 1
                    if fake.metrics_status != 200:
                        self._send(fake.metrics_status, "error\n", "text/plain")
                        return
                    self._send(200, fake.exposition(),
                               "text/plain; version=0.0.4; charset=utf-8")
                elif path == "/health":
                    self._send(200 if fake.healthy else 503, "", "text/plain")
                elif path == "/v1/models":
                    body = {"object": "list", "data": [
                        {"id": fake.model_name, "object": "model", "owned_by": "vllm"}]}
                    self._send(200, json.dumps(body), "application/json")
                elif path == "/version":
                    self._send(200, json.dumps({"version": "0.33.0"}), "application/json")
                else:
                    self._send(404, json.dumps({"detail": "Not Found"}), "application/json")

        self._server, self._thread = http_thread.start(self.host, self._port, Handler, "fake-vllm")
        return self

    def stop(self) -> None:
        """Stop serving: connections are refused afterwards (vLLM down)."""
        http_thread.stop(self._server, self._thread)
        self._server, self._thread = None, None

    @property
    def port(self) -> int:
        if self._server is None:
            return self._port
        return self._server.server_address[1]

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def metrics_url(self) -> str:
        return f"{self.url}/metrics"

    def __enter__(self) -> FakeVLLM:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Fake vLLM 0.33.0 /metrics with spec-decode counters")
    p.add_argument("--host", default="0.0.0.0")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--k", type=int, default=4, help="num_speculative_tokens (0 = spec off)")
    p.add_argument("--acceptance", type=float, default=0.9,
                   help="per-position acceptance probability p")
    p.add_argument("--acceptance-per-position", default=None,
                   help="comma-separated conditional acceptance per position (overrides)")
    p.add_argument("--drafts-per-second", type=float, default=50.0)
    p.add_argument("--model-name", default="fake-model")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--tick", type=float, default=1.0, help="seconds between advances")
    args = p.parse_args(argv)

    fake = FakeVLLM(k=args.k, model_name=args.model_name, host=args.host, port=args.port,
                    seed=args.seed).start()
    acceptance: float | list[float] = args.acceptance
    if args.acceptance_per_position:
        acceptance = [float(x) for x in args.acceptance_per_position.split(",")]
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    print(json.dumps({"event": "fake_vllm_started", "url": fake.url, "k": args.k}), flush=True)
    carry = 0.0
    while not stop.wait(args.tick):
        if args.k > 0:
            carry += args.drafts_per_second * args.tick
            n, carry = int(carry), carry - int(carry)
            fake.advance_random(n, acceptance)
    fake.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
