// The operator console in a browser (Debian's chromium through playwright-core): the
// CrmErpDemo scenarios 02a, 03 and 06 with Resubmit clicked in the page, as the original's
// browser tests did (docs/crm-erp-demo.md section 7), then a resubmit with changes, a skip, a
// hand-off completed from the event page, a bulk resubmit of a failure group, live updates,
// and the screenshots of docs/console/ (embedded transport only).
//
//   node --test spec/browser/console_spec.mjs                 (NIMBUS_HOST=path/to/nimbus-host)
//   NH_TRANSPORT=amqp://guest:guest@127.0.0.1:5672 node --test spec/browser/console_spec.mjs
//
// One demo host for the file (its own temp directory and, on RabbitMQ, its own vhost); the
// scenarios run in order against it, each starting from the knobs' defaults.
import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { mkdirSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { DemoHost, SOURCE_DIR, TRANSPORT, WAIT_MS, eventually, launchBrowser, newPage, open, ready } from './harness.mjs';

const SHOTS = TRANSPORT.kind === 'embedded' ? join(SOURCE_DIR, 'docs/console') : null;
const ERP = { endpoint: 'ErpEndpoint' };
let host;
let browser;
let page;

before(async () => {
  host = await DemoHost.start();
  browser = await launchBrowser();
  page = await newPage(browser, host);
});

after(async () => {
  if (browser) await browser.close();
  if (host) await host.stop();
});

// A scenario: knobs reset first; on failure the page's URL, a screenshot and the host's log
// tail are printed. A console error or uncaught exception in the page fails it too.
function scenario(name, fn) {
  it(name, { timeout: 180000 }, async () => {
    page.problems.length = 0;
    await host.reset();
    try {
      await fn();
      assert.deepEqual(page.problems, [], 'the page logged errors');
    } catch (e) {
      const shot = join(tmpdir(), `nh-console-failure-${name.replace(/[^a-z0-9]+/gi, '-').slice(0, 40)}.png`);
      await page.screenshot({ path: shot, fullPage: true }).catch(() => {});
      console.error(`\n# ${name} failed on ${page.url()} (screenshot ${shot})\n${host.tail(80)}\n`);
      if (page.problems.length) console.error(`# page problems: ${page.problems.join('\n')}`);
      const live = await page.evaluate(() => [document.getElementById('live').textContent, window.nimbusStream]).catch(() => null);
      console.error(`# the page's live updates: ${JSON.stringify(live)}`);
      throw e;
    }
  });
}

// The events table's row of an event, found as the original did: the row containing the
// first 8 characters of the eventId. Those are the leading time bits of a UUIDv7, shared by
// events of the same minute, so the row must also hold the whole id.
// (Another row can name the event too: a parked event's text names its blocker; so the
// event column is what is matched.)
function rowOf(eventId) {
  const cell = (text) => page.locator('th', { hasText: text });
  return page.locator('table.events tbody tr').filter({ has: cell(eventId.slice(0, 8)) }).filter({ has: cell(eventId) });
}

async function rowStatus(eventId, status) {
  await page.waitForFunction(([id, st]) => {
    const tr = document.querySelector(`tr[data-event-id="${id}"]`);
    return tr && tr.dataset.status === st;
  }, [eventId, status], { timeout: WAIT_MS });
}

async function clickResubmitInEndpointPage(eventId) {
  const row = rowOf(eventId);
  await row.waitFor({ timeout: WAIT_MS });
  assert.equal(await row.count(), 1, `one row for ${eventId}`);
  await row.getByRole('button', { name: /^Resubmit/ }).click();
  await page.getByRole('status').filter({ hasText: 'Resubmit queued' }).waitFor({ timeout: WAIT_MS });
}

const failedOn = (session) => host.waitEvent({ ...ERP, session }, (e) => e.status === 'Failed', `a Failed ErpEndpoint event for ${session}`);

describe('the operator console', () => {
  scenario('the page is served by the host: / redirects to /console/, nothing is fetched from elsewhere', async () => {
    await page.goto(`${host.base}/`);
    assert.equal(new URL(page.url()).pathname, '/console/');
    await ready(page);
    await page.getByRole('heading', { level: 1, name: 'Overview' }).waitFor();
    await page.getByRole('navigation', { name: 'Main' }).getByRole('link', { name: 'Blocked sessions' }).click();
    await ready(page);
    await page.getByRole('heading', { level: 1, name: 'Blocked sessions' }).waitFor();
  });

  scenario('02a: error mode fails the account; Resubmit in the ErpEndpoint page creates the customer', async () => {
    await host.errorMode(true);
    const a = await host.newAccount(`BadFlow Inc ${Date.now()}`, 'GB');
    const failed = await failedOn(a.id);
    assert.match(failed.error_text, /error mode/);
    assert.equal(await host.customerFor(a.id), null);
    await host.errorMode(false);
    await open(page, host, '#/endpoints/ErpEndpoint');
    await clickResubmitInEndpointPage(failed.event_id);
    const c = await eventually(() => host.customerFor(a.id), 'the ERP customer');
    assert.equal(c.legalName, a.legalName);
    await rowStatus(failed.event_id, 'Completed');
  });

  scenario('03: a blocked session drains in order after its head is resubmitted from the page', async () => {
    const name = `BatchCo-${Date.now()}`;
    const a = await host.newAccount(name, 'SE');
    await eventually(() => host.customerFor(a.id), 'the ERP customer');
    await host.errorMode(true);
    for (let i = 1; i <= 3; i++) await host.updateAccount(a.id, `${name}-rev${i}`, 'SE');
    const head = await failedOn(a.id);
    await eventually(async () => (await host.events({ ...ERP, session: a.id, status: 'Deferred' })).length === 2, 'two Deferred siblings');
    await host.errorMode(false);
    // the endpoints list first, then the ErpEndpoint row
    await open(page, host, '#/');
    await page.locator('table.overview tbody tr', { hasText: 'ErpEndpoint' }).click({ position: { x: 4, y: 4 } });
    await page.waitForFunction(() => location.hash === '#/endpoints/ErpEndpoint');
    await ready(page);
    await clickResubmitInEndpointPage(head.event_id);
    await eventually(async () => (await host.customerFor(a.id))?.legalName === `${name}-rev3`, 'the last revision in the ERP');
    const rows = await eventually(async () => {
      const evs = await host.events({ ...ERP, session: a.id });
      return evs.length === 4 && evs.every((e) => e.status === 'Completed') && evs;
    }, 'nothing left Failed, Deferred or DeadLettered');
    for (const e of rows) await rowStatus(e.event_id, 'Completed');
  });

  scenario('06: a failed hand-off resubmitted from the page with hand-off mode off imports the customer', async () => {
    await host.handoffMode(true, 1, 1);
    const a = await host.newAccount(`Handoff-Resubmit-${Date.now()}`, 'FR');
    const failed = await failedOn(a.id);
    assert.match(failed.error_text, /^DMF rejected:/);
    await host.handoffMode(false, 3, 0);
    await open(page, host, '#/endpoints/ErpEndpoint');
    await clickResubmitInEndpointPage(failed.event_id);
    const c = await eventually(() => host.customerFor(a.id), 'the ERP customer');
    assert.equal(c.legalName, a.legalName);
    await rowStatus(failed.event_id, 'Completed');
  });

  scenario('resubmit with changes: the editor refuses bad JSON, and the edited payload reaches the ERP', async () => {
    await host.errorMode(true);
    const a = await host.newAccount(`Typo Ltd ${Date.now()}`, 'IE');
    const failed = await failedOn(a.id);
    await host.errorMode(false);
    await open(page, host, `#/events/${failed.event_id}`);
    await page.getByRole('heading', { level: 1, name: /CrmAccountCreated/ }).waitFor();
    assert.match(await page.locator('pre.json').first().textContent(), new RegExp(`"LegalName": "${a.legalName}"`));
    const editor = page.getByLabel('Payload to resubmit (JSON)');
    const button = page.getByRole('button', { name: 'Resubmit with changes' });
    await editor.fill('{"LegalName": ');
    await page.locator('#ed-msg', { hasText: 'Not valid JSON' }).waitFor();
    assert.equal(await editor.getAttribute('aria-invalid'), 'true');
    assert.equal(await button.isDisabled(), true);
    const fixed = `Fixed Ltd ${Date.now()}`;
    const payload = JSON.parse(JSON.stringify((await host.event(failed.event_id)).payload));
    payload.LegalName = fixed;
    await editor.fill(JSON.stringify(payload, null, 2));
    await page.locator('#ed-msg', { hasText: 'Valid JSON' }).waitFor();
    assert.equal(await editor.getAttribute('aria-invalid'), null);
    await button.click();
    await page.getByRole('status').filter({ hasText: 'Resubmit with changes queued' }).waitFor({ timeout: WAIT_MS });
    const c = await eventually(async () => { const x = await host.customerFor(a.id); return x && x.legalName === fixed && x; },
      'the customer with the edited name');
    assert.equal(c.legalName, fixed);
    // the page follows: Completed, the edited payload shown, the old one in the history
    await page.locator('.facts .badge', { hasText: 'Completed' }).waitFor({ timeout: WAIT_MS });
    await page.locator('pre.json', { hasText: fixed }).first().waitFor({ timeout: WAIT_MS });
    await page.locator('.timeline summary', { hasText: 'Payload before this change' }).waitFor({ timeout: WAIT_MS });
    await page.locator('#op-h + div', { hasText: /resubmit/i }).waitFor({ timeout: WAIT_MS });
  });

  scenario('skip from the endpoint page (by keyboard): Skipped, no customer', async () => {
    await host.errorMode(true);
    const a = await host.newAccount(`Skip Me GmbH ${Date.now()}`, 'DE');
    const failed = await failedOn(a.id);
    await open(page, host, '#/endpoints/ErpEndpoint');
    const skip = rowOf(failed.event_id).getByRole('button', { name: /^Skip/ });
    await skip.focus();
    await page.keyboard.press('Enter');
    await page.getByRole('status').filter({ hasText: 'Skip queued' }).waitFor({ timeout: WAIT_MS });
    await rowStatus(failed.event_id, 'Skipped');
    await host.waitEvent({ ...ERP, session: a.id }, (e) => e.event_id === failed.event_id && e.status === 'Skipped', 'Skipped');
    assert.equal(await host.customerFor(a.id), null);
  });

  scenario('a pending hand-off completed from the event page', async () => {
    await host.handoffMode(true, 600, 0);
    const a = await host.newAccount(`Manual Import AB ${Date.now()}`, 'SE');
    const pending = await host.waitEvent({ ...ERP, session: a.id }, (e) => e.status === 'Pending' && e.sub_status === 'Handoff',
      'the Pending+Handoff event');
    await open(page, host, `#/events/${pending.event_id}`);
    await page.getByRole('heading', { level: 2, name: 'Hand-off' }).waitFor();
    await page.locator('.facts', { hasText: pending.external_job_id }).waitFor();
    const result = page.getByLabel('Result (JSON, optional)');
    await result.fill('{"importedRecordId": ');
    await page.locator('#ho-result-msg', { hasText: 'Not valid JSON' }).waitFor();
    await result.fill(JSON.stringify({ importedRecordId: pending.external_job_id }));
    await page.getByRole('button', { name: 'Complete hand-off' }).click();
    await page.getByRole('status').filter({ hasText: 'Hand-off completion queued' }).waitFor({ timeout: WAIT_MS });
    await host.waitEvent({ ...ERP, session: a.id }, (e) => e.event_id === pending.event_id && e.status === 'Completed', 'Completed');
    await page.locator('.facts .badge', { hasText: 'Completed' }).waitFor({ timeout: WAIT_MS });
    assert.equal(await page.getByRole('heading', { level: 2, name: 'Hand-off' }).isVisible(), false, 'the hand-off forms are gone');
    await host.handoffMode(false, 3, 0);
  });

  scenario('a failure group resubmitted in bulk from the failures page, after a dry run shows its count', async () => {
    await host.errorMode(true);
    const stamp = Date.now();
    const accounts = [];
    for (let i = 1; i <= 3; i++) accounts.push(await host.newAccount(`Outage Victim ${i} ${stamp}`, 'US'));
    const failed = [];
    for (const a of accounts) failed.push(await failedOn(a.id));
    await host.errorMode(false);
    await open(page, host, '#/failures');
    const row = page.locator('table.failures tbody tr', { hasText: 'ERP is in error mode' });
    await row.waitFor();
    assert.equal(await row.locator('td.num').textContent(), '3');
    await row.getByRole('button', { name: /^Resubmit 3 events/ }).click();
    const dialog = page.getByRole('dialog', { name: 'Resubmit 3 events?' });
    await dialog.waitFor();
    await dialog.locator('.confirm-count', { hasText: '3 events match' }).waitFor();
    await dialog.getByRole('button', { name: 'Resubmit 3 events' }).click();
    await page.getByRole('status').filter({ hasText: 'Resubmit: 3 of 3 events queued' }).waitFor({ timeout: WAIT_MS });
    for (const a of accounts) {
      const c = await eventually(() => host.customerFor(a.id), `the ERP customer of ${a.legalName}`);
      assert.equal(c.legalName, a.legalName);
    }
    for (const f of failed) await host.waitEvent({ ...ERP, session: f.session_id }, (e) => e.event_id === f.event_id && e.status === 'Completed', 'Completed');
    await page.locator('p.empty', { hasText: 'No unresolved failure' }).waitFor({ timeout: WAIT_MS });
  });

  scenario('live updates: a new failure appears in the open pages without a reload, through /api/v1/stream', async () => {
    await open(page, host, '#/');
    await host.errorMode(true);
    const a = await host.newAccount(`Live Update Co ${Date.now()}`, 'NO');
    const failed = await failedOn(a.id);
    await page.locator('table.overview tbody tr', { hasText: 'ErpEndpoint' }).getByRole('link', { name: /Failed on ErpEndpoint/ })
      .waitFor({ timeout: WAIT_MS });
    await open(page, host, '#/endpoints/ErpEndpoint');
    await rowOf(failed.event_id).waitFor();
    await host.errorMode(false);
    await clickResubmitInEndpointPage(failed.event_id);
    await rowStatus(failed.event_id, 'Completed');
    // the page said where its updates came from
    const kind = await page.evaluate(() => document.getElementById('live').dataset.kind);
    assert.equal(kind, 'live', `the page is not on the stream: "${await page.textContent('#live')}"`);
  });

  scenario('the main pages: labelled for screen readers, readable at 1280 and 390 px (screenshots)', async () => {
    // a state worth looking at: a failure group, a blocked session with parked updates, an
    // event failed twice (with the operator's resubmit between), a pending hand-off
    await host.errorMode(true);
    const stamp = Date.now();
    const names = ['Initech', 'Globex', 'Soylent', 'Umbrella'];
    const acc = [];
    for (const n of names) acc.push(await host.newAccount(`${n} ${stamp}`, 'US'));
    await host.updateAccount(acc[0].id, `Initech Holdings ${stamp}`);
    await host.updateAccount(acc[0].id, `Initech Holdings Ltd ${stamp}`);
    const fails = [];
    for (const a of acc) fails.push(await failedOn(a.id));
    await eventually(async () => (await host.events({ ...ERP, session: acc[0].id, status: 'Deferred' })).length === 2, 'two parked updates');
    await open(page, host, `#/events/${fails[1].event_id}`);
    await page.getByRole('button', { name: 'Resubmit', exact: true }).click();
    await page.getByRole('status').filter({ hasText: 'Resubmit queued' }).waitFor({ timeout: WAIT_MS });
    await eventually(async () => (await host.event(fails[1].event_id)).history.filter((x) => x.status === 'Failed').length >= 2,
      'the second failure');
    await host.errorMode(false);
    await host.handoffMode(true, 600, 0);
    const ho = await host.newAccount(`Hooli ${stamp}`, 'US');
    await host.waitEvent({ ...ERP, session: ho.id }, (e) => e.sub_status === 'Handoff', 'the pending hand-off');
    await host.handoffMode(false, 3, 0);
    const ok = await host.newAccount(`Acme ${stamp}`, 'US');
    await eventually(() => host.customerFor(ok.id), 'a synced account');

    const pages = [
      ['overview', '#/', 'Overview'],
      ['endpoint', '#/endpoints/ErpEndpoint', 'ErpEndpoint'],
      ['event', `#/events/${fails[1].event_id}`, 'CrmAccountCreated'],
      ['sessions', '#/sessions', 'Blocked sessions'],
      ['failures', '#/failures', 'Failure groups'],
    ];
    for (const [file, hash, h1] of pages) {
      await open(page, host, hash);
      await page.getByRole('heading', { level: 1, name: new RegExp(h1) }).waitFor();
      if (file === 'overview') {
        // the overview has caught up with the blocked sessions (it reloads as events settle)
        const blocked = (await (await fetch(`${host.api}/sessions`)).json()).sessions.length;
        await page.locator('.card', { hasText: 'Blocked sessions' }).locator('.card-n', { hasText: String(blocked) }).waitFor({ timeout: WAIT_MS });
      }
      await checkA11y(page, file);
      await page.evaluate(() => document.activeElement && document.activeElement.blur());
      if (file === 'event') await page.locator('.timeline .stack').last().waitFor();
      if (SHOTS) {
        mkdirSync(SHOTS, { recursive: true });
        await page.screenshot({ path: join(SHOTS, `${file}.png`), fullPage: true });
      }
    }
    const narrow = await newPage(browser, host, { width: 390, height: 844 });
    try {
      for (const [file, hash] of pages) {
        await open(narrow, host, hash);
        const width = await narrow.evaluate(() => document.documentElement.scrollWidth);
        assert.ok(width <= 390, `${file} at 390 px is ${width} px wide (scrolls sideways)`);
        if (file === 'overview' && SHOTS) {
          await narrow.evaluate(() => document.activeElement && document.activeElement.blur());
          await narrow.screenshot({ path: join(SHOTS, 'overview-390.png'), fullPage: true });
        }
      }
      assert.deepEqual(narrow.problems, []);
    } finally {
      await narrow.context().close();
    }
  });
});

// Every form control has an accessible name, column headers have a scope, actions are buttons.
async function checkA11y(p, what) {
  const bad = await p.evaluate(() => {
    const out = [];
    for (const el of document.querySelectorAll('main input, main select, main textarea')) {
      const named = (el.labels && el.labels.length) || el.getAttribute('aria-label') || el.getAttribute('aria-labelledby');
      if (!named) out.push(`unlabelled ${el.tagName.toLowerCase()}#${el.id || '?'}`);
    }
    for (const th of document.querySelectorAll('main thead th')) if (!th.getAttribute('scope')) out.push(`th without scope: ${th.textContent}`);
    for (const el of document.querySelectorAll('main [onclick], main div[tabindex]:not(.table-wrap)')) out.push(`clickable non-button: ${el.outerHTML.slice(0, 80)}`);
    if (!document.querySelector('[role="alert"]')) out.push('no alert region');
    if (!document.querySelector('[aria-live]')) out.push('no live region');
    return out;
  });
  assert.deepEqual(bad, [], `accessibility of the ${what} page`);
}
