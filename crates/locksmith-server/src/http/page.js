// The live page of the lock table. It reads the JSON API of the same
// listener every second (api/locks, api/sessions, api/history, api/cluster), renders with
// DOM calls and textContent only (lock names and labels come from clients),
// and counts leases down between reads. The prefix filter and the lock whose
// grants are shown live in the URL (?prefix=...#lock=...), so a view can be
// bookmarked or shared.
"use strict";

const REFRESH_MS = 1000;
const params = new URLSearchParams(location.search);
const prefixInput = document.getElementById("prefix");
prefixInput.value = params.get("prefix") || "";

// Server time at the last read, and the local time it arrived, so countdowns
// run on the server's clock.
let serverNow = 0;
let readAt = 0;
let timer = null;

function now() {
  return serverNow + (Date.now() - readAt);
}

function selectedLock() {
  const hash = location.hash;
  return hash.startsWith("#lock=") ? decodeURIComponent(hash.slice(6)) : null;
}

function el(tag, text, cls) {
  const node = document.createElement(tag);
  if (text !== undefined && text !== null) node.textContent = String(text);
  if (cls) node.className = cls;
  return node;
}

function row(cells) {
  const tr = document.createElement("tr");
  for (const cell of cells) {
    tr.appendChild(cell instanceof Node && cell.nodeName === "TD" ? cell : td(cell));
  }
  return tr;
}

function td(content, cls) {
  const cell = el("td", undefined, cls);
  if (content instanceof Node) cell.appendChild(content);
  else cell.textContent = content === undefined || content === null ? "" : String(content);
  return cell;
}

function seconds(ms) {
  if (ms < 0) ms = 0;
  if (ms < 60000) return (ms / 1000).toFixed(1) + "s";
  const s = Math.round(ms / 1000);
  if (s < 3600) return Math.floor(s / 60) + "m" + String(s % 60).padStart(2, "0") + "s";
  return Math.floor(s / 3600) + "h" + String(Math.floor((s % 3600) / 60)).padStart(2, "0") + "m";
}

function time(ms) {
  return new Date(ms).toISOString().replace("T", " ").replace(/\.\d+Z$/, "Z");
}

function lockBy(client, host) {
  if (!client && !host) return el("span", "-", "muted");
  return el("span", host ? client + "@" + host : client);
}

// A cell whose text counts down to `deadline` (server clock); see tick().
function countdown(deadline) {
  const cell = td("", "num countdown");
  cell.dataset.deadline = String(deadline);
  return cell;
}

function tick() {
  const t = now();
  for (const cell of document.querySelectorAll("td.countdown")) {
    const left = Number(cell.dataset.deadline) - t;
    cell.textContent = seconds(left);
    cell.classList.toggle("expiring", left < 2000);
  }
}

function lockLink(name) {
  const a = el("a", name);
  a.href = "#lock=" + encodeURIComponent(name);
  a.title = "recent grants of " + name;
  return a;
}

function waitersList(waiters) {
  if (waiters.length === 0) return el("span", "-", "muted");
  const list = el("ol", undefined, "waiters");
  for (const w of waiters) {
    const since = seconds(now() - w.since_ms);
    list.appendChild(el("li", w.owner + " (" + w.mode + ", session " + w.session_id + ", waiting " + since + ")"));
  }
  return list;
}

function renderLocks(data) {
  const body = document.querySelector("#locks tbody");
  const rows = [];
  for (const lock of data.locks) {
    const holders = lock.holders.length ? lock.holders : [null];
    holders.forEach((h, i) => {
      const name = td(i === 0 ? lockLink(lock.name) : "", "name");
      const waiters = td(i === 0 ? waitersList(lock.waiters) : "");
      if (h === null) {
        const delay = lock.lock_delay_until_ms;
        rows.push(row([name, td(delay ? "lock-delay" : "-", "muted"), td("-", "muted"), td("-", "muted"),
          td("-", "muted"), td("-", "muted"), delay ? countdown(delay) : td("-", "muted"), waiters]));
        return;
      }
      const expiry = h.lease_until_ms !== null ? h.lease_until_ms : h.session_expires_at_ms;
      const mode = h.hold_count > 1 ? h.mode + " ×" + h.hold_count : h.mode;
      rows.push(row([
        name,
        td(mode),
        td(h.owner, "mono owner"),
        td(lockBy(h.client_name, h.host), "lock-by"),
        td(h.fencing_token, "token num"),
        td(time(h.lock_time_ms), "num"),
        expiry !== null ? countdown(expiry) : td("-", "muted"),
        waiters,
      ]));
    });
  }
  body.replaceChildren(...rows);
  document.getElementById("no-locks").hidden = data.locks.length > 0;
  const shown = data.locks.length;
  document.getElementById("lock-count").textContent =
    data.more ? "(the first " + shown + "; more match)" : "(" + shown + ")";
}

function renderSessions(data) {
  const body = document.querySelector("#sessions tbody");
  body.replaceChildren(...data.sessions.map((s) => row([
    td(s.session_id, "num"),
    td(s.client_name),
    td(s.host),
    td(s.holds, "num"),
    td(seconds(s.ttl_ms), "num"),
    countdown(s.expires_at_ms),
    td(s.connected ? "yes" : "no", s.connected ? "" : "lost"),
  ])));
  document.getElementById("session-count").textContent = "(" + data.sessions.length + ")";
}

// The members of the Raft group as this member sees them; shown even when
// the lock table is not (a follower sends inspection to the leader).
function renderCluster(data) {
  const body = document.querySelector("#cluster tbody");
  body.replaceChildren(...data.members.map((m) => row([
    td(m.id === data.node_id ? m.id + " (this page)" : m.id, "num"),
    td(m.address),
    td(m.role, m.role === "leader" ? "leader" : ""),
    td(m.last_log_index, "num"),
    td(m.applied_index, "num"),
    td(m.lag, "num"),
  ])));
  const leader = data.leader_id === null ? "no leader (an election is under way)" : "leader " + data.leader_id;
  document.getElementById("cluster-summary").textContent =
    "(" + data.members.length + " member" + (data.members.length === 1 ? "" : "s") + ", " + leader + ", term " + data.term +
    (data.changing ? ", a change of voters under way" : "") + ")";
}

function renderHistory(name, data) {
  const section = document.getElementById("history");
  if (name === null) {
    section.hidden = true;
    return;
  }
  section.hidden = false;
  document.getElementById("history-name").textContent = name;
  const grants = data ? data.grants.filter((g) => g.name === name).reverse() : [];
  const body = document.querySelector("#grants tbody");
  body.replaceChildren(...grants.map((g) => {
    let ended = "held";
    let cls = "";
    if (g.end === "released") ended = "released " + time(g.ended_at_ms);
    if (g.end === "lost") {
      ended = "lost (" + g.lost_reason + ") " + time(g.ended_at_ms);
      cls = "lost";
    }
    return row([
      td(g.fencing_token, "token num"),
      td(g.owner, "mono"),
      td(lockBy(g.client_name, g.host)),
      td(g.mode),
      td(time(g.granted_at_ms), "num"),
      td(seconds(g.waited_ms), "num"),
      td(ended, cls),
    ]);
  }));
  document.getElementById("no-grants").hidden = grants.length > 0;
}

async function getJson(path) {
  const response = await fetch(path, { cache: "no-store" });
  if (!response.ok) throw new Error(path + ": " + response.status + " " + (await response.text()).trim());
  return response.json();
}

async function refresh() {
  clearTimeout(timer);
  const prefix = prefixInput.value;
  const name = selectedLock();
  const status = document.getElementById("status");
  getJson("api/cluster").then(renderCluster, () => {
    document.getElementById("cluster-summary").textContent = "(not known yet)";
  });
  try {
    const [locks, sessions, history] = await Promise.all([
      getJson("api/locks?prefix=" + encodeURIComponent(prefix)),
      getJson("api/sessions"),
      name === null ? null : getJson("api/history?prefix=" + encodeURIComponent(name)),
    ]);
    serverNow = locks.now_ms;
    readAt = Date.now();
    renderLocks(locks);
    renderSessions(sessions);
    renderHistory(name, history);
    tick();
    status.textContent = "live, server time " + time(serverNow);
    status.className = "status live";
  } catch (error) {
    status.textContent = "cannot reach the server (" + error.message + "); retrying";
    status.className = "status down";
  }
  timer = setTimeout(refresh, REFRESH_MS);
}

document.getElementById("filter").addEventListener("submit", (event) => event.preventDefault());
prefixInput.addEventListener("input", () => {
  const url = new URL(location.href);
  if (prefixInput.value) url.searchParams.set("prefix", prefixInput.value);
  else url.searchParams.delete("prefix");
  history.replaceState(null, "", url);
  refresh();
});
document.getElementById("history-close").addEventListener("click", (event) => {
  event.preventDefault();
  history.replaceState(null, "", location.pathname + location.search);
  refresh();
});
window.addEventListener("hashchange", refresh);
setInterval(tick, 200);
refresh();
