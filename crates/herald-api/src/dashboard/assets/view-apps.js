// Applications, and one application's endpoints with their live health (refreshed every few seconds).
import { call } from './api.js';
import { action, age, badge, describe, fillRows, flash, h, link, replace, table, time } from './dom.js';

/** How often endpoint health is read again. */
export const REFRESH_MS = 5000;

/** A "Load more" button for a cursor listing: `load(iterator)` resolves to the page it rendered. */
export function pager(container, load) {
  const more = h('button', { type: 'button', class: 'secondary more' }, 'Load more');
  let iterator = null;
  const next = async () => {
    more.disabled = true;
    try {
      const page = await load(iterator);
      iterator = page.iterator;
      more.hidden = page.done || !page.iterator;
    } catch (error) {
      flash(describe(error), 'error');
    } finally {
      more.disabled = false;
    }
  };
  more.addEventListener('click', next);
  container.append(more);
  return next();
}

export async function appsView(ctx) {
  const list = table(['Name', 'Id', 'Uid', 'Created']);
  ctx.root.append(h('h1', {}, 'Applications'), h('section', { class: 'card' }, list.element));
  await pager(ctx.root.lastChild, async (iterator) => {
    const page = await call('listApps', {}, { query: { limit: 50, iterator } });
    fillRows(list.body, page.data.map((app) => [
      link(app.name, ['app', app.id]),
      h('code', {}, app.id),
      app.uid || '—',
      time(app.createdAt),
    ]), 4, 'No applications yet.');
    return page;
  });
}

/** The breaker state and pause as a badge. */
export function stateBadge(endpoint) {
  if (endpoint.disabled) return badge('paused', 'warn');
  const state = endpoint.health ? endpoint.health.state : 'unknown';
  const tone = { closed: 'ok', half_open: 'warn', open: 'bad' }[state] || 'idle';
  return badge(state.replace('_', '-'), tone);
}

/** The health block's figures, as table cells (see docs/flow-control.md, "Seeing it"). */
export function healthCells(endpoint) {
  const health = endpoint.health || {};
  const failures = health.consecutiveFailures || 0;
  return [
    h('div', {}, stateBadge(endpoint), endpoint.disabledReason ? h('div', { class: 'muted' }, endpoint.disabledReason) : null),
    { cell: failures ? h('span', { class: 'bad' }, String(failures)) : '0', class: 'num' },
    health.nextProbeAt ? age(health.nextProbeAt) : health.heldUntil ? `held ${age(health.heldUntil)}` : '—',
    { cell: `${health.inFlight ?? '—'} / ${health.concurrencyLimit ?? '—'}`, class: 'num' },
    { cell: health.queueDepth === undefined ? '—' : `${health.queueDepth}${health.queueDepthCapped ? '+' : ''}`, class: 'num' },
    health.oldestPendingAt ? age(health.oldestPendingAt).replace(' ago', '') : '—',
  ];
}

export const HEALTH_HEADERS = ['State', { text: 'Failures', class: 'num' }, 'Next probe',
  { text: 'In flight / limit', class: 'num' }, { text: 'Queued', class: 'num' }, 'Oldest pending'];

/** Pause or resume an endpoint (`disabled`), then `done()`. */
export function pauseButton(appId, endpoint, done) {
  const paused = endpoint.disabled;
  return action(paused ? 'Resume' : 'Pause', async () => {
    if (!paused && !confirm(`Pause ${endpoint.url}? Deliveries queue until it is resumed.`)) return;
    await call('patchEndpoint', { app_id: appId, endpoint_id: endpoint.id }, { body: { disabled: !paused } });
    flash(paused ? 'Endpoint resumed.' : 'Endpoint paused.');
    await done();
  }, paused ? '' : 'secondary');
}

export async function appView(ctx, appId) {
  const app = await call('getApp', { app_id: appId });
  const updated = h('span', { class: 'muted' });
  const body = h('div');
  ctx.root.append(
    h('h1', {}, app.name, ' ', h('code', { class: 'muted' }, app.id)),
    h('section', { class: 'card' }, h('div', { class: 'row' }, h('h2', {}, 'Endpoints'), updated), body),
  );
  const refresh = async () => {
    if (!ctx.shown) return;
    try {
      // Health is only on the single-endpoint answer, so each endpoint of the page is read again.
      const page = await call('listEndpoints', { app_id: appId }, { query: { limit: 100 } });
      const endpoints = await Promise.all(page.data.map((ep) =>
        call('getEndpoint', { app_id: appId, endpoint_id: ep.id }).catch(() => ep)));
      const list = table(['Endpoint', ...HEALTH_HEADERS, ''], []);
      fillRows(list.body, endpoints.map((ep) => [
        h('div', {}, link(ep.uid || ep.id, ['app', appId, 'endpoint', ep.id]), h('div', { class: 'url muted' }, ep.url)),
        ...healthCells(ep),
        pauseButton(appId, ep, refresh),
      ]), 8, 'No endpoints.');
      replace(body, list.element, page.done ? null : h('p', { class: 'muted' }, 'Showing the first 100 endpoints.'));
      updated.textContent = `updated ${new Date().toLocaleTimeString()} · every ${REFRESH_MS / 1000} s`;
    } catch (error) {
      updated.textContent = `refresh failed: ${describe(error)}`;
    }
  };
  await refresh();
  ctx.every(REFRESH_MS, refresh);
}
