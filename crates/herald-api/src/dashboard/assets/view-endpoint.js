// One endpoint: its settings and live health, charts of its attempts (outcome and latency over time),
// delivery counts over a window, its deliveries by status with their last outcome, and the repairs.
import { call } from './api.js';
import { append, badge, describe, h, hrefOf, pageSize, replace, stat, table, utc } from './dom.js';
import { latencyChart, outcomeChart } from './chart.js';
import { HEALTH_HEADERS, REFRESH_MS, healthCells, pauseButton } from './view-apps.js';
import { deliveryListing, repairPanel, statusSelect } from './view-deliveries.js';

/** The windows offered, in hours: up to a day in 5-minute buckets, beyond in days. */
const WINDOWS = [[1, 'Last hour'], [6, 'Last 6 hours'], [24, 'Last 24 hours'], [168, 'Last 7 days'], [720, 'Last 30 days']];

export async function endpointView(ctx, appId, endpointId) {
  const ids = { app_id: appId, endpoint_id: endpointId };
  const first = await call('getEndpoint', ids);
  const status = ctx.query.get('status') || 'dead';
  const hours = Number(ctx.query.get('window')) || 24;
  const health = h('div');
  const updated = h('span', { class: 'muted small' });
  const charts = h('div', { class: 'charts' });
  const stats = h('div', { class: 'grid' });
  const windowSelect = h('select', { name: 'window' }, WINDOWS.map(([value, label]) => h('option', { value, selected: value === hours }, label)));
  windowSelect.addEventListener('change', () => {
    location.hash = hrefOf(['app', appId, 'endpoint', endpointId], { status, window: windowSelect.value });
  });
  const listing = h('div');
  let reload = async () => {};
  append(ctx.root, 
    h('h1', {}, 'Endpoint ', h('code', {}, first.uid || first.id)),
    h('section', { class: 'card' },
      h('div', { class: 'url' }, first.url),
      h('p', { class: 'muted' }, [
        first.description, first.uid ? `id ${first.id}` : null, `ordering ${first.ordering}`,
        first.rateLimit ? `rate limit ${first.rateLimit}/s` : null,
        first.maxConcurrency ? `max concurrency ${first.maxConcurrency}` : null,
        (first.filterTypes || []).length ? `event types: ${first.filterTypes.join(', ')}` : 'all event types',
        `created ${utc(first.createdAt)}`,
      ].filter(Boolean).join(' · ')),
      h('div', { class: 'row between' }, h('h2', {}, 'Health'), updated),
      health),
    h('section', { class: 'card' },
      h('div', { class: 'row between' }, h('h2', {}, 'Attempts'), h('label', {}, 'Window', windowSelect)),
      charts,
      h('h3', {}, 'Deliveries of the messages created in the window'),
      stats),
    h('section', { class: 'card' },
      h('div', { class: 'row between' }, h('h2', {}, 'Deliveries by status'), statusSelect(status, (s) => {
        location.hash = hrefOf(['app', appId, 'endpoint', endpointId], { status: s, window: hours });
      })),
      listing),
    repairPanel(appId, [first], () => reload()),
  );

  const refreshHealth = async () => {
    if (!ctx.shown) return;
    try {
      const endpoint = await call('getEndpoint', ids);
      const button = pauseButton(appId, endpoint, refreshHealth);
      const list = table([...HEALTH_HEADERS, ...(button ? [''] : [])]);
      list.add([[...healthCells(endpoint), ...(button ? [button] : [])]]);
      replace(health, list.element, recentOutcomes(endpoint));
      updated.textContent = `updated ${new Date().toISOString().slice(11, 19)} UTC · every ${REFRESH_MS / 1000} s`;
    } catch (error) {
      updated.textContent = `refresh failed: ${describe(error)}`;
    }
  };
  const refreshCharts = async () => {
    const end = new Date();
    const start = new Date(end.getTime() - hours * 3600e3);
    try {
      const s = await call('attemptStats', ids, { query: { startDate: start.toISOString(), endDate: end.toISOString() } });
      const total = (s.data.successCount || []).reduce((a, b) => a + b, 0) + (s.data.failureCount || []).reduce((a, b) => a + b, 0);
      replace(charts, outcomeChart(s), latencyChart(s),
        total ? null : h('p', { class: 'muted' }, 'No attempt in this window.'));
    } catch (error) {
      replace(charts, h('p', { class: 'bad' }, describe(error)));
    }
  };
  const refreshStats = async () => {
    const query = { since: new Date(Date.now() - hours * 3600e3).toISOString() };
    try {
      const s = await call('endpointStats', ids, { query });
      replace(stats, stat('Delivered', String(s.success), 'ok'), stat('Failed or dead', String(s.fail), s.fail ? 'bad' : ''),
        stat('Pending', String(s.pending + s.sending), s.pending ? 'warn' : ''), stat('Cancelled', String(s.cancelled)));
    } catch (error) {
      replace(stats, h('span', { class: 'bad' }, describe(error)));
    }
  };
  const [, , , reloadListing] = await Promise.all([refreshHealth(), refreshCharts(), refreshStats(),
    deliveryListing(listing, appId, first.id, status, pageSize(ctx.query, 50), [first])]);
  reload = async () => { await Promise.all([reloadListing(), refreshStats(), refreshCharts(), refreshHealth()]); };
  ctx.every(REFRESH_MS, refreshHealth);
}

/** The outcome classes of the endpoint's last attempts, oldest first, as coloured badges. */
function recentOutcomes(endpoint) {
  const recent = (endpoint.health || {}).recentOutcomes || [];
  if (!recent.length) return h('p', { class: 'muted small recent-outcomes' }, 'Recent outcomes: no attempt since the server started.');
  const tone = (outcome) => (outcome === 'success' ? 'ok' : outcome === 'client_error' || outcome === 'gone' ? 'warn' : 'bad');
  return h('p', { class: 'recent-outcomes' }, 'Recent outcomes (oldest first): ',
    ...recent.map((outcome) => badge(outcome, tone(outcome))));
}
