import assert from 'node:assert/strict';
import { test } from 'node:test';
import {
  ModelOffer,
  NextEditState,
  SseParser,
  debounce,
  defaults,
  focusParams,
  initializationOptions,
  loginArgs,
  lspArgs,
  offerMessage,
  parseUiAddress,
  pullPercent,
  readSettings,
  searchItems,
  uiArgs,
} from '../src/logic';

test('settings map to the language server and the page server', () => {
  const values: Record<string, unknown> = { tabModel: 'tab-big', budget: 1024.7, debounceMs: 40, family: 'qwen-coder', token: 7 };
  const s = readSettings((k) => values[k]);
  assert.equal(s.path, 'caret', 'unset: the default');
  assert.equal(s.token, '', 'a value of the wrong type is ignored');
  assert.deepEqual(initializationOptions(s), { model: 'tab-big', family: 'qwen-coder', budget: 1024, debounce_ms: 40 });
  assert.deepEqual(initializationOptions(defaults), {});
  assert.deepEqual(lspArgs(s), ['lsp']);
  assert.deepEqual(lspArgs({ ...s, server: 'https://caret.example', token: 't0k' }), ['lsp', '--server', 'https://caret.example', '--token', 't0k']);
  assert.deepEqual(uiArgs('/w', { ...s, agentModel: 'agent-x' }), ['ui', '/w', '--model', 'agent-x', '--tab-model', 'tab-big']);
  assert.equal(loginArgs(s), null, 'no team server: nothing to sign in to');
  assert.deepEqual(loginArgs({ ...s, server: 'https://caret.example' }), ['login', '--server', 'https://caret.example']);
});

test("caret ui's address is read from its first line, and nothing else passes", () => {
  const token = 'ab'.repeat(32);
  assert.deepEqual(parseUiAddress(`caret ui: http://127.0.0.1:4242/#token=${token}\n`), { base: 'http://127.0.0.1:4242', token });
  assert.equal(parseUiAddress(`caret ui: http://evil.example:4242/#token=${token}`), null, 'loopback only');
  assert.equal(parseUiAddress('caret ui: http://127.0.0.1:4242/#token=short'), null);
  assert.equal(parseUiAddress('warning: something'), null);
});

test('server-sent events are split across chunks and bad ones skipped', () => {
  const p = new SseParser();
  assert.deepEqual(p.push('data: {"type":"turn_begin","turn":1}\n\ndata: {"ty'), [{ type: 'turn_begin', turn: 1 }]);
  assert.deepEqual(p.push('pe":"text_delta","text":"hi"}\n\n: comment\n\ndata: {not json}\n\n'), [{ type: 'text_delta', text: 'hi' }]);
  assert.deepEqual(p.push('event: x\ndata: [1,\ndata: 2]\n\n'), [[1, 2]], 'data lines join');
});

test('search hits become quick pick items that open at their line', () => {
  const items = searchItems([
    { path: 'src/auth/token.rs', line: 12, end_line: 30, snippet: '\n  pub fn check(token: &str) -> bool {\n', score: 0.9 },
    { path: 'README.md', line: 3, snippet: 'Caret' },
  ]);
  assert.deepEqual(items[0], { label: 'token.rs', description: 'src/auth · line 12–30', detail: 'pub fn check(token: &str) -> bool {', path: 'src/auth/token.rs', line: 12 });
  assert.deepEqual(items[1], { label: 'README.md', description: 'line 3', detail: 'Caret', path: 'README.md', line: 3 });
});

test('focus notifications and the debounce', async () => {
  assert.deepEqual(focusParams('file:///w/a.py', 3, 8), { textDocument: { uri: 'file:///w/a.py' }, position: { line: 3, character: 8 } });
  const seen: number[] = [];
  const f = debounce((n: number) => seen.push(n), 20);
  f(1);
  f(2);
  f(3);
  await new Promise((r) => setTimeout(r, 60));
  f(4);
  await new Promise((r) => setTimeout(r, 60));
  assert.deepEqual(seen, [3, 4]);
});

test('next edit: Tab jumps to a prediction elsewhere (opening its file), then applies it; Esc drops it', () => {
  const s = new NextEditState();
  const uri = 'file:///w/a.py';
  const edit = { textDocument: { uri }, range: { start: { line: 7, character: 4 }, end: { line: 7, character: 10 } }, newText: 'xs', reason: 'repeat' };
  assert.deepEqual(s.tab(uri, { line: 0, character: 0 }), { kind: 'none' }, 'nothing shown');
  s.offer(edit);
  assert.deepEqual(
    s.tab('file:///w/b.py', { line: 7, character: 4 }),
    { kind: 'open', uri, to: { line: 7, character: 4 } },
    'from another document: its file opened at the target',
  );
  assert.deepEqual(s.tab(uri, { line: 2, character: 3 }), { kind: 'jump', to: { line: 7, character: 4 } });
  assert.deepEqual(s.tab(uri, { line: 7, character: 4 }), { kind: 'apply', edit });
  assert.equal(s.current(), undefined, 'applied once');
  s.offer(edit);
  s.dismiss();
  assert.deepEqual(s.tab(uri, { line: 7, character: 4 }), { kind: 'none' });
  s.offer(null);
  assert.equal(s.current(), undefined);
});

test('the default model offer: the question, and a download as a percentage', () => {
  const offer: ModelOffer = {
    needed: true,
    model: 'qwen2.5-coder-1.5b-instruct-q4',
    size_text: '1.0 GiB',
    pull: { state: 'pulling', done: 512, total: 2048 },
  };
  assert.equal(
    offerMessage(offer),
    "Caret: no model is configured. Download the default code model, qwen2.5-coder-1.5b-instruct-q4 (1.0 GiB, runs on this machine's CPU)?",
  );
  assert.equal(pullPercent(offer.pull), 25);
  assert.equal(pullPercent({ state: 'pulling', done: 5, total: 0 }), 0, 'no total yet');
  assert.equal(pullPercent({ state: 'pulling', done: 9, total: 4 }), 100, 'never past the end');
  assert.equal(pullPercent({ state: 'done', done: 0, total: 0 }), 100);
});
