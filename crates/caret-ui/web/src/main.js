// The workspace page: file tree, tabs, Monaco with Tab's ghost text, the agent panel with
// its review of changed files, codebase search and background runs — all over the `caret
// ui` server's API (see api.js).
import * as monaco from 'monaco-editor/esm/vs/editor/edcore.main.js';
import 'monaco-editor/esm/vs/basic-languages/monaco.contribution.js';
import './style.css';
import { call, get, onServer, post, put, signIn, stream } from './api.js';
import { AgentPanel } from './agent-panel.js';
import * as runs from './runs.js';
import { installNextEdit } from './next-edit.js';
import { offerModel } from './model-offer.js';

self.MonacoEnvironment = { getWorkerUrl: () => 'assets/editor.worker.js' };

const $ = (sel) => document.querySelector(sel);
const state = {
  info: null,
  paths: [],
  tabs: new Map(), // path → { model, version, saved, conflict, viewState }
  active: null,
  review: null, // path shown in the diff editor
  tab: { shown: 0, accepted: 0 },
};
// What tests and benchmarks read.
window.caret = { state, monaco };

const status = (text, kind = 'ok') => {
  const s = $('#status');
  s.textContent = text;
  s.dataset.state = kind;
};

// ---- editor -----------------------------------------------------------------------------

const editor = monaco.editor.create($('#editor'), {
  theme: 'vs-dark',
  automaticLayout: true,
  inlineSuggest: { enabled: true, mode: 'prefix' },
  minimap: { enabled: false },
  fontSize: 13,
  tabSize: 4,
  scrollBeyondLastLine: false,
  model: null,
});
window.caret.editor = editor;
const diffEditor = monaco.editor.createDiffEditor($('#diff'), {
  theme: 'vs-dark',
  automaticLayout: true,
  readOnly: true,
  renderSideBySide: true,
  minimap: { enabled: false },
});
window.caret.diffEditor = diffEditor;

const uriOf = (path) => monaco.Uri.from({ scheme: 'file', path: `/${path}` });
const pathOf = (model) => model.uri.path.slice(1);

function showPane(which) {
  $('#review-accept').hidden = false;
  $('#review-reject').hidden = false;
  $('#editor').hidden = which !== 'editor';
  $('#diff').hidden = which !== 'diff';
  $('#empty').hidden = which !== 'empty';
  $('#review-bar').hidden = which !== 'diff';
}

function renderTabs() {
  const bar = $('#tabs');
  bar.replaceChildren();
  for (const [path, t] of state.tabs) {
    const dirty = t.model.getValue() !== t.saved;
    const tab = document.createElement('div');
    tab.className = `tab${path === state.active ? ' on' : ''}${dirty ? ' dirty' : ''}${t.conflict ? ' conflict' : ''}`;
    tab.dataset.path = path;
    tab.title = path;
    const name = document.createElement('span');
    name.textContent = path.split('/').pop();
    name.onclick = () => activate(path);
    const close = document.createElement('button');
    close.className = 'close';
    close.textContent = dirty ? '●' : '×';
    close.onclick = (e) => {
      e.stopPropagation();
      closeTab(path);
    };
    tab.append(name, close);
    bar.append(tab);
  }
}

function showConflict() {
  const t = state.tabs.get(state.active);
  $('#conflict').hidden = !t?.conflict;
  if (t?.conflict) {
    $('#conflict-text').textContent = `${state.active} changed on disk while you had unsaved edits. Your edits are kept here until you choose.`;
  }
}

async function openFile(path, line) {
  if (!state.tabs.has(path)) {
    let file;
    try {
      file = await get(`/api/file?path=${encodeURIComponent(path)}`);
    } catch (e) {
      status(`${path}: ${e.message}`, 'error');
      return;
    }
    const model = monaco.editor.getModel(uriOf(path)) || monaco.editor.createModel(file.text, undefined, uriOf(path));
    model.setValue(file.text);
    const t = { model, version: file.version, saved: file.text, conflict: null, viewState: null };
    model.onDidChangeContent(() => renderTabs());
    state.tabs.set(path, t);
    nextEdit.follow(model);
  }
  activate(path);
  if (line) {
    editor.revealLineInCenter(line);
    editor.setPosition({ lineNumber: line, column: 1 });
  }
  editor.focus();
  warm();
}

function activate(path) {
  const prev = state.tabs.get(state.active);
  if (prev) prev.viewState = editor.saveViewState();
  state.active = path;
  const t = state.tabs.get(path);
  editor.setModel(t.model);
  if (t.viewState) editor.restoreViewState(t.viewState);
  showPane('editor');
  renderTabs();
  showConflict();
  for (const li of document.querySelectorAll('#tree li.file')) li.classList.toggle('on', li.dataset.path === path);
}

function closeTab(path) {
  const t = state.tabs.get(path);
  if (!t) return;
  if (t.model.getValue() !== t.saved && !confirm(`${path} has unsaved changes. Close it anyway?`)) return;
  state.tabs.delete(path);
  t.model.dispose();
  if (state.active === path) {
    const next = [...state.tabs.keys()].pop();
    state.active = null;
    if (next) activate(next);
    else {
      editor.setModel(null);
      showPane('empty');
    }
  }
  renderTabs();
}

async function save(force = false) {
  const path = state.active;
  const t = state.tabs.get(path);
  if (!t) return;
  const text = t.model.getValue();
  try {
    const r = await put('/api/file', { path, text, base: force ? null : t.version });
    t.version = r.version;
    t.saved = text;
    t.conflict = null;
    status(`saved ${path}`);
  } catch (e) {
    if (e.status === 409) {
      t.conflict = { version: e.body.version, text: e.body.text };
      status(`${path} changed on disk: not saved`, 'error');
    } else status(`saving ${path}: ${e.message}`, 'error');
  }
  renderTabs();
  showConflict();
}

editor.addCommand(monaco.KeyMod.CtrlCmd | monaco.KeyCode.KeyS, () => save());
const nextEdit = installNextEdit(monaco, editor, pathOf, openFile);

$('#conflict-disk').onclick = () => {
  const t = state.tabs.get(state.active);
  if (!t?.conflict) return;
  t.model.setValue(t.conflict.text);
  t.saved = t.conflict.text;
  t.version = t.conflict.version;
  t.conflict = null;
  renderTabs();
  showConflict();
};
$('#conflict-mine').onclick = () => save(true);

// A file changed on disk: an open tab without unsaved edits reloads (the cursor kept); one
// with unsaved edits keeps them and shows the conflict.
async function changedOnDisk(path) {
  const t = state.tabs.get(path);
  if (!t) return;
  let file;
  try {
    file = await get(`/api/file?path=${encodeURIComponent(path)}`);
  } catch (e) {
    if (e.status === 404) status(`${path} was deleted on disk (the tab keeps its text)`, 'error');
    return;
  }
  if (file.version === t.version) return;
  const current = t.model.getValue();
  if (current === t.saved || current === file.text) {
    const view = state.active === path ? editor.saveViewState() : null;
    t.model.pushEditOperations([], [{ range: t.model.getFullModelRange(), text: file.text }], () => null);
    t.saved = file.text;
    t.version = file.version;
    t.conflict = null;
    if (view) editor.restoreViewState(view);
    status(`reloaded ${path}`);
  } else {
    t.conflict = { version: file.version, text: file.text };
  }
  renderTabs();
  showConflict();
}

// ---- file tree --------------------------------------------------------------------------

function buildTree(paths) {
  const root = { dirs: new Map(), files: [] };
  for (const p of paths) {
    const parts = p.split('/');
    let node = root;
    for (const d of parts.slice(0, -1)) {
      if (!node.dirs.has(d)) node.dirs.set(d, { dirs: new Map(), files: [] });
      node = node.dirs.get(d);
    }
    node.files.push(p);
  }
  return root;
}

function renderTree() {
  const open = new Set([...document.querySelectorAll('#tree li.dir.open')].map((li) => li.dataset.path));
  const render = (node, prefix, ul) => {
    for (const [name, child] of [...node.dirs].sort((a, b) => a[0].localeCompare(b[0]))) {
      const path = prefix + name;
      const li = document.createElement('li');
      li.className = `dir${open.has(path) ? ' open' : ''}`;
      li.dataset.path = path;
      const label = document.createElement('span');
      label.textContent = name;
      label.onclick = () => li.classList.toggle('open');
      const sub = document.createElement('ul');
      render(child, `${path}/`, sub);
      li.append(label, sub);
      ul.append(li);
    }
    for (const path of node.files.sort()) {
      const li = document.createElement('li');
      li.className = `file${path === state.active ? ' on' : ''}`;
      li.dataset.path = path;
      li.textContent = path.split('/').pop();
      li.onclick = () => openFile(path);
      ul.append(li);
    }
  };
  const ul = $('#tree');
  ul.replaceChildren();
  render(buildTree(state.paths), '', ul);
}

async function loadTree() {
  const t = await get('/api/tree');
  state.paths = t.files;
  renderTree();
}

// ---- watching the disk ------------------------------------------------------------------

async function watch() {
  for (;;) {
    try {
      await stream('/api/watch', (e) => {
        if (e.type === 'changed') changedOnDisk(e.path);
        if (e.type === 'tree') loadTree();
      });
    } catch (e) {
      status(`lost the server: ${e.message}`, 'error');
    }
    await new Promise((r) => setTimeout(r, 1000));
  }
}

// ---- Tab --------------------------------------------------------------------------------

let warmTimer = null;
function warm() {
  clearTimeout(warmTimer);
  warmTimer = setTimeout(() => {
    const model = editor.getModel();
    const pos = editor.getPosition();
    if (!model || !pos || !state.info?.tab) return;
    post('/api/tab/open', { path: pathOf(model), text: model.getValue(), cursor: model.getOffsetAt(pos) }).catch(() => {});
  }, 300);
}
editor.onDidChangeCursorSelection((e) => {
  const p = e.selection.getPosition();
  $('#cursor').textContent = `Ln ${p.lineNumber}, Col ${p.column}`;
  const model = editor.getModel();
  if (e.reason !== 0 /* not from typing */) warm();
  // Typing: ask at once, as an editor speaking LSP would; Monaco asks the provider 50 ms
  // later (its own debounce), which then takes this same request.
  else if (e.source === 'keyboard' && model && state.info?.tab) ask(model, model.getOffsetAt(p)).catch(() => {});
});

// The request in flight, shared by the keystroke that sent it and Monaco's provider call for
// the same text and cursor.
let inFlight = null;
function ask(model, offset) {
  const key = `${model.uri}|${model.getAlternativeVersionId()}|${offset}`;
  if (inFlight?.key === key && !inFlight.ac.signal.aborted) return inFlight.promise;
  inFlight?.ac.abort();
  const ac = new AbortController();
  const promise = post('/api/tab/complete', { path: pathOf(model), text: model.getValue(), cursor: offset }, ac.signal);
  inFlight = { key, ac, promise };
  return promise;
}

// Keystroke → suggestion, for benchmarks: each provider call's time from the last key press to
// the suggestion handed to the editor.
window.caret.tabLog = [];
// Callbacks waiting for the next provider answer (benchmarks wait without polling).
window.caret.tabWaiters = [];
const logTab = (entry) => {
  window.caret.tabLog.push(entry);
  for (const w of window.caret.tabWaiters.splice(0)) w(window.caret.tabLog.length);
};
editor.onKeyDown(() => {
  state.lastKey = performance.now();
});

// What was reported, for tests.
window.caret.feedbackLog = [];
const feedback = (event, item) => {
  window.caret.feedbackLog.push({ event, key: item?.key });
  post('/api/tab/feedback', { event, model: item?.model || state.info?.tab || '' }).catch(() => {});
};

// Live provider items per suggestion key, and what became of each suggestion shown.
const suggestions = new Map();
const outcome = new Map();

monaco.editor.registerCommand('caret.tab.accepted', (_accessor, item) => {
  // (Accepted whole after a part: counted once, as accepted.)
  if (outcome.get(item.key) === 'accepted' || outcome.get(item.key) === 'reported') return;
  outcome.set(item.key, 'accepted');
  state.tab.accepted += 1;
  feedback('accepted', item);
});

monaco.languages.registerInlineCompletionsProvider({ pattern: '**' }, {
  async provideInlineCompletions(model, position, _context, token) {
    if (!state.info?.tab) return { items: [] };
    const started = performance.now();
    let r;
    try {
      const asked = ask(model, model.getOffsetAt(position));
      const mine = inFlight;
      // Monaco cancels a call it no longer needs (and may ask again for the same spot at
      // once, which then sends a new request).
      token.onCancellationRequested(() => {
        if (inFlight === mine) {
          mine.ac.abort();
          inFlight = null;
        }
      });
      r = await asked;
    } catch (e) {
      if (e.name !== 'AbortError' && e.status !== 409) $('#tab-status').textContent = `Tab: ${e.message}`;
      logTab({ ms: null });
      return { items: [] };
    }
    logTab({ ms: performance.now() - (state.lastKey ?? started), cached: r?.cached, text: r?.text ?? '' });
    if (!r?.text) return { items: [] };
    $('#tab-status').textContent = `Tab ${r.cached ? 'cached' : `${Math.round(r.ms)} ms`} · round trip ${Math.round(performance.now() - started)} ms`;
    const item = {
      insertText: r.text,
      range: new monaco.Range(position.lineNumber, position.column, position.lineNumber, position.column),
      model: r.model,
      // The same suggestion for the same text and spot, however often Monaco asks for it.
      key: `${model.uri}|${model.getAlternativeVersionId()}|${model.getOffsetAt(position)}|${r.text}`,
    };
    suggestions.set(item.key, (suggestions.get(item.key) ?? 0) + 1);
    item.command = { id: 'caret.tab.accepted', title: 'accepted', arguments: [item] };
    return { items: [item] };
  },
  // Counted once per suggestion (text and spot), not per provider item: Monaco may ask again
  // for a suggestion it is showing.
  handleItemDidShow(_completions, item) {
    item.shown = true;
    if (outcome.has(item.key)) return;
    outcome.set(item.key, 'shown');
    state.tab.shown += 1;
    feedback('shown', item);
  },
  // Accepted in part: reported when the suggestion goes, unless it was then accepted whole.
  // (Monaco also calls this with nothing accepted, when a Tab lands mid-refresh.)
  handlePartialAccept(_completions, item, acceptedCharacters) {
    if (acceptedCharacters > 0 && outcome.get(item.key) === 'shown') outcome.set(item.key, 'partial');
  },
  freeInlineCompletions(completions) {
    for (const item of completions.items) {
      const left = (suggestions.get(item.key) ?? 1) - 1;
      if (left > 0) {
        suggestions.set(item.key, left);
        continue;
      }
      suggestions.delete(item.key);
      if (!item.shown) continue;
      // Monaco may free a suggestion accepted in part just before it runs the command of the
      // whole accept: the outcome is read a moment later.
      setTimeout(() => {
        const end = outcome.get(item.key);
        if (end === 'shown' || end === 'partial') feedback(end === 'shown' ? 'rejected' : 'partial', item);
        if (end !== undefined) outcome.set(item.key, 'reported');
        if (outcome.size > 1000) outcome.delete(outcome.keys().next().value);
      }, 1000);
    }
  },
});

// ---- review: the agent's changes as diffs ------------------------------------------------

async function showDiff(path) {
  let d;
  try {
    d = await get(`/api/review/diff?path=${encodeURIComponent(path)}`);
  } catch (e) {
    status(e.message, 'error');
    return;
  }
  const lang = monaco.languages.getLanguages().find((l) => l.extensions?.some((x) => path.endsWith(x)))?.id;
  const old = diffEditor.getModel();
  diffEditor.setModel({
    original: monaco.editor.createModel(d.before ?? '', lang),
    modified: monaco.editor.createModel(d.after ?? '', lang),
  });
  old?.original.dispose();
  old?.modified.dispose();
  state.review = path;
  $('#review-title').textContent = `${path} — the agent's change`;
  showPane('diff');
}

const reviewHost = {
  review: () => get('/api/review'),
  accept: async (path) => {
    await post('/api/review/accept', { path });
    afterReview(path);
  },
  reject: async (path) => {
    await post('/api/review/reject', { path });
    afterReview(path);
  },
};

function afterReview(path) {
  if (state.review === path) {
    state.review = null;
    showPane(state.active ? 'editor' : 'empty');
  }
  changedOnDisk(path);
}

restoreReviewButtons();
$('#review-close').onclick = () => {
  state.review = null;
  showPane(state.active ? 'editor' : 'empty');
};

// ---- agent panel ------------------------------------------------------------------------

const panel = new AgentPanel($('#agent'), {
  start: () => post('/api/agent/sessions', {}),
  send: (id, op) => post(`/api/agent/sessions/${id}/ops`, op),
  events: (id, onEvent, signal) => stream(`/api/agent/sessions/${id}/events`, onEvent, signal),
  ...reviewHost,
  restore: async (turn) => {
    const r = await post('/api/checkpoints/restore', { turn });
    for (const p of r.restored || []) changedOnDisk(p);
  },
  showDiff,
  openFile,
  paths: () => state.paths,
  mcp: () => get('/api/mcp'),
  docs: () => state.docs || [],
  commands: () => state.commands || [],
  parallel: {
    start: (task, n) => post('/api/parallel', { task, n }),
    status: () => get('/api/parallel'),
    apply: (number) => post('/api/parallel/apply', { number }),
  },
  trustMcp: (name) => post('/api/mcp/trust', { name }),
});
window.caret.panel = panel;
get('/api/docs').then((r) => (state.docs = r.sources.map((s) => s.name))).catch(() => {});
get('/api/commands').then((r) => (state.commands = r.commands)).catch(() => {});

// ---- Cmd-K: an instruction applied to the selection -------------------------------------

// Ctrl-K opens an instruction box above the editor for the selected lines; Enter sends it,
// and the model's rewrite comes back as a diff to accept or reject.
const cmdk = { form: $('#cmdk'), input: $('#cmdk-input'), selection: null };

function closeCmdk() {
  cmdk.form.hidden = true;
  cmdk.selection = null;
  editor.focus();
}

editor.addAction({
  id: 'caret.edit-selection',
  label: 'Caret: Edit the selection with an instruction',
  keybindings: [monaco.KeyMod.CtrlCmd | monaco.KeyCode.KeyK],
  run: (ed) => {
    const model = ed.getModel();
    const sel = ed.getSelection();
    if (!model || !sel) return;
    cmdk.selection = { model, start: model.getOffsetAt(sel.getStartPosition()), end: model.getOffsetAt(sel.getEndPosition()) };
    cmdk.form.hidden = false;
    cmdk.input.select();
    cmdk.input.focus();
  },
});

$('#cmdk-cancel').onclick = closeCmdk;
cmdk.input.addEventListener('keydown', (ev) => {
  if (ev.key === 'Escape') closeCmdk();
});

cmdk.form.onsubmit = async (ev) => {
  ev.preventDefault();
  const instruction = cmdk.input.value.trim();
  const target = cmdk.selection;
  if (!instruction || !target) return;
  const { model } = target;
  const path = pathOf(model);
  const before = model.getValue();
  cmdk.form.hidden = true;
  cmdk.selection = null;
  status('editing…', 'busy');
  try {
    const r = await post('/api/edit', { path, text: before, start: target.start, end: target.end, instruction });
    diffEditor.setModel({
      original: monaco.editor.createModel(before, model.getLanguageId()),
      modified: monaco.editor.createModel(r.text, model.getLanguageId()),
    });
    state.review = null;
    $('#review-title').textContent = `${path} — proposed edit (${r.format})`;
    showPane('diff');
    $('#review-accept').onclick = () => {
      if (model.getValue() !== before) {
        status('the file changed while the edit was made: ask again', 'error');
      } else {
        model.pushEditOperations([], [{ range: model.getFullModelRange(), text: r.text }], () => null);
        status('edit kept (unsaved)');
      }
      showPane('editor');
      restoreReviewButtons();
    };
    $('#review-reject').onclick = () => {
      showPane('editor');
      restoreReviewButtons();
      status('edit dropped');
    };
    status('edit proposed: accept or reject');
  } catch (e) {
    status(`edit: ${e.message}`, 'error');
  }
};

// The review bar's buttons act on the agent's change shown (Cmd-K borrows them meanwhile).
function restoreReviewButtons() {
  $('#review-accept').onclick = async () => {
    await reviewHost.accept(state.review);
    panel.refreshReview();
  };
  $('#review-reject').onclick = async () => {
    await reviewHost.reject(state.review);
    panel.refreshReview();
  };
}

// ---- search -----------------------------------------------------------------------------

$('#search-form').onsubmit = async (e) => {
  e.preventDefault();
  const q = $('#search-q').value.trim();
  if (!q) return;
  const mode = document.querySelector('#search-form input[name=mode]:checked').value;
  $('#search-note').textContent = 'searching…';
  try {
    const r = await get(`/api/search?q=${encodeURIComponent(q)}&mode=${mode}`);
    $('#search-note').textContent = r.note || `${r.hits.length} hits`;
    $('#search-hits').replaceChildren(
      ...r.hits.map((h) => {
        const li = document.createElement('li');
        if (mode === 'docs') {
          // A section of added documentation: its page opens in a new tab.
          li.dataset.url = h.url;
          const where = document.createElement('div');
          where.className = 'where';
          where.textContent = h.heading ? `${h.title} › ${h.heading}` : h.title;
          const from = document.createElement('div');
          from.className = 'source';
          from.textContent = `${h.source} · ${h.url}`;
          const snip = document.createElement('pre');
          snip.textContent = h.text;
          li.append(where, from, snip);
          li.onclick = () => window.open(h.url, '_blank', 'noopener');
          return li;
        }
        li.dataset.path = h.path;
        const where = document.createElement('div');
        where.className = 'where';
        where.textContent = `${h.path}:${h.line}`;
        const snip = document.createElement('pre');
        snip.textContent = h.snippet;
        li.append(where, snip);
        li.onclick = () => openFile(h.path, h.line);
        return li;
      }),
    );
  } catch (err) {
    $('#search-note').textContent = err.message;
  }
};

// ---- side panes ---------------------------------------------------------------------------

for (const b of document.querySelectorAll('.side-tabs button')) {
  b.onclick = () => {
    for (const x of document.querySelectorAll('.side-tabs button')) x.classList.toggle('on', x === b);
    for (const p of document.querySelectorAll('.side-pane')) p.classList.toggle('on', p.id === b.dataset.side);
    if (b.dataset.side === 'runs') runs.show(openFile, showPatch);
    if (b.dataset.side === 'search') $('#search-q').focus();
  };
}

// A run's patch, to look at (applying it is the run's own button).
function showPatch(title, before, after, lang) {
  diffEditor.setModel({
    original: monaco.editor.createModel(before, lang),
    modified: monaco.editor.createModel(after, lang),
  });
  state.review = null;
  $('#review-title').textContent = title;
  showPane('diff');
  $('#review-accept').hidden = true;
  $('#review-reject').hidden = true;
}

// ---- start ------------------------------------------------------------------------------

// A team's page: the API token, kept for this tab's session.
function askToken() {
  status('sign in with an API token', 'error');
  const empty = $('#empty');
  empty.replaceChildren();
  const form = document.createElement('form');
  form.id = 'sign-in';
  const input = document.createElement('input');
  input.type = 'password';
  input.placeholder = 'API token (caret admin token create)';
  input.autocomplete = 'off';
  const button = document.createElement('button');
  button.type = 'submit';
  button.textContent = 'Sign in';
  form.append(input, button);
  form.addEventListener('submit', (ev) => {
    ev.preventDefault();
    if (!input.value.trim()) return;
    signIn(input.value);
    empty.replaceChildren('Open a file from the tree.');
    start();
  });
  empty.append(form);
  showPane('empty');
  input.focus();
}

async function start() {
  try {
    state.info = await get('/api/info');
  } catch (e) {
    if (e.status === 401 && onServer) {
      askToken();
    } else {
      status(e.status === 401 ? 'open the address `caret ui` printed (it carries the token)' : e.message, 'error');
    }
    return;
  }
  $('#workspace').textContent = state.info.root;
  document.title = `${state.info.name} — caret`;
  await loadTree();
  showPane('empty');
  status(state.info.tab ? `ready · Tab: ${state.info.tab}` : 'ready · no Tab model configured');
  offerModel(async () => {
    state.info = await get('/api/info');
    status(`ready · Tab: ${state.info.tab}`);
  });
  watch();
  const first = new URLSearchParams(location.search).get('open');
  if (first) {
    await openFile(first);
    // Navigation start → the file editable (benchmarks read it).
    window.caret.openedAt = performance.now();
  }
  window.caret.ready = true;
}
start();
