#!/usr/bin/env bash
# Tries `caret lsp` in the editors installed here, through their own LSP clients:
# Neovim (0.7+, built-in client) and Emacs (eglot 1.9+). Each opens a Python file, asks for a
# completion at `    p = ` and runs `caret.apply` (the editor applies the server's edit).
#
#   scripts/editor-check.sh [CARET_BIN]     (default: caret on PATH)
#
# Uses caret's configuration as it is (CARET_HOME): configure a `tab` model first, or the
# completion comes back empty. Debian: apt-get install neovim emacs-nox elpa-eglot
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
caret="$(command -v "${1:-caret}")"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/ws"
sample() {
  printf 'def area(w, h):\n    return w * h\n\n\ndef perimeter(w, h):\n    return 2 * (w + h)\n\n\ndef describe(w, h):\n    a = area(w, h)\n    p = \n' > "$work/ws/shapes.py"
}
status=0
check() { # editor, output file
  if grep -q "2 \* w + 2 \* h" "$2" && grep -q "^completion" "$2"; then
    echo "== $1: ok"
  else
    echo "== $1: FAILED"
    status=1
  fi
  sed 's/^/   /' "$2"
}
if command -v nvim > /dev/null; then
  sample
  CARET_BIN="$caret" WS="$work/ws" OUT="$work/nvim.txt" \
    timeout 300 nvim --headless -u NONE -c "luafile $here/editors/neovim.lua" > "$work/nvim.log" 2>&1 || true
  touch "$work/nvim.txt"
  check "neovim $(nvim --version | head -1)" "$work/nvim.txt"
else
  echo "== neovim: not installed"
fi
if command -v emacs > /dev/null; then
  sample
  CARET_BIN="$caret" WS="$work/ws" OUT="$work/emacs.txt" \
    timeout 300 emacs --batch -l "$here/editors/emacs-eglot.el" > "$work/emacs.log" 2>&1 || true
  touch "$work/emacs.txt"
  check "emacs $(emacs --version | head -1) + eglot" "$work/emacs.txt"
else
  echo "== emacs: not installed"
fi
exit $status
