// Background runs: start one from the page, watch its events, review its patch file by file
// and apply it to the workspace.
import { get, post, stream } from './api.js';

const $ = (sel) => document.querySelector(sel);
let started = false;
let watching = null;

export function show(openFile, showPatch) {
  if (!started) {
    started = true;
    $('#run-form').onsubmit = async (e) => {
      e.preventDefault();
      const task = $('#run-task').value.trim();
      if (!task) return;
      try {
        await post('/api/runs', { task });
        $('#run-task').value = '';
        $('#run-note').textContent = '';
      } catch (err) {
        $('#run-note').textContent = `starting the run: ${err.message}`;
      }
      refresh(openFile, showPatch);
    };
    setInterval(() => refresh(openFile, showPatch), 3000);
  }
  refresh(openFile, showPatch);
}

async function refresh(openFile, showPatch) {
  let runs;
  try {
    runs = (await get('/api/runs')).runs;
  } catch (e) {
    $('#run-list').replaceChildren(Object.assign(document.createElement('li'), { textContent: e.message }));
    return;
  }
  $('#run-list').replaceChildren(
    ...runs.map((r) => {
      const li = document.createElement('li');
      li.dataset.run = r.id;
      li.className = r.state;
      const head = document.createElement('div');
      head.className = 'where';
      head.textContent = `${r.state} · ${r.task.slice(0, 80)}`;
      li.append(head);
      li.onclick = () => open(r, openFile, showPatch, li);
      return li;
    }),
  );
}

async function open(run, openFile, showPatch, li) {
  watching?.abort();
  watching = new AbortController();
  const log = document.createElement('pre');
  log.className = 'run-log';
  li.append(log);
  stream(`/api/runs/${run.id}/events`, (e) => {
    const line = describe(e);
    if (line) log.textContent += `${line}\n`;
  }, watching.signal).catch(() => {});
  const r = await get(`/api/runs/${run.id}/patch`).catch(() => null);
  if (!r?.files?.length) return;
  const files = document.createElement('div');
  for (const f of r.files) {
    const a = document.createElement('a');
    a.href = '#';
    a.textContent = f.path;
    a.onclick = (ev) => {
      ev.preventDefault();
      ev.stopPropagation();
      showPatch(`${f.path} — run ${run.id}`, f.before ?? '', f.after ?? '');
    };
    files.append(a, document.createElement('br'));
  }
  const apply = document.createElement('button');
  apply.textContent = 'Apply to the workspace';
  apply.onclick = async (ev) => {
    ev.stopPropagation();
    try {
      const out = await post(`/api/runs/${run.id}/apply`, {});
      $('#run-note').textContent = `applied: ${out.changed.join(', ')}`;
      for (const p of out.changed) openFile(p);
    } catch (err) {
      $('#run-note').textContent = `applying: ${err.message}`;
    }
  };
  li.append(files, apply);
}

// One line for a run's event: its lifecycle, the agent's tool calls and turns, errors.
function describe(e) {
  if (e.type === 'end') return `— ${e.state}`;
  if (e.type === 'error') return `error: ${e.message}`;
  const ev = e.event || {};
  switch (ev.type) {
    case 'tool_call_begin': {
      const a = ev.arguments || {};
      return `▸ ${ev.name} ${a.path || a.command || a.pattern || ''}`;
    }
    case 'tool_call_end':
      return ev.ok ? null : `  ✗ ${ev.name}: ${(ev.output || '').split('\n')[0].slice(0, 120)}`;
    case 'file_change':
      return `  ${ev.kind} ${ev.path}`;
    case 'text_delta':
    case 'token_usage':
    case 'turn_begin':
      return null;
    case 'turn_end':
      return `turn ended: ${ev.reason}`;
    case 'error':
      return `error: ${ev.message}`;
    default:
      return ev.type ? ev.type.replaceAll('_', ' ') : null;
  }
}
