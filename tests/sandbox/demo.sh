#!/usr/bin/env bash
# Demo: bring the sandbox up and show the simulated GPU pools. Extend below (e.g. deploy an
# MTPInference); KUBECONFIG and PATH (cached kubectl, helm) are set for the steps you add.
set -euo pipefail
cd "$(dirname "$0")/../.."
PYTHON=${PYTHON:-.venv/bin/python}
[[ -x $PYTHON ]] || PYTHON=python3

line=$("$PYTHON" tests/sandbox/sandbox.py up | tail -n 1)
export "${line?}"                       # KUBECONFIG=<repo>/.sandbox/kubeconfig
eval "$("$PYTHON" tests/sandbox/sandbox.py env)"

echo "== nodes (simulated by kwok; control plane is real kube-apiserver $(kubectl version -o json | "$PYTHON" -c 'import json,sys; print(json.load(sys.stdin)["serverVersion"]["gitVersion"])'))"
kubectl get nodes -o custom-columns='NAME:.metadata.name,READY:.status.conditions[?(@.type=="Ready")].status,GPU:.metadata.labels.nvidia\.com/gpu\.product,GPUS:.status.capacity.nvidia\.com/gpu,GPU_MEM_MIB:.metadata.labels.nvidia\.com/gpu\.memory,FAMILY:.metadata.labels.nvidia\.com/gpu\.family'

echo "KUBECONFIG=$KUBECONFIG"
