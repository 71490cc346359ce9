// Caret in VS Code, kept thin: Tab comes from `caret lsp` through vscode-languageclient; the
// agent panel is the workspace page's own panel component in a webview, talking (through this
// extension) to a `caret ui` server started for the workspace folder; search is a quick pick
// over the same server's search.
import { ChildProcess, spawn } from 'node:child_process';
import * as readline from 'node:readline';
import * as vscode from 'vscode';
import { LanguageClient, LanguageClientOptions, ServerOptions } from 'vscode-languageclient/node';
import {
  Hit,
  ModelOffer,
  NextEdit,
  NextEditState,
  SseParser,
  Settings,
  debounce,
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
} from './logic';

let client: LanguageClient | undefined;
let page: PageServer | undefined;
const before = new Map<string, string>();

function settings(): Settings {
  const c = vscode.workspace.getConfiguration('caret');
  return readSettings((k) => c.get(k));
}

function root(): string | undefined {
  return vscode.workspace.workspaceFolders?.[0]?.uri.fsPath;
}

/** A `caret ui` server for the workspace folder, started on first use. */
class PageServer {
  private child: ChildProcess | undefined;
  private ready: Promise<{ base: string; token: string }> | undefined;

  constructor(private readonly folder: string, private readonly s: Settings) {}

  address(): Promise<{ base: string; token: string }> {
    if (!this.ready) {
      this.ready = new Promise((resolve, reject) => {
        const child = spawn(this.s.path, uiArgs(this.folder, this.s), { stdio: ['ignore', 'pipe', 'pipe'] });
        this.child = child;
        child.on('error', (e) => reject(new Error(`starting ${this.s.path}: ${e.message}`)));
        child.on('exit', (code) => reject(new Error(`caret ui exited (${code})`)));
        readline.createInterface({ input: child.stdout! }).once('line', (line) => {
          const a = parseUiAddress(line);
          if (a) resolve(a);
          else reject(new Error(`caret ui printed ${JSON.stringify(line)}`));
        });
      });
    }
    return this.ready;
  }

  async call(method: string, path: string, body?: unknown): Promise<any> {
    const { base, token } = await this.address();
    const r = await fetch(base + path, {
      method,
      headers: { authorization: `Bearer ${token}`, 'content-type': 'application/json' },
      body: body === undefined ? undefined : JSON.stringify(body),
    });
    const text = await r.text();
    const data = text ? JSON.parse(text) : null;
    if (!r.ok) throw new Error(data?.error?.message ?? `${r.status}`);
    return data;
  }

  /** Forwards the event stream at `path` to `onEvent` until it ends. */
  async stream(path: string, onEvent: (e: unknown) => void): Promise<void> {
    const { base, token } = await this.address();
    const r = await fetch(base + path, { headers: { authorization: `Bearer ${token}` } });
    if (!r.ok || !r.body) throw new Error(`${r.status}`);
    const parser = new SseParser();
    const decoder = new TextDecoder();
    for await (const chunk of r.body as unknown as AsyncIterable<Uint8Array>) {
      for (const e of parser.push(decoder.decode(chunk, { stream: true }))) onEvent(e);
    }
  }

  dispose() {
    this.child?.kill();
  }
}

function server(): PageServer {
  const folder = root();
  if (!folder) throw new Error('open a folder first: the agent and search work in a workspace folder');
  page ??= new PageServer(folder, settings());
  return page;
}

async function openAt(path: string, line?: number) {
  const folder = root();
  if (!folder) return;
  const doc = await vscode.workspace.openTextDocument(vscode.Uri.joinPath(vscode.Uri.file(folder), path));
  const pos = new vscode.Position(Math.max(0, (line ?? 1) - 1), 0);
  await vscode.window.showTextDocument(doc, { selection: new vscode.Range(pos, pos) });
}

async function showDiff(path: string) {
  const d = await server().call('GET', `/api/review/diff?path=${encodeURIComponent(path)}`);
  before.set(path, d.before ?? '');
  const left = vscode.Uri.from({ scheme: 'caret-before', path: `/${path}` });
  const right = vscode.Uri.joinPath(vscode.Uri.file(root()!), path);
  await vscode.commands.executeCommand('vscode.diff', left, right, `${path} (the agent's change)`);
}

function openAgent(context: vscode.ExtensionContext) {
  const panel = vscode.window.createWebviewPanel('caret.agent', 'Caret Agent', vscode.ViewColumn.Beside, {
    enableScripts: true,
    retainContextWhenHidden: true,
    localResourceRoots: [vscode.Uri.joinPath(context.extensionUri, 'media')],
  });
  const media = (f: string) => panel.webview.asWebviewUri(vscode.Uri.joinPath(context.extensionUri, 'media', f));
  panel.webview.html = `<!doctype html><html><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; script-src ${panel.webview.cspSource}; style-src ${panel.webview.cspSource} 'unsafe-inline'; font-src ${panel.webview.cspSource};">
<link rel="stylesheet" href="${media('panel.css')}"></head>
<body class="vscode"><div id="agent"></div><script src="${media('panel.js')}"></script></body></html>`;
  const s = server();
  const methods: Record<string, (...a: any[]) => Promise<unknown>> = {
    start: () => s.call('POST', '/api/agent/sessions', {}),
    send: (id: string, op: unknown) => s.call('POST', `/api/agent/sessions/${id}/ops`, op),
    events: async (id: string) => {
      s.stream(`/api/agent/sessions/${id}/events`, (data) => panel.webview.postMessage({ type: 'event', session: id, data })).catch(
        (e) => panel.webview.postMessage({ type: 'event', session: id, data: { type: 'error', message: String(e) } }),
      );
    },
    review: () => s.call('GET', '/api/review'),
    accept: (path: string) => s.call('POST', '/api/review/accept', { path }),
    reject: (path: string) => s.call('POST', '/api/review/reject', { path }),
    restore: (turn: number) => s.call('POST', '/api/checkpoints/restore', { turn }),
    showDiff: (path: string) => showDiff(path),
    openFile: (path: string, line?: number) => openAt(path, line),
    paths: async () => (await s.call('GET', '/api/tree')).files,
    mcp: () => s.call('GET', '/api/mcp'),
    docs: async () => (await s.call('GET', '/api/docs')).sources.map((d: { name: string }) => d.name),
    commands: async () => (await s.call('GET', '/api/commands')).commands,
    parallelStart: (task: string, n: number) => s.call('POST', '/api/parallel', { task, n }),
    parallelStatus: () => s.call('GET', '/api/parallel'),
    parallelApply: (number: number) => s.call('POST', '/api/parallel/apply', { number }),
    trustMcp: (name: string) => s.call('POST', '/api/mcp/trust', { name }),
  };
  panel.webview.onDidReceiveMessage(async (m: { type: string; id: number; method: string; args: unknown[] }) => {
    if (m.type !== 'call') return;
    try {
      const result = await methods[m.method](...m.args);
      panel.webview.postMessage({ type: 'reply', id: m.id, result });
    } catch (e) {
      panel.webview.postMessage({ type: 'reply', id: m.id, error: e instanceof Error ? e.message : String(e) });
    }
  });
}

async function search(mode: 'semantic' | 'grep') {
  const s = server();
  const pick = vscode.window.createQuickPick<vscode.QuickPickItem & { path: string; line: number }>();
  pick.placeholder = mode === 'grep' ? 'Grep the workspace (a regular expression)' : 'Search the codebase by meaning';
  pick.matchOnDescription = true;
  pick.matchOnDetail = true;
  const run = debounce(async (q: string) => {
    if (!q.trim()) return;
    pick.busy = true;
    try {
      const r = await s.call('GET', `/api/search?mode=${mode}&q=${encodeURIComponent(q)}`);
      pick.items = searchItems(r.hits as Hit[]);
      pick.title = r.note;
    } catch (e) {
      pick.title = e instanceof Error ? e.message : String(e);
    }
    pick.busy = false;
  }, 300);
  pick.onDidChangeValue(run);
  pick.onDidAccept(() => {
    const item = pick.selectedItems[0];
    pick.hide();
    if (item) openAt(item.path, item.line);
  });
  pick.show();
}

function startClient(): LanguageClient {
  const s = settings();
  const serverOptions: ServerOptions = { command: s.path, args: lspArgs(s) };
  const clientOptions: LanguageClientOptions = {
    documentSelector: [{ scheme: 'file' }],
    initializationOptions: initializationOptions(s),
  };
  const c = new LanguageClient('caret', 'Caret', serverOptions, clientOptions);
  // Inline completion is a proposed feature of vscode-languageclient 9: without this the
  // client registers no inline provider and VS Code shows Tab's suggestions in the
  // completion list instead of as ghost text.
  c.registerProposedFeatures();
  started = c.start();
  return c;
}

let started: Promise<void> | undefined;

/**
 * With no model configured or installed (the language server names none), offers the default
 * code model: downloaded by the workspace's `caret ui` with a progress notification, then the
 * language server restarted so that Tab uses it (the agent panel's server uses it at once).
 */
async function offerModel() {
  try {
    await started;
  } catch {
    return;
  }
  const info = client?.initializeResult?.serverInfo as { model?: string | null } | undefined;
  if (!info || info.model || !root() || settings().server) return;
  const s = server();
  let offer: ModelOffer = await s.call('GET', '/api/models/default');
  if (!offer.needed) return;
  if (offer.pull.state !== 'pulling') {
    const pick = await vscode.window.showInformationMessage(offerMessage(offer), 'Download', 'Later');
    if (pick !== 'Download') return;
    await s.call('POST', '/api/models/default');
  }
  const title = `Caret: downloading ${offer.model}`;
  await vscode.window.withProgress({ location: vscode.ProgressLocation.Notification, title }, async (progress) => {
    let shown = 0;
    for (;;) {
      offer = await s.call('GET', '/api/models/default');
      const pct = pullPercent(offer.pull);
      progress.report({ increment: pct - shown, message: `${pct}%` });
      shown = pct;
      if (offer.pull.state === 'done') return;
      if (offer.pull.state === 'failed') throw new Error(offer.pull.error ?? 'the download failed');
      await new Promise((r) => setTimeout(r, 500));
    }
  });
  await vscode.commands.executeCommand('caret.restartServer');
  vscode.window.showInformationMessage(`Caret: ${offer.model} installed; Tab, next edit and the agent use it now.`);
}

const nextEdit = new NextEditState();
/** Tab is opening another file for the prediction: its editor change keeps the prediction. */
let jumping = false;
const nextEditMark = vscode.window.createTextEditorDecorationType({
  backgroundColor: new vscode.ThemeColor('diffEditor.removedTextBackground'),
  border: '1px dashed',
  borderColor: new vscode.ThemeColor('editorInfo.foreground'),
});

/** Shows `edit` in `editor` (a marked range and what it becomes) and lets Tab take it. */
function showNextEdit(editor: vscode.TextEditor, edit: NextEdit | null) {
  nextEdit.offer(edit);
  vscode.commands.executeCommand('setContext', 'caret.nextEditShown', !!edit);
  if (!edit) {
    editor.setDecorations(nextEditMark, []);
    return;
  }
  const r = edit.range;
  if (edit.textDocument.uri !== editor.document.uri.toString()) {
    // In another open file: said at the end of the cursor's line, Tab opens it there.
    const line = editor.selection.active.line;
    const end = editor.document.lineAt(line).range.end;
    const file = decodeURIComponent(edit.textDocument.uri.split('/').pop() ?? '');
    editor.setDecorations(nextEditMark, [
      {
        range: new vscode.Range(end, end),
        renderOptions: { after: { contentText: ` ⇥ ${file}:${r.start.line + 1} ${edit.newText.split('\n')[0]}`, color: new vscode.ThemeColor('editorInfo.foreground') } },
        hoverMessage: `Tab: the same change in ${file}`,
      },
    ]);
    return;
  }
  const range = new vscode.Range(r.start.line, r.start.character, r.end.line, r.end.character);
  editor.setDecorations(nextEditMark, [
    {
      range,
      renderOptions: { after: { contentText: ` ⇥ ${edit.newText.split('\n')[0]}`, color: new vscode.ThemeColor('editorInfo.foreground') } },
      hoverMessage: `Tab: ${edit.reason === 'jump' ? 'go here next' : edit.reason === 'model' ? 'the predicted edit' : 'the same change here'}`,
    },
  ]);
}

/** Asks the server for the edit likely next after the user's recent ones. */
const askNextEdit = debounce(async (editor: vscode.TextEditor) => {
  if (!client?.isRunning() || vscode.window.activeTextEditor !== editor) return;
  const p = editor.selection.active;
  const uri = editor.document.uri.toString();
  try {
    const edit = await client.sendRequest<NextEdit | null>('caret/nextEdit', focusParams(uri, p.line, p.character));
    if (vscode.window.activeTextEditor === editor && editor.document.uri.toString() === uri) showNextEdit(editor, edit);
  } catch {
    // An older server without caret/nextEdit: nothing to show.
  }
}, 400);

/** Tab with a prediction shown: jump to it, or apply it (and ask for the one after). */
async function takeNextEdit() {
  const editor = vscode.window.activeTextEditor;
  if (!editor) return;
  const p = editor.selection.active;
  const step = nextEdit.tab(editor.document.uri.toString(), { line: p.line, character: p.character });
  if (step.kind === 'open') {
    const edit = nextEdit.current()!;
    editor.setDecorations(nextEditMark, []);
    const at = new vscode.Position(step.to.line, step.to.character);
    jumping = true;
    try {
      const doc = await vscode.workspace.openTextDocument(vscode.Uri.parse(step.uri));
      const there = await vscode.window.showTextDocument(doc, { selection: new vscode.Range(at, at) });
      showNextEdit(there, edit);
    } finally {
      jumping = false;
    }
    return;
  }
  if (step.kind === 'jump') {
    const at = new vscode.Position(step.to.line, step.to.character);
    editor.selection = new vscode.Selection(at, at);
    editor.revealRange(new vscode.Range(at, at), vscode.TextEditorRevealType.InCenterIfOutsideViewport);
    return;
  }
  if (step.kind === 'apply') {
    const r = step.edit.range;
    const range = new vscode.Range(r.start.line, r.start.character, r.end.line, r.end.character);
    showNextEdit(editor, null);
    await editor.edit((b) => b.replace(range, step.edit.newText));
    const end = editor.document.positionAt(editor.document.offsetAt(range.start) + step.edit.newText.length);
    editor.selection = new vscode.Selection(end, end);
    // Counted (with usage shared) like an accepted Tab suggestion.
    client
      ?.sendRequest('workspace/executeCommand', { command: 'caret.nextEditAccepted', arguments: [] })
      .catch(() => {});
  }
}

export function activate(context: vscode.ExtensionContext) {
  client = startClient();
  offerModel().catch((e) => vscode.window.showErrorMessage(`Caret: ${e instanceof Error ? e.message : String(e)}`));
  // The cursor resting somewhere: the server warms the model for a suggestion there.
  const focus = debounce((e: vscode.TextEditorSelectionChangeEvent) => {
    const p = e.selections[0]?.active;
    if (p && client?.isRunning()) client.sendNotification('caret/focus', focusParams(e.textEditor.document.uri.toString(), p.line, p.character));
  }, 250);
  context.subscriptions.push(
    vscode.window.onDidChangeTextEditorSelection(focus),
    // A keystroke drops the shown prediction; a pause asks for the next one.
    vscode.workspace.onDidChangeTextDocument((e) => {
      const editor = vscode.window.activeTextEditor;
      if (!editor || e.document !== editor.document || e.contentChanges.length === 0) return;
      if (nextEdit.current()) showNextEdit(editor, null);
      askNextEdit(editor);
    }),
    vscode.window.onDidChangeActiveTextEditor((editor) => {
      if (jumping) return; // Tab opening the prediction's own file
      nextEdit.dismiss();
      vscode.commands.executeCommand('setContext', 'caret.nextEditShown', false);
      editor?.setDecorations(nextEditMark, []);
    }),
    vscode.commands.registerCommand('caret.nextEdit', takeNextEdit),
    vscode.commands.registerCommand('caret.dismissNextEdit', () => {
      const editor = vscode.window.activeTextEditor;
      if (editor) showNextEdit(editor, null);
    }),
    vscode.workspace.registerTextDocumentContentProvider('caret-before', {
      provideTextDocumentContent: (uri) => before.get(uri.path.slice(1)) ?? '',
    }),
    vscode.commands.registerCommand('caret.openAgent', () => openAgent(context)),
    // Not `caret.search`: vscode-languageclient registers the server's own commands
    // (`caret.search`, `caret.apply`, `caret.tabAccepted`) under their names, and a second
    // registration of one fails the client's start.
    vscode.commands.registerCommand('caret.searchCodebase', () => search('semantic')),
    vscode.commands.registerCommand('caret.grep', () => search('grep')),
    vscode.commands.registerCommand('caret.signIn', async () => {
      const s = settings();
      const args = loginArgs(s);
      if (!args) {
        vscode.window.showErrorMessage('Caret: set caret.server to your team server first');
        return;
      }
      // The command line signs in (a browser, loopback redirect and PKCE) and keeps the tokens
      // every Caret client on this machine uses; the language server restarts with them.
      const terminal = vscode.window.createTerminal({ name: 'Caret sign-in', shellPath: s.path, shellArgs: args });
      terminal.show();
      const closed = vscode.window.onDidCloseTerminal(async (t) => {
        if (t !== terminal) return;
        closed.dispose();
        if (t.exitStatus?.code === 0) {
          await client?.stop();
          client = startClient();
        }
      });
    }),
    vscode.commands.registerCommand('caret.restartServer', async () => {
      await client?.stop();
      client = startClient();
    }),
    vscode.workspace.onDidChangeConfiguration((e) => {
      if (e.affectsConfiguration('caret')) vscode.commands.executeCommand('caret.restartServer');
    }),
  );
}

export async function deactivate() {
  page?.dispose();
  await client?.stop();
}
