// Operator actions shared by the views: one event's resubmit and skip, and bulk actions
// (on a filter, through a dry run first; or on a selection, one request per event).
import { post } from './api.js';
import { ACTIONABLE, RESOLVED, busy, confirmDialog, h, notice, plural, queuedText, shortId, showError, hideError } from './ui.js';

export function canResubmit(ev) { return ACTIONABLE.has(ev.status); }
export function canSkip(ev) { return ACTIONABLE.has(ev.status); }

export async function resubmit(ev, { body, force, button } = {}) {
  hideError();
  const payload = {};
  if (body !== undefined) payload.body = body;
  if (force) payload.force = true;
  try {
    const a = await busy(button, () => post(`/events/${encodeURIComponent(ev.event_id)}/resubmit`, payload));
    notice(queuedText(body !== undefined ? 'Resubmit with changes' : 'Resubmit', a), a.live_hosts === 0 ? 'warn' : 'ok');
    return a;
  } catch (e) {
    showError(e, `Resubmitting ${shortId(ev.event_id)}`);
    return null;
  }
}

export async function skip(ev, { reason, button } = {}) {
  hideError();
  try {
    const a = await busy(button, () => post(`/events/${encodeURIComponent(ev.event_id)}/skip`, reason ? { reason } : {}));
    notice(queuedText('Skip', a), a.live_hosts === 0 ? 'warn' : 'ok');
    return a;
  } catch (e) {
    showError(e, `Skipping ${shortId(ev.event_id)}`);
    return null;
  }
}

function describeFilter(filter) {
  const parts = [];
  for (const [k, v] of Object.entries(filter)) parts.push(`${k} = ${Array.isArray(v) ? v.join(', ') : v}`);
  return parts.join('; ');
}

// kind 'resubmit' | 'skip'. Asks for a dry run, shows its count and sample, and on
// confirmation runs the action. Returns the result or null.
export async function bulkOnFilter(kind, filter, { force = false, button, what } = {}) {
  hideError();
  const verb = kind === 'resubmit' ? 'Resubmit' : 'Skip';
  const body = { filter, dry_run: true };
  if (force && kind === 'resubmit') body.force = true;
  let dry;
  try {
    dry = await busy(button, () => post(`/bulk/${kind}`, body));
  } catch (e) {
    showError(e, `Counting the events to ${kind}`);
    return null;
  }
  if (!dry.matched) {
    notice(`Nothing to ${kind}: no event matches ${what || describeFilter(filter)}.`, 'warn');
    return null;
  }
  const sample = (dry.sample || []).map((e) => h('li', null, h('span', { class: 'mono' }, shortId(e.event_id)), ` ${e.event_type} · ${e.status}`));
  const answer = await confirmDialog({
    title: `${verb} ${plural(dry.matched, 'event')}?`,
    body: [
      h('p', { class: 'confirm-count' }, `${plural(dry.matched, 'event')} match${dry.matched === 1 ? 'es' : ''} `,
        what || describeFilter(filter), '.'),
      kind === 'skip' ? h('p', null, 'Skipped events are not handled again; their parked successors replay.') : null,
      sample.length ? h('details', null, h('summary', null, `The first ${sample.length}`), h('ul', { class: 'sample' }, sample)) : null,
    ],
    confirmLabel: `${verb} ${plural(dry.matched, 'event')}`,
    reason: kind === 'skip',
    danger: kind === 'skip',
  });
  if (!answer.ok) return null;
  const real = { filter, dry_run: false };
  if (force && kind === 'resubmit') real.force = true;
  if (kind === 'skip' && answer.reason) real.reason = answer.reason;
  try {
    const r = await busy(button, () => post(`/bulk/${kind}`, real));
    const idle = (r.endpoints || []).filter((e) => e.live_hosts === 0).map((e) => e.endpoint);
    let text = `${verb}: ${r.queued} of ${plural(r.matched, 'event')} queued`;
    if (r.refused) text += `, ${r.refused} refused (first: ${r.first_refusal})`;
    text += '.';
    if (idle.length) text += ` No host serves ${idle.join(', ')} now: the requests wait until one starts.`;
    notice(text, r.refused || idle.length ? 'warn' : 'ok');
    return r;
  } catch (e) {
    showError(e, `${verb} of ${plural(dry.matched, 'event')}`);
    return null;
  }
}

// The selected events, one request each, after a confirmation with their count.
export async function bulkOnSelection(kind, events, { force = false, button } = {}) {
  hideError();
  const verb = kind === 'resubmit' ? 'Resubmit' : 'Skip';
  if (!events.length) return null;
  const needForce = kind === 'resubmit' && !force ? events.filter((e) => RESOLVED.has(e.status)).length : 0;
  const answer = await confirmDialog({
    title: `${verb} ${plural(events.length, 'selected event')}?`,
    body: [h('p', { class: 'confirm-count' }, `${plural(events.length, 'event')} selected on this page.`),
      needForce ? h('p', null, `${needForce} of them ${needForce === 1 ? 'is' : 'are'} Completed or Skipped and will be refused without “force”.`) : null],
    confirmLabel: `${verb} ${plural(events.length, 'event')}`,
    reason: kind === 'skip',
    danger: kind === 'skip',
  });
  if (!answer.ok) return null;
  let queued = 0;
  const refused = [];
  await busy(button, async () => {
    for (const ev of events) {
      try {
        const body = kind === 'resubmit' ? (force ? { force: true } : {}) : (answer.reason ? { reason: answer.reason } : {});
        await post(`/events/${encodeURIComponent(ev.event_id)}/${kind}`, body);
        queued++;
      } catch (e) {
        refused.push(`${shortId(ev.event_id)}: ${e.body && e.body.error ? e.body.error : e.message}`);
      }
    }
  });
  notice(`${verb}: ${queued} of ${plural(events.length, 'event')} queued.`, refused.length ? 'warn' : 'ok');
  if (refused.length) showError({ message: `${refused.length} refused. ${refused.slice(0, 3).join(' · ')}${refused.length > 3 ? ' …' : ''}` }, `${verb} of the selection`);
  return { queued, refused };
}
