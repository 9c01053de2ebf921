// Helpers of the console's browser tests: a CrmErpDemo host in a fresh temporary directory
// (its own RabbitMQ vhost under NH_TRANSPORT=amqp://...), the fake APIs' knobs, polling with
// deadlines, and Debian's chromium driven through playwright-core (no browser download).
import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { createWriteStream, mkdtempSync, readFileSync, rmSync, existsSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { randomBytes } from 'node:crypto';
import { chromium } from 'playwright-core';

const here = dirname(fileURLToPath(import.meta.url));
export const SOURCE_DIR = process.env.NIMBUS_SOURCE_DIR || resolve(here, '../..');
export const HOST_BIN = process.env.NIMBUS_HOST || join(SOURCE_DIR, 'build-a/host/nimbus-host');
export const CHROMIUM = process.env.NH_CHROMIUM || '/usr/bin/chromium';
export const WAIT_MS = 30000;   // every wait's deadline; the conditions are polled, never slept on

// ------------------------------------------------------------------ transport

function transportConfig() {
  const url = process.env.NH_TRANSPORT;
  if (!url || url === 'embedded') return { kind: 'embedded' };
  const u = new URL(url);
  if (u.protocol !== 'amqp:' && u.protocol !== 'amqps:') throw new Error(`NH_TRANSPORT=${url}: expected an amqp:// or amqps:// base URL`);
  if (u.pathname && u.pathname !== '/') throw new Error(`NH_TRANSPORT=${url}: give the base URL without a vhost; every test file makes its own`);
  const mgmt = (process.env.NH_RMQ_MGMT || u.searchParams.get('management') || 'http://127.0.0.1:15672').replace(/\/+$/, '');
  return {
    kind: 'amqp', base: `${u.protocol}//${u.host}`, auth: u.username ? `${u.username}:${u.password}@` : '', search: u.search,
    user: decodeURIComponent(u.username || 'guest'), password: decodeURIComponent(u.password || 'guest'), mgmt,
  };
}
export const TRANSPORT = transportConfig();

async function rmq(method, path, body) {
  const res = await fetch(`${TRANSPORT.mgmt}/api${path}`, {
    method,
    headers: { authorization: `Basic ${Buffer.from(`${TRANSPORT.user}:${TRANSPORT.password}`).toString('base64')}`, 'content-type': 'application/json' },
    body: body ? JSON.stringify(body) : undefined,
  });
  if (!res.ok && !(method === 'DELETE' && res.status === 404)) {
    throw new Error(`RabbitMQ management ${method} ${path}: HTTP ${res.status} ${await res.text()}`);
  }
}

// ------------------------------------------------------------------ waiting

export async function eventually(fn, what, timeoutMs = WAIT_MS) {
  const deadline = Date.now() + timeoutMs;
  let last;
  for (;;) {
    try {
      const v = await fn();
      if (v) return v;
    } catch (e) { last = e; }
    if (Date.now() > deadline) {
      const desc = typeof what === 'function' ? await what() : what;
      throw new Error(`condition not met within ${timeoutMs / 1000} s: ${desc}${last ? ` (last error: ${last.message})` : ''}`);
    }
    await new Promise((r) => setTimeout(r, 50));
  }
}

// ------------------------------------------------------------------ HTTP

export async function http(method, url, body) {
  const res = await fetch(url, {
    method,
    headers: body !== undefined ? { 'content-type': 'application/json' } : {},
    body: body !== undefined ? JSON.stringify(body) : undefined,
  });
  const text = await res.text();
  let data = text;
  try { data = text ? JSON.parse(text) : null; } catch { /* not JSON */ }
  return { status: res.status, data };
}

export async function ok(method, url, body) {
  const r = await http(method, url, body);
  if (r.status < 200 || r.status >= 300) throw new Error(`${method} ${url} -> ${r.status} ${JSON.stringify(r.data)}`);
  return r.data;
}

// ------------------------------------------------------------------ the demo host

export class DemoHost {
  static async start() {
    if (!existsSync(HOST_BIN)) throw new Error(`no nimbus-host at ${HOST_BIN}: build it, or set NIMBUS_HOST`);
    const h = new DemoHost();
    h.dir = mkdtempSync(join(process.env.TMPDIR || tmpdir(), 'nh-browser-'));
    h.logPath = join(h.dir, 'host.log');
    // run from the source tree with relative paths, so tracebacks (and the committed
    // screenshots) name samples/crm-erp/... and lua/nimbus/..., not this machine's directories
    const args = ['samples/crm-erp/demo.lua', '--store', join(h.dir, 'nimbus.db'), '--admin', '127.0.0.1:0', '--no-reload'];
    if (TRANSPORT.kind === 'amqp') {
      h.vhost = `nh-${randomBytes(8).toString('hex')}`;
      await rmq('PUT', `/vhosts/${h.vhost}`);
      await rmq('PUT', `/permissions/${h.vhost}/${encodeURIComponent(TRANSPORT.user)}`, { configure: '.*', write: '.*', read: '.*' });
      args.push('--transport', `${TRANSPORT.base.replace('//', `//${TRANSPORT.auth}`)}/${encodeURIComponent(h.vhost)}${TRANSPORT.search}`);
    }
    const env = {
      ...process.env, CRM_API_PORT: '0', ERP_API_PORT: '0', DEMO_DEBUG_PORT: '0', DEMO_QUIET: '1',
      DATAPLATFORM_DELAY: '0', CHECKER_EVERY: '0.2', DEMO_DATA_DIR: h.dir, NIMBUS_LUA_DIR: 'lua',
    };
    delete env.NIMBUS_ADMIN;
    const log = createWriteStream(h.logPath);
    h.proc = spawn(HOST_BIN, args, { cwd: SOURCE_DIR, env, stdio: ['ignore', 'pipe', 'pipe'] });
    h.proc.stdout.pipe(log, { end: false });
    h.proc.stderr.pipe(log, { end: false });
    h.exited = once(h.proc, 'exit').then(([code, signal]) => { h.exit = { code, signal }; return h.exit; });
    await eventually(() => h.exit || /ready:/.test(h.log()), () => `the host never logged ready:\n${h.tail()}`);
    if (h.exit) throw new Error(`the host exited (${JSON.stringify(h.exit)}) before ready:\n${h.tail()}`);
    const text = h.log();
    const kind = (text.match(/ready: .*transport (\w+)/) || [])[1];
    if (kind !== (TRANSPORT.kind === 'amqp' ? 'amqp' : 'embedded')) throw new Error(`the host runs on transport ${kind}, not ${TRANSPORT.kind}:\n${h.tail()}`);
    const urls = text.match(/CRM API (http:\/\/[\d.:]+), ERP API (http:\/\/[\d.:]+)/);
    const admin = text.match(/operator API on http:\/\/127\.0\.0\.1:(\d+)\/api\/v1\//);
    if (!urls || !admin) throw new Error(`the demo did not log its URLs:\n${h.tail()}`);
    [, h.crm, h.erp] = urls;
    h.base = `http://127.0.0.1:${admin[1]}`;
    h.api = `${h.base}/api/v1`;
    return h;
  }

  log() { try { return readFileSync(this.logPath, 'utf8'); } catch { return ''; } }
  tail(n = 60) {
    const lines = this.log().split('\n');
    return `--- host log (last ${n} lines of ${this.logPath}) ---\n${lines.slice(-n - 1).join('\n')}`;
  }

  // SIGTERM and wait for the exit (SIGKILL after 30 s, which is an error)
  async stop() {
    if (!this.proc) return;
    if (!this.exit) {
      this.proc.kill('SIGTERM');
      const t = setTimeout(() => this.proc.kill('SIGKILL'), 30000);
      await this.exited;
      clearTimeout(t);
    }
    const e = this.exit;
    this.proc = null;
    if (this.vhost) await rmq('DELETE', `/vhosts/${this.vhost}`).catch(() => {});
    if (!process.env.NH_KEEP) rmSync(this.dir, { recursive: true, force: true });
    if (e.signal === 'SIGKILL') throw new Error('the host did not stop on SIGTERM within 30 s');
    return e;
  }

  // ---- the fake APIs' knobs and data (docs/crm-erp-demo.md section 4)
  async reset() {
    await ok('PUT', `${this.erp}/api/admin/error-mode`, { enabled: false });
    await ok('PUT', `${this.erp}/api/admin/service-mode`, { enabled: false });
    await ok('PUT', `${this.erp}/api/admin/handoff-mode`, { enabled: false, durationSeconds: 10, failureRate: 0 });
  }
  errorMode(enabled) { return ok('PUT', `${this.erp}/api/admin/error-mode`, { enabled }); }
  handoffMode(enabled, durationSeconds, failureRate) {
    return ok('PUT', `${this.erp}/api/admin/handoff-mode`, { enabled, durationSeconds, failureRate });
  }
  newAccount(legalName, countryCode = 'US') {
    return ok('POST', `${this.crm}/api/accounts`, { legalName, countryCode, taxId: `TAX-${legalName}` });
  }
  updateAccount(id, legalName, countryCode = 'US') {
    return ok('PUT', `${this.crm}/api/accounts/${id}`, { legalName, countryCode });
  }
  async customerFor(accountId) {
    const r = await http('GET', `${this.erp}/api/customers/by-crm/${accountId}`);
    return r.status === 200 && !r.data.isDeleted ? r.data : null;
  }

  // ---- the operator API (reads only: the tests act through the page)
  async events(query) {
    const q = new URLSearchParams({ limit: '1000', ...query });
    return (await ok('GET', `${this.api}/events?${q}`)).events;
  }
  async event(id) { return ok('GET', `${this.api}/events/${id}`); }
  async waitEvent(query, pred, what) {
    let last = [];
    return eventually(async () => {
      last = await this.events(query);
      return last.find(pred);
    }, () => `${what}; rows: ${JSON.stringify(last.map((e) => [e.event_id, e.event_type, e.status, e.sub_status]))}`);
  }
}

// ------------------------------------------------------------------ the browser

export async function launchBrowser() {
  if (!existsSync(CHROMIUM)) throw new Error(`no chromium at ${CHROMIUM} (apt-get install chromium; make test installs it)`);
  return chromium.launch({
    executablePath: CHROMIUM,
    args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run', '--disable-background-networking',
      '--disable-component-update', '--disable-sync'],
  });
}

// A page that fails the test on a console error or an uncaught exception of the page, and
// on any request to another origin (the console fetches nothing from elsewhere).
export async function newPage(browser, host, { width = 1280, height = 900 } = {}) {
  const context = await browser.newContext({ viewport: { width, height }, colorScheme: 'light', reducedMotion: 'reduce' });
  const page = await context.newPage();
  page.problems = [];
  page.on('pageerror', (e) => page.problems.push(`page error: ${e.message}`));
  // (an answer of 4xx/5xx is logged as "Failed to load resource": the tests expect some of those)
  page.on('console', (m) => {
    if (m.type() === 'error' && !/^Failed to load resource/.test(m.text())) page.problems.push(`console error: ${m.text()}`);
  });
  page.on('request', (r) => {
    const u = new URL(r.url());
    if (u.origin !== host.base && u.protocol !== 'data:') page.problems.push(`request to another origin: ${r.url()}`);
  });
  return page;
}

// Navigates to a console route and waits until the view has rendered.
export async function open(page, host, hash) {
  const url = `${host.base}/console/${hash}`;
  if (page.url().startsWith(`${host.base}/console/`)) {
    await page.evaluate((h) => {
      if (location.hash === h) return;
      document.getElementById('main').setAttribute('aria-busy', 'true');   // ready() waits for the new view
      location.hash = h;
    }, hash);
  } else {
    await page.goto(url);
  }
  await ready(page);
}

export async function ready(page) {
  await page.waitForFunction(() => {
    const m = document.getElementById('main');
    return m && m.getAttribute('aria-busy') === 'false';
  }, null, { timeout: WAIT_MS });
}
