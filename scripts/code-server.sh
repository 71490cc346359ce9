#!/usr/bin/env bash
# Installs code-server (VS Code in the browser, from the npm registry, pinned by
# editors/vscode/e2e/package-lock.json) for the VS Code extension's end-to-end test.
# Needs Debian's libkrb5-dev, libx11-dev, libxkbfile-dev, libsecret-1-dev (native modules)
# and ripgrep. Nothing is downloaded from outside the registries:
# - code-server's bundled VS Code runs `npm install` for its own modules in a postinstall
#   step, which refuses to run as root without `unsafe-perm` (set for it below) and which
#   npm may leave to be run by hand (install-script approval): then it is run here, with the
#   user agent it reads to tell which package manager is installing;
# - its @vscode/ripgrep would download rg from GitHub unless its cache directory holds the
#   archive, which Debian's rg fills.
set -euo pipefail
dir="$(cd "$(dirname "$0")/.." && pwd)/editors/vscode/e2e"
vscode="$dir/node_modules/code-server/lib/vscode"
if [ -x "$dir/node_modules/.bin/code-server" ] && [ -x "$vscode/node_modules/@vscode/ripgrep/bin/rg" ] &&
  [ -e "$vscode/node_modules/node-pty/build/Release/pty.node" ]; then
  exit 0
fi
tmp="$(node -p 'require("os").tmpdir()')"
cache="$tmp/vscode-ripgrep-cache-1.15.11"
mkdir -p "$cache"
tar czf "$cache/ripgrep-v13.0.0-10-x86_64-unknown-linux-musl.tar.gz" -C "$(dirname "$(command -v rg)")" rg
export npm_config_yes=true npm_config_unsafe_perm=true
npm ci --prefix "$dir" --no-audit --no-fund --loglevel=error 2> >(grep -v 'Unknown env config "unsafe-perm"' >&2)
if [ ! -e "$vscode/node_modules/node-pty/build/Release/pty.node" ]; then
  (cd "$dir/node_modules/code-server" &&
    npm_config_user_agent="npm/$(npm --version) node/$(node --version) linux x64" sh ./postinstall.sh >/dev/null)
fi
"$dir/node_modules/.bin/code-server" --version >/dev/null
