// #/events/ID : one event: its fields, payload, an editor to resubmit with changes, the
// hand-off forms, its history as a timeline (with tracebacks) and the operator log.
import { api, post } from './api.js';
import { resubmit, skip } from './actions.js';
import {
  ACTIONABLE, RESOLVED, announce, append, busy, clear, endpointLink, h, hideError, isOverdue, notice, queuedText, shortId,
  showError, statusBadge, tableWrap, th, time,
} from './ui.js';

const pretty = (v) => (typeof v === 'string' ? v : JSON.stringify(v, null, 2));

export async function render(page, { id }, ctx) {
  let ev = await api(`/events/${encodeURIComponent(id)}`);
  ctx.title(`${ev.event_type} ${shortId(ev.event_id)}`);

  const crumbs = h('nav', { class: 'crumbs', 'aria-label': 'Breadcrumb' });
  const title = h('h1');
  const waiting = h('p', { class: 'waiting', hidden: true });
  const facts = h('dl', { class: 'facts' });
  const actions = h('section', { class: 'panel', 'aria-labelledby': 'act-h' });
  const handoff = h('section', { class: 'panel', 'aria-labelledby': 'ho-h', hidden: true });
  const payloadPre = h('pre', { class: 'json', tabindex: '0', 'aria-label': 'Payload' });
  const editorBox = h('section', { class: 'panel', 'aria-labelledby': 'ed-h' });
  const timeline = h('ol', { class: 'timeline' });
  const oplog = h('div');
  page.append(crumbs, title, waiting, facts, actions, handoff,
    h('div', { class: 'two' },
      h('section', { 'aria-labelledby': 'pl-h' }, h('h2', { id: 'pl-h' }, 'Payload'), payloadPre),
      editorBox),
    h('section', { 'aria-labelledby': 'hist-h' }, h('h2', { id: 'hist-h' }, 'History'), timeline),
    h('section', { 'aria-labelledby': 'op-h' }, h('h2', { id: 'op-h' }, 'Operator log'), oplog));

  // ---- actions: resubmit / skip
  const force = h('input', { type: 'checkbox', id: 'ev-force' });
  const forceLabel = h('label', { class: 'check', for: 'ev-force' }, force, ' Force (the event is resolved)');
  const reason = h('input', { id: 'ev-reason', type: 'text', autocomplete: 'off' });
  const bRes = h('button', { type: 'button', class: 'primary' }, 'Resubmit');
  const bSkip = h('button', { type: 'button' }, 'Skip');
  bRes.addEventListener('click', async () => { if (await resubmit(ev, { force: force.checked, button: bRes })) reload(); });
  bSkip.addEventListener('click', async () => { if (await skip(ev, { reason: reason.value.trim(), button: bSkip })) { reason.value = ''; reload(); } });
  actions.append(h('h2', { id: 'act-h' }, 'Actions'),
    h('div', { class: 'act-row' },
      h('p', null, bRes, ' ', forceLabel),
      h('p', { class: 'field inline' }, h('label', { for: 'ev-reason' }, 'Skip reason (optional)'), reason, bSkip)));

  // ---- resubmit with changes
  const edHelp = h('p', { id: 'ed-help', class: 'help' }, 'Edit the JSON; it replaces the payload for this resubmit only (the original stays in the history).');
  const edMsg = h('p', { id: 'ed-msg', class: 'valid', 'aria-live': 'polite' });
  const editor = h('textarea', { id: 'editor', rows: '14', spellcheck: 'false', autocomplete: 'off', 'aria-describedby': 'ed-help ed-msg' });
  let dirty = false;
  const bEdit = h('button', { type: 'button', class: 'primary' }, 'Resubmit with changes');
  const bReset = h('button', { type: 'button' }, 'Reset to the current payload');
  function validate() {
    try {
      const v = JSON.parse(editor.value);
      if (v === null || typeof v !== 'object') throw new Error('the payload must be a JSON object or array');
      editor.removeAttribute('aria-invalid');
      edMsg.className = 'valid';
      edMsg.textContent = 'Valid JSON.';
      return { ok: true, value: v };
    } catch (e) {
      editor.setAttribute('aria-invalid', 'true');
      edMsg.className = 'invalid';
      edMsg.textContent = `Not valid JSON: ${e.message}`;
      return { ok: false };
    }
  }
  editor.addEventListener('input', () => { dirty = true; bEdit.disabled = !validate().ok || !canAct(); });
  bReset.addEventListener('click', () => { dirty = false; editor.value = pretty(ev.payload); bEdit.disabled = !validate().ok || !canAct(); });
  bEdit.addEventListener('click', async () => {
    const v = validate();
    if (!v.ok) { editor.focus(); return; }
    if (await resubmit(ev, { body: v.value, force: force.checked, button: bEdit })) { dirty = false; reload(); }
  });
  editorBox.append(h('h2', { id: 'ed-h' }, 'Resubmit with changes'),
    h('label', { for: 'editor' }, 'Payload to resubmit (JSON)'), edHelp, editor, edMsg,
    h('p', { class: 'buttons' }, bEdit, ' ', bReset));

  // ---- hand-off forms
  const result = h('textarea', { id: 'ho-result', rows: '4', spellcheck: 'false', 'aria-describedby': 'ho-result-help ho-result-msg' });
  const resultMsg = h('p', { id: 'ho-result-msg', class: 'valid', 'aria-live': 'polite' });
  const hoErr = h('input', { id: 'ho-error', type: 'text', required: true, autocomplete: 'off' });
  const hoReason = h('input', { id: 'ho-reason', type: 'text', required: true, autocomplete: 'off' });
  const bDone = h('button', { type: 'submit', class: 'primary' }, 'Complete hand-off');
  const bFail = h('button', { type: 'submit', class: 'danger' }, 'Fail hand-off');
  const doneForm = h('form', { class: 'ho-form', 'aria-labelledby': 'ho-done-h' },
    h('h3', { id: 'ho-done-h' }, 'Complete'),
    h('label', { for: 'ho-result' }, 'Result (JSON, optional)'),
    h('p', { id: 'ho-result-help', class: 'help' }, 'What the external work produced, e.g. {"importedRecordId": "…"}.'),
    result, resultMsg, h('p', { class: 'buttons' }, bDone));
  const failForm = h('form', { class: 'ho-form', 'aria-labelledby': 'ho-fail-h' },
    h('h3', { id: 'ho-fail-h' }, 'Fail'),
    h('p', { class: 'field' }, h('label', { for: 'ho-error' }, 'Error (required)'), hoErr),
    h('p', { class: 'field' }, h('label', { for: 'ho-reason' }, 'Reason (required)'), hoReason),
    h('p', { class: 'buttons' }, bFail));
  result.addEventListener('input', () => {
    if (!result.value.trim()) { result.removeAttribute('aria-invalid'); resultMsg.textContent = ''; return; }
    try { JSON.parse(result.value); result.removeAttribute('aria-invalid'); resultMsg.className = 'valid'; resultMsg.textContent = 'Valid JSON.'; } catch (e) {
      result.setAttribute('aria-invalid', 'true'); resultMsg.className = 'invalid'; resultMsg.textContent = `Not valid JSON: ${e.message}`;
    }
  });
  doneForm.addEventListener('submit', async (e) => {
    e.preventDefault();
    hideError();
    const body = {};
    if (result.value.trim()) {
      try { body.result = JSON.parse(result.value); } catch (err) { showError({ message: `the result is not valid JSON: ${err.message}` }, 'Completing the hand-off'); result.focus(); return; }
    }
    try {
      const a = await busy(bDone, () => post(`/events/${encodeURIComponent(ev.event_id)}/handoff/complete`, body));
      notice(queuedText('Hand-off completion', a), a.live_hosts === 0 ? 'warn' : 'ok');
      result.value = '';
      reload();
    } catch (err) { showError(err, 'Completing the hand-off'); }
  });
  failForm.addEventListener('submit', async (e) => {
    e.preventDefault();
    hideError();
    try {
      const a = await busy(bFail, () => post(`/events/${encodeURIComponent(ev.event_id)}/handoff/fail`,
        { error: hoErr.value.trim(), reason: hoReason.value.trim() }));
      notice(queuedText('Hand-off failure', a), a.live_hosts === 0 ? 'warn' : 'ok');
      hoErr.value = hoReason.value = '';
      reload();
    } catch (err) { showError(err, 'Failing the hand-off'); }
  });
  handoff.append(h('h2', { id: 'ho-h' }, 'Hand-off'),
    h('p', { class: 'help' }, 'Settle the external work by hand when no status checker will (the session stays blocked until then).'),
    h('div', { class: 'two' }, doneForm, failForm));

  const canAct = () => ctx.canAct && (ACTIONABLE.has(ev.status) || (RESOLVED.has(ev.status) && force.checked));
  force.addEventListener('change', () => sync());

  function sync() {
    const resolved = RESOLVED.has(ev.status);
    forceLabel.hidden = !resolved;
    if (!resolved) force.checked = false;
    const ok = canAct();
    bRes.disabled = !ok;
    bSkip.disabled = !(ctx.canAct && ACTIONABLE.has(ev.status));
    reason.disabled = bSkip.disabled;
    bEdit.disabled = !ok || !validate().ok;
  }

  function draw() {
    clear(crumbs).append(h('a', { href: '#/' }, 'Overview'), ' / ', endpointLink(ev.endpoint), ' / ');
    clear(title).append(ev.event_type, ' ', h('span', { class: 'h1-sub mono' }, ev.event_id));
    waiting.hidden = !ev.request_waiting;
    waiting.textContent = ev.request_waiting ? 'An operator request for this event is queued and not applied yet.' : '';
    const sess = new URLSearchParams(); sess.set('session', ev.session_id);
    const fact = (k, v, wide) => h('div', { class: wide ? 'fact wide' : 'fact' }, h('dt', null, k),
      h('dd', null, v == null || v === '' ? h('span', { class: 'muted' }, '—') : v));
    append(clear(facts), [
      fact('Status', statusBadge(ev.status, ev.sub_status)),
      fact('Endpoint', endpointLink(ev.endpoint)),
      fact('Session', h('a', { class: 'mono', href: `#/endpoints/${encodeURIComponent(ev.endpoint)}?${sess}` }, ev.session_id)),
      fact('Event id', h('span', { class: 'mono' }, ev.event_id)),
      fact('Message id', ev.message_id && h('span', { class: 'mono' }, ev.message_id)),
      fact('Correlation id', ev.correlation_id && h('span', { class: 'mono' }, ev.correlation_id)),
      fact('Created', time(ev.created_at)),
      fact('Updated', time(ev.updated_at)),
      fact('Retries', `${ev.retry_count ?? 0} (attempts ${ev.attempts ?? 0})`),
      ev.error_text ? fact('Error', h('span', { class: 'err' }, ev.error_type ? h('strong', null, `${ev.error_type}: `) : null, ev.error_text), true) : null,
      ev.sub_status === 'Handoff' || ev.handoff_reason ? [
        fact('Hand-off reason', ev.handoff_reason),
        fact('External job', ev.external_job_id && h('span', { class: 'mono' }, ev.external_job_id)),
        fact('Expected by', ev.expected_by ? h('span', null, time(ev.expected_by), isOverdue(ev) ? h('strong', { class: 'overdue' }, ' overdue') : null) : null),
      ] : null]);
    actions.hidden = !ctx.canAct;
    handoff.hidden = !(ctx.canAct && ev.status === 'Pending' && ev.sub_status === 'Handoff');
    editorBox.hidden = !ctx.canAct;
    payloadPre.textContent = pretty(ev.payload);
    if (!dirty) {
      editor.value = pretty(ev.payload);
      editor.rows = Math.min(24, Math.max(6, editor.value.split('\n').length + 1));
    }
    sync();

    clear(timeline);
    for (const x of ev.history || []) {
      const li = h('li', { class: `tl st-${String(x.status).toLowerCase()}` },
        h('p', { class: 'tl-head' }, time(x.at), ' ', statusBadge(x.status), ' ', h('span', { class: 'muted' }, x.message_type || '')),
        x.detail ? h('p', null, x.detail) : null,
        x.error_text ? h('p', { class: 'err' }, x.error_type ? h('strong', null, `${x.error_type}: `) : null, x.error_text) : null,
        x.error_stack ? h('details', null, h('summary', null, 'Traceback'), h('pre', { class: 'stack', tabindex: '0' }, x.error_stack)) : null,
        x.previous_payload != null ? h('details', null, h('summary', null, 'Payload before this change'), h('pre', { class: 'json', tabindex: '0' }, pretty(x.previous_payload))) : null,
        x.message_id ? h('p', { class: 'muted small' }, 'message ', h('span', { class: 'mono' }, x.message_id)) : null);
      timeline.append(li);
    }
    if (!(ev.history || []).length) timeline.append(h('li', { class: 'muted' }, 'No history yet.'));
    // the newest failure's traceback open: that is what the operator came for
    const last = [...timeline.querySelectorAll('li.tl details')].filter((d) => d.querySelector('.stack')).pop();
    if (last && ev.status === 'Failed') last.open = true;

    clear(oplog);
    const log = ev.operator_log || [];
    if (!log.length) oplog.append(h('p', { class: 'empty' }, 'No operator action on this event yet.'));
    else {
      oplog.append(tableWrap('Operator log', h('table', { class: 'grid' },
        h('caption', { class: 'visually-hidden' }, 'Operator actions on this event, oldest first'),
        h('thead', null, h('tr', null, th('When'), th('Who'), th('Action'), th('Detail'))),
        h('tbody', null, log.map((o) => h('tr', null, h('td', null, time(o.at)), h('td', null, o.actor),
          h('th', { scope: 'row' }, o.action), h('td', null, o.detail || '')))))));
    }
  }

  async function reload() {
    try {
      const before = ev.status;
      const next = await api(`/events/${encodeURIComponent(ev.event_id)}`);
      const changed = JSON.stringify(next) !== JSON.stringify(ev);
      ev = next;
      if (changed) {
        const focusId = document.activeElement && document.activeElement.id;
        draw();
        if (focusId) { const el = document.getElementById(focusId); if (el && !el.disabled) el.focus(); }
        if (before !== ev.status) announce(`This event is now ${ev.status}`);
      }
    } catch { /* polling goes on */ }
  }

  draw();
  let timer = null;
  return {
    poll: reload,
    status: (x) => { if (x.event_id === ev.event_id) { clearTimeout(timer); timer = setTimeout(reload, 100); } },
    destroy: () => clearTimeout(timer),
  };
}
