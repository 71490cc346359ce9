// The fleet dashboard: polls GET /v1/fleet with the operator token every second and renders
// it. Everything from the server is put in with textContent (tenant names are anyone's).
"use strict";

const POLL_MS = 1000;
const KEY = "caret-operator-token";
let timer = null;

function token() {
  return sessionStorage.getItem(KEY);
}

function $(sel) {
  return document.querySelector(sel);
}

function setFigure(name, value) {
  for (const el of document.querySelectorAll(`[data-figure="${name}"]`)) el.textContent = String(value);
}

function bytes(n) {
  if (n == null) return "–";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return `${n.toFixed(i === 0 ? 0 : 1)} ${units[i]}`;
}

function duration(ms) {
  if (ms == null || ms < 0) return "–";
  const s = Math.round(ms / 1000);
  if (s < 60) return `${s} s`;
  if (s < 3600) return `${Math.floor(s / 60)} min ${s % 60} s`;
  return `${Math.floor(s / 3600)} h ${Math.floor((s % 3600) / 60)} min`;
}

function fill(table, rows, columns, empty) {
  const body = $(`#${table} tbody`);
  const out = [];
  for (const r of rows) {
    const tr = document.createElement("tr");
    if (r.id) tr.dataset.run = r.id;
    for (const c of columns) {
      const td = document.createElement("td");
      const v = c(r);
      if (v && typeof v === "object") {
        td.textContent = v.text;
        if (v.className) td.className = v.className;
      } else {
        td.textContent = v == null ? "" : String(v);
      }
      tr.appendChild(td);
    }
    out.push(tr);
  }
  if (out.length === 0) {
    const tr = document.createElement("tr");
    const td = document.createElement("td");
    td.colSpan = columns.length;
    td.className = "empty";
    td.textContent = empty;
    tr.appendChild(td);
    out.push(tr);
  }
  body.replaceChildren(...out);
}

function render(f) {
  const sum = (xs, g) => xs.reduce((a, x) => a + g(x), 0);
  const queued = (cls) => sum(f.queue.filter((q) => cls == null || q.class === cls), (q) => q.queued);
  // A sandbox is live once its worker has reported on it (the first heartbeat).
  const live = f.running.filter((r) => r.usage);
  setFigure("workers", f.workers.length);
  setFigure("slots", sum(f.workers, (w) => w.slots));
  setFigure("busy", sum(f.workers, (w) => w.busy));
  setFigure("running", f.running.length);
  setFigure("queued", queued(null));
  setFigure("queued-interactive", queued("interactive"));
  setFigure("queued-batch", queued("batch"));
  setFigure("sandboxes", live.length);
  setFigure("sandbox-memory", bytes(sum(f.running, (r) => (r.usage ? r.usage.memory_bytes : 0))));
  fill("sandboxes", f.running, [
    (r) => r.id, (r) => r.tenant, (r) => r.class, (r) => r.worker, (r) => r.attempt, (r) => duration(r.age_ms),
    (r) => (r.usage ? r.usage.processes : "–"),
    (r) => (r.usage ? `${(r.usage.cpu_ms / 1000).toFixed(1)} s` : "–"),
    (r) => (r.usage ? bytes(r.usage.memory_bytes) : "–"),
  ], "nothing running");
  fill("queue", f.queue, [(q) => q.class, (q) => q.tenant, (q) => q.queued, (q) => q.running], "queue empty");
  fill("workers", f.workers, [
    (w) => w.name, (w) => w.sandbox, (w) => w.slots, (w) => w.busy, (w) => `${duration(w.last_seen_ms_ago)} ago`,
  ], "no worker heard from in the last 5 minutes");
  fill("recent", f.recent, [
    (r) => r.id, (r) => r.tenant, (r) => r.class,
    (r) => ({ text: r.state, className: `state-${r.state}` }),
    (r) => r.attempt,
    (r) => duration(r.finished_ms != null && r.started_ms != null ? r.finished_ms - r.started_ms : null),
    (r) => r.reason || "",
  ], "no run has ended yet");
  document.body.dataset.at = String(f.at_ms);
}

function status(text, error) {
  const s = $("#status");
  s.textContent = text;
  s.classList.toggle("error", !!error);
}

async function poll() {
  const t = token();
  if (!t) return showLogin();
  try {
    const r = await fetch("/v1/fleet", { headers: { Authorization: `Bearer ${t}` }, cache: "no-store" });
    if (r.status === 401) {
      sessionStorage.removeItem(KEY);
      status("the operator token was refused", true);
      return showLogin();
    }
    if (!r.ok) throw new Error(`${r.status} ${await r.text()}`);
    render(await r.json());
    status(`live · updated ${new Date().toLocaleTimeString()}`, false);
  } catch (e) {
    status(`cannot reach the server: ${e.message}`, true);
  }
  timer = setTimeout(poll, POLL_MS);
}

function showLogin() {
  clearTimeout(timer);
  $("#board").hidden = true;
  $("#forget").hidden = true;
  $("#login").hidden = false;
}

function start() {
  $("#login").hidden = true;
  $("#board").hidden = false;
  $("#forget").hidden = false;
  clearTimeout(timer);
  poll();
}

// A token handed over in the fragment (never sent to the server) moves to this tab's storage
// and out of the address bar.
function tokenFromFragment() {
  const m = location.hash.match(/token=([^&]+)/);
  if (!m) return false;
  sessionStorage.setItem(KEY, decodeURIComponent(m[1]));
  history.replaceState(null, "", location.pathname);
  return true;
}

window.addEventListener("hashchange", () => {
  if (tokenFromFragment()) start();
});

document.addEventListener("DOMContentLoaded", () => {
  tokenFromFragment();
  $("#login").addEventListener("submit", (e) => {
    e.preventDefault();
    sessionStorage.setItem(KEY, $("#token").value.trim());
    start();
  });
  $("#forget").addEventListener("click", () => {
    sessionStorage.removeItem(KEY);
    status("not connected", false);
    showLogin();
  });
  if (token()) start(); else showLogin();
});
