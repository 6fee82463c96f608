"""Model folders for the real-size sweep: a `config.json` (vLLM's dummy loader builds the full
model from it, random weights, nothing downloaded) and a word-level tokenizer.

    python3 realsize_models.py --kind qwen35-27b --out DIR      # prints MODEL=DIR

Two shapes, both with one MTP layer:
- `qwen35-27b`: the seed's family, a Qwen3.5/3.6 27B-class hybrid
  (`Qwen3_5ForConditionalGeneration`; 64 layers, three gated-DeltaNet layers to one
  full-attention layer; hidden 5120; vocabulary 248,320; a vision tower the runs switch off
  with `--language-model-only`).
- `mimo-7b`: a dense 7B MTP model of MiMo-7B's shape (`MiMoForCausalLM` on `model_type` qwen2:
  36 layers, hidden 4096, 32 heads / 8 KV heads of 128, vocabulary 151,680).

The tokenizer has TOKENIZER_SIZE tokens `<t0>`, `<t1>`, ... split on whitespace: the bench
sends token-id prompts of ids below the acceptance rewrite's N (acceptance_ext.py), and the
rewritten target only ever emits such ids, so the detokenizer always knows them.
Standard library plus `tokenizers` (present on the GPU machine with transformers).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

TOKENIZER_SIZE = 4096

QWEN35_27B = {
    "architectures": ["Qwen3_5ForConditionalGeneration"],
    "model_type": "qwen3_5",
    "image_token_id": 248056,
    "video_token_id": 248057,
    "vision_start_token_id": 248053,
    "vision_end_token_id": 248054,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "text_config": {
        "model_type": "qwen3_5_text",
        "vocab_size": 248320,
        "hidden_size": 5120,
        "intermediate_size": 17408,
        "num_hidden_layers": 64,
        "full_attention_interval": 4,
        "num_attention_heads": 24,
        "num_key_value_heads": 4,
        "head_dim": 256,
        "linear_conv_kernel_dim": 4,
        "linear_key_head_dim": 128,
        "linear_value_head_dim": 128,
        "linear_num_key_heads": 16,
        "linear_num_value_heads": 48,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-6,
        "max_position_embeddings": 262144,
        "attn_output_gate": True,
        "mtp_num_hidden_layers": 1,
        "mtp_use_dedicated_embeddings": False,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000000,
                            "partial_rotary_factor": 0.25, "mrope_interleaved": True,
                            "mrope_section": [11, 11, 10]},
        "eos_token_id": 0,
    },
    "vision_config": {"model_type": "qwen3_5", "depth": 2, "hidden_size": 1152,
                      "intermediate_size": 4304, "num_heads": 16, "out_hidden_size": 5120,
                      "patch_size": 16, "spatial_merge_size": 2, "temporal_patch_size": 2,
                      "in_channels": 3, "num_position_embeddings": 2304,
                      "hidden_act": "gelu_pytorch_tanh"},
}

MIMO_7B = {
    "architectures": ["MiMoForCausalLM"],
    "model_type": "qwen2",
    "vocab_size": 151680,
    "hidden_size": 4096,
    "intermediate_size": 11008,
    "num_hidden_layers": 36,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "hidden_act": "silu",
    "rms_norm_eps": 1e-5,
    "max_position_embeddings": 32768,
    "rope_theta": 640000,
    "attention_dropout": 0.0,
    "use_sliding_window": False,
    "num_nextn_predict_layers": 1,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "eos_token_id": 0,
    "bos_token_id": 0,
}

KINDS = {"qwen35-27b": QWEN35_27B, "mimo-7b": MIMO_7B}
# MTP method per kind as a pool writes it: the seed writes `qwen3_next_mtp` for its model
METHODS = {"qwen35-27b": "qwen3_next_mtp", "mimo-7b": "mtp"}
# extraArgs of every real-size pool: dummy weights, the acceptance rewrite's worker extension,
# CUDA graphs for decode without torch.compile (tests/contract checks them on vLLM 0.33 too)
COMMON_ARGS = ["--load-format", "dummy", "--attention-backend", "TRITON_ATTN",
               "--seed", "0", "--worker-extension-cls", "acceptance_ext.AcceptanceControl",
               "--compilation-config", '{"mode":0,"cudagraph_mode":"FULL_DECODE_ONLY"}']
# flags a kind needs on vLLM 0.26 beyond the common ones (realsize.py)
KIND_ARGS = {"qwen35-27b": ["--language-model-only", "--gdn-prefill-backend", "triton"],
             "mimo-7b": []}


def write_tokenizer(out: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {f"<t{i}>": i for i in range(TOKENIZER_SIZE)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<t1>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<t0>", "unk_token": "<t1>",
        "model_max_length": 1 << 20}))


def write_model(kind: str, out: Path) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(KINDS[kind], indent=1))
    (out / "generation_config.json").write_text(json.dumps({"eos_token_id": 0}))
    write_tokenizer(out)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kind", choices=sorted(KINDS), required=True)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    print(f"MODEL={write_model(args.kind, args.out)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
