#!/usr/bin/env bash
# `make demo`: the sandbox, the operator, one MTPInference with a pool per GPU product, and an
# automatic rollback of the one pool whose MTP acceptance is bad.
#
#  1. sandbox up (real kube-apiserver etc., kwok GPU nodes), the CRD applied
#  2. the operator (`mtp-operator run`, built-in evaluator every second) in the background,
#     logging to <sandbox state dir>/demo-operator.log
#  3. examples/deepseek-v3-auto.yaml in namespace mtp-demo, with short rollback timings added
#     (the defaults wait 5 minutes before acting)
#  4. a fake vLLM (tests/support/fake_vllm.py: vLLM 0.33.0's /metrics) on every pool pod's IP
#     (kwok pods have loopback IPs): acceptance 0.95, but 0.6 on the H100 pool
#  5. the evaluator sees the H100 pool's hit rate fall below 0.88 and steps its K down; only
#     that pool's Deployment changes; status, condition and Event say why
#  6. fakes and operator stopped, the resource deleted (its pods hold whole GPU nodes, which
#     `make test` needs; MTP_DEMO_KEEP=1 keeps it); the sandbox stays up (`make sandbox-down`)
set -euo pipefail
cd "$(dirname "$0")/../.."
PYTHON=${PYTHON:-.venv/bin/python}
[[ -x $PYTHON ]] || PYTHON=python3

NS=mtp-demo
NAME=deepseek-v3
H100=NVIDIA-H100-80GB-HBM3
DEGRADED_P=0.6
HEALTHY_P=0.95
ROLLBACK='{"windowSeconds": 10, "forSeconds": 5, "minDrafts": 50, "cooldownSeconds": 120, "stabilizationSeconds": 30}'

# MTP_SANDBOX_STARTED_BY=api: a test session's sandbox stays the session's to stop
line=$("$PYTHON" tests/sandbox/sandbox.py up --started-by "${MTP_SANDBOX_STARTED_BY:-cli}" | tail -n 1)
export "${line?}"                       # KUBECONFIG=<state dir>/kubeconfig
eval "$("$PYTHON" tests/sandbox/sandbox.py env)"
STATE_DIR=$(dirname "$KUBECONFIG")

if [[ -t 1 ]]; then say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }; else say() { printf '\n== %s\n' "$*"; }; fi
started=$(date +%s)

say "nodes (simulated by kwok; control plane is real kube-apiserver $(kubectl version -o json | "$PYTHON" -c 'import json,sys; print(json.load(sys.stdin)["serverVersion"]["gitVersion"])'))"
kubectl get nodes -o custom-columns='NAME:.metadata.name,READY:.status.conditions[?(@.type=="Ready")].status,GPU:.metadata.labels.nvidia\.com/gpu\.product,GPUS:.status.capacity.nvidia\.com/gpu,GPU_MEM_MIB:.metadata.labels.nvidia\.com/gpu\.memory,FAMILY:.metadata.labels.nvidia\.com/gpu\.family'

# ---- everything started below is stopped on exit, by its own pid ---------------------------
PIDS=()
cleanup() {
    local pid
    for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
    for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
}
trap cleanup EXIT

say "CRD and namespace $NS"
kubectl apply --server-side --force-conflicts -f crds/mtp-operator.io_mtpinferences.yaml >/dev/null
kubectl wait --for=condition=Established crd/mtpinferences.mtp-operator.io --timeout=60s >/dev/null
kubectl create namespace "$NS" --dry-run=client -o yaml | kubectl apply -f - >/dev/null
remove_demo() {  # the resource, its pools and their pods, at once (no grace period)
    local i
    kubectl delete mtpi --all -n "$NS" --wait=true >/dev/null
    kubectl delete deployments,replicasets --all -n "$NS" --wait=false >/dev/null 2>&1 || true
    for i in $(seq 100); do
        [[ -z $(kubectl get pods -n "$NS" -o name 2>/dev/null) ]] && return 0
        kubectl delete pods --all -n "$NS" --grace-period=0 --force >/dev/null 2>&1 || true
        sleep 0.3
    done
    echo "pods in $NS still there after 30 s:"; kubectl get pods -n "$NS"; return 1
}
if [[ -n $(kubectl get mtpi,pods -n "$NS" -o name 2>/dev/null) ]]; then
    echo "removing the previous demo's resources"
    remove_demo
fi

say "operator: mtp-operator run --namespace $NS --evaluator --evaluator-interval 1 (log: $STATE_DIR/demo-operator.log)"
METRICS_PORT=$("$PYTHON" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
OPLOG=$STATE_DIR/demo-operator.log
"$PYTHON" -m mtp_operator.cli run --namespace "$NS" --evaluator --evaluator-interval 1 \
    --metrics-address "127.0.0.1:$METRICS_PORT" >"$OPLOG" 2>&1 &
PIDS+=($!)
for i in $(seq 150); do
    "$PYTHON" -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=1)' \
        "http://127.0.0.1:$METRICS_PORT/healthz" >/dev/null 2>&1 && break
    kill -0 "${PIDS[0]}" 2>/dev/null || { echo "operator exited:"; tail -n 30 "$OPLOG"; exit 1; }
    [[ $i == 150 ]] && { echo "operator not healthy in 30 s:"; tail -n 30 "$OPLOG"; exit 1; }
    sleep 0.2
done
echo "operator up (metrics on http://127.0.0.1:$METRICS_PORT/metrics)"

say "apply examples/deepseek-v3-auto.yaml (K auto per GPU, capped at 4) + spec.rollback $ROLLBACK"
"$PYTHON" - "$ROLLBACK" <<'EOF' | kubectl apply -n "$NS" -f -
import json, sys, yaml
doc = yaml.safe_load(open("examples/deepseek-v3-auto.yaml"))
doc["spec"]["rollback"] = json.loads(sys.argv[1])
print(yaml.safe_dump(doc))
EOF

wait_ready() {   # phase Ready for the current generation
    local i phase observed generation
    for i in $(seq 300); do
        read -r phase observed generation < <(kubectl get mtpi "$NAME" -n "$NS" -o \
            jsonpath='{.status.phase} {.status.observedGeneration} {.metadata.generation}{"\n"}' \
            2>/dev/null || echo "- - -")
        [[ $phase == Ready && $observed == "$generation" ]] && return 0
        sleep 0.3
    done
    echo "$NAME not Ready (phase: $phase)"; kubectl get mtpi,deploy,pods -n "$NS"; tail -n 30 "$OPLOG"; exit 1
}

pools() {   # deployment, GPU product, K from its vllm-command annotation, ready replicas
    kubectl get deployments -n "$NS" -l "mtp-operator.io/mtpinference=$NAME" -o json | "$PYTHON" -c '
import json, sys
rows = [("DEPLOYMENT", "GPU_PRODUCT", "K", "READY")]
for d in sorted(json.load(sys.stdin)["items"], key=lambda d: d["metadata"]["name"]):
    ann = d["metadata"]["annotations"]
    argv = json.loads(ann["mtp-operator.io/vllm-command"])
    k = json.loads(argv[argv.index("--speculative-config") + 1])["num_speculative_tokens"] \
        if "--speculative-config" in argv else 0
    st = d.get("status") or {}
    ready = "%s/%s" % (st.get("readyReplicas", 0), d["spec"]["replicas"])
    rows.append((d["metadata"]["name"], ann["mtp-operator.io/gpu-product"], str(k), ready))
w = [max(len(r[i]) for r in rows) for i in range(4)]
for r in rows:
    print("   ".join(c.ljust(w[i]) for i, c in enumerate(r)).rstrip())
'
}

wait_ready
say "kubectl get mtpi -n $NS"
kubectl get mtpi -n "$NS"
say "pools: one Deployment per GPU product, each with its own K"
pools

# ---- fake vLLM servers on the pod IPs --------------------------------------------------------
FAKE_DIR=$STATE_DIR/demo-fakes
rm -rf "$FAKE_DIR" && mkdir -p "$FAKE_DIR"
declare -A FAKE_PID
SEED=0
start_fake() {  # pod ip product k p
    local log=$FAKE_DIR/$1.log i
    SEED=$((SEED + 1))
    "$PYTHON" tests/support/fake_vllm.py --host "$2" --port 8000 --k "$4" --acceptance "$5" \
        --drafts-per-second 50 --model-name deepseek-v3 --seed "$SEED" >"$log" 2>&1 &
    PIDS+=($!)
    FAKE_PID[$1]=$!
    for i in $(seq 50); do
        grep -q fake_vllm_started "$log" 2>/dev/null && return 0
        kill -0 "${FAKE_PID[$1]}" 2>/dev/null || break
        sleep 0.1
    done
    echo "fake vLLM for $1 on $2:8000 did not start:"; cat "$log"; exit 1
}
pod_rows() {    # name ip product k, for the Ready pool pods
    kubectl get pods -n "$NS" -l "mtp-operator.io/mtpinference=$NAME" -o json | "$PYTHON" -c '
import json, sys
for p in json.load(sys.stdin)["items"]:
    st = p.get("status") or {}
    ready = any(c["type"] == "Ready" and c["status"] == "True" for c in st.get("conditions") or [])
    if not ready or not st.get("podIP") or p["metadata"].get("deletionTimestamp"):
        continue
    env = {e["name"]: e.get("value") for e in p["spec"]["containers"][0].get("env") or []}
    k = json.loads(env["MTP_RUNTIME_CONFIG"])["serve"]["num_speculative_tokens"]
    print(p["metadata"]["name"], st["podIP"], p["metadata"]["labels"]["mtp-operator.io/gpu-product"], k)
'
}

say "fake vLLM 0.33.0 /metrics on each pod IP:8000 (50 drafts/s; acceptance $HEALTHY_P, H100 pool $DEGRADED_P)"
printf '%-46s %-13s %-24s %s  %s\n' POD IP GPU_PRODUCT K ACCEPTANCE
while read -r pod ip product k; do
    p=$HEALTHY_P; [[ $product == "$H100" ]] && p=$DEGRADED_P
    start_fake "$pod" "$ip" "$product" "$k" "$p"
    printf '%-46s %-13s %-24s %s  %s\n' "$pod" "$ip" "$product" "$k" "$p"
done < <(pod_rows)
H100_BEFORE=$(kubectl get deploy -n "$NS" -l "mtp-operator.io/gpu-product=$H100,mtp-operator.io/mtpinference=$NAME" -o jsonpath='{.items[0].metadata.annotations.mtp-operator\.io/settings-hash}')
OTHERS_BEFORE=$(kubectl get deploy -n "$NS" -l "mtp-operator.io/gpu-product!=$H100,mtp-operator.io/mtpinference=$NAME" -o jsonpath='{range .items[*]}{.metadata.name}={.metadata.annotations.mtp-operator\.io/settings-hash}{" "}{end}')

say "waiting for the evaluator (window 10 s, for 5 s, at least 50 drafts) to roll the H100 pool back"
t0=$(date +%s)
for i in $(seq 300); do
    n=$(kubectl get mtpi "$NAME" -n "$NS" -o jsonpath='{.status.rollbacks[*].toK}')
    [[ -n $n ]] && break
    [[ $i == 300 ]] && { echo "no rollback in 90 s"; tail -n 30 "$OPLOG"; exit 1; }
    sleep 0.3
done
echo "rolled back $(( $(date +%s) - t0 )) s after the fakes started"
# The H100 pod is being replaced by one with the new K: its fake goes with it (vLLM restarts).
for pod in "${!FAKE_PID[@]}"; do
    if [[ $pod == "$NAME"-h100-* ]]; then kill "${FAKE_PID[$pod]}" 2>/dev/null || true; fi
done
wait_ready

say "kubectl get mtpi -n $NS (after)"
kubectl get mtpi -n "$NS"
say "pools (after): only the H100 pool's K changed"
pools
H100_AFTER=$(kubectl get deploy -n "$NS" -l "mtp-operator.io/gpu-product=$H100,mtp-operator.io/mtpinference=$NAME" -o jsonpath='{.items[0].metadata.annotations.mtp-operator\.io/settings-hash}')
OTHERS_AFTER=$(kubectl get deploy -n "$NS" -l "mtp-operator.io/gpu-product!=$H100,mtp-operator.io/mtpinference=$NAME" -o jsonpath='{range .items[*]}{.metadata.name}={.metadata.annotations.mtp-operator\.io/settings-hash}{" "}{end}')
echo "H100 settings-hash $H100_BEFORE -> $H100_AFTER; other pools $([[ $OTHERS_BEFORE == "$OTHERS_AFTER" ]] && echo unchanged || echo CHANGED)"

say "status.rollbacks and condition SpeculationRolledBack"
kubectl get mtpi "$NAME" -n "$NS" -o jsonpath='{range .status.rollbacks[*]}{.time}  {.gpuProduct}  K {.fromK} -> {.toK}  {.reason}  (via {.via}){"\n"}{end}'
kubectl get mtpi "$NAME" -n "$NS" -o jsonpath='{range .status.conditions[?(@.type=="SpeculationRolledBack")]}SpeculationRolledBack={.status} reason={.reason}: {.message}{"\n"}{end}'

say "Event SpeculationRolledBack"
UID_=$(kubectl get mtpi "$NAME" -n "$NS" -o jsonpath='{.metadata.uid}')
kubectl get events -n "$NS" --field-selector "reason=SpeculationRolledBack,involvedObject.uid=$UID_" \
    -o custom-columns='TYPE:.type,REASON:.reason,OBJECT:.involvedObject.name,MESSAGE:.message'

cleanup
trap - EXIT
if [[ ${MTP_DEMO_KEEP:-0} == 1 ]]; then
    kept="the demo's resources are kept (MTP_DEMO_KEEP=1)"
else
    # Its pools hold whole GPU nodes (tensorParallelSize 8): free them for `make test`.
    remove_demo
    kept="$NAME deleted again so its pods free the simulated GPUs (MTP_DEMO_KEEP=1 keeps it)"
fi
say "done in $(( $(date +%s) - started )) s: fake vLLM servers and the operator stopped; $kept"
cat <<EOF
The sandbox is still up:   export KUBECONFIG=$KUBECONFIG   (kubectl: $(command -v kubectl))
Stop it with:              ${MTP_SANDBOX_DIR:+MTP_SANDBOX_DIR=$MTP_SANDBOX_DIR }make sandbox-down
EOF
