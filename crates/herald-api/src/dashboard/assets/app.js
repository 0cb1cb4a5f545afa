// Entry point: login, navigation (hash routes, so every view can be bookmarked) and each view's lifecycle.
import { call, session } from './api.js';
import { describe, flash, h, link, replace } from './dom.js';
import { appsView, appView } from './view-apps.js';
import { messagesView } from './view-messages.js';
import { deadView, timelineView } from './view-deliveries.js';
import { endpointView } from './view-endpoint.js';
import { opsView } from './view-ops.js';

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
    /** Run `fn` now and every `ms` while this view is shown. */
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
  go(`#/app/${encodeURIComponent(session.app)}`);
  return undefined;
}

function nav(appId) {
  const items = [];
  if (session.admin) items.push(link('Applications', []), link('Operational events', ['ops']));
  if (appId) {
    items.push(
      link('Endpoints', ['app', appId]),
      link('Messages', ['app', appId, 'messages']),
      link('Failing deliveries', ['app', appId, 'failing']),
    );
  }
  replace(document.getElementById('nav'), items);
  document.getElementById('who').textContent = session.admin ? 'admin token' : `application token · ${session.app}`;
  document.getElementById('logout').hidden = false;
}

async function route() {
  leave();
  document.getElementById('flash').replaceChildren();
  if (!session.token) return showLogin();
  const [path, search] = (location.hash.slice(1) || '/').split('?');
  const query = new URLSearchParams(search || '');
  for (const [pattern, view] of ROUTES) {
    const match = pattern.exec(path);
    if (!match) continue;
    let args;
    try { args = match.slice(1).map(decodeURIComponent); } catch { break; }
    nav(args[0] && path.startsWith('/app/') ? args[0] : '');
    if (!session.admin && args[0] && path.startsWith('/app/') && args[0] !== session.app) {
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
  replace(main, h('section', { class: 'card' }, 'No such page. ', link('Start over', [])));
  return undefined;
}

function showLogin() {
  replace(document.getElementById('nav'));
  document.getElementById('who').textContent = '';
  document.getElementById('logout').hidden = true;
  const form = document.getElementById('login-template').content.cloneNode(true);
  replace(main, form);
  main.querySelector('#login-form').addEventListener('submit', async (event) => {
    event.preventDefault();
    const data = new FormData(event.target);
    const token = String(data.get('token') || '').trim();
    const app = String(data.get('app') || '').trim();
    loggingIn = true;
    try {
      await login(token, app);
      go(session.admin ? '#/' : `#/app/${encodeURIComponent(app)}`);
    } catch (error) {
      session.clear();
      flash(describe(error), 'error');
    } finally {
      loggingIn = false;
    }
  });
}

/** Show `hash`: a new hash routes through `hashchange`, the current one is routed again. */
function go(hash) {
  if (location.hash === hash) route();
  else location.hash = hash;
}

/** Set while a login is checked: its 401 is the form's error, not an expired session. */
let loggingIn = false;

/** Find out what the token is: the admin token may list applications, an application token may not. */
async function login(token, app) {
  if (!token) throw new Error('Enter a token.');
  session.save(token, app, true);
  try {
    await call('listApps', {}, { query: { limit: 1 } });
    return;
  } catch (error) {
    if (error.status !== 403) throw error.status === 401 ? new Error('This token is not valid (or has expired).') : error;
  }
  if (!app) throw new Error('This is an application token: enter the id or uid of its application.');
  session.save(token, app, false);
  try {
    await call('getApp', { app_id: app });
  } catch (error) {
    throw error.status === 403 ? new Error(`This token does not belong to application ${app}.`) : error;
  }
}

window.addEventListener('herald:unauthorized', () => {
  if (loggingIn) return;
  session.clear();
  flash('The token was refused (expired or revoked): log in again.', 'error');
  leave();
  showLogin();
});
document.getElementById('logout').addEventListener('click', () => {
  session.clear();
  go('#/');
});
window.addEventListener('hashchange', route);
route();
