#!/usr/bin/env bash
# Tools some tests drive besides Python: Node.js + npm (openai-node), Chromium (dashboard screenshot),
# redis-server (the quota tests start and stop one of their own), and wrk, the benchmark's load generator.
# Safe to run repeatedly; needs root for apt-get.
set -euo pipefail
cd "$(dirname "$0")/.."
need=()
command -v node >/dev/null || need+=(nodejs)
command -v npm >/dev/null || need+=(npm)
command -v chromium >/dev/null || need+=(chromium)
command -v wrk >/dev/null || need+=(wrk)
command -v redis-server >/dev/null || need+=(redis-server)
if [ ${#need[@]} -gt 0 ]; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi
# Installed again whenever a package the tests need is missing (the lock file pins the versions).
if [ -f tests/compat/node/package.json ] && { [ ! -f tests/compat/node/node_modules/openai/package.json ] \
    || [ ! -f tests/compat/node/node_modules/ai/package.json ] \
    || [ ! -f tests/compat/node/node_modules/@ai-sdk/deepseek/package.json ]; }; then
  (cd tests/compat/node && npm ci --no-audit --no-fund --silent)
fi
