// One endpoint: its settings and live health, delivery counts over a window, its deliveries by status
// with their last outcome, and the repairs.
import { call } from './api.js';
import { describe, fillRows, h, replace, stat, table, time } from './dom.js';
import { HEALTH_HEADERS, REFRESH_MS, healthCells, pauseButton } from './view-apps.js';
import { deliveryListing, repairPanel, statusSelect } from './view-deliveries.js';

/** The windows offered for the delivery counts, in hours (0: since the beginning). */
const WINDOWS = [[1, 'Last hour'], [24, 'Last 24 hours'], [168, 'Last 7 days'], [0, 'All time']];

export async function endpointView(ctx, appId, endpointId) {
  const ids = { app_id: appId, endpoint_id: endpointId };
  const first = await call('getEndpoint', ids);
  const status = ctx.query.get('status') || 'dead';
  const health = h('div');
  const updated = h('span', { class: 'muted' });
  const stats = h('div', { class: 'grid' });
  const windowSelect = h('select', {}, WINDOWS.map(([hours, label]) => h('option', { value: hours, selected: hours === 24 }, label)));
  const listing = h('section', { class: 'card' });
  ctx.root.append(
    h('h1', {}, 'Endpoint ', h('code', {}, first.uid || first.id)),
    h('section', { class: 'card' },
      h('div', { class: 'url' }, first.url),
      h('p', { class: 'muted' }, [
        first.description, `id ${first.id}`, `ordering ${first.ordering}`,
        first.rateLimit ? `rate limit ${first.rateLimit}/s` : null,
        first.maxConcurrency ? `max concurrency ${first.maxConcurrency}` : null,
        (first.filterTypes || []).length ? `event types: ${first.filterTypes.join(', ')}` : 'all event types',
        `created ${time(first.createdAt)}`,
      ].filter(Boolean).join(' · ')),
      h('div', { class: 'row' }, h('h2', {}, 'Health'), updated),
      health),
    h('section', { class: 'card' },
      h('div', { class: 'row' }, h('h2', {}, 'Deliveries'), h('label', {}, 'Created in', windowSelect)),
      stats),
    h('section', { class: 'card row' }, statusSelect(status, (s) => {
      location.hash = `#/app/${encodeURIComponent(appId)}/endpoint/${encodeURIComponent(endpointId)}?status=${s}`;
    })),
    listing,
    repairPanel(appId, [first]),
  );

  const refreshHealth = async () => {
    if (!ctx.shown) return;
    try {
      const endpoint = await call('getEndpoint', ids);
      const list = table([...HEALTH_HEADERS, ''], []);
      fillRows(list.body, [[...healthCells(endpoint), pauseButton(appId, endpoint, refreshHealth)]], 7);
      replace(health, list.element);
      updated.textContent = `updated ${new Date().toLocaleTimeString()} · every ${REFRESH_MS / 1000} s`;
    } catch (error) {
      updated.textContent = `refresh failed: ${describe(error)}`;
    }
  };
  const refreshStats = async () => {
    const hours = Number(windowSelect.value);
    const query = hours ? { since: new Date(Date.now() - hours * 3600e3).toISOString() } : {};
    try {
      const s = await call('endpointStats', ids, { query });
      replace(stats, stat('Delivered', String(s.success), 'ok'), stat('Failed or dead', String(s.fail), s.fail ? 'bad' : ''),
        stat('Pending', String(s.pending + s.sending), s.pending ? 'warn' : ''), stat('Cancelled', String(s.cancelled)));
    } catch (error) {
      replace(stats, h('span', { class: 'bad' }, describe(error)));
    }
  };
  windowSelect.addEventListener('change', refreshStats);
  await Promise.all([refreshHealth(), refreshStats(), deliveryListing(listing, appId, endpointId, status)]);
  ctx.every(REFRESH_MS, refreshHealth);
}
