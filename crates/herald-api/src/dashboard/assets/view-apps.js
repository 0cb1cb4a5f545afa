// Applications, and one application's endpoints with their live health (refreshed every few seconds).
import { call, session } from './api.js';
import { action, age, append, badge, describe, flash, h, link, named, pageSize, pager, replace, table, time } from './dom.js';

/** How often endpoint health is read again. */
export const REFRESH_MS = 5000;

export async function appsView(ctx) {
  const list = table(['Application', 'Uid', 'Id', 'Created'], [], 'No applications yet.');
  const card = h('section', { class: 'card' }, list.element);
  append(ctx.root, h('h1', {}, 'Applications'), card);
  await pager(card, async (iterator) => {
    const page = await call('listApps', {}, { query: { limit: pageSize(ctx.query, 50), iterator } });
    list.add(page.data.map((app) => [
      link(app.name, ['app', app.id]),
      app.uid || h('span', { class: 'muted' }, '—'),
      h('code', {}, app.id),
      time(app.createdAt),
    ]));
    return page;
  });
}

/** The breaker state and pause as a badge. */
export function stateBadge(endpoint) {
  if (endpoint.disabled) return badge(endpoint.disabledReason ? 'disabled' : 'paused', 'warn');
  const state = endpoint.health ? endpoint.health.state : 'unknown';
  const tone = { closed: 'ok', half_open: 'warn', open: 'bad' }[state] || 'idle';
  const label = { closed: 'healthy', half_open: 'probing', open: 'breaker open' }[state] || state;
  return badge(label, tone);
}

/** A moment ahead (`in 3.2 s`), or `due` once it has passed. */
function soon(iso) {
  return new Date(iso).getTime() > Date.now() ? age(iso) : h('span', { title: iso }, 'due');
}

/** The health block's figures, as table cells (see docs/flow-control.md, "Seeing it"). */
export function healthCells(endpoint) {
  const health = endpoint.health || {};
  const failures = health.consecutiveFailures || 0;
  return [
    h('div', {}, stateBadge(endpoint), endpoint.disabledReason ? h('div', { class: 'muted small' }, endpoint.disabledReason) : null),
    { cell: failures ? h('span', { class: 'bad' }, String(failures)) : '0', class: 'num' },
    health.nextProbeAt ? soon(health.nextProbeAt) : health.heldUntil ? ['held ', soon(health.heldUntil)] : '—',
    { cell: `${health.inFlight ?? '—'} / ${health.concurrencyLimit ?? '—'}`, class: 'num' },
    { cell: health.queueDepth === undefined ? '—' : `${health.queueDepth}${health.queueDepthCapped ? '+' : ''}`, class: 'num' },
    health.oldestPendingAt ? age(health.oldestPendingAt) : '—',
  ];
}

export const HEALTH_HEADERS = ['State', { text: 'Failures', class: 'num' }, 'Next probe',
  { text: 'In flight / limit', class: 'num' }, { text: 'Queued', class: 'num' }, 'Oldest pending'];

/** Pause or resume an endpoint (`disabled`), then `done()`; nothing for a read-only token. */
export function pauseButton(appId, endpoint, done) {
  if (session.readOnly) return null;
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
  const updated = h('span', { class: 'muted small' });
  const body = h('div');
  append(ctx.root, 
    h('h1', {}, app.name, ' ', h('span', { class: 'muted' }, named(app))),
    h('section', { class: 'card' }, h('div', { class: 'row between' }, h('h2', {}, 'Endpoints'), updated), body),
  );
  const refresh = async () => {
    if (!ctx.shown) return;
    try {
      // Health is only on the single-endpoint answer, so each endpoint of the page is read again.
      const page = await call('listEndpoints', { app_id: appId }, { query: { limit: 100, order: 'ascending' } });
      const endpoints = await Promise.all(page.data.map((ep) =>
        call('getEndpoint', { app_id: appId, endpoint_id: ep.id }).catch(() => ep)));
      const list = table(['Endpoint', ...HEALTH_HEADERS, ...(session.readOnly ? [] : [''])], [], 'No endpoints.');
      list.add(endpoints.map((ep) => [
        h('div', {}, link(ep.uid || ep.id, ['app', app.id, 'endpoint', ep.id]), h('div', { class: 'url muted small' }, ep.url)),
        ...healthCells(ep),
        ...(session.readOnly ? [] : [pauseButton(app.id, ep, refresh)]),
      ]));
      replace(body, list.element, page.done ? null : h('p', { class: 'muted' }, 'Showing the first 100 endpoints.'));
      updated.textContent = `updated ${new Date().toISOString().slice(11, 19)} UTC · every ${REFRESH_MS / 1000} s`;
    } catch (error) {
      updated.textContent = `refresh failed: ${describe(error)}`;
    }
  };
  await refresh();
  ctx.every(REFRESH_MS, refresh);
}
