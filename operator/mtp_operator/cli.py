"""`mtp-operator`: run the operator, render a resource offline, print the CRD."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from pathlib import Path

from mtp_operator.settings import SettingsFileError, load_settings


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="mtp-operator", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="run the operator against the current KUBECONFIG")
    run.add_argument(
        "--namespace",
        "-n",
        action="append",
        default=[],
        help="watch only this namespace (repeatable; default: all namespaces)",
    )
    run.add_argument("--settings", type=Path, help="operator settings YAML file")
    run.add_argument("--default-image", help="runtime image for resources that set none")
    run.add_argument(
        "--alerts-address", help="HOST:PORT for the Alertmanager webhook (POST /alerts)"
    )
    run.add_argument("--alerts-token-file", type=Path, help="file holding the webhook bearer token")
    run.add_argument("--alerts-tls-cert", type=Path, help="TLS certificate for the webhook")
    run.add_argument("--alerts-tls-key", type=Path, help="TLS key for the webhook")
    ev = run.add_mutually_exclusive_group()
    ev.add_argument(
        "--evaluator",
        dest="evaluator",
        action="store_true",
        default=None,
        help="run the built-in evaluator (default: the settings file decides)",
    )
    ev.add_argument("--no-evaluator", dest="evaluator", action="store_false")
    run.add_argument("--evaluator-interval", type=float, help="seconds between evaluations")
    run.add_argument(
        "--metrics-address",
        default="0.0.0.0:8080",
        help="HOST:PORT for /metrics and /healthz ('' to disable)",
    )
    le = run.add_mutually_exclusive_group()
    le.add_argument(
        "--leader-election",
        dest="leader_election",
        action="store_true",
        default=False,
        help="act only while holding a Lease (safe with 2 replicas)",
    )
    le.add_argument("--no-leader-election", dest="leader_election", action="store_false")
    run.add_argument("--lease-namespace", default="default")
    run.add_argument("--lease-name", default="mtp-operator")
    run.add_argument("--log-level", default="INFO")

    render = sub.add_parser("render", help="print the objects the operator would create")
    render.add_argument(
        "-f", "--filename", required=True, type=Path, help="MTPInference YAML ('-' for stdin)"
    )
    render.add_argument(
        "--gpu-product",
        action="append",
        default=[],
        help="render a pool for this nvidia.com/gpu.product (repeatable)",
    )
    render.add_argument("--settings", type=Path, help="operator settings YAML file")

    sub.add_parser("crd", help="print the MTPInference CustomResourceDefinition")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "crd":
        from mtp_operator.api.crd import crd_yaml

        sys.stdout.write(crd_yaml())
        return 0
    try:
        settings = load_settings(args.settings)
    except SettingsFileError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if args.command == "render":
        from mtp_operator.render import RenderError, render_documents

        try:
            text = sys.stdin.read() if str(args.filename) == "-" else args.filename.read_text()
        except OSError as err:
            print(f"error: {args.filename}: {err.strerror or err}", file=sys.stderr)
            return 2
        try:
            sys.stdout.write(render_documents(text, args.gpu_product or None, settings))
        except RenderError as err:
            print(f"error: {args.filename}: {err}", file=sys.stderr)
            return 2
        return 0

    from mtp_operator.app.main import RunOptions, run

    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    if args.default_image:
        settings = settings.model_copy(update={"default_image": args.default_image})
    opts = RunOptions(
        settings=settings,
        namespaces=args.namespace,
        alerts_address=args.alerts_address,
        alerts_token_file=args.alerts_token_file,
        alerts_tls_cert=args.alerts_tls_cert,
        alerts_tls_key=args.alerts_tls_key,
        evaluator=args.evaluator,
        evaluator_interval=args.evaluator_interval,
        metrics_address=args.metrics_address or None,
        leader_election=args.leader_election,
        lease_namespace=args.lease_namespace,
        lease_name=args.lease_name,
    )
    try:
        return asyncio.run(run(opts))
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
