// The admin page: the organisation's people, tokens, groups and audit trail through the admin
// API, signed in through the organisation's identity provider (an HttpOnly session cookie,
// every change carrying its CSRF token) or with a token kept in this tab only. Everything
// from the server is put in with textContent (names and emails are anyone's).
"use strict";

const KEY = "caret-admin-token";
const $ = (sel) => document.querySelector(sel);
const token = () => sessionStorage.getItem(KEY);

function cookie(name) {
  const kv = document.cookie.split(";").map((c) => c.trim().split("=")).find(([k]) => k === name);
  return kv ? kv[1] : null;
}

async function api(method, path, body) {
  // A token typed in wins; else the session cookie goes along, with the CSRF token.
  const headers = token() ? { Authorization: `Bearer ${token()}` } : { "X-CSRF-Token": cookie("caret_csrf") || "" };
  const init = { method, headers, credentials: "same-origin" };
  if (body !== undefined) {
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  const r = await fetch(path, init);
  const text = await r.text();
  const data = text ? JSON.parse(text) : null;
  if (!r.ok) {
    const err = new Error(data && data.error ? data.error.message : `HTTP ${r.status}`);
    err.status = r.status;
    throw err;
  }
  return data;
}

function when(ms) {
  return ms == null ? "–" : new Date(ms).toISOString().replace("T", " ").slice(0, 16);
}

function fill(table, rows, columns) {
  const body = $(`#${table} tbody`);
  const out = rows.map((r) => {
    const tr = document.createElement("tr");
    if (r.id) tr.dataset.id = r.id;
    for (const c of columns) {
      const td = document.createElement("td");
      const v = c(r);
      if (v instanceof Node) td.appendChild(v); else td.textContent = v == null ? "" : String(v);
      tr.appendChild(td);
    }
    return tr;
  });
  body.replaceChildren(...out);
}

function button(label, onClick) {
  const b = document.createElement("button");
  b.type = "button";
  b.textContent = label;
  b.addEventListener("click", onClick);
  return b;
}

function status(text, error) {
  $("#status").textContent = text;
  $("#status").classList.toggle("error", !!error);
}

async function act(what) {
  try {
    await what();
    await load();
  } catch (e) {
    status(e.message, true);
  }
}

async function load() {
  let me;
  try {
    me = await api("GET", "/v1/me");
  } catch (e) {
    if (e.status === 401 && !token()) status("not signed in");
    else status(e.status === 401 ? "the token was refused" : e.message, true);
    showLogin();
    return;
  }
  if (!me.scopes.includes("admin")) {
    status(`${me.name} (${me.role}) holds no admin scope`, true);
    showLogin();
    return;
  }
  const [people, tokens, groups, audit, usage, settings, flags] = await Promise.all([
    api("GET", "/v1/admin/users"),
    api("GET", "/v1/admin/tokens"),
    api("GET", "/v1/admin/groups"),
    api("GET", "/v1/admin/audit?limit=1000"),
    api("GET", "/v1/admin/usage?days=7"),
    api("GET", "/v1/admin/settings"),
    api("GET", "/v1/admin/flags"),
  ]);
  $("#set-docs").value = settings.docs_sources;
  $("#set-days").value = settings.token_max_days;
  fill("flags", flags, [(f) => f.name, (f) => (f.on ? "on" : "off"), (f) => f.rule]);
  const email = Object.fromEntries(people.map((p) => [p.id, p.email]));
  fill("people", people, [
    (p) => p.email,
    (p) => p.name,
    (p) => {
      const s = document.createElement("select");
      for (const r of ["member", "admin", "owner"]) s.add(new Option(r, r, false, r === p.role));
      s.addEventListener("change", () => act(() => api("PATCH", `/v1/admin/users/${p.id}`, { role: s.value })));
      return s;
    },
    (p) => p.state,
    (p) => button(p.state === "active" ? "Deactivate" : "Activate", () =>
      act(() => api("PATCH", `/v1/admin/users/${p.id}`, { state: p.state === "active" ? "deactivated" : "active" }))),
  ]);
  fill("tokens", tokens, [
    (t) => t.name,
    (t) => t.kind,
    (t) => (t.user ? email[t.user] || t.user : `service (${t.role})`),
    (t) => t.scopes.join(","),
    (t) => when(t.last_used_at),
    (t) => (t.revoked_at ? "revoked" : t.expires_at ? `expires ${when(t.expires_at)}` : "no expiry"),
    (t) => (t.revoked_at ? "" : button("Revoke", () => act(() => api("DELETE", `/v1/admin/tokens/${t.id}`)))),
  ]);
  fill("groups", groups, [
    (g) => g.name,
    (g) => g.members.map((m) => email[m] || m).join(", "),
    (g) => (g.models ? g.models.join(", ") : "every model"),
    (g) => {
      const input = document.createElement("input");
      input.type = "number";
      input.min = "0";
      input.placeholder = "no budget";
      input.value = g.daily_tokens ?? "";
      input.setAttribute("aria-label", `daily tokens of ${g.name}`);
      input.addEventListener("change", () => act(() => api("PUT", `/v1/admin/groups/${g.id}/budget`,
        { daily_tokens: input.value === "" ? null : Number(input.value) })));
      return input;
    },
    (g) => g.source,
  ]);
  $("#usage-since").textContent = usage.since;
  for (const [table, rows] of [["usage-people", usage.by_person], ["usage-models", usage.by_model], ["usage-groups", usage.by_group]]) {
    fill(table, rows, [(t) => t.name, (t) => t.tokens, (t) => t.requests]);
  }
  fill("usage-activity", usage.activity || [], [(a) => a.email, (a) => a.event, (a) => a.count, (a) => a.failed]);
  fill("audit", audit.slice(-200).reverse(), [
    (r) => r.seq,
    (r) => when(r.at_ms),
    (r) => (r.actor.startsWith("user:") && email[r.actor.slice(5)]) || r.actor,
    (r) => r.address,
    (r) => r.action,
    (r) => email[r.target] || r.target,
    (r) => r.outcome,
  ]);
  status(`${me.name} (${me.role}) in ${me.organisation_name}`);
  $("#login").hidden = true;
  $("#board").hidden = false;
  $("#forget").hidden = false;
}

async function showLogin() {
  $("#board").hidden = true;
  $("#login").hidden = false;
  try {
    const methods = await (await fetch("/v1/auth/methods")).json();
    $("#sso").hidden = !methods.oidc;
    $("#ldap").hidden = !methods.ldap;
  } catch (e) {
    $("#sso").hidden = true;
  }
}

$("#login").addEventListener("submit", (e) => {
  e.preventDefault();
  sessionStorage.setItem(KEY, $("#token").value.trim());
  $("#token").value = "";
  load();
});
$("#set-docs").addEventListener("change", () =>
  act(() => api("PATCH", "/v1/admin/settings", { docs_sources: $("#set-docs").value })));
$("#set-days").addEventListener("change", () =>
  act(() => api("PATCH", "/v1/admin/settings", { token_max_days: Number($("#set-days").value) })));
$("#ldap-go").addEventListener("click", async () => {
  const r = await fetch("/v1/auth/ldap", {
    method: "POST",
    credentials: "same-origin",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ username: $("#ldap-user").value, password: $("#ldap-password").value, page: true }),
  });
  $("#ldap-password").value = "";
  if (!r.ok) {
    const b = await r.json().catch(() => null);
    status(b && b.error ? b.error.message : `HTTP ${r.status}`, true);
    return;
  }
  load();
});
$("#forget").addEventListener("click", async () => {
  if (!token()) {
    try { await api("POST", "/v1/auth/logout"); } catch (e) { /* signed out already */ }
  }
  sessionStorage.removeItem(KEY);
  $("#forget").hidden = true;
  status("not signed in");
  showLogin();
});
$("#add-person").addEventListener("submit", (e) => {
  e.preventDefault();
  const f = e.target;
  act(() => api("POST", "/v1/admin/users", { email: f.email.value, role: f.role.value }).then(() => f.reset()));
});
$("#invite").addEventListener("click", () => {
  const f = $("#add-person");
  act(async () => {
    const made = await api("POST", "/v1/admin/invitations", { email: f.email.value, role: f.role.value });
    $("#invited").textContent = `Invitation for ${made.email} (shown once): caret login --server ${location.origin} --invitation ${made.code}`;
    f.reset();
  });
});
$("#add-token").addEventListener("submit", (e) => {
  e.preventDefault();
  const f = e.target;
  const scopes = f.scopes.value.split(",").map((s) => s.trim()).filter(Boolean);
  act(async () => {
    const made = await api("POST", "/v1/admin/tokens", { name: f.name.value, scopes });
    $("#made").textContent = `Token for ${made.info.name} (shown once): ${made.token}`;
    f.reset();
  });
});
$("#verify").addEventListener("click", () =>
  act(async () => {
    const v = await api("POST", "/v1/admin/audit/verify");
    $("#verified").textContent = v.problems.length ? v.problems.join("; ") : `intact: ${v.records} records`;
    $("#verified").classList.toggle("error", v.problems.length > 0);
  }));

// A token handed in the address (#token=…) is taken and removed from it.
function tokenFromHash() {
  const given = new URLSearchParams(location.hash.slice(1)).get("token");
  if (!given) return false;
  sessionStorage.setItem(KEY, given);
  history.replaceState(null, "", location.pathname);
  return true;
}
window.addEventListener("hashchange", () => { if (tokenFromHash()) load(); });
tokenFromHash();
// With no token, a session cookie may be there (after signing in through the provider).
load();
