// Bundles the extension (dist/extension.js), the agent panel's webview (media/panel.js and
// panel.css, from the workspace page's component in ../../crates/caret-ui/web/src) and, with --tests, the
// logic's tests (dist-test/, for `node --test`).
import * as esbuild from 'esbuild';
import { readdirSync, rmSync } from 'node:fs';

const common = { bundle: true, minify: true, logLevel: 'warning', legalComments: 'none' };
await esbuild.build({
  ...common,
  entryPoints: ['src/extension.ts'],
  outfile: 'dist/extension.js',
  platform: 'node',
  format: 'cjs',
  target: 'node18',
  external: ['vscode'],
});
await esbuild.build({
  ...common,
  entryPoints: { panel: 'webview/main.js' },
  outdir: 'media',
  format: 'iife',
  target: 'chrome110',
  loader: { '.ttf': 'empty' },
});
if (process.argv.includes('--tests')) {
  rmSync('dist-test', { recursive: true, force: true });
  const tests = readdirSync('test').filter((f) => f.endsWith('.test.ts'));
  await esbuild.build({
    ...common,
    minify: false,
    entryPoints: tests.map((f) => `test/${f}`),
    outdir: 'dist-test',
    outExtension: { '.js': '.mjs' },
    platform: 'node',
    format: 'esm',
    target: 'node18',
  });
}
