// The agent panel in VS Code's webview: the workspace page's own component (web/src), its
// calls posted to the extension, which makes them against `caret ui`.
import { AgentPanel } from '../../../crates/caret-ui/web/src/agent-panel.js';
import '../../../crates/caret-ui/web/src/style.css';
import './panel.css';

const vscode = acquireVsCodeApi();
const pending = new Map();
const listeners = new Map();
let next = 1;
let paths = [];
let docs = [];
let commands = [];

window.addEventListener('message', (e) => {
  const m = e.data;
  if (m.type === 'reply') {
    const p = pending.get(m.id);
    pending.delete(m.id);
    if (m.error) p?.reject(new Error(m.error));
    else p?.resolve(m.result);
  } else if (m.type === 'event') {
    listeners.get(m.session)?.(m.data);
  }
});

const call = (method, ...args) =>
  new Promise((resolve, reject) => {
    const id = next++;
    pending.set(id, { resolve, reject });
    vscode.postMessage({ type: 'call', id, method, args });
  });

const host = {
  start: () => call('start'),
  send: (id, op) => call('send', id, op),
  events: (id, onEvent) => {
    listeners.set(id, onEvent);
    return call('events', id);
  },
  review: () => call('review'),
  accept: (path) => call('accept', path),
  reject: (path) => call('reject', path),
  restore: (turn) => call('restore', turn),
  showDiff: (path) => call('showDiff', path),
  openFile: (path, line) => call('openFile', path, line),
  paths: () => paths,
  mcp: () => call('mcp'),
  docs: () => docs,
  commands: () => commands,
  parallel: {
    start: (task, n) => call('parallelStart', task, n),
    status: () => call('parallelStatus'),
    apply: (number) => call('parallelApply', number),
  },
  trustMcp: (name) => call('trustMcp', name),
};

call('paths').then((p) => (paths = p)).catch(() => {});
call('docs').then((d) => (docs = d)).catch(() => {});
call('commands').then((c) => (commands = c)).catch(() => {});
new AgentPanel(document.getElementById('agent'), host);
