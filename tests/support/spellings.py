"""extraArgs entries the API server (CEL) and the operator must refuse, and neighbours they must
let through: shared by tests/unit/api/test_crd.py and tests/cluster/test_spec_refusals.py."""

# every spelling vLLM's parser takes for a reserved flag, and neighbours it must let through
EXTRA_ARGS_REFUSED = [
    "--port", "--port=9000", "--po", "--max_model_len=8k", "--max-model", "--tensor_parallel",
    "--speculative-config.method=ngram", "--speculative_config", "-sc", "-sc.method", "-sc=x",
    "-tp", "--spec-tokens=3", "--spec-m", "--served-model-name", "--reasoning-parser=qwen3",
    "--enforce-eager --port 9000", "--enforce-eager\t-tp 2", "--model", "--mod=x",
    "--pipeline-parallel-size", "--pipeline_parallel", "-pp", "-pp=2", "--data-parallel-size=2",
    "--data-parallel", "-dp", "-dp.x",
    # a config file can set any flag, reserved ones included (issue 36)
    "--config", "--config=file.yaml", "--config file.yaml", "--conf", "--confi=x", "--config.x",
]  # fmt: skip
EXTRA_ARGS_ACCEPTED = [
    "--enforce-eager", "--max-num-seqs=8", "--gpu-memory-utilization", "0.9", "--port-x",
    "--model-impl", "--reasoning-parser-plugin", "--data-parallel-size-local", "-dpl", "-tp8x",
    "--", "-", "hello --port", "x--port", "--tokenizer", "--portable",
    "--config-format", "--config-format=hf", "--configx", "file.yaml",
]  # fmt: skip
