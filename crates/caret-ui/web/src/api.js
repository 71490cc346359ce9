// The page's calls to its server: `caret ui` (the launch token comes in the URL's fragment,
// `#token=…`, never sent to a server or kept in its logs) or a team's `caret serve` (an API
// token, typed into the sign-in form or given the same way). The token goes with every
// request as a bearer token. Paths are relative to the page (`/ui/NAME/` on a server).

let token = (() => {
  const m = /(?:^|[#&])token=([^&]+)/.exec(location.hash);
  if (m) {
    sessionStorage.setItem('caret-token', decodeURIComponent(m[1]));
    history.replaceState(null, '', location.pathname + location.search);
  }
  return sessionStorage.getItem('caret-token') || '';
})();

// Keeps `value` as the token for this tab's session.
export function signIn(value) {
  token = value.trim();
  sessionStorage.setItem('caret-token', token);
}

// Whether the page is a team's, on `caret serve` (under `/ui/NAME/`).
export const onServer = location.pathname !== '/';

// `/api/x` → `api/x`: the page's own API, wherever the page is.
const here = (path) => path.replace(/^\//, '');

export class ApiError extends Error {
  constructor(status, message, body) {
    super(message);
    this.status = status;
    this.body = body;
  }
}

export async function call(method, path, body, signal) {
  const init = { method, headers: { authorization: `Bearer ${token}` }, signal };
  if (body !== undefined) {
    init.headers['content-type'] = 'application/json';
    init.body = JSON.stringify(body);
  }
  const r = await fetch(here(path), init);
  const text = await r.text();
  let data = null;
  try {
    data = text ? JSON.parse(text) : null;
  } catch {
    data = { error: { message: text } };
  }
  if (!r.ok) throw new ApiError(r.status, data?.error?.message || `${r.status}`, data);
  return data;
}

export const get = (path, signal) => call('GET', path, undefined, signal);
export const post = (path, body, signal) => call('POST', path, body ?? {}, signal);
export const put = (path, body) => call('PUT', path, body);

// Reads a server-sent event stream, calling `onEvent(data)` for each event's JSON; returns
// when the stream ends or `signal` aborts. Reconnects are the caller's.
export async function stream(path, onEvent, signal) {
  const r = await fetch(here(path), { headers: { authorization: `Bearer ${token}` }, signal });
  if (!r.ok) throw new ApiError(r.status, await r.text());
  const reader = r.body.pipeThrough(new TextDecoderStream()).getReader();
  let buf = '';
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buf += value;
    let i;
    while ((i = buf.indexOf('\n\n')) >= 0) {
      const block = buf.slice(0, i);
      buf = buf.slice(i + 2);
      const data = block
        .split('\n')
        .filter((l) => l.startsWith('data:'))
        .map((l) => l.slice(5).trimStart())
        .join('\n');
      if (data) {
        try {
          onEvent(JSON.parse(data));
        } catch (e) {
          console.error('bad event', e, data);
        }
      }
    }
  }
}
