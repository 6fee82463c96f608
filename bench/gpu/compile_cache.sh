#!/usr/bin/env bash
# What a pod restart (every change of K) pays for compiling, and whether a cache folder that
# outlives the pod saves it. On the GPU machine, from the repository root, .gpu-carry carried:
#
#   CC_KS=2 CC_COMPILATION=production CC_BUDGET_S=570 bash bench/gpu/compile_cache.sh
#
# CC_VIA=runtime: each start with an empty HOME and no cache variable set, the folder named as
# the pool's model cache in its config, so the runtime's own choice (mtp_runtime.model_cache.
# compile_cache_env) is what keeps the kernels. CC_STARTS picks the starts (default below).
#
# Three engine starts of the 27B-class hybrid (realsize.py, one short point each), every one
# with HOME and every cache variable vLLM, Triton, torch and CUDA read pointed into one folder
# (what a cache volume mounted into the pod would hold):
#   cold:  folder A, empty (a new pod today: its caches live in the container's file system)
#   warm:  folder A again, as the cold start left it (a new pod with the cache volume)
#   fresh: folder B, empty, if the time box still holds a cold start (the control: the same
#          machine, its page cache and GPU state warm, only the folder new)
# Each start's results (ready_s among them) in $OUT/<start>/, the folder's size per cache in
# $OUT/<start>/cache-du.txt. Written as it goes.
set -u
OUT="${OUT:-/tmp/mtp-out}"
mkdir -p "$OUT"
T0=$(date +%s)
left() { echo $(( ${CC_BUDGET_S:-570} - ($(date +%s) - T0) )); }
nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | tee "$OUT/card.txt"
last=0
for start in ${CC_STARTS:-cold:A warm:A fresh:B}; do
  name="${start%%:*}"; root="/tmp/compile-cache-${start##*:}"
  need=${CC_COLD_S:-260}
  [ "$last" -eq 0 ] || need=$(( last + 40 ))
  [ "$name" = warm ] && need=120
  if [ "$(left)" -lt "$need" ]; then
    echo "$name: skipped, $(left) s left, a start needs ~$need s" | tee -a "$OUT/summary.txt"
    continue
  fi
  mkdir -p "$root/home" "$OUT/$name"
  t=$(date +%s)
  args="--levels 0.8 --concurrency 1 --per-k-estimate 60 --compilation ${CC_COMPILATION:-production}"
  if [ "${CC_VIA:-env}" = runtime ]; then
    # the runtime's own choice: a fresh HOME each start (nothing kept outside the folder), the
    # folder named as the pool's model cache, so mtp-runtime sets the variables it keeps
    home="/tmp/compile-home-$name-$(date +%s)"; mkdir -p "$home"
    HOME="$home" OUT="$OUT/$name" REALSIZE_KINDS=qwen35-27b REALSIZE_KS="${CC_KS:-2}" \
      REALSIZE_ARGS="$args --model-cache $root" \
      REALSIZE_BUDGET_S="$(( $(left) - 10 ))" bash .gpu-carry/realsize.sh > "$OUT/$name/call.log" 2>&1
  else
    HOME="$root/home" XDG_CACHE_HOME="$root/xdg" VLLM_CACHE_ROOT="$root/vllm" \
      TRITON_CACHE_DIR="$root/triton" TORCHINDUCTOR_CACHE_DIR="$root/inductor" \
      CUDA_CACHE_PATH="$root/nv" FLASHINFER_WORKSPACE_BASE="$root/flashinfer" \
      OUT="$OUT/$name" REALSIZE_KINDS=qwen35-27b REALSIZE_KS="${CC_KS:-2}" REALSIZE_ARGS="$args" \
      REALSIZE_BUDGET_S="$(( $(left) - 10 ))" bash .gpu-carry/realsize.sh > "$OUT/$name/call.log" 2>&1
  fi
  took=$(( $(date +%s) - t ))
  [ "$name" = cold ] && last=$took
  [ "$name" = fresh ] && [ "$last" -eq 0 ] && last=$took
  du -s --block-size=1K "$root"/* "$root"/*/* "$root"/home/.[a-z]* "$root"/home/.cache/* \
    2>/dev/null > "$OUT/$name/cache-du.txt"
  grep -ho '"VLLM_CACHE_ROOT": "[^"]*"\|"TRITON_CACHE_DIR": "[^"]*"' "$OUT/$name/realsize.log" \
    /tmp/mtp-realsize/*-serve-k*.log 2>/dev/null | sort -u >> "$OUT/$name/cache-du.txt"
  ready=$(grep -ho '"ready_s": [0-9.]*' "$OUT/$name"/*-results.json 2>/dev/null | head -1)
  echo "$name ($root): ${took} s for the call, ${ready:-no ready_s}" | tee -a "$OUT/summary.txt"
done
