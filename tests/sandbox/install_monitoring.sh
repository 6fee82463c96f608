#!/usr/bin/env bash
# Installs Prometheus and Alertmanager from Debian (prometheus 2.x, prometheus-alertmanager 0.2x)
# when /usr/bin/prometheus or /usr/bin/prometheus-alertmanager is missing. Idempotent: returns
# at once when both are present. No service is started; tests run them as plain processes
# (tests/sandbox/monitoring.py).
set -euo pipefail

if [[ -x /usr/bin/prometheus && -x /usr/bin/prometheus-alertmanager && -x /usr/bin/promtool ]]; then
  exit 0
fi
SUDO=()
if [[ $(id -u) -ne 0 ]]; then SUDO=(sudo -n); fi
export DEBIAN_FRONTEND=noninteractive
echo "[install-monitoring] apt-get install prometheus prometheus-alertmanager" >&2
# policy-rc.d 101 keeps the packages' maintainer scripts from starting services
if [[ ! -e /usr/sbin/policy-rc.d ]]; then
  printf '#!/bin/sh\nexit 101\n' | "${SUDO[@]}" tee /usr/sbin/policy-rc.d >/dev/null
  "${SUDO[@]}" chmod +x /usr/sbin/policy-rc.d
  trap '"${SUDO[@]}" rm -f /usr/sbin/policy-rc.d' EXIT
fi
"${SUDO[@]}" apt-get update -qq >&2
"${SUDO[@]}" apt-get install -y -qq --no-install-recommends prometheus prometheus-alertmanager >&2
/usr/bin/prometheus --version 2>&1 | head -1 >&2
/usr/bin/prometheus-alertmanager --version 2>&1 | head -1 >&2
