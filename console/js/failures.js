// #/failures?endpoint=E : unresolved events grouped by endpoint, error type and message,
// with a bulk resubmit or skip of a whole group.
import { api } from './api.js';
import { bulkOnFilter } from './actions.js';
import { append, clear, endpointOptions, reloadingView, labelCells, eventLink, h, plural, shortId, tableWrap, th, time } from './ui.js';

export async function render(page, { query }, ctx) {
  ctx.title('Failure groups');
  const endpoint = query.get('endpoint') || '';
  const select = h('select', { id: 'g-endpoint', name: 'endpoint' });
  const form = h('form', { class: 'filters inline-form', role: 'search', 'aria-label': 'Filter the failure groups' },
    h('p', { class: 'field' }, h('label', { for: 'g-endpoint' }, 'Endpoint'), select),
    h('p', { class: 'buttons' }, h('button', { type: 'submit', class: 'primary' }, 'Show')));
  form.addEventListener('submit', (e) => {
    e.preventDefault();
    location.hash = select.value ? `#/failures?endpoint=${encodeURIComponent(select.value)}` : '#/failures';
  });
  const box = h('div');
  page.append(h('h1', null, 'Failure groups'),
    h('p', { class: 'lead' }, 'Unresolved events with the same endpoint, error type and message, largest group first. Fix the cause, then resubmit the group, or skip it.'),
    form, box);

  function draw(data, eps) {
    if (eps) endpointOptions(select, eps, endpoint);
    const groups = data.groups || [];
    clear(box);
    if (!groups.length) { box.append(h('p', { class: 'empty' }, 'No unresolved failure. ')); return; }
    box.append(tableWrap('Failure groups table', labelCells(h('table', { class: 'grid failures stack' },
      h('caption', null, `${plural(groups.length, 'group')}, ${plural(groups.reduce((n, g) => n + g.count, 0), 'event')}`),
      h('thead', null, h('tr', null, th('Message'), th('Endpoint'), th('Error type'), th('Events', { class: 'num' }),
        th('First seen'), th('Last seen'), th('Sample'), ctx.canAct ? th('Actions') : null)),
      h('tbody', null, groups.map((g) => {
        const what = `in the group “${g.message}” on ${g.endpoint}`;
        const filter = { group: g.group, endpoint: g.endpoint };
        const label = `${plural(g.count, 'event')} of the group ${g.message}`;
        const acts = [];
        if (ctx.canAct) {
          const r = h('button', { type: 'button', class: 'small', 'aria-label': `Resubmit ${label}` }, 'Resubmit group…');
          r.addEventListener('click', async () => { if (await bulkOnFilter('resubmit', filter, { button: r, what })) refresh(); });
          const s = h('button', { type: 'button', class: 'small', 'aria-label': `Skip ${label}` }, 'Skip group…');
          s.addEventListener('click', async () => { if (await bulkOnFilter('skip', filter, { button: s, what })) refresh(); });
          acts.push(r, ' ', s);
        }
        const evs = new URLSearchParams(); evs.set('group', g.group);
        return h('tr', { 'data-group': g.group },
          h('th', { scope: 'row', class: 'info' }, h('span', { class: 'err', title: g.sample_error_text || g.message }, g.message)),
          h('td', null, h('a', { href: `#/endpoints/${encodeURIComponent(g.endpoint)}` }, g.endpoint)),
          h('td', null, g.error_type || '—'),
          h('td', { class: 'num' }, h('a', { href: `#/endpoints/${encodeURIComponent(g.endpoint)}?${evs}`, 'aria-label': `The ${plural(g.count, 'event')} of this group` }, String(g.count))),
          h('td', null, time(g.first_seen)), h('td', null, time(g.last_seen)),
          h('td', null, g.sample_event_id ? eventLink(g.sample_event_id, shortId(g.sample_event_id)) : '—'),
          ctx.canAct ? h('td', { class: 'actions' }, acts) : null);
      }))))));
  }

  const q = { endpoint };
  async function refresh() { try { draw(await api('/failures', { query: q })); } catch { /* next tick */ } }
  const [data, eps] = await Promise.all([api('/failures', { query: q }), api('/endpoints')]);
  draw(data, eps);
  return reloadingView(refresh);
}
