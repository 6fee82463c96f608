"""Train (or reuse) the tiny MiMo MTP model the real CPU engine serves in tests and the demo.

    python tests/engine/tiny_model.py [--device cpu|cuda] [--out DIR] [--force]

Run it with the engine venv's python (`make tiny-model` does); the last line is
`MODEL=<absolute path>`. The folder is cached under ~/.cache/mtp-operator/models/<key>/ where
<key> hashes this script and its settings, and is reused when warm (a marker is written last).

What it makes (see the README.md written next to the weights):

- a Qwen2 target, `MiMoForCausalLM` with `model_type` qwen2 and one MTP layer
  (`num_nextn_predict_layers` 1), trained jointly on a corpus this script generates itself
  with tests/engine/traffic.py's rules: two thirds arithmetic progressions of token ids, one
  third uniform random ids, each led by the token of its kind (the prompts are made alike);
- the MTP head trained exactly the way vLLM's MiMo MTP code runs it: the target's hidden state
  BEFORE `model.norm`, the next token's embedding (zeroed at position 0), both RMS-normed,
  `input_proj` over their concatenation, one Qwen2 block plus its residual, `final_layernorm`,
  the shared `lm_head` → token t+2. Later draft steps (K > 1) run the same layer on its own
  output and attend to the earlier steps' keys; the head is trained on those unrolled steps too;
- `ZERO_LAYERS` extra decoder layers after the trained ones, whose output projections
  (`o_proj`, `down_proj`) are exactly zero: each adds exactly 0 to the residual stream, so the
  function, and the hidden state the MTP head sees, are bit-identical to the trained 2-layer
  target, while the engine still computes them. They give the target a realistic cost relative
  to its one-block draft (a 2-layer target step is so cheap that framework overhead hides any
  gain from speculation); real MiMo has 36 layers per MTP block.
- bf16 safetensors, a byte-level BPE tokenizer.json (tokenizers library) and
  tokenizer_config.json.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import random
import shutil
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
# run as a script: this folder is sys.path[0] (traffic.py, tiny_mimo.py beside it)
import traffic  # noqa: E402  (stdlib only; the token-id ranges and corpus rules)
from tiny_mimo import draft_agreement, make_model  # noqa: E402

SETTINGS = {
    "vocab_size": traffic.VOCAB_SIZE,
    "hidden_size": 256,
    "intermediate_size": 512,
    "trained_layers": 2,
    "zero_layers": 22,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 128,
    "rope_theta": 10000.0,
    "rms_norm_eps": 1e-6,
    "max_position_embeddings": 512,
    "seq_len": traffic.MAX_CONTEXT,
    "batch": 9,
    "steps": 300,
    "lr": 3e-3,
    "warmup": 30,
    "mtp_steps": 2,  # draft steps unrolled in training (K > 2 runs the layer deeper than trained)
    "mtp_weight": 1.0,
    "seed": 17,
}


def cache_key(settings: dict, device: str = "cpu") -> str:
    h = hashlib.sha256()
    h.update(device.encode())
    h.update(Path(__file__).read_bytes())
    h.update(Path(traffic.__file__).read_bytes())
    h.update((HERE / "tiny_mimo.py").read_bytes())
    h.update(json.dumps(settings, sort_keys=True).encode())
    return h.hexdigest()[:16]


def default_out(settings: dict, device: str = "cpu") -> Path:
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "mtp-operator"
    suffix = "" if device == "cpu" else f"-{device}"
    return cache / "models" / f"tiny-mimo-mtp-{cache_key(settings, device)}{suffix}"


def log(msg: str) -> None:
    print(f"tiny_model: {msg}", file=sys.stderr, flush=True)


# -- tokenizer ---------------------------------------------------------------------------------

def build_tokenizer(out: Path, vocab_size: int, seed: int) -> None:
    """Byte-level BPE with exactly `vocab_size` tokens, trained on generated pseudo-words."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    rng = random.Random(seed)
    syll = [a + b for a in "bcdfghklmnprstvz" for b in "aeiou"]
    words = ["".join(rng.choice(syll) for _ in range(rng.randint(1, 4))) for _ in range(3000)]
    text = [" ".join(rng.choice(words) for _ in range(20)) for _ in range(3000)]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<|endoftext|>", "<|pad|>", "<|progression|>", "<|random|>"]  # ids 0..3
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(text, trainer)
    if tok.get_vocab_size() != vocab_size:
        raise SystemExit(f"tokenizer has {tok.get_vocab_size()} tokens, wanted {vocab_size}")
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": "<|endoftext|>",
        "pad_token": "<|pad|>",
        "bos_token": None,
        "model_max_length": SETTINGS["max_position_embeddings"],
        "clean_up_tokenization_spaces": False,
    }, indent=2) + "\n")


def corpus_batch(rng: random.Random, batch: int, T: int) -> list[list[int]]:
    """Two thirds arithmetic progressions, one third uniform random ids (traffic.py's rules)."""
    out = []
    for i in range(batch):
        out.append(traffic.sequence("predictable" if i % 3 != 2 else "unpredictable", rng, T))
    return out


def train(s: dict, device: str):
    import torch
    from torch.nn import functional as F

    torch.manual_seed(s["seed"])
    rng = random.Random(s["seed"])
    model = make_model(s).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=s["lr"], betas=(0.9, 0.95),
                            weight_decay=0.01)
    T, n = s["seq_len"], s["mtp_steps"]
    t0, c0 = time.monotonic(), time.process_time()
    for step in range(1, s["steps"] + 1):
        lr = s["lr"] * min(1.0, step / s["warmup"])
        lr *= 0.5 * (1 + math.cos(math.pi * min(1.0, step / s["steps"])))
        lr = max(lr, s["lr"] * 0.02)
        for g in opt.param_groups:
            g["lr"] = lr
        ids = torch.tensor(corpus_batch(rng, s["batch"], T), device=device)
        main, outs = model(ids, n)
        V = s["vocab_size"]
        loss_main = F.cross_entropy(main[:, :-1].reshape(-1, V), ids[:, 1:].reshape(-1))
        loss = loss_main
        mtp_losses = []
        for r, logits in enumerate(outs, start=1):
            lo = F.cross_entropy(logits[:, : T - r - 1].reshape(-1, V),
                                 ids[:, r + 1:].reshape(-1))
            mtp_losses.append(lo)
            loss = loss + s["mtp_weight"] * lo / n
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 10 == 0 or step == 1:
            log(f"step {step}/{s['steps']} loss {loss_main.item():.3f} mtp "
                + " ".join(f"{x.item():.3f}" for x in mtp_losses)
                + f" ({time.monotonic() - t0:.0f} s, {time.process_time() - c0:.0f} CPU-s)")
    return model, time.monotonic() - t0, time.process_time() - c0


def state_dict_for_vllm(model, s: dict) -> dict:
    """The weight names vLLM's MiMoForCausalLM / MiMoMTP loaders read."""
    import torch

    out: dict[str, torch.Tensor] = {}

    def block(prefix: str, b) -> None:
        for name, t in b.state_dict().items():
            out[f"{prefix}.{name}"] = t

    out["model.embed_tokens.weight"] = model.embed_tokens.weight
    for i, layer in enumerate(model.layers):
        block(f"model.layers.{i}", layer)
    gen = torch.Generator().manual_seed(s["seed"] + 1)
    ref = model.layers[-1].state_dict()
    n_trained = s["trained_layers"]
    for j in range(s["zero_layers"]):
        prefix = f"model.layers.{n_trained + j}"
        for name, t in ref.items():
            if name.endswith(("o_proj.weight", "mlp.down_proj.weight")):
                val = torch.zeros_like(t)  # exactly zero: the layer adds 0 to the residual
            elif name.endswith("layernorm.weight"):
                val = torch.ones_like(t)
            else:
                val = torch.randn(t.shape, generator=gen) * 0.02
            out[f"{prefix}.{name}"] = val
    out["model.norm.weight"] = model.norm.weight
    out["lm_head.weight"] = model.lm_head.weight
    mtp = model.mtp
    m = "model.mtp_layers.0"
    for name in ("token_layernorm", "hidden_layernorm", "final_layernorm"):
        out[f"{m}.{name}.weight"] = getattr(mtp, name).weight
    out[f"{m}.input_proj.weight"] = mtp.input_proj.weight
    block(m, mtp.block)  # the checkpoint has no `mtp_block.` level (vLLM adds it)
    return {k: v.detach().to("cpu", torch.bfloat16).contiguous() for k, v in out.items()}


def write_config(out: Path, s: dict) -> None:
    cfg = {
        "architectures": ["MiMoForCausalLM"],
        "model_type": "qwen2",
        "vocab_size": s["vocab_size"],
        "hidden_size": s["hidden_size"],
        "intermediate_size": s["intermediate_size"],
        "num_hidden_layers": s["trained_layers"] + s["zero_layers"],
        "num_attention_heads": s["num_attention_heads"],
        "num_key_value_heads": s["num_key_value_heads"],
        "head_dim": s["head_dim"],
        "hidden_act": "silu",
        "max_position_embeddings": s["max_position_embeddings"],
        "max_window_layers": s["trained_layers"] + s["zero_layers"],
        "rms_norm_eps": s["rms_norm_eps"],
        "rope_theta": s["rope_theta"],
        "sliding_window": None,
        "use_sliding_window": False,
        "attention_dropout": 0.0,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "bos_token_id": None,
        "eos_token_id": 0,
        "pad_token_id": 1,
        "num_nextn_predict_layers": 1,
        "use_cache": True,
    }
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    (out / "generation_config.json").write_text(json.dumps(
        {"eos_token_id": 0, "pad_token_id": 1, "do_sample": False}, indent=2) + "\n")


README = """# tiny-mimo-mtp (made by mtp-operator's tests/engine/tiny_model.py)

A tiny MiMo-architecture model (`MiMoForCausalLM`, `model_type` qwen2) with one MTP layer, for
testing MTP speculative decoding on a real vLLM engine. Not a language model: it was trained
for {train_s:.0f} s on token-id sequences generated by the script (two thirds arithmetic
progressions `{first} + (s + d*i) mod {span}` led by `<|progression|>`, one third uniform random
ids led by `<|random|>`), so it continues progressions and nothing else. Cache key {key};
offline draft agreement by position (greedy, K=4): {agreement}. Settings:

```
{settings}
```

Layers: {n_layers} decoder layers; layers 0..{last_trained} are trained, layers
{first_zero}..{last_zero} are padding whose output projections (`o_proj`, `down_proj`) are
exactly zero. Each padding layer adds exactly 0 to the residual stream, so the model's function,
and the pre-norm hidden state its MTP layer reads, are bit-identical to the trained
{trained}-layer model; the engine still computes their attention and MLP inputs, which gives the
target a realistic cost relative to its one-block draft (real MiMo has 36 layers per MTP block).

MTP layer (`model.mtp_layers.0.*`): trained jointly with the target to predict token t+2 from
the target's pre-norm hidden state at t and token t+1, exactly as vLLM's MiMo MTP code runs it,
and on {mtp_steps} unrolled draft steps (the layer fed its own output, as for K > 1).
Final training losses: main {loss_main:.3f}, MTP steps {loss_mtp}.

Traffic that it speculates well on and traffic where speculation fails: tests/engine/traffic.py.
"""


def final_losses(model, s: dict, device: str):
    import torch
    from torch.nn import functional as F

    rng = random.Random(s["seed"] + 99)
    T, V = s["seq_len"], s["vocab_size"]
    ids = torch.tensor(corpus_batch(rng, 32, T), device=device)
    with torch.no_grad():
        main, outs = model(ids, s["mtp_steps"])
        lm = F.cross_entropy(main[:, :-1].reshape(-1, V), ids[:, 1:].reshape(-1)).item()
        lmtp = [F.cross_entropy(lo[:, : T - r - 1].reshape(-1, V),
                                ids[:, r + 1:].reshape(-1)).item()
                for r, lo in enumerate(outs, start=1)]
    return lm, lmtp


def build(out: Path, device: str) -> float:
    import torch
    from safetensors.torch import save_file

    s = SETTINGS
    # One thread by default: on a small shared machine two OpenMP threads spin-wait for each
    # other and cost ~10x the CPU time per step (measured: 3.3 vs 0.33 CPU-s).
    torch.set_num_threads(int(os.environ.get("MTP_TRAIN_THREADS", "1")))
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    log(f"training on {device} ({s['steps']} steps of {s['batch']} x {s['seq_len']} tokens, "
        f"{torch.get_num_threads()} threads)")
    model, train_s, train_cpu_s = train(s, device)
    lm, lmtp = final_losses(model, s, device)
    log(f"trained in {train_s:.0f} s ({train_cpu_s:.0f} CPU-s); held-out loss main {lm:.3f}, mtp "
        + " ".join(f"{x:.3f}" for x in lmtp))
    agreement = {cls: draft_agreement(model, traffic.prompts(cls, 8, seed=12345), 48, 4, device)
                 for cls in traffic.CLASSES}
    log("offline draft agreement by position (K=4): " + "; ".join(
        f"{c} " + " ".join(f"{x:.3f}" for x in v) for c, v in agreement.items()))
    save_file(state_dict_for_vllm(model, s), str(tmp / "model.safetensors"),
              metadata={"format": "pt"})
    write_config(tmp, s)
    build_tokenizer(tmp, s["vocab_size"], s["seed"])
    n_layers = s["trained_layers"] + s["zero_layers"]
    (tmp / "README.md").write_text(README.format(
        train_s=train_s, first=traffic.FIRST_ID, span=traffic.SPAN, key=cache_key(s, device),
        settings=json.dumps(s, indent=1), n_layers=n_layers, last_trained=s["trained_layers"] - 1,
        first_zero=s["trained_layers"], last_zero=n_layers - 1, trained=s["trained_layers"],
        mtp_steps=s["mtp_steps"], loss_main=lm, agreement=json.dumps(agreement),
        loss_mtp=", ".join(f"{x:.3f}" for x in lmtp)))
    (tmp / "training.json").write_text(json.dumps(
        {"train_seconds": round(train_s, 1), "train_cpu_seconds": round(train_cpu_s, 1),
         "threads": torch.get_num_threads(), "device": device, "loss_main": lm,
         "loss_mtp": lmtp, "offline_draft_agreement": agreement, "settings": s,
         "key": cache_key(s, device)}, indent=2) + "\n")
    (tmp / ".mtp-model-ok").write_text("ok\n")
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return train_s


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    ap.add_argument("--out", type=Path, default=None, help="default: the cache folder")
    ap.add_argument("--force", action="store_true", help="retrain even if cached")
    ap.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                    help="override one training setting (changes the cache key); for experiments")
    args = ap.parse_args()
    for item in args.set:
        name, _, value = item.partition("=")
        if name not in SETTINGS:
            ap.error(f"--set {name}: no such setting (one of {', '.join(SETTINGS)})")
        SETTINGS[name] = type(SETTINGS[name])(value)
    out = (args.out or default_out(SETTINGS, args.device)).resolve()
    if (out / ".mtp-model-ok").is_file() and not args.force:
        log(f"reusing {out}")
    else:
        import fcntl

        out.parent.mkdir(parents=True, exist_ok=True)
        with open(out.parent / f".{out.name}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if (out / ".mtp-model-ok").is_file() and not args.force:
                log(f"reusing {out} (made meanwhile)")
            else:
                t0 = time.monotonic()
                build(out, args.device)
                log(f"made {out} in {time.monotonic() - t0:.0f} s")
    print(f"MODEL={out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
