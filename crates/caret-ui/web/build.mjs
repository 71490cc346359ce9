// Builds the workspace page into OUT (default: ./dist): the app bundle (Monaco's editor core
// and its language modes, split into chunks loaded when a language is first used), the
// editor worker, the stylesheet and the codicon font. No CDN: everything the page loads is
// in OUT. Run by crates/caret/build.rs (which embeds OUT in the binary) or `npm run build`.
import * as esbuild from 'esbuild';
import { copyFileSync, mkdirSync, readdirSync, rmSync, statSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

// WEB: the web/ directory (this file is copied next to the packages when cargo builds).
const here = process.env.WEB || dirname(fileURLToPath(import.meta.url));
const out = process.env.OUT || join(here, 'dist');
// Packages come from NODE_MODULES when the build runs elsewhere (cargo's OUT_DIR).
const nodePaths = process.env.NODE_MODULES ? [process.env.NODE_MODULES] : [];
rmSync(out, { recursive: true, force: true });
mkdirSync(out, { recursive: true });

const common = { bundle: true, minify: true, nodePaths, logLevel: 'warning', legalComments: 'none', target: 'chrome110' };
await esbuild.build({
  ...common,
  entryPoints: { app: join(here, 'src/main.js') },
  outdir: out,
  format: 'esm',
  splitting: true,
  chunkNames: 'chunks/[name]-[hash]',
  loader: { '.ttf': 'file' },
  assetNames: '[name]',
});
await esbuild.build({
  ...common,
  entryPoints: { 'editor.worker': 'monaco-editor/esm/vs/editor/editor.worker.js' },
  outdir: out,
  format: 'iife',
});
copyFileSync(join(here, 'src/index.html'), join(out, 'index.html'));

let bytes = 0;
let files = 0;
const walk = (dir) => {
  for (const name of readdirSync(dir)) {
    const p = join(dir, name);
    if (statSync(p).isDirectory()) walk(p);
    else {
      bytes += statSync(p).size;
      files += 1;
    }
  }
};
walk(out);
console.log(`web: ${files} files, ${(bytes / 1048576).toFixed(2)} MiB in ${out}`);
