// The console's entry: who the caller is (a login form when the listener wants a token), the
// hash router, and live updates fanned out to the view on screen.
import { api, ApiError, live, onUnauthorized, setToken, token } from './api.js';
import { clear, clearNotice, h, hideError, showError } from './ui.js';
import * as overview from './overview.js';
import * as endpoint from './endpoint.js';
import * as eventView from './event.js';
import * as sessions from './sessions.js';
import * as failures from './failures.js';

const main = document.getElementById('main');
const ctx = { role: 'reader', canAct: false, name: '' };
let current = null;      // the view on screen: { poll, status, counts, destroy }
let seq = 0;             // bumped per navigation: a slow render of a page left behind is dropped
let stream = null;
let settleTimer = null;
const SETTLE_MS = 1200;   // > the host's NH_ADMIN_CACHE_MS (host/src/admin/nh_admin_int.h)

const routes = [
  [/^#?\/?$/, overview, () => ({}), 'overview'],
  [/^#\/endpoints\/([^?]+)(?:\?(.*))?$/, endpoint, (m) => ({ name: decodeURIComponent(m[1]), query: new URLSearchParams(m[2] || '') }), 'overview'],
  [/^#\/events\/([^?]+)$/, eventView, (m) => ({ id: decodeURIComponent(m[1]) }), null],
  [/^#\/sessions(?:\?(.*))?$/, sessions, (m) => ({ query: new URLSearchParams(m[1] || '') }), 'sessions'],
  [/^#\/failures(?:\?(.*))?$/, failures, (m) => ({ query: new URLSearchParams(m[1] || '') }), 'failures'],
];

function setNav(which) {
  for (const a of document.querySelectorAll('[data-nav]')) {
    if (a.dataset.nav === which) a.setAttribute('aria-current', 'page');
    else a.removeAttribute('aria-current');
  }
}

ctx.title = (text) => { document.title = `${text} · nimbus-host console`; };

async function route({ focus = true } = {}) {
  const hash = location.hash || '#/';
  const my = ++seq;
  if (current && current.destroy) current.destroy();
  current = null;
  hideError();
  clearNotice();
  let hit = null;
  for (const [re, view, params, nav] of routes) {
    const m = hash.match(re);
    if (m) { hit = { view, params: params(m), nav }; break; }
  }
  clear(main);
  main.setAttribute('aria-busy', 'true');
  if (!hit) {
    setNav(null);
    ctx.title('Not found');
    main.append(h('h1', { tabindex: '-1' }, 'No such page'), h('p', null, 'The address ', h('code', null, hash),
      ' is not a page of the console. ', h('a', { href: '#/' }, 'Go to the overview'), '.'));
    main.setAttribute('aria-busy', 'false');
    return;
  }
  setNav(hit.nav);
  const page = h('div', { class: 'page' });
  main.append(page);
  try {
    const v = await hit.view.render(page, hit.params, ctx);
    if (my !== seq) { if (v && v.destroy) v.destroy(); return; }
    current = v || {};
    // one more read once the host's short answer cache (counts, failure groups) has turned over
    clearTimeout(settleTimer);
    settleTimer = setTimeout(() => { if (my === seq && current && current.poll) current.poll(); }, SETTLE_MS);
  } catch (e) {
    if (my !== seq) return;
    if (e instanceof ApiError && e.status === 401) return;   // the login form took over
    clear(page);
    page.append(h('h1', { tabindex: '-1' }, 'This page could not be loaded'));
    showError(e, 'Loading the page');
  }
  main.setAttribute('aria-busy', 'false');
  if (focus) {
    const h1 = main.querySelector('h1');
    if (h1) { h1.setAttribute('tabindex', '-1'); h1.focus({ preventScroll: false }); }
  }
}

// ------------------------------------------------------------------ who is calling

function showWho() {
  const el = clear(document.getElementById('who'));
  if (!ctx.name) return;
  el.append(h('span', null, `${ctx.name} · ${ctx.role === 'operator' ? 'operator' : 'read only'}`));
  if (token()) {
    el.append(' ', h('button', { type: 'button', class: 'small link', onclick: () => { setToken(null); location.reload(); } }, 'Sign out'));
  }
}

function loginForm(message) {
  if (stream) { stream.stop(); stream = null; }
  if (current && current.destroy) current.destroy();
  current = null;
  seq++;
  setNav(null);
  ctx.title('Sign in');
  clear(main);
  const input = h('input', { id: 'token', name: 'token', type: 'password', autocomplete: 'current-password', required: true, 'aria-describedby': 'token-help' });
  const form = h('form', { class: 'login', onsubmit: async (e) => {
    e.preventDefault();
    setToken(input.value.trim());
    hideError();
    await start();
  } },
  h('h1', { tabindex: '-1' }, 'Sign in'),
  message ? h('p', null, message) : null,
  h('p', null, h('label', { for: 'token' }, 'Access token')),
  h('p', null, input),
  h('p', { id: 'token-help', class: 'help' }, 'A token from the host\'s --admin-token-file. It is kept in this tab only (sessionStorage).'),
  h('p', null, h('button', { type: 'submit', class: 'primary' }, 'Sign in')));
  main.append(form);
  main.setAttribute('aria-busy', 'false');
  input.focus();
}

onUnauthorized(() => {
  const had = token();
  setToken(null);
  loginForm(had ? 'That token was not accepted (unknown or expired). Enter another one.' : 'This console needs an access token.');
});

const liveEl = document.getElementById('live');
function liveState(text, kind) {
  liveEl.textContent = text;
  liveEl.dataset.kind = kind;
}

async function start() {
  let who;
  try {
    who = await api('/whoami');
  } catch (e) {
    if (e instanceof ApiError && e.status === 401) return;   // login form shown
    clear(main);
    main.append(h('h1', { tabindex: '-1' }, 'The operator API does not answer'));
    main.setAttribute('aria-busy', 'false');
    showError(e, 'Asking who you are');
    liveState('Offline', 'polling');
    return;
  }
  if (who.login_required && !token()) { loginForm('This console needs an access token.'); return; }
  ctx.name = who.name;
  ctx.role = who.role;
  ctx.canAct = who.role === 'operator';
  document.body.dataset.role = who.role;
  showWho();
  if (!stream) {
    stream = live({
      state: liveState,
      poll: () => { if (current && current.poll) current.poll(); },
      status: (ev) => {
        if (current && current.status) current.status(ev);
        // the overview counts and failure groups are cached by the host for up to a second
        // while the store changes: read the view once more after the changes settle
        clearTimeout(settleTimer);
        settleTimer = setTimeout(() => { if (current && current.poll) current.poll(); }, SETTLE_MS);
      },
      counts: (data) => { if (current && current.counts) current.counts(data); },
    });
  }
  await route();
}

window.addEventListener('hashchange', () => route());
start();
