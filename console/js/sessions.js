// #/sessions?endpoint=E : blocked sessions, with the blocking event's Resubmit and Skip.
import { api } from './api.js';
import { canResubmit, canSkip, resubmit, skip } from './actions.js';
import { append, clear, endpointOptions, reloadingView, labelCells, eventLink, h, plural, shortId, statusBadge, tableWrap, th, time } from './ui.js';

export async function render(page, { query }, ctx) {
  ctx.title('Blocked sessions');
  const endpoint = query.get('endpoint') || '';
  const after = query.get('after') || '';
  const hashFor = (p) => `#/sessions${p.toString() ? `?${p}` : ''}`;

  const select = h('select', { id: 's-endpoint', name: 'endpoint' }, h('option', { value: '' }, 'All endpoints'));
  const form = h('form', { class: 'filters inline-form', role: 'search', 'aria-label': 'Filter the blocked sessions' },
    h('p', { class: 'field' }, h('label', { for: 's-endpoint' }, 'Endpoint'), select),
    h('p', { class: 'buttons' }, h('button', { type: 'submit', class: 'primary' }, 'Show')));
  form.addEventListener('submit', (e) => {
    e.preventDefault();
    const p = new URLSearchParams();
    if (select.value) p.set('endpoint', select.value);
    location.hash = hashFor(p);
  });
  const box = h('div');
  const pager = h('nav', { class: 'pager', 'aria-label': 'Pages' });
  page.append(h('h1', null, 'Blocked sessions'),
    h('p', { class: 'lead' }, 'A session is blocked while its head event is Failed, retrying or waiting on a hand-off; its later events are parked (Deferred) and replay in order once the head is resubmitted, skipped or settled.'),
    form, box, pager);

  function draw(data, eps) {
    if (eps) endpointOptions(select, eps, endpoint);
    const list = data.sessions || [];
    clear(box);
    if (!list.length) { box.append(h('p', { class: 'empty' }, endpoint ? `No blocked session on ${endpoint}.` : 'No blocked session.')); }
    else {
      box.append(tableWrap('Blocked sessions table', labelCells(h('table', { class: 'grid sessions stack' },
        h('caption', null, `${plural(list.length, 'blocked session')}${after ? ' (a later page)' : ''}`),
        h('thead', null, h('tr', null, th('Session'), th('Endpoint'), th('Blocked by'), th('Status'), th('Reason'),
          th('Since'), th('Retry due'), th('Parked', { class: 'num' }), ctx.canAct ? th('Actions') : null)),
        h('tbody', null, list.map((s) => {
          const ev = { event_id: s.blocked_by, endpoint: s.endpoint, session_id: s.session_id, event_type: s.event_type, status: s.status, sub_status: s.sub_status };
          const label = `${s.event_type} ${shortId(s.blocked_by)}`;
          const acts = [];
          if (ctx.canAct && canResubmit(ev)) {
            const b = h('button', { type: 'button', class: 'small', 'aria-label': `Resubmit ${label}` }, 'Resubmit');
            b.addEventListener('click', async () => { if (await resubmit(ev, { button: b })) refresh(); });
            acts.push(b, ' ');
          }
          if (ctx.canAct && canSkip(ev)) {
            const b = h('button', { type: 'button', class: 'small', 'aria-label': `Skip ${label}` }, 'Skip');
            b.addEventListener('click', async () => { if (await skip(ev, { button: b })) refresh(); });
            acts.push(b);
          }
          const sess = new URLSearchParams(); sess.set('session', s.session_id);
          return h('tr', { 'data-session': s.session_id },
            h('th', { scope: 'row' }, h('a', { class: 'mono', href: `#/endpoints/${encodeURIComponent(s.endpoint)}?${sess}`, title: 'The events of this session' }, s.session_id)),
            h('td', null, h('a', { href: `#/endpoints/${encodeURIComponent(s.endpoint)}` }, s.endpoint)),
            h('td', null, eventLink(s.blocked_by, shortId(s.blocked_by)), ' ', s.event_type),
            h('td', null, statusBadge(s.status, s.sub_status)),
            h('td', { class: 'info' }, h('span', { class: 'err', title: s.reason || '' }, s.reason || '—')),
            h('td', null, time(s.since)), h('td', null, time(s.retry_due)),
            h('td', { class: 'num' }, String(s.parked ?? 0)),
            ctx.canAct ? h('td', { class: 'actions' }, acts) : null);
        }))))));
    }
    clear(pager);
    if (after) {
      const p = new URLSearchParams(); if (endpoint) p.set('endpoint', endpoint);
      pager.append(h('a', { class: 'button', href: hashFor(p) }, '← First page'), ' ');
    }
    if (data.next) {
      const p = new URLSearchParams(); if (endpoint) p.set('endpoint', endpoint); p.set('after', data.next);
      pager.append(h('a', { class: 'button', href: hashFor(p) }, 'Next page →'));
    }
  }

  const q = { endpoint, after, limit: 100 };
  async function refresh() { try { draw(await api('/sessions', { query: q })); } catch { /* next tick */ } }
  const [data, eps] = await Promise.all([api('/sessions', { query: q }), api('/endpoints')]);
  draw(data, eps);
  return reloadingView(refresh);
}
