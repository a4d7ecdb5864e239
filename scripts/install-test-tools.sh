#!/usr/bin/env bash
# Tools some tests drive besides Python: Node.js + npm (openai-node; the Claude Code and Codex CLIs of
# tests/compat/test_cli.py, pinned in tests/compat/cli/package-lock.json), Chromium (dashboard screenshot),
# redis-server (the quota tests start and stop one of their own), and wrk, the benchmark's load generator.
# Safe to run repeatedly; needs root for apt-get.
set -euo pipefail
cd "$(dirname "$0")/.."
need=()
command -v node >/dev/null || need+=(nodejs)
command -v npm >/dev/null || need+=(npm)
command -v chromium >/dev/null || need+=(chromium)
# a CJK font, without which Chromium draws the Chinese dashboard (tests/web/test_dashboard_lead.py) as boxes
[ -f /usr/share/fonts/truetype/wqy/wqy-microhei.ttc ] || need+=(fonts-wqy-microhei)
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
# The real Claude Code and Codex CLIs, at the versions tests/compat/cli/package.json pins (installed again when
# one is missing or another version is installed).
if [ -f tests/compat/cli/package.json ] && ! (cd tests/compat/cli && node -e '
    const pins = require("./package.json").dependencies;
    for (const [name, version] of Object.entries(pins)) {
      let found; try { found = require(`./node_modules/${name}/package.json`).version } catch { process.exit(1) }
      if (found !== version) process.exit(1);
    }' && [ -x node_modules/.bin/claude ] && [ -x node_modules/.bin/codex ]); then
  (cd tests/compat/cli && npm ci --no-audit --no-fund --silent)
fi
