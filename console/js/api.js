// The admin API (docs/admin-api.md): JSON over fetch, a bearer token kept in sessionStorage
// when the listener wants a login, and the Server-Sent Events stream.

const TOKEN_KEY = 'nimbus-host.token';

export function token() {
  try { return sessionStorage.getItem(TOKEN_KEY); } catch { return null; }
}
export function setToken(t) {
  try { if (t) sessionStorage.setItem(TOKEN_KEY, t); else sessionStorage.removeItem(TOKEN_KEY); } catch { /* private mode */ }
}

export class ApiError extends Error {
  constructor(status, body) {
    super(body && body.error ? body.error : `HTTP ${status}`);
    this.status = status;
    this.body = body || {};
  }
}

let unauthorized = () => {};
export function onUnauthorized(fn) { unauthorized = fn; }

export async function api(path, { method = 'GET', body, query } = {}) {
  const headers = { Accept: 'application/json' };
  if (body !== undefined) headers['Content-Type'] = 'application/json';
  const t = token();
  if (t) headers.Authorization = `Bearer ${t}`;
  let url = `/api/v1${path}`;
  if (query) {
    const q = new URLSearchParams();
    for (const [k, v] of Object.entries(query)) if (v != null && v !== '') q.set(k, v);
    const s = q.toString();
    if (s) url += `?${s}`;
  }
  let res;
  try {
    res = await fetch(url, { method, headers, body: body === undefined ? undefined : JSON.stringify(body), cache: 'no-store' });
  } catch (e) {
    throw new ApiError(0, { error: `the host does not answer (${e.message}); is it still running?` });
  }
  const text = await res.text();
  let data = null;
  if (text) {
    try { data = JSON.parse(text); } catch { data = { error: text.slice(0, 500) }; }
  }
  if (!res.ok) {
    const err = new ApiError(res.status, data);
    if (res.status === 401) unauthorized(err);
    throw err;
  }
  return data;
}

export const post = (path, body = {}) => api(path, { method: 'POST', body });

// ------------------------------------------------------------------ live updates

// Opens /api/v1/stream and calls handlers.status(Event) / handlers.counts(endpoints answer).
// When the stream cannot be had (an older host, a proxy that buffers), it falls back to
// calling handlers.poll() every POLL_MS and tries the stream again now and then.
// handlers.state(text, kind) reports what is going on: kind 'live' | 'connecting' | 'polling'.
const POLL_MS = 3000;
const RETRY_STREAM_MS = 30000;

export function live(handlers) {
  let es = null;
  let pollTimer = null;
  let retryTimer = null;
  let stopped = false;
  // what came so far (for a look from the devtools: nimbusStream in the console)
  const seen = { opened: 0, status: 0, counts: 0, errors: 0, recent: [] };
  window.nimbusStream = seen;

  const startPolling = (why) => {
    handlers.state(`Refreshing every ${POLL_MS / 1000} s (${why})`, 'polling');
    if (!pollTimer) pollTimer = setInterval(() => handlers.poll(), POLL_MS);
    clearTimeout(retryTimer);
    retryTimer = setTimeout(open, RETRY_STREAM_MS);
  };
  const stopPolling = () => { clearInterval(pollTimer); pollTimer = null; };

  function open() {
    if (stopped) return;
    if (typeof EventSource === 'undefined') { startPolling('this browser has no EventSource'); return; }
    const t = token();
    es = new EventSource(`/api/v1/stream${t ? `?access_token=${encodeURIComponent(t)}` : ''}`);
    handlers.state('Connecting to live updates…', 'connecting');
    es.addEventListener('open', () => {
      seen.opened++;
      stopPolling();
      clearTimeout(retryTimer);
      handlers.state('Live updates on', 'live');
      handlers.poll();   // catch up on what changed before the stream opened
    });
    es.addEventListener('status', (m) => {
      seen.status++;
      let ev;
      try { ev = JSON.parse(m.data); } catch { return; }
      seen.recent.push(`${ev.event_id} ${ev.status}`);
      if (seen.recent.length > 20) seen.recent.shift();
      handlers.status(ev);
    });
    es.addEventListener('counts', (m) => { seen.counts++; try { handlers.counts(JSON.parse(m.data)); } catch { /* not JSON */ } });
    es.addEventListener('error', () => {
      seen.errors++;
      if (es.readyState === EventSource.CLOSED) {
        // a non-200 answer (e.g. 501 from a host without the stream): EventSource gives up
        es.close();
        es = null;
        startPolling('the live stream is not available');
      } else {
        handlers.state('Reconnecting to live updates…', 'connecting');
        if (!pollTimer) pollTimer = setInterval(() => handlers.poll(), POLL_MS);
      }
    });
  }

  open();
  return {
    restart() { if (es) es.close(); es = null; stopPolling(); clearTimeout(retryTimer); open(); },
    stop() { stopped = true; if (es) es.close(); stopPolling(); clearTimeout(retryTimer); },
  };
}
