// #/endpoints/NAME?filters : the events of one endpoint, filtered and paged, with per-row
// Resubmit and Skip and bulk actions on the filter or on a selection.
import { api } from './api.js';
import { bulkOnFilter, bulkOnSelection, canResubmit, canSkip, resubmit, skip } from './actions.js';
import {
  RESOLVED, STATUSES, announce, clear, eventLink, h, isOverdue, labelCells, plural, shortId, statusBadge, tableWrap, th, time,
} from './ui.js';

const TEXT_FILTERS = [
  ['type', 'Event type', 'comma list, e.g. CrmAccountCreated'],
  ['session', 'Session', ''],
  ['event_id', 'Event id', ''],
  ['payload', 'Payload contains', ''],
  ['error', 'Error contains', 'any case'],
  ['group', 'Failure group', ''],
  ['since', 'Updated since', 'ISO time or an age: 30m, 2h, 7d'],
  ['before', 'Updated before', 'ISO time or an age'],
];
const BULK_KEYS = ['status', 'type', 'session', 'error', 'group', 'since', 'before'];
const DEFAULT_LIMIT = '50';

// previous pages' cursors per filter, so "Previous page" works (cursors only go forward)
const cursorStacks = new Map();

export async function render(page, { name, query }, ctx) {
  ctx.title(name);
  const q = new URLSearchParams(query);
  if (!q.get('order')) q.set('order', 'newest');
  if (!q.get('limit')) q.set('limit', DEFAULT_LIMIT);
  const after = q.get('after') || '';
  const filterKey = (() => { const k = new URLSearchParams(q); k.delete('after'); return k.toString(); })();
  const stack = cursorStacks.get(filterKey) || [];
  cursorStacks.clear();
  cursorStacks.set(filterKey, stack);
  if (!after) stack.length = 0;

  const hashFor = (params) => `#/endpoints/${encodeURIComponent(name)}${params.toString() ? `?${params}` : ''}`;
  const selected = new Map();    // event_id -> Event
  const rows = new Map();        // event_id -> { ev, tr }
  let changedElsewhere = 0;

  // ---- heading and status chips
  const chips = h('ul', { class: 'chips', 'aria-label': 'Events per status' });
  page.append(
    h('nav', { class: 'crumbs', 'aria-label': 'Breadcrumb' }, h('a', { href: '#/' }, 'Overview'), ' / '),
    h('h1', null, name, h('span', { class: 'h1-sub' }, ' events')),
    chips);

  function drawChips(data) {
    const ep = ((data && data.endpoints) || []).find((e) => e.endpoint === name);
    clear(chips);
    const active = (q.get('status') || '').split(',').filter(Boolean);
    for (const s of STATUSES) {
      const n = ep ? ep.counts[s] || 0 : 0;
      const p = new URLSearchParams(q); p.set('status', s); p.delete('after');
      chips.append(h('li', null, h('a', {
        href: hashFor(p), class: `chip st-${s.toLowerCase()}${n ? '' : ' zero'}`,
        'aria-current': active.length === 1 && active[0] === s ? 'true' : null,
      }, `${s} `, h('span', { class: 'chip-n' }, String(n)))));
    }
    if (ep && ep.blocked_sessions) {
      chips.append(h('li', null, h('a', { class: 'chip', href: `#/sessions?endpoint=${encodeURIComponent(name)}` },
        'Blocked sessions ', h('span', { class: 'chip-n' }, String(ep.blocked_sessions)))));
    }
  }

  // ---- filters
  const statusSet = new Set((q.get('status') || '').split(',').filter(Boolean).map((s) => s.toLowerCase()));
  const form = h('form', { class: 'filters', role: 'search', 'aria-label': `Filter the events of ${name}` },
    h('fieldset', { class: 'statuses' }, h('legend', null, 'Status'),
      STATUSES.map((s) => h('label', { class: 'check' },
        h('input', { type: 'checkbox', name: 'status', value: s, checked: statusSet.has(s.toLowerCase()) }), ` ${s}`))),
    h('div', { class: 'fields' },
      TEXT_FILTERS.map(([key, label, hint]) => h('p', { class: 'field' },
        h('label', { for: `f-${key}` }, label),
        h('input', { id: `f-${key}`, name: key, type: 'text', value: q.get(key) || '', autocomplete: 'off', spellcheck: 'false',
          placeholder: hint || null }))),
      h('p', { class: 'field' }, h('label', { for: 'f-order' }, 'Order'),
        h('select', { id: 'f-order', name: 'order' },
          h('option', { value: 'newest', selected: q.get('order') === 'newest' }, 'Newest first'),
          h('option', { value: 'oldest', selected: q.get('order') === 'oldest' }, 'Oldest first'))),
      h('p', { class: 'field' }, h('label', { for: 'f-limit' }, 'Per page'),
        h('select', { id: 'f-limit', name: 'limit' }, ['25', '50', '100', '250', '1000'].map((n) =>
          h('option', { value: n, selected: q.get('limit') === n }, n))))),
    h('p', { class: 'buttons' },
      h('button', { type: 'submit', class: 'primary' }, 'Apply filters'),
      h('a', { href: hashFor(new URLSearchParams()), class: 'button' }, 'Clear filters')));
  form.addEventListener('submit', (e) => {
    e.preventDefault();
    const fd = new FormData(form);
    const p = new URLSearchParams();
    const st = fd.getAll('status');
    if (st.length) p.set('status', st.join(','));
    for (const [key] of TEXT_FILTERS) { const v = String(fd.get(key) || '').trim(); if (v) p.set(key, v); }
    if (fd.get('order') !== 'newest') p.set('order', fd.get('order'));
    if (fd.get('limit') !== DEFAULT_LIMIT) p.set('limit', fd.get('limit'));
    location.hash = hashFor(p);
  });
  const nActive = countFilters(q);
  page.append(h('details', { class: 'filter-box', open: nActive > 0 },
    h('summary', null, 'Filters', h('span', { class: 'muted' }, nActive ? ` (${nActive} active)` : ' (none: every event of the endpoint)')), form));

  // ---- bulk toolbar
  const selCount = h('span', { class: 'sel-count', 'aria-live': 'polite' }, 'No event selected');
  const force = h('input', { type: 'checkbox', id: 'bulk-force' });
  const bulkFilter = { endpoint: name };
  for (const k of BULK_KEYS) if (q.get(k)) bulkFilter[k] = q.get(k);
  const filterBlocked = q.get('payload') || q.get('event_id');
  const filterWhat = `on ${name}${Object.keys(bulkFilter).length > 1 ? ' with these filters' : ''}`;
  const bResSel = h('button', { type: 'button', disabled: true, onclick: async () => {
    const r = await bulkOnSelection('resubmit', [...selected.values()], { force: force.checked, button: bResSel });
    if (r) { clearSelection(); refresh(); }
  } }, 'Resubmit selected');
  const bSkipSel = h('button', { type: 'button', disabled: true, onclick: async () => {
    const r = await bulkOnSelection('skip', [...selected.values()], { button: bSkipSel });
    if (r) { clearSelection(); refresh(); }
  } }, 'Skip selected');
  const bResAll = h('button', { type: 'button', disabled: !!filterBlocked, onclick: async () => {
    const r = await bulkOnFilter('resubmit', bulkFilter, { force: force.checked, button: bResAll, what: filterWhat });
    if (r) refresh();
  } }, 'Resubmit all matching…');
  const bSkipAll = h('button', { type: 'button', disabled: !!filterBlocked, onclick: async () => {
    const r = await bulkOnFilter('skip', bulkFilter, { button: bSkipAll, what: filterWhat });
    if (r) refresh();
  } }, 'Skip all matching…');
  if (ctx.canAct) {
    page.append(h('section', { class: 'bulk', 'aria-label': 'Bulk actions' },
      h('p', { class: 'bulk-sel' }, selCount, ' ', bResSel, ' ', bSkipSel),
      h('p', { class: 'bulk-all' }, bResAll, ' ', bSkipAll, ' ',
        h('label', { class: 'check', for: 'bulk-force' }, force, ' Force (also Completed and Skipped events)')),
      filterBlocked ? h('p', { class: 'help' }, 'Bulk actions on a filter cannot use “Payload contains” or “Event id”: select the rows instead.') : null));
  }

  // ---- table
  const caption = h('caption', null);
  const tbody = h('tbody');
  const selAll = h('input', { type: 'checkbox', id: 'sel-all', 'aria-label': 'Select every event on this page' });
  selAll.addEventListener('change', () => {
    for (const { ev, tr } of rows.values()) {
      const box = tr.querySelector('input.sel');
      if (box) { box.checked = selAll.checked; if (selAll.checked) selected.set(ev.event_id, ev); else selected.delete(ev.event_id); }
    }
    updateSel();
  });
  const table = h('table', { class: 'grid events stack' }, caption,
    h('thead', null, h('tr', null,
      ctx.canAct ? h('td', { class: 'sel', 'data-label': 'Select' }, selAll) : null,
      th('Event'), th('Session'), th('Status'), th('Error or hand-off'), th('Retries', { class: 'num' }),
      th('Updated'), ctx.canAct ? th('Actions') : null)),
    tbody);
  const more = h('p', { class: 'changed', hidden: true, 'aria-live': 'polite' });
  const pager = h('nav', { class: 'pager', 'aria-label': 'Pages' });
  page.append(more, tableWrap(`Events of ${name}`, table), pager);

  function updateSel() {
    const n = selected.size;
    selCount.textContent = n ? `${plural(n, 'event')} selected` : 'No event selected';
    bResSel.disabled = bSkipSel.disabled = n === 0;
    selAll.checked = n > 0 && n === [...rows.values()].filter((r) => r.tr.querySelector('input.sel')).length;
  }
  function clearSelection() { selected.clear(); for (const { tr } of rows.values()) { const b = tr.querySelector('input.sel'); if (b) b.checked = false; } updateSel(); }

  function row(ev) {
    const label = `${ev.event_type} ${shortId(ev.event_id)}`;
    const box = h('input', { type: 'checkbox', class: 'sel', 'aria-label': `Select ${label}`, checked: selected.has(ev.event_id) });
    box.addEventListener('change', () => { if (box.checked) selected.set(ev.event_id, ev); else selected.delete(ev.event_id); updateSel(); });
    const sess = new URLSearchParams(); sess.set('session', ev.session_id);
    let info;
    if (ev.sub_status === 'Handoff' && ev.status === 'Pending') {
      info = h('span', null, ev.handoff_reason || 'hand-off', h('br'),
        h('span', { class: 'muted' }, ev.external_job_id ? ['job ', h('span', { class: 'mono' }, ev.external_job_id)] : null,
          ev.expected_by ? [' · expected by ', time(ev.expected_by)] : null), isOverdue(ev) ? h('strong', { class: 'overdue' }, ' overdue') : null);
    } else if (ev.error_text) {
      info = h('span', { class: 'err', title: ev.error_text }, ev.error_type ? h('span', { class: 'etype' }, `${ev.error_type}: `) : null, ev.error_text);
    } else info = h('span', { class: 'muted' }, '—');
    const actions = [];
    if (ctx.canAct) {
      if (canResubmit(ev)) {
        const b = h('button', { type: 'button', class: 'small', 'aria-label': `Resubmit ${label}` }, 'Resubmit');
        b.addEventListener('click', async () => { if (await resubmit(ev, { button: b })) refresh(); });
        actions.push(b);
      }
      if (canSkip(ev)) {
        const b = h('button', { type: 'button', class: 'small', 'aria-label': `Skip ${label}` }, 'Skip');
        b.addEventListener('click', async () => { if (await skip(ev, { button: b })) refresh(); });
        actions.push(' ', b);
      }
    }
    return h('tr', { 'data-event-id': ev.event_id, 'data-status': ev.status },
      ctx.canAct ? h('td', { class: 'sel' }, box) : null,
      h('th', { scope: 'row' }, eventLink(ev.event_id), h('br'), h('span', { class: 'etype-col' }, ev.event_type)),
      h('td', null, h('a', { href: hashFor(sess), class: 'mono', title: `Events of session ${ev.session_id}`, 'aria-label': `Events of session ${ev.session_id}` }, shortId(ev.session_id))),
      h('td', null, statusBadge(ev.status, ev.sub_status)),
      h('td', { class: 'info' }, info),
      h('td', { class: 'num' }, String(ev.retry_count ?? 0)),
      h('td', null, time(ev.updated_at)),
      ctx.canAct ? h('td', { class: 'actions' }, actions.length ? actions : h('span', { class: 'muted' }, RESOLVED.has(ev.status) ? 'resolved' : '—')) : null);
  }

  // Replaces the row of ev when it changed; keeps the focus on the same control.
  function patch(ev) {
    const old = rows.get(ev.event_id);
    if (!old) return false;
    if (JSON.stringify(old.ev) === JSON.stringify(ev)) return true;
    const focused = document.activeElement && old.tr.contains(document.activeElement) ? document.activeElement.textContent : null;
    const tr = row(ev);
    old.tr.replaceWith(tr);
    rows.set(ev.event_id, { ev, tr });
    labelCells(table);
    if (selected.has(ev.event_id)) selected.set(ev.event_id, ev);
    if (old.ev.status !== ev.status) announce(`${ev.event_type} ${shortId(ev.event_id)} is now ${ev.status}`);
    if (focused) {
      const again = [...tr.querySelectorAll('button, a')].find((x) => x.textContent === focused);
      (again || tr.querySelector('a')).focus();
    }
    return true;
  }

  function apiQuery() {
    const p = { endpoint: name };
    for (const [k, v] of q) if (k !== 'after' || v) p[k] = v;
    return p;
  }

  function drawPage(data) {
    // keep the focus on the same control of the same row across a redraw
    const f = document.activeElement;
    const fRow = f && tbody.contains(f) ? f.closest('tr')?.dataset.eventId : null;
    const fText = fRow ? f.textContent : null;
    clear(tbody);
    rows.clear();
    const evs = data.events || [];
    for (const ev of evs) { const tr = row(ev); rows.set(ev.event_id, { ev, tr }); tbody.append(tr); }
    const pageNo = stack.length + 1;
    clear(caption).append(`${plural(evs.length, 'event')} on page ${pageNo}${anyFilter(q) ? ' (filtered)' : ''}, ${q.get('order') === 'oldest' ? 'oldest' : 'newest'} first`);
    if (!evs.length) tbody.append(h('tr', null, h('td', { colspan: ctx.canAct ? 8 : 6, class: 'empty' }, 'No event matches.')));
    labelCells(table);
    if (fRow && rows.has(fRow)) {
      const tr = rows.get(fRow).tr;
      const again = [...tr.querySelectorAll('button, a, input')].find((x) => x.textContent === fText);
      (again || tr.querySelector('a')).focus();
    }
    clear(pager);
    if (after) {
      const prev = new URLSearchParams(q); const back = stack[stack.length - 1] || '';
      if (back) prev.set('after', back); else prev.delete('after');
      pager.append(h('a', { class: 'button', href: hashFor(prev), onclick: () => { stack.pop(); } }, '← Previous page'), ' ');
    }
    if (data.next) {
      const next = new URLSearchParams(q); next.set('after', data.next);
      pager.append(h('a', { class: 'button', href: hashFor(next), onclick: () => { stack.push(after); } }, 'Next page →'));
    }
    updateSel();
  }

  async function refresh() {
    try {
      const [data, eps] = await Promise.all([api('/events', { query: apiQuery() }), api('/endpoints')]);
      drawChips(eps);
      let fresh = 0;
      for (const ev of data.events || []) if (!patch(ev)) fresh++;
      // the first page, newest first: new events go on top as they come; elsewhere a button offers them
      if (fresh && !after && q.get('order') === 'newest') { drawPage(data); showChanged(0); announce(`${plural(fresh, 'new event')} on ${name}`); } else showChanged(fresh);
    } catch { /* shown on the next action; polling goes on */ }
  }

  function showChanged(n) {
    changedElsewhere = n;
    more.hidden = n === 0;
    clear(more);
    if (n) {
      more.append(`${plural(n, 'event')} new or changed beyond this page. `,
        h('button', { type: 'button', class: 'small', onclick: async () => { drawPage(await api('/events', { query: apiQuery() })); showChanged(0); } }, 'Show them'));
    }
  }

  const [data, eps] = await Promise.all([api('/events', { query: apiQuery() }), api('/endpoints')]);
  drawChips(eps);
  drawPage(data);

  let timer = null;
  return {
    poll: refresh,
    status: (ev) => {
      if (ev.endpoint !== name) return;
      if (!patch(ev)) { clearTimeout(timer); timer = setTimeout(refresh, 300); }
    },
    counts: (d) => drawChips(d),
    destroy: () => { clearTimeout(timer); void changedElsewhere; },
  };
}

function countFilters(q) {
  let n = q.get('status') ? 1 : 0;
  for (const [k] of TEXT_FILTERS) if (q.get(k)) n++;
  return n;
}

function anyFilter(q) {
  for (const [k] of TEXT_FILTERS) if (q.get(k)) return true;
  return !!q.get('status');
}
