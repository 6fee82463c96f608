"""Real greedy traffic for the engine of a `RealPool`, of one traffic class at a time.

`concurrency` threads send completions (tests/engine/traffic.py's prompts and request shape:
token-id prompts, temperature 0, `ignore_eos`) to whichever engine serves the pool now; while
the pool has no healthy engine (a restart with a new K) they wait and carry on with the next
one. `switch(cls)` changes the class of every later request and returns the time it did.

    with Traffic(pool, "predictable") as load:
        ...
        t_switch = load.switch("unpredictable")
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import Counter

import traffic  # tests/engine/traffic.py (stdlib only)

from support.real_pool import RealPool

PROMPTS_PER_CLASS = 256


class Traffic:
    def __init__(self, pool: RealPool, cls: str, *, concurrency: int = 2,
                 max_tokens: int = traffic.DEFAULT_MAX_TOKENS, seed: int = 0) -> None:
        self.pool = pool
        self.concurrency, self.max_tokens = concurrency, max_tokens
        self._prompts = {c: itertools.cycle(traffic.prompts(c, PROMPTS_PER_CLASS, seed))
                         for c in traffic.CLASSES}
        self._lock = threading.Lock()
        self.cls = self._check(cls)
        self.sent: Counter[str] = Counter()  # completed requests per class
        self.tokens: Counter[str] = Counter()  # completion tokens per class
        self.failed = 0
        self.last_error = ""
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    @staticmethod
    def _check(cls: str) -> str:
        if cls not in traffic.CLASSES:
            raise ValueError(f"unknown traffic class {cls!r}: one of {traffic.CLASSES}")
        return cls

    def switch(self, cls: str) -> float:
        with self._lock:
            self.cls = self._check(cls)
        return time.monotonic()

    def _next(self) -> tuple[str, list[int]]:
        with self._lock:
            return self.cls, next(self._prompts[self.cls])

    def _loop(self) -> None:
        while not self._stop.is_set():
            run = self.pool.current()
            if run is None or run.served_model is None:
                self._stop.wait(0.2)
                continue
            cls, prompt = self._next()
            try:
                reply = traffic.send(run.url, run.served_model, prompt, self.max_tokens,
                                     timeout=60)
            except OSError as err:  # the engine went away under us (a restart)
                self.failed += 1
                self.last_error = str(err)
                self._stop.wait(0.2)
                continue
            self.sent[cls] += 1
            self.tokens[cls] += int((reply.get("usage") or {}).get("completion_tokens") or 0)

    def start(self) -> Traffic:
        for i in range(self.concurrency):
            t = threading.Thread(target=self._loop, daemon=True, name=f"traffic-{i}")
            t.start()
            self._threads.append(t)
        return self

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=70)

    def __enter__(self) -> Traffic:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class PerEngineTraffic:
    """A closed loop of `concurrency` requests for EVERY healthy engine of the pool at once.

    A pool of several replicas behind one Service sees the same traffic mix on each replica;
    what tuning compares is each replica's output at its own concurrency, so each engine gets
    its own loop (a round-robin over engines would hand every engine the same request count
    and hide the faster one). Each completion is recorded as (time done, completion tokens)
    per pod: `tokens_per_second(pod, t0, t1)` is the client's own count of what that engine
    produced, independent of vLLM's counters and of the operator.

    With `hold_while_starting`, no request is sent while an engine of the pool is starting.
    On a GPU cluster a canary starts on a GPU of its own; here every engine shares two cores,
    and a replica kept busy (its model worker and its engine-core loop took both cores) left
    the canary's engine 1 % of a CPU: its start took 8-15 minutes instead of 30 s in cold
    runs. Traffic held during starts makes a start cost what it costs on an idle machine;
    what tuning compares (two engines over the same window, both serving) is unchanged.
    """

    def __init__(self, pool: RealPool, cls: str, *, concurrency: int = 2,
                 max_tokens: int = traffic.DEFAULT_MAX_TOKENS, seed: int = 0,
                 hold_while_starting: bool = False) -> None:
        if cls not in traffic.CLASSES:
            raise ValueError(f"unknown traffic class {cls!r}: one of {traffic.CLASSES}")
        self.pool, self.cls = pool, cls
        self.concurrency, self.max_tokens = concurrency, max_tokens
        self.hold_while_starting = hold_while_starting
        self._prompts = itertools.cycle(traffic.prompts(cls, PROMPTS_PER_CLASS, seed))
        self._lock = threading.Lock()
        self.done: dict[str, list[tuple[float, int]]] = {}  # pod -> [(time.time(), tokens)]
        self.failed = 0
        self._stop = threading.Event()
        self._loops: dict[str, list[threading.Thread]] = {}
        self._watch: threading.Thread | None = None

    def _prompt(self) -> list[int]:
        with self._lock:
            return next(self._prompts)

    def _loop(self, run) -> None:
        pod = run.launch.pod
        while not self._stop.is_set() and run.stopped_at is None:
            if self.hold_while_starting and self.pool.starting():
                self._stop.wait(0.2)
                continue
            try:
                reply = traffic.send(run.url, run.served_model, self._prompt(), self.max_tokens,
                                     timeout=120)
            except OSError:  # the engine is going away (its pod was replaced)
                with self._lock:
                    self.failed += 1
                self._stop.wait(0.2)
                continue
            n = int((reply.get("usage") or {}).get("completion_tokens") or 0)
            with self._lock:
                self.done.setdefault(pod, []).append((time.time(), n))

    def _follow(self) -> None:
        while not self._stop.is_set():
            for run in self.pool.serving():
                if run.launch.pod not in self._loops:
                    self._loops[run.launch.pod] = threads = [
                        threading.Thread(target=self._loop, args=(run,), daemon=True,
                                         name=f"load-{run.launch.pod}-{i}")
                        for i in range(self.concurrency)]
                    for t in threads:
                        t.start()
            self._stop.wait(0.2)

    def tokens_per_second(self, pod: str, t0: float, t1: float) -> float:
        """Completion tokens of requests to `pod` that finished in [t0, t1] (epoch seconds,
        the clock of the operator's status times), per second."""
        with self._lock:
            n = sum(tokens for t, tokens in self.done.get(pod, []) if t0 <= t <= t1)
        return n / (t1 - t0)

    def start(self) -> PerEngineTraffic:
        self._watch = threading.Thread(target=self._follow, daemon=True, name="load-follow")
        self._watch.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._watch is not None:
            self._watch.join(timeout=5)
        for threads in self._loops.values():
            for t in threads:
                t.join(timeout=130)

    def __enter__(self) -> PerEngineTraffic:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
