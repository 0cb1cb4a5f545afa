// Operational events: what Herald did on its own (endpoint disabled, deliveries failing or exhausted…),
// oldest first. The admin token only.
import { call } from './api.js';
import { fillRows, h, link, table, time } from './dom.js';
import { pager } from './view-apps.js';

export async function opsView(ctx) {
  const list = table(['Time', 'Type', 'Application', 'Endpoint', 'Details']);
  const card = h('section', { class: 'card' }, list.element);
  ctx.root.append(h('h1', {}, 'Operational events'),
    h('p', { class: 'muted' }, 'Oldest first; also pushed to the operational webhook when one is configured.'), card);
  await pager(card, async (iterator) => {
    const page = await call('operationalEvents', {}, { query: { limit: 100, iterator } });
    fillRows(list.body, page.data.map((event) => {
      const { appId: _, endpointId, ...rest } = event.data || {};
      const appId = event.appId;
      return [
        time(event.timestamp),
        h('code', {}, event.eventType),
        appId ? link(String(appId), ['app', String(appId)]) : '—',
        appId && endpointId ? link(String(endpointId), ['app', String(appId), 'endpoint', String(endpointId)]) : '—',
        h('pre', { class: 'body' }, JSON.stringify(rest, null, 1)),
      ];
    }), 5, 'No operational events.');
    return page;
  });
}
