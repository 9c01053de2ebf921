// #/ : every endpoint with its counts per status, blocked sessions and hand-offs.
import { api } from './api.js';
import { STATUSES, clear, h, labelCells, plural, tableWrap, th } from './ui.js';

export async function render(page, _params, ctx) {
  ctx.title('Overview');
  const summary = h('section', { class: 'cards', 'aria-label': 'Summary' });
  const tableBox = h('div');
  page.append(h('h1', null, 'Overview'), summary,
    h('h2', { id: 'endpoints-h' }, 'Endpoints'), tableBox);

  function draw(data) {
    const eps = (data && data.endpoints) || [];
    const sum = (k) => eps.reduce((n, e) => n + (e[k] || 0), 0);
    const failed = eps.reduce((n, e) => n + (e.counts.Failed || 0) + (e.counts.DeadLettered || 0) + (e.counts.Unsupported || 0), 0);
    clear(summary).append(
      card('Unresolved failures', failed, '#/failures', failed > 0 ? 'bad' : ''),
      card('Blocked sessions', sum('blocked_sessions'), '#/sessions', sum('blocked_sessions') > 0 ? 'warn' : ''),
      card('Pending hand-offs', sum('handoffs_pending'), null, ''),
      card('Overdue hand-offs', sum('handoffs_overdue'), null, sum('handoffs_overdue') > 0 ? 'bad' : ''),
    );
    clear(tableBox);
    if (!eps.length) {
      tableBox.append(h('p', { class: 'empty' }, 'No endpoint has handled an event yet.'));
      return;
    }
    const rows = eps.map((e) => {
      const name = e.endpoint;
      const tr = h('tr', { class: 'clickable', 'data-endpoint': name },
        h('th', { scope: 'row' }, h('a', { href: `#/endpoints/${encodeURIComponent(name)}` }, name)),
        STATUSES.map((s) => {
          const n = e.counts[s] || 0;
          const cls = n === 0 ? 'num zero' : `num${['Failed', 'DeadLettered', 'Unsupported'].includes(s) ? ' bad' : ''}`;
          return h('td', { class: cls }, n === 0 ? '0' : h('a', {
            href: `#/endpoints/${encodeURIComponent(name)}?status=${s}`, 'aria-label': `${plural(n, 'event')} ${s} on ${name}`,
          }, String(n)));
        }),
        h('td', { class: `num${e.blocked_sessions ? ' warn' : ' zero'}` }, e.blocked_sessions
          ? h('a', { href: `#/sessions?endpoint=${encodeURIComponent(name)}`, 'aria-label': `${plural(e.blocked_sessions, 'blocked session')} on ${name}` }, String(e.blocked_sessions))
          : '0'),
        h('td', { class: `num${e.handoffs_pending ? '' : ' zero'}` }, e.handoffs_pending
          ? h('a', { href: `#/endpoints/${encodeURIComponent(name)}?status=Pending`, 'aria-label': `${plural(e.handoffs_pending, 'pending hand-off')} on ${name}` }, String(e.handoffs_pending))
          : '0'),
        h('td', { class: `num${e.handoffs_overdue ? ' bad' : ' zero'}` }, String(e.handoffs_overdue || 0)),
        h('td', { class: `num${e.live_hosts ? '' : ' warn'}` }, String(e.live_hosts ?? 0)));
      // the whole row opens the endpoint (the name is the link for the keyboard)
      tr.addEventListener('click', (ev) => {
        if (ev.target.closest('a, button, input')) return;
        location.hash = `#/endpoints/${encodeURIComponent(name)}`;
      });
      return tr;
    });
    tableBox.append(tableWrap('Endpoints table', labelCells(h('table', { class: 'grid overview stack', 'aria-labelledby': 'endpoints-h' },
      h('thead', null, h('tr', null, th('Endpoint'), STATUSES.map((s) => th(s === 'DeadLettered' ? 'Dead-lettered' : s, { class: 'num' })),
        th('Blocked sessions', { class: 'num' }), th('Hand-offs pending', { class: 'num' }), th('Hand-offs overdue', { class: 'num' }),
        th('Live hosts', { class: 'num' }))),
      h('tbody', null, rows)))));
  }

  draw(await api('/endpoints'));
  return {
    poll: async () => { try { draw(await api('/endpoints')); } catch { /* next tick */ } },
    counts: (data) => draw(data),
  };
}

function card(label, n, href, kind) {
  return h('div', { class: `card ${kind}` },
    h('p', { class: 'card-n' }, String(n)),
    h('p', { class: 'card-label' }, href ? h('a', { href }, label) : label));
}
