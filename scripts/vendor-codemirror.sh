#!/bin/sh
# Rebuilds static/vendor/codemirror-6.0.2.min.js, the kernel lab's editor (templates/lab.html): CodeMirror 6
# with Python highlighting and diagnostics, bundled by esbuild as one script defining the global CM.
# Needs Node.js and npm; the bundle is committed, so the server needs neither.
set -eu
out="$(cd "$(dirname "$0")/.." && pwd)/static/vendor/codemirror-6.0.2.min.js"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cd "$work"
npm init -y >/dev/null
npm install --silent codemirror@6.0.2 @codemirror/lang-python@6.2.1 @codemirror/lint@6.9.8 \
  @codemirror/view@6.44.2 @codemirror/state@6.7.6 @codemirror/commands@6.11.2 esbuild@0.28.2
cat > entry.js <<'JS'
export { EditorView, basicSetup } from "codemirror";
export { python } from "@codemirror/lang-python";
export { setDiagnostics, lintGutter } from "@codemirror/lint";
export { keymap } from "@codemirror/view";
export { indentWithTab } from "@codemirror/commands";
JS
./node_modules/.bin/esbuild entry.js --bundle --minify --format=iife --global-name=CM --legal-comments=none \
  --outfile="$out"
