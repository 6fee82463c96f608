"""Run `vllm serve` argv lists through vLLM 0.33.0's own parser and engine-config validation.

Runs INSIDE the vLLM venv made by install_vllm.sh (never in the project's environment), on
CPU, following shared/vllm-0.33.0/FACTS.md. vLLM is imported once (~15 s) for all cases.

    python vllm_driver.py RESULT.json < cases.json

cases.json: {"cases": [{"id": str, "argv": ["vllm", "serve", MODEL, ...],
                        "engine": true, "env": {...},
                        "parse_only": false, "dests": [...]}]}
RESULT.json: {"vllm_version": str, "reasoning_parsers": [...], "results": [{
    "id", "ok", "stage" (failing stage: parse | validate | reasoning_parser | engine_config),
    "error_type", "error", "speculative" ({"method", "num_speculative_tokens"} or null),
    "per_batch_size" (the speculative config's num_speculative_tokens_per_batch_size),
    "tensor_parallel_size", "max_model_len", "reasoning_parser",
    "reasoning_parser_registered" (true/false, null when none is set),
    "values" (parse_only cases: {dest: the parsed value, as JSON (repr where JSON can't)})}],
    "serve_options": {option string: dest} of the serve parser}

Stages: (1) argparse with vLLM's serve parser (make_arg_parser); (2) validate_parsed_serve_args;
(3) --reasoning-parser: the name must be in vLLM's ReasoningParserManager registry and its
class must load (the very lookup create_engine_config does); (4) create_engine_config with the
reasoning parser removed: with one set, vLLM 0.33 also tokenizes the parser's think tags and
so needs the model's tokenizer, which the tiny config-only models don't ship. Stage 3 covers
what stage 4 would check about the name. A `parse_only` case stops after stage 1 and reports
the parsed values of its `dests` (what a spelling of a flag really sets).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
import traceback

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")  # without it even the parser fails on CPU
# the tiny models' max_position_embeddings is 4096; real ones take the lengths we generate
os.environ.setdefault("VLLM_ALLOW_LONG_MAX_MODEL_LEN", "1")


def main() -> int:
    out_path = sys.argv[1]
    cases = json.load(sys.stdin)["cases"]

    import vllm
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.entrypoints.common.cli_args import make_arg_parser, validate_parsed_serve_args
    from vllm.reasoning import ReasoningParserManager
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    registered = sorted(ReasoningParserManager.list_registered())
    serve_parser = make_arg_parser(FlexibleArgumentParser())
    serve_options = {opt: action.dest
                     for opt, action in serve_parser._option_string_actions.items()}
    results = []
    for case in cases:
        argv = case["argv"]
        res: dict[str, object] = {"id": case["id"], "ok": False, "stage": None,
                                  "error_type": None, "error": None, "speculative": None,
                                  "reasoning_parser": None, "reasoning_parser_registered": None}
        saved_env = {k: os.environ.get(k) for k in case.get("env", {})}
        os.environ.update(case.get("env", {}))
        stage = "parse"
        try:
            if argv[:2] != ["vllm", "serve"]:
                raise ValueError(f"not a `vllm serve` command: {argv[:2]}")
            err = io.StringIO()
            try:
                # parse_only cases (hundreds of spellings) share one parser: it is reusable
                parser = (serve_parser if case.get("parse_only")
                          else make_arg_parser(FlexibleArgumentParser()))
                with contextlib.redirect_stderr(err):
                    args = parser.parse_args(argv[2:])
            except SystemExit as exc:
                raise ValueError(err.getvalue().strip() or f"argparse exit {exc.code}") from None
            if case.get("parse_only"):
                res["values"] = {d: json.loads(json.dumps(getattr(args, d, None), default=repr))
                                 for d in case.get("dests", [])}
                res["ok"] = True
                results.append(res)
                continue
            args.model = args.model_tag
            stage = "validate"
            validate_parsed_serve_args(args)
            name = getattr(args, "reasoning_parser", None)
            if name:
                stage = "reasoning_parser"
                res["reasoning_parser"] = name
                res["reasoning_parser_registered"] = name in registered
                ReasoningParserManager.get_reasoning_parser(name)  # KeyError if unknown
                args.reasoning_parser = None  # see the module doc: needs a tokenizer
            if case.get("engine", True):
                stage = "engine_config"
                config = AsyncEngineArgs.from_cli_args(args).create_engine_config()
                spec = config.speculative_config
                res["speculative"] = None if spec is None else {
                    "method": spec.method, "num_speculative_tokens": spec.num_speculative_tokens}
                schedule = getattr(spec, "num_speculative_tokens_per_batch_size", None)
                res["per_batch_size"] = None if schedule is None else [list(e) for e in schedule]
                res["tensor_parallel_size"] = config.parallel_config.tensor_parallel_size
                res["max_model_len"] = config.model_config.max_model_len
            res["ok"] = True
        except BaseException as exc:  # report every failure, including pydantic's
            if isinstance(exc, KeyboardInterrupt):
                raise
            res["stage"] = stage
            res["error_type"] = type(exc).__name__
            res["error"] = str(exc)
            if os.environ.get("MTP_DRIVER_TRACEBACKS"):
                res["traceback"] = traceback.format_exc()
        finally:
            for k, v in saved_env.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        results.append(res)
        print(f"vllm_driver: {case['id']}: {'ok' if res['ok'] else res['error_type']}",
              file=sys.stderr, flush=True)

    with open(out_path, "w") as f:
        json.dump({"vllm_version": vllm.__version__, "reasoning_parsers": registered,
                   "serve_options": serve_options, "results": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
