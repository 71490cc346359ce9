// The agent panel: a conversation with the agent (text as it streams, tool calls folded,
// approvals in place, the todo list), the files the agent changed with per-file accept and
// reject, and a checkpoint before every turn to roll the workspace back to. It knows nothing
// of how it is hosted: `host` gives it the calls (the page's HTTP API, or a VS Code webview's
// messages to its extension).
//
// host = {
//   start(): Promise<{id, model}>           a new session
//   send(id, op): Promise                    an Op (user_input, approval, interrupt)
//   events(id, onEvent, signal): Promise     the session's events from its first
//   review(): Promise<{files, checkpoints}>  what the agent changed, the turns' checkpoints
//   accept(path), reject(path), restore(turn): Promise
//   showDiff(path), openFile(path, line)     the host's editor
//   paths(): string[]                        workspace files, for @ mentions
//   docs(): string[]                         (optional) documentation sources, for @Docs
//   commands(): {name, description, argument_hint}[]  (optional) custom commands, for /
//   parallel: {start(task, n), status(), apply(number)}  (optional) "Run N" in worktrees
//   mcp(): Promise<{servers, untrusted}>     (optional) MCP servers; the project's untrusted
//   trustMcp(name): Promise                  (optional) trusts one: new chats start it
// }

const el = (tag, attrs = {}, ...children) => {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === 'class') e.className = v;
    else if (k.startsWith('on')) e.addEventListener(k.slice(2), v);
    else if (v !== undefined && v !== null && v !== false) e.setAttribute(k, v === true ? '' : v);
  }
  for (const c of children.flat()) if (c !== null && c !== undefined) e.append(c);
  return e;
};

const summary = (name, args) => {
  const a = args || {};
  const s = a.command || (a.query && JSON.stringify(a.query)) || a.pattern || a.path || '';
  const text = typeof s === 'string' ? s : JSON.stringify(s);
  return text.length > 90 ? `${text.slice(0, 90)}…` : text;
};

// Assistant text with ``` fences as code blocks.
const renderText = (node, text) => {
  node.replaceChildren();
  const parts = text.split(/```[^\n]*\n?/);
  parts.forEach((p, i) => {
    if (!p) return;
    node.append(i % 2 ? el('pre', { class: 'code' }, p) : el('span', {}, p));
  });
};

export class AgentPanel {
  constructor(root, host) {
    this.root = root;
    this.host = host;
    this.session = null;
    this.busy = false;
    this.calls = new Map();
    this.abort = null;
    this.build();
    this.askTrust();
  }

  build() {
    this.title = el('span', { class: 'title' }, 'Agent');
    this.newButton = el('button', { class: 'small', onclick: () => this.reset() }, 'New chat');
    // Plan mode: read-only tools, and a plan to approve before anything is built.
    this.mode = 'build';
    this.planButton = el('button', {
      class: 'small', 'data-role': 'plan-mode', title: 'Plan first: read-only tools, then a plan to approve',
      onclick: () => this.togglePlan(),
    }, 'Plan');
    this.log = el('div', { class: 'log', 'data-role': 'log' });
    this.todos = el('ul', { class: 'todos', hidden: true });
    this.changes = el('div', { class: 'changes', hidden: true });
    this.input = el('textarea', {
      rows: 3,
      placeholder: 'Ask the agent… (@ attaches a file, Enter sends, Shift-Enter a new line)',
      'data-role': 'input',
    });
    this.mentions = el('ul', { class: 'mentions', hidden: true });
    this.sendButton = el('button', { class: 'primary', 'data-role': 'send', onclick: () => this.submit() }, 'Send');
    this.stopButton = el('button', { hidden: true, onclick: () => this.interrupt() }, 'Stop');
    // "Run N": the request tried by N agents at once, each in a git worktree of its own.
    this.runN = this.host.parallel
      ? el('select', { 'data-role': 'run-n', title: 'Attempts at once, each in a git worktree of its own' },
        ...[2, 3, 4].map((n) => el('option', { value: n }, `×${n}`)))
      : null;
    this.runButton = this.host.parallel
      ? el('button', { 'data-role': 'run-parallel', onclick: () => this.runParallel() }, 'Run N')
      : null;
    this.usage = el('span', { class: 'usage' });
    this.root.replaceChildren(
      el('div', { class: 'agent-head' }, this.title, this.usage, this.planButton, this.newButton),
      this.log,
      this.todos,
      this.changes,
      el('div', { class: 'agent-input' }, this.mentions, this.input, el('div', { class: 'row' }, this.stopButton, this.runN, this.runButton, this.sendButton)),
    );
    this.input.addEventListener('keydown', (e) => this.key(e));
    this.input.addEventListener('input', () => this.mention());
  }

  reset() {
    this.abort?.abort();
    this.session = null;
    this.busy = false;
    this.calls.clear();
    this.log.replaceChildren();
    this.todos.hidden = true;
    this.setBusy(false);
    this.askTrust();
  }

  // One line for the chats' MCP servers, how each is; asked again while one is starting.
  showServers(servers) {
    clearTimeout(this.serversTimer);
    if (!servers.length) return this.serversLine?.remove();
    if (!this.serversLine?.isConnected) {
      this.serversLine = el('div', { class: 'entry notice', 'data-role': 'mcp-servers' });
      this.log.prepend(this.serversLine);
    }
    this.serversLine.textContent = `MCP: ${servers.map((s) => `${s.name} ${s.status}`).join(' · ')}`;
    this.serversLine.dataset.ready = servers.filter((s) => s.ready).map((s) => s.name).join(',');
    if (servers.some((s) => s.status === 'starting')) {
      this.serversTimer = setTimeout(async () => {
        try {
          this.showServers((await this.host.mcp()).servers || []);
        } catch {}
      }, 1000);
    }
  }

  // The project's MCP servers that run only once trusted: each shown with what it would run,
  // and a button to trust it (for chats started from then on).
  async askTrust() {
    if (!this.host.mcp) return;
    let info;
    try {
      info = await this.host.mcp();
    } catch (e) {
      this.notice(`MCP servers: ${e.message}`, 'error');
      return;
    }
    this.showServers(info.servers || []);
    for (const s of info.untrusted || []) {
      const what = el('code', {}, s.command_line.join(' '));
      const note = el('div', { class: 'entry trust', 'data-role': 'mcp-trust', 'data-server': s.name });
      const trust = async () => {
        try {
          await this.host.trustMcp(s.name);
          const when = this.session ? 'the next chat' : 'this chat';
          note.replaceChildren(el('span', {}, `MCP server ${s.name} trusted: it starts with ${when}.`));
          note.dataset.trusted = 'yes';
          this.showServers((await this.host.mcp()).servers || []);
        } catch (e) {
          note.append(el('span', { class: 'error' }, ` ${e.message}`));
        }
      };
      note.append(
        el('span', {}, `${s.file} declares the MCP server ${s.name} (`, what, '). It runs only once you trust it. '),
        el('button', { class: 'small', 'data-role': 'trust', onclick: trust }, 'Trust'),
        el('button', { class: 'small', onclick: () => note.remove() }, 'Not now'),
      );
      this.log.append(note);
    }
  }

  key(e) {
    if (!this.mentions.hidden && (e.key === 'Tab' || (e.key === 'Enter' && !e.shiftKey))) {
      const first = this.mentions.querySelector('li');
      if (first) {
        e.preventDefault();
        first.click();
        return;
      }
    }
    if (e.key === 'Escape') this.mentions.hidden = true;
    if (e.key === 'Enter' && !e.shiftKey) {
      e.preventDefault();
      this.submit();
    }
  }

  // "/na" at the start → the custom commands whose name starts so; "@par" → the workspace
  // paths containing "par", to attach.
  mention() {
    const upto = this.input.value.slice(0, this.input.selectionStart);
    const slash = /^\/([\w:.-]*)$/.exec(upto);
    if (slash) {
      const q = slash[1].toLowerCase();
      const commands = (this.host.commands?.() || []).filter((c) => c.name.toLowerCase().startsWith(q)).slice(0, 8);
      this.offer(commands.map((c) => ({
        value: c.name,
        label: [`/${c.name}`, c.argument_hint, c.description ? `— ${c.description}` : null].filter(Boolean).join(' '),
        attrs: { 'data-command': c.name },
        put: () => `/${c.name} ${this.input.value.slice(upto.length).trimStart()}`,
      })));
      return;
    }
    const m = /@([\w./-]*)$/.exec(upto);
    if (!m) {
      this.mentions.hidden = true;
      return;
    }
    const q = m[1].toLowerCase();
    // Documentation sources first (`@Docs NAME` attaches their best sections), then files.
    const docs = (this.host.docs?.() || []).map((d) => `Docs ${d}`).filter((d) => d.toLowerCase().includes(q) || 'docs'.startsWith(q));
    const hits = [...docs, ...this.host.paths().filter((p) => p.toLowerCase().includes(q))].slice(0, 8);
    const at = upto.length - m[0].length;
    this.offer(hits.map((p) => ({
      value: p,
      label: p,
      attrs: { 'data-mention': p },
      put: () => `${this.input.value.slice(0, at)}@${p} ${this.input.value.slice(upto.length)}`,
    })));
  }

  // The list under the input: a click (or Tab/Enter on the first) puts one into the input.
  offer(items) {
    this.mentions.replaceChildren(
      ...items.map((item) =>
        el('li', {
          ...item.attrs,
          onclick: () => {
            this.input.value = item.put();
            this.mentions.hidden = true;
            this.input.focus();
          },
        }, item.label),
      ),
    );
    this.mentions.hidden = items.length === 0;
  }

  // N attempts at the input's request in worktrees; when they end, their diffs side by side.
  async runParallel() {
    const task = this.input.value.trim();
    if (!task) return this.notice('say what the attempts should do', 'error');
    const n = Number(this.runN.value);
    const line = el('div', { class: 'entry notice', 'data-role': 'parallel-status' }, `${n} attempts at "${task}", each in a worktree…`);
    try {
      await this.host.parallel.start(task, n);
    } catch (e) {
      return this.notice(e.message, 'error');
    }
    this.input.value = '';
    this.log.append(line);
    this.scroll();
    for (;;) {
      await new Promise((r) => setTimeout(r, 1000));
      let s;
      try {
        s = await this.host.parallel.status();
      } catch (e) {
        line.textContent = `attempts: ${e.message}`;
        line.className = 'entry error';
        return;
      }
      if (s.state === 'running') continue;
      if (s.state !== 'done') {
        line.textContent = `the attempts did not start: ${s.error || s.state}`;
        line.className = 'entry error';
        return;
      }
      line.textContent = `${s.attempts.length} attempts at "${s.task}" ended`;
      this.showAttempts(s);
      return;
    }
  }

  // The attempts side by side: each one's files and diff, and a button that applies it (the
  // others, and every worktree, are then discarded).
  showAttempts(s) {
    document.querySelector('.attempts')?.remove();
    const view = el('div', { class: 'attempts', 'data-role': 'attempts' });
    const choose = async (number) => {
      try {
        const r = await this.host.parallel.apply(number);
        this.notice(r.applied);
        view.remove();
      } catch (e) {
        this.notice(e.message, 'error');
      }
    };
    const diff = (text) => el('pre', { class: 'diff' }, ...text.split('\n').map((l) =>
      el('div', { class: l.startsWith('+') && !l.startsWith('+++') ? 'add' : l.startsWith('-') && !l.startsWith('---') ? 'del' : l.startsWith('@@') ? 'hunk' : '' }, l)));
    view.append(
      el('div', { class: 'attempts-head' },
        el('span', { class: 'title' }, `Attempts: ${s.task}`),
        el('button', { class: 'small', 'data-role': 'discard-attempts', onclick: () => choose(0) }, 'Discard all')),
      el('div', { class: 'attempts-grid', style: `grid-template-columns: repeat(${s.attempts.length}, minmax(0, 1fr))` },
        ...s.attempts.map((a) => el('div', { class: 'attempt', 'data-attempt': a.number },
          el('div', { class: 'attempt-head' }, `Attempt ${a.number} · ${a.model} · ${a.ended}`),
          el('div', { class: 'attempt-files' }, a.files.length ? a.files.map((f) => `${f.path} +${f.added} −${f.removed}`).join('\n') : 'no changes'),
          diff(a.diff),
          el('button', { class: 'primary', 'data-role': 'apply-attempt', disabled: !a.diff.trim(), onclick: () => choose(a.number) }, `Apply attempt ${a.number}`)))),
    );
    document.body.append(view);
  }

  setBusy(busy) {
    this.busy = busy;
    this.stopButton.hidden = !busy;
    this.root.dataset.busy = busy ? 'yes' : 'no';
  }

  async ensureSession() {
    if (this.session) return this.session;
    const s = await this.host.start();
    this.session = s.id;
    this.title.textContent = `Agent · ${s.model}`;
    this.abort = new AbortController();
    this.host.events(s.id, (e) => this.event(e), this.abort.signal).catch((e) => {
      if (e.name !== 'AbortError') this.notice(`event stream: ${e.message}`, 'error');
    });
    return s.id;
  }

  async submit() {
    const text = this.input.value.trim();
    if (!text) return;
    this.input.value = '';
    this.mentions.hidden = true;
    try {
      const id = await this.ensureSession();
      await this.host.send(id, { type: 'user_input', text });
    } catch (e) {
      this.notice(e.message, 'error');
    }
  }

  async interrupt() {
    if (this.session) await this.host.send(this.session, { type: 'interrupt' });
  }

  async togglePlan() {
    try {
      const id = await this.ensureSession();
      await this.host.send(id, { type: 'set_mode', mode: this.mode === 'plan' ? 'build' : 'plan' });
    } catch (err) {
      this.notice(err.message, 'error');
    }
  }

  // A proposed plan: its steps, the plan as JSON to edit, and a button that builds it.
  showPlan(plan) {
    const text = el('textarea', { class: 'plan-text', rows: 12, 'data-role': 'plan-text' });
    text.value = JSON.stringify(plan, null, 2);
    const steps = plan.steps.map((s) => el('li', {}, s.files?.length ? `${s.title} (${s.files.join(', ')})` : s.title));
    const approve = async () => {
      let edited;
      try {
        edited = JSON.parse(text.value);
      } catch (err) {
        this.notice(`the plan is not valid JSON: ${err.message}`, 'error');
        return;
      }
      node.dataset.approved = 'yes';
      node.querySelector('.row').replaceChildren(el('span', { class: 'decided' }, 'Approved: building it'));
      await this.host.send(this.session, { type: 'approve_plan', plan: edited });
    };
    const node = el('div', { class: 'entry plan', 'data-role': 'plan' },
      el('div', {}, `Plan: ${plan.summary}`),
      el('ol', {}, ...steps),
      ...(plan.risks?.length ? [el('div', { class: 'risks' }, `Risks: ${plan.risks.join('; ')}`)] : []),
      el('details', {}, el('summary', {}, 'Edit the plan'), text),
      el('div', { class: 'row' },
        el('button', { class: 'primary', 'data-role': 'approve-plan', onclick: approve }, 'Approve and build')));
    this.log.append(node);
  }

  scroll() {
    this.log.scrollTop = this.log.scrollHeight;
  }

  notice(text, kind = 'notice') {
    this.log.append(el('div', { class: `entry ${kind}` }, text));
    this.scroll();
  }

  event(e) {
    switch (e.type) {
      case 'turn_begin':
        this.setBusy(true);
        this.current = null;
        break;
      case 'text_delta': {
        if (!this.current) {
          this.current = { text: '', node: el('div', { class: 'entry assistant' }) };
          this.log.append(this.current.node);
        }
        this.current.text += e.text;
        renderText(this.current.node, this.current.text);
        break;
      }
      case 'tool_call_begin': {
        this.current = null;
        const out = el('pre', { class: 'output' });
        const head = el('summary', {}, el('span', { class: 'tool-name' }, e.name), ' ',
          ...(e.server ? [el('span', { class: 'tool-server' }, `MCP server ${e.server}`), ' '] : []),
          el('span', { class: 'tool-arg' }, summary(e.name, e.arguments)));
        const node = el('details', { class: 'entry tool running', 'data-call': e.call_id, 'data-tool': e.name }, head, out);
        this.calls.set(e.call_id, { node, out });
        this.log.append(node);
        break;
      }
      case 'tool_call_end': {
        const c = this.calls.get(e.call_id);
        if (c) {
          c.node.classList.remove('running');
          c.node.classList.add(e.ok ? 'ok' : 'failed');
          c.out.textContent = e.output;
        }
        break;
      }
      case 'file_change': {
        const node = el('div', { class: 'entry change', 'data-path': e.path },
          el('span', { class: `kind ${e.kind}` }, e.kind), ' ',
          el('a', { href: '#', onclick: (ev) => { ev.preventDefault(); this.host.showDiff(e.path); } }, e.path));
        this.log.append(node);
        this.refreshReview();
        break;
      }
      case 'todo_update':
        this.todos.replaceChildren(...e.items.map((t) => el('li', { class: t.status }, t.content)));
        this.todos.hidden = e.items.length === 0;
        break;
      case 'approval_request': {
        const said = { approve: 'Run once', approve_for_session: 'Run, and like it for this session', deny: 'Denied' };
        const decide = (decision) => async () => {
          node.dataset.decided = decision;
          node.querySelector('.row').replaceChildren(el('span', { class: 'decided' }, said[decision]));
          await this.host.send(this.session, { type: 'approval', call_id: e.call_id, decision });
        };
        const node = el('div', { class: 'entry approval', 'data-call': e.call_id },
          el('div', {}, `Run this? ${e.reason}`),
          el('pre', { class: 'code' }, e.command),
          el('div', { class: 'row' },
            el('button', { class: 'primary', onclick: decide('approve') }, 'Run'),
            el('button', { onclick: decide('approve_for_session') }, 'Always'),
            el('button', { onclick: decide('deny') }, 'Deny')));
        this.log.append(node);
        break;
      }
      case 'token_usage':
        this.usage.textContent = `${Math.round((100 * e.context_tokens) / Math.max(1, e.context_window))}% of context`;
        break;
      case 'error':
        this.notice(e.message, 'error');
        break;
      case 'subagent': {
        // A subagent's calls, nested under the task call that started it.
        const inner = e.event;
        if (inner.type === 'tool_call_begin') {
          const parent = this.calls.get(e.call_id)?.node || this.log;
          parent.append(el('div', { class: 'entry subagent', 'data-agent': e.agent },
            `↳ ${e.agent}: ${inner.name} ${summary(inner.name, inner.arguments)}`));
        }
        break;
      }
      case 'mode_changed':
        this.mode = e.mode;
        this.planButton.textContent = e.mode === 'plan' ? 'Planning' : 'Plan';
        this.root.dataset.mode = e.mode;
        this.notice(e.mode === 'plan' ? 'plan mode: read-only tools; the agent proposes a plan' : 'build mode');
        break;
      case 'plan_proposed':
        this.showPlan(e.plan);
        break;
      case 'notice':
        this.notice(e.message, 'notice');
        break;
      case 'hook_run':
        // Hooks that let things be stay quiet; the others say what they decided.
        if (e.decision !== 'pass' && e.decision !== 'allow') {
          const why = e.message ? `: ${e.message}` : '';
          this.notice(`hook ${e.event} \`${e.command}\` (${Math.round(e.ms)} ms): ${e.decision}${why}`, 'notice hook');
        }
        break;
      case 'rules_applied': {
        // Which of the project's rules files the agent follows now.
        const parts = [];
        if (e.rules.length) parts.push(`rules: ${e.rules.join(', ')}`);
        if (e.dropped?.length) parts.push(`left out (over the size cap): ${e.dropped.join(', ')}`);
        this.notice(parts.join('; '), 'notice rules');
        break;
      }
      case 'turn_end':
        this.setBusy(false);
        this.current = null;
        if (e.reason !== 'done') this.notice(`turn ended: ${e.reason.replace('_', ' ')}`);
        this.refreshReview();
        break;
      case 'user_message': {
        // The page's own echo of what was sent, with the checkpoint taken before its turn.
        const restore = el('button', {
          class: 'small restore',
          title: 'Roll the workspace back to before this message',
          onclick: async () => {
            if (!confirm('Restore the files the agent changed since this message?')) return;
            await this.host.restore(e.turn);
            this.notice(`restored the checkpoint before turn ${e.turn}`);
            this.refreshReview();
          },
        }, 'Restore checkpoint');
        this.log.append(el('div', { class: 'entry user', 'data-turn': e.turn }, el('div', {}, e.text), restore));
        break;
      }
      default:
        break;
    }
    this.scroll();
  }

  async refreshReview() {
    let review;
    try {
      review = await this.host.review();
    } catch (e) {
      return;
    }
    const files = review.files || [];
    this.changes.hidden = files.length === 0;
    const act = (fn, path) => async () => {
      try {
        await fn(path);
      } catch (e) {
        this.notice(e.message, 'error');
      }
      this.refreshReview();
    };
    this.changes.replaceChildren(
      el('div', { class: 'changes-head' }, el('span', {}, `${files.length} file${files.length === 1 ? '' : 's'} changed`),
        el('button', { class: 'small', onclick: async () => { for (const f of files) await this.host.accept(f.path); this.refreshReview(); } }, 'Accept all'),
        el('button', { class: 'small', onclick: async () => { for (const f of files) await this.host.reject(f.path); this.refreshReview(); } }, 'Reject all')),
      ...files.map((f) =>
        el('div', { class: 'changed', 'data-path': f.path },
          el('span', { class: `kind ${f.kind}` }, f.kind[0].toUpperCase()),
          el('a', { href: '#', onclick: (ev) => { ev.preventDefault(); this.host.showDiff(f.path); } }, f.path),
          el('span', { class: 'counts' }, `+${f.added} −${f.removed}`),
          el('button', { class: 'small accept', title: 'Keep this change', onclick: act(this.host.accept, f.path) }, '✓'),
          el('button', { class: 'small reject', title: 'Undo this change', onclick: act(this.host.reject, f.path) }, '✗'))),
    );
  }
}
