// What the extension decides without VS Code: settings → the language server's arguments and
// initializationOptions, `caret ui`'s address, server-sent events, search hits → quick pick
// items. Tested with Node's test runner (test/logic.test.ts).

export interface Settings {
  path: string;
  tabModel: string;
  agentModel: string;
  family: string;
  budget: number;
  debounceMs: number;
  server: string;
  token: string;
}

export const defaults: Settings = {
  path: 'caret',
  tabModel: '',
  agentModel: '',
  family: '',
  budget: 0,
  debounceMs: 0,
  server: '',
  token: '',
};

/** Settings read through `get` (VS Code's configuration), defaults for what is unset. */
export function readSettings(get: (key: string) => unknown): Settings {
  const s = { ...defaults };
  for (const key of Object.keys(defaults) as (keyof Settings)[]) {
    const v = get(key);
    if (typeof v === typeof defaults[key]) (s as Record<string, unknown>)[key] = v;
  }
  return s;
}

/** `caret lsp`'s arguments. */
export function lspArgs(s: Settings): string[] {
  const args = ['lsp'];
  if (s.server) args.push('--server', s.server);
  if (s.server && s.token) args.push('--token', s.token);
  return args;
}

/**
 * `caret login`'s arguments for signing in to the team server (through its identity provider,
 * in a browser), or null without one. What it keeps (`$CARET_HOME/credentials.json`) the
 * language server then uses, refreshed as it expires.
 */
export function loginArgs(s: Settings): string[] | null {
  return s.server ? ['login', '--server', s.server] : null;
}

/** The language server's `initializationOptions` (only what is set). */
export function initializationOptions(s: Settings): Record<string, unknown> {
  const o: Record<string, unknown> = {};
  if (s.tabModel) o.model = s.tabModel;
  if (s.family) o.family = s.family;
  if (s.budget > 0) o.budget = Math.floor(s.budget);
  if (s.debounceMs > 0) o.debounce_ms = Math.floor(s.debounceMs);
  return o;
}

/** `caret ui`'s arguments for a workspace folder (the page's server, for the agent and search). */
export function uiArgs(root: string, s: Settings): string[] {
  const args = ['ui', root];
  if (s.agentModel) args.push('--model', s.agentModel);
  if (s.tabModel) args.push('--tab-model', s.tabModel);
  return args;
}

/** The address `caret ui` prints first: `caret ui: http://127.0.0.1:PORT/#token=T`. */
export function parseUiAddress(line: string): { base: string; token: string } | null {
  const m = /^caret ui: (http:\/\/127\.0\.0\.1:\d+)\/#token=([0-9a-f]{64})\s*$/.exec(line);
  return m ? { base: m[1], token: m[2] } : null;
}

/** Splits a server-sent event stream into the JSON values of its `data:` lines. */
export class SseParser {
  private buf = '';

  push(chunk: string): unknown[] {
    this.buf += chunk;
    const out: unknown[] = [];
    let i: number;
    while ((i = this.buf.indexOf('\n\n')) >= 0) {
      const block = this.buf.slice(0, i);
      this.buf = this.buf.slice(i + 2);
      const data = block
        .split('\n')
        .filter((l) => l.startsWith('data:'))
        .map((l) => l.slice(5).trimStart())
        .join('\n');
      if (!data) continue;
      try {
        out.push(JSON.parse(data));
      } catch {
        // A malformed event is skipped; the stream goes on.
      }
    }
    return out;
  }
}

export interface Hit {
  path: string;
  line: number;
  end_line?: number;
  snippet: string;
  score?: number;
}

export interface PickItem {
  label: string;
  description: string;
  detail: string;
  path: string;
  line: number;
}

/** Search hits as quick pick items: the file name, its folder and line, the first code line. */
export function searchItems(hits: Hit[]): PickItem[] {
  return hits.map((h) => {
    const slash = h.path.lastIndexOf('/');
    const first = h.snippet.split('\n').find((l) => l.trim()) ?? '';
    return {
      label: slash >= 0 ? h.path.slice(slash + 1) : h.path,
      description: `${slash >= 0 ? h.path.slice(0, slash) + ' · ' : ''}line ${h.line}${h.end_line && h.end_line !== h.line ? `–${h.end_line}` : ''}`,
      detail: first.trim().slice(0, 160),
      path: h.path,
      line: h.line,
    };
  });
}

/** The `caret/focus` notification for a cursor (0-based line and UTF-16 character). */
export function focusParams(uri: string, line: number, character: number) {
  return { textDocument: { uri }, position: { line, character } };
}

/** Calls `f` once calls stop for `ms`, with the last call's arguments. */
export function debounce<A extends unknown[]>(f: (...a: A) => void, ms: number): (...a: A) => void {
  let t: ReturnType<typeof setTimeout> | undefined;
  return (...a: A) => {
    if (t) clearTimeout(t);
    t = setTimeout(() => f(...a), ms);
  };
}

/** A position as LSP says it (0-based line, UTF-16 character). */
export interface Pos {
  line: number;
  character: number;
}

/** `caret/nextEdit`'s answer: replace `range` with `newText` (possibly away from the cursor). */
export interface NextEdit {
  textDocument: { uri: string };
  range: { start: Pos; end: Pos };
  newText: string;
  reason: string;
}

/**
 * A shown next-edit prediction and what Tab does with it: the first Tab jumps to it when the
 * cursor is elsewhere (opening its file when it is in another one: a rename's uses in another
 * open file), the next applies it; Esc or a keystroke drops it.
 */
export class NextEditState {
  private shown: NextEdit | undefined;

  /** Shows `edit` (null: nothing to show). */
  offer(edit: NextEdit | null | undefined): void {
    this.shown = edit ?? undefined;
  }

  /** The prediction shown, if any. */
  current(): NextEdit | undefined {
    return this.shown;
  }

  /** What Tab does with the cursor in `uri` at `cursor`: open its file, jump there, apply it, or nothing. */
  tab(
    uri: string,
    cursor: Pos,
  ): { kind: 'open'; uri: string; to: Pos } | { kind: 'jump'; to: Pos } | { kind: 'apply'; edit: NextEdit } | { kind: 'none' } {
    const e = this.shown;
    if (!e) return { kind: 'none' };
    const at = e.range.start;
    if (e.textDocument.uri !== uri) return { kind: 'open', uri: e.textDocument.uri, to: at };
    // Off the target's line: go there first, so that the user sees what Tab will do.
    if (cursor.line !== at.line) return { kind: 'jump', to: at };
    this.shown = undefined;
    return { kind: 'apply', edit: e };
  }

  /** Drops it (Esc, a keystroke). */
  dismiss(): void {
    this.shown = undefined;
  }
}

/** What `caret ui` says of the default model (`GET /api/models/default`). */
export interface ModelOffer {
  needed: boolean;
  model: string;
  size_text: string;
  pull: { state: 'idle' | 'pulling' | 'done' | 'failed'; done: number; total: number; error?: string };
}

/** The question put to a user with no model. */
export function offerMessage(o: ModelOffer): string {
  return `Caret: no model is configured. Download the default code model, ${o.model} (${o.size_text}, runs on this machine's CPU)?`;
}

/** A download's percentage, whole, 0–100. */
export function pullPercent(p: ModelOffer['pull']): number {
  if (p.state === 'done') return 100;
  return p.total > 0 ? Math.min(100, Math.floor((p.done * 100) / p.total)) : 0;
}
