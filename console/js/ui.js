// Small DOM helpers shared by the views: element building, times, status badges, the
// alert and notice regions, and the confirmation dialog.

export const STATUSES = ['Completed', 'Failed', 'Pending', 'Deferred', 'DeadLettered', 'Unsupported', 'Skipped'];
// statuses an operator can resubmit or skip without force (a Deferred event replays by itself)
export const ACTIONABLE = new Set(['Failed', 'Pending', 'DeadLettered', 'Unsupported']);
export const RESOLVED = new Set(['Completed', 'Skipped']);

// h('a', { href: '#/', class: 'x', onclick: fn }, 'text', child, [more])
export function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v == null || v === false) continue;
    if (k === 'class') el.className = v;
    else if (k.startsWith('on') && typeof v === 'function') el.addEventListener(k.slice(2), v);
    else if (k === 'value') el.value = v;
    else if (k === 'checked') el.checked = !!v;
    else if (v === true) el.setAttribute(k, '');
    else el.setAttribute(k, String(v));
  }
  append(el, children);
  return el;
}

export function append(el, children) {
  for (const c of [children].flat(Infinity)) {
    if (c == null || c === false) continue;
    el.append(c instanceof Node ? c : String(c));
  }
  return el;
}

export function clear(el) {
  while (el.firstChild) el.firstChild.remove();
  return el;
}

const pad = (n, w = 2) => String(n).padStart(w, '0');

// local time as YYYY-MM-DD HH:MM:SS (the raw ISO value in the title and datetime)
export function localTime(iso) {
  const d = new Date(iso);
  if (Number.isNaN(d.getTime())) return String(iso);
  return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ` +
    `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
}

export function time(iso) {
  if (iso == null || iso === '') return h('span', { class: 'muted' }, '—');
  return h('time', { datetime: iso, title: iso }, localTime(iso));
}

export function isOverdue(ev) {
  return ev.status === 'Pending' && ev.sub_status === 'Handoff' && ev.expected_by &&
    new Date(ev.expected_by).getTime() < Date.now();
}

export function statusBadge(status, sub) {
  const text = sub ? `${status} · ${sub}` : status;
  return h('span', { class: `badge st-${String(status).toLowerCase()}` }, text);
}

// the first 8 characters and the last 4: time-ordered ids (UUIDv7) share their first ones
export function shortId(id) {
  if (!id) return '';
  const s = String(id);
  return s.length > 14 ? `${s.slice(0, 8)}…${s.slice(-4)}` : s;
}

export function eventLink(id, text) {
  return h('a', { href: `#/events/${encodeURIComponent(id)}`, class: 'mono', title: id }, text ?? id);
}

export function endpointLink(name, query) {
  const q = query ? `?${new URLSearchParams(query)}` : '';
  return h('a', { href: `#/endpoints/${encodeURIComponent(name)}${q}` }, name);
}

// A list view that reads itself again when events change: a burst of status events
// reloads it once, 300 ms after the last; `poll` is the app's fallback when the stream is down.
export function reloadingView(refresh) {
  let timer = null;
  return {
    poll: refresh,
    status: () => { clearTimeout(timer); timer = setTimeout(refresh, 300); },
    destroy: () => clearTimeout(timer),
  };
}

// The endpoint filter's <select>: every endpoint of the overview (eps) and the one chosen.
export function endpointOptions(select, eps, endpoint) {
  const names = (eps.endpoints || []).map((e) => e.endpoint);
  if (endpoint && !names.includes(endpoint)) names.push(endpoint);
  append(clear(select), [h('option', { value: '' }, 'All endpoints'),
    names.map((n) => h('option', { value: n, selected: n === endpoint }, n))]);
}

export function plural(n, one, many = `${one}s`) {
  return `${n} ${n === 1 ? one : many}`;
}

// A table wrapper: scrolls sideways at narrow widths, reachable by keyboard.
export function tableWrap(label, table) {
  return h('div', { class: 'table-wrap', role: 'region', 'aria-label': label, tabindex: '0' }, table);
}

// Narrow screens show the rows of a table.grid.stack as cards: every cell gets its column's
// name (data-label, shown before it by the CSS) and explicit roles, which keep the table's
// semantics once the CSS changes the display of its parts.
export function labelCells(table) {
  table.setAttribute('role', 'table');
  const heads = [...table.querySelectorAll('thead tr > *')].map((c) =>
    (c.getAttribute('data-label') || c.textContent || c.querySelector('[aria-label]')?.getAttribute('aria-label') || '').trim());
  for (const g of table.querySelectorAll('thead, tbody')) g.setAttribute('role', 'rowgroup');
  for (const c of table.querySelectorAll('thead tr > *')) c.setAttribute('role', 'columnheader');
  for (const tr of table.querySelectorAll('tr')) {
    tr.setAttribute('role', 'row');
    if (tr.parentElement.tagName !== 'TBODY') continue;
    [...tr.children].forEach((c, i) => {
      c.setAttribute('role', c.tagName === 'TH' ? 'rowheader' : 'cell');
      if (heads[i] && !c.hasAttribute('colspan')) c.setAttribute('data-label', heads[i]);
    });
  }
  return table;
}

export function th(text, attrs) {
  return h('th', { scope: 'col', ...attrs }, text);
}

// ------------------------------------------------------------------ messages

const alertEl = () => document.getElementById('alert');
const noticeEl = () => document.getElementById('notice');

// Shows an API error ({error, field}) or any Error in the alert region.
export function showError(err, context) {
  const el = alertEl();
  clear(el);
  const body = err && err.body;
  let text = body && body.error ? body.error : (err && err.message) || String(err);
  if (body && body.field) text += ` (field: ${body.field})`;
  const status = err && err.status ? `HTTP ${err.status}: ` : '';
  el.append(h('p', null, h('strong', null, context ? `${context} failed. ` : 'Error. '), status + text));
  if (body && body.event && body.event.status) {
    el.append(h('p', null, `The event is now ${body.event.status}${body.event.sub_status ? ' · ' + body.event.sub_status : ''}.`));
  }
  el.append(h('button', { type: 'button', class: 'small', onclick: () => hideError() }, 'Dismiss'));
  el.hidden = false;
}

export function hideError() {
  const el = alertEl();
  if (el) { el.hidden = true; clear(el); }
}

let noticeTimer = null;
export function clearNotice() {
  const el = noticeEl();
  clearTimeout(noticeTimer);
  if (el) { clear(el); el.className = 'notice'; }
}

export function notice(text, kind = 'ok') {
  const el = noticeEl();
  clear(el);
  el.className = `notice notice-${kind}`;
  el.append(h('p', null, text));
  clearTimeout(noticeTimer);
  noticeTimer = setTimeout(() => { clear(el); el.className = 'notice'; }, 15000);
}

// What an action's 202 answer means for the operator.
export function queuedText(what, answer) {
  const ev = answer && answer.event;
  let t = `${what} queued${ev ? ` for ${ev.event_type} ${shortId(ev.event_id)}` : ''}.`;
  if (answer && answer.live_hosts === 0) {
    t += ` No host serves ${ev ? ev.endpoint : 'the endpoint'} now: the request waits until one starts.`;
  }
  return t;
}

// Polite announcement for screen readers (status changes arriving live).
let announceTimer = null;
const pending = [];
export function announce(text) {
  pending.push(text);
  clearTimeout(announceTimer);
  announceTimer = setTimeout(() => {
    const el = document.getElementById('announce');
    const lines = pending.splice(0);
    el.textContent = lines.length > 3 ? `${lines.length} events changed status` : lines.join('. ');
  }, 400);
}

// ------------------------------------------------------------------ confirmation

// Resolves { ok, reason } after the operator confirms or cancels.
export function confirmDialog({ title, body, confirmLabel = 'Confirm', reason = false, danger = false }) {
  const dlg = document.getElementById('confirm');
  document.getElementById('confirm-title').textContent = title;
  const text = clear(document.getElementById('confirm-text'));
  append(text, body);
  const reasonP = dlg.querySelector('.confirm-reason');
  const reasonIn = document.getElementById('confirm-reason');
  reasonP.hidden = !reason;
  reasonIn.value = '';
  const ok = document.getElementById('confirm-ok');
  ok.textContent = confirmLabel;
  ok.className = danger ? 'danger' : 'primary';
  const opener = document.activeElement;
  dlg.returnValue = 'cancel';
  return new Promise((resolve) => {
    dlg.addEventListener('close', () => {
      if (opener && opener.isConnected) opener.focus();
      resolve({ ok: dlg.returnValue === 'ok', reason: reasonIn.value.trim() });
    }, { once: true });
    dlg.showModal();
    document.getElementById('confirm-cancel').focus();
  });
}

// Disables a button while fn runs (so a double click sends one request).
export async function busy(button, fn) {
  if (button) { button.disabled = true; button.setAttribute('aria-busy', 'true'); }
  try { return await fn(); } finally {
    if (button && button.isConnected) { button.disabled = false; button.removeAttribute('aria-busy'); }
  }
}
