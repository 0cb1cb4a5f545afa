// Entry point: login (typed, or from a portal link's fragment), navigation (hash routes, so every view can
// be bookmarked), the search box, and each view's lifecycle.
import { ApiError, call, session } from './api.js';
import { describe, flash, h, hrefOf, later, link, replace } from './dom.js';
import { appsView, appView } from './view-apps.js';
import { messagesView } from './view-messages.js';
import { deadView, timelineView } from './view-deliveries.js';
import { endpointView } from './view-endpoint.js';
import { opsView } from './view-ops.js';
import { searchForm } from './search.js';

const main = document.getElementById('main');

/** Hash routes: the pattern's captures (decoded) are passed to the view after its context. */
const ROUTES = [
  [/^\/$/, home],
  [/^\/app\/([^/]+)$/, appView],
  [/^\/app\/([^/]+)\/messages$/, messagesView],
  [/^\/app\/([^/]+)\/msg\/([^/]+)$/, timelineView],
  [/^\/app\/([^/]+)\/failing$/, deadView],
  [/^\/app\/([^/]+)\/endpoint\/([^/]+)$/, endpointView],
  [/^\/ops$/, opsView],
];

/** What the current view started (timers), stopped when the user goes elsewhere. */
let cleanups = [];

function leave() {
  for (const stop of cleanups) stop();
  cleanups = [];
}

/** The context a view renders with. */
function context(query) {
  const root = h('div');
  replace(main, root);
  return {
    root,
    query,
    /** Run `fn` every `ms` while this view is shown. */
    every(ms, fn) {
      const id = setInterval(fn, ms);
      cleanups.push(() => clearInterval(id));
    },
    /** Whether this view is still the one shown (an answer may arrive after the user moved on). */
    get shown() { return root.isConnected; },
  };
}

function home(ctx) {
  if (session.admin) return appsView(ctx);
  go(hrefOf(['app', session.app]));
  return undefined;
}

function nav(appId) {
  const items = [];
  if (session.admin) items.push(link('Applications', []), link('Operational events', ['ops']));
  replace(document.getElementById('nav'), items);
  const sub = document.getElementById('subnav');
  sub.hidden = !appId;
  replace(sub, appId ? [
    h('span', { class: 'app-name' }, session.admin
      ? later(call('getApp', { app_id: appId }).then((a) => a.name), appId)
      : session.appLabel),
    link('Endpoints', ['app', appId]),
    link('Messages', ['app', appId, 'messages']),
    link('Failing deliveries', ['app', appId, 'failing']),
  ] : null);
  for (const a of document.querySelectorAll('#nav a, #subnav a')) {
    if (a.getAttribute('href') === (location.hash.split('?')[0] || '#/')) a.setAttribute('aria-current', 'page');
  }
  replace(document.getElementById('search'), appId || session.admin ? searchForm(appId) : null);
  const who = session.admin ? 'admin token' : `application token · ${session.appLabel}`;
  document.getElementById('who').textContent = session.readOnly ? `${who} · read-only` : who;
  document.getElementById('logout').hidden = false;
}

async function route() {
  leave();
  document.getElementById('flash').replaceChildren();
  if (takePortalToken()) return undefined;
  if (!session.token) return showLogin();
  const [path, search] = (location.hash.slice(1) || '/').split('?');
  const query = new URLSearchParams(search || '');
  for (const [pattern, view] of ROUTES) {
    const match = pattern.exec(path);
    if (!match) continue;
    let args;
    try { args = match.slice(1).map(decodeURIComponent); } catch { break; }
    const appId = args[0] && path.startsWith('/app/') ? args[0] : '';
    nav(appId);
    if (!session.admin && appId && appId !== session.app) {
      flash('This application token only sees its own application.', 'error');
    }
    try {
      await view(context(query), ...args);
    } catch (error) {
      // A refused token already sent the user back to the login form (see below).
      if (error.status !== 401) flash(describe(error), 'error');
    }
    return undefined;
  }
  nav('');
  replace(main, h('section', { class: 'card' }, 'No such page. ', link('Start over', [])));
  return undefined;
}

/**
 * A portal link (`POST /auth/app-portal-access/{app_id}` answers one) carries its token in the fragment,
 * `#key=…`, which the browser never sends to any server. Take it, drop it from the address bar and the
 * history, and log in with it. Returns whether it did.
 */
function takePortalToken() {
  const fragment = new URLSearchParams(location.hash.slice(1));
  const token = location.hash.startsWith('#key=') ? fragment.get('key') : null;
  if (!token) return false;
  history.replaceState(null, '', `${location.pathname}${location.search}`);
  loginWith(token).catch((error) => {
    showLogin();
    flash(describe(error), 'error');
  });
  return true;
}

function showLogin() {
  replace(document.getElementById('nav'));
  replace(document.getElementById('subnav'));
  document.getElementById('subnav').hidden = true;
  replace(document.getElementById('search'));
  document.getElementById('who').textContent = '';
  document.getElementById('logout').hidden = true;
  const form = document.getElementById('login-template').content.cloneNode(true);
  replace(main, form);
  main.querySelector('#login-form').addEventListener('submit', async (event) => {
    event.preventDefault();
    const data = new FormData(event.target);
    try {
      await loginWith(String(data.get('token') || '').trim());
    } catch (error) {
      flash(describe(error), 'error');
    }
  });
}

/** Show `hash`: a new hash routes through `hashchange`, the current one is routed again. */
function go(hash) {
  if (location.hash === hash) route();
  else location.hash = hash;
}

/** Ask the server what the token is (admin, or which application, read-only or not), then show its home. */
async function loginWith(token) {
  session.clear();
  if (!token) throw new Error('Enter a token.');
  let info;
  try {
    info = await call('tokenInfo', {}, { token });
  } catch (error) {
    throw error instanceof ApiError && error.status === 401 ? new Error('This token is not valid (or has expired).') : error;
  }
  let label = '';
  if (info.kind !== 'admin') {
    const app = await call('getApp', { app_id: info.appId }, { token });
    label = app.uid || app.name;
  }
  session.save(token, info, label);
  go(info.kind === 'admin' ? '#/' : hrefOf(['app', info.appId]));
}

window.addEventListener('herald:unauthorized', () => {
  session.clear();
  leave();
  showLogin();
  flash('The token was refused (expired or revoked): log in again.', 'error');
});
document.getElementById('logout').addEventListener('click', () => {
  session.clear();
  go('#/');
});
window.addEventListener('hashchange', route);
route();
