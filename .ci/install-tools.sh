#!/usr/bin/env bash
# Install the real tools the tests run (deploy checks, fake NVML build, browser), from Debian's packages:
#   promtool        <- package `prometheus` (2.42.0 on bookworm; the server it also ships is not
#                      started here: no init system in CI, and nothing calls it)
#   docker-compose  <- package `docker-compose` (1.29.2; `docker-compose config` validates the
#                      compose file without a Docker engine). A working `docker compose` plugin
#                      is used instead when present.
# Idempotent and fast when the tools are already there: apt runs only for what is missing.
set -euo pipefail

packages=()
command -v promtool >/dev/null 2>&1 || packages+=(prometheus)
# gcc builds the stand-in libnvidia-ml.so.1 the GPU tests load under the real pynvml bindings.
command -v gcc >/dev/null 2>&1 || packages+=(gcc libc6-dev)
# chromium: the HTML report's browser test (tests/test_html_report.py) renders it headless through
# playwright's Python driver (pip, the test extra) with executable_path /usr/bin/chromium.
command -v chromium >/dev/null 2>&1 || packages+=(chromium)
if ! command -v docker-compose >/dev/null 2>&1 && ! docker compose version >/dev/null 2>&1; then
  packages+=(docker-compose)
fi

if ((${#packages[@]})); then
  sudo=""
  [[ $(id -u) -eq 0 ]] || sudo="sudo"
  echo "install-tools: installing ${packages[*]}"
  $sudo apt-get update -qq
  # policy-rc.d 101: never start the packaged prometheus service during install.
  policy=/usr/sbin/policy-rc.d
  if [[ ! -e $policy ]]; then
    printf '#!/bin/sh\nexit 101\n' | $sudo tee "$policy" >/dev/null
    $sudo chmod +x "$policy"
    trap '$sudo rm -f "$policy"' EXIT
  fi
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${packages[@]}" >/dev/null
fi

promtool --version 2>&1 | head -n 1
chromium --version 2>/dev/null | head -n 1
if docker compose version >/dev/null 2>&1; then
  docker compose version | head -n 1
else
  docker-compose version --short
fi
