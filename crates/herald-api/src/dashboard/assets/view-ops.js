// Operational events: what Herald did on its own (endpoint disabled, deliveries failing or exhausted…),
// newest first, a page at a time. The admin token only.
import { call, labels } from './api.js';
import { append, badge, h, later, link, pageSize, pager, table, time } from './dom.js';

const TONE = {
  'endpoint.disabled': 'bad', 'message.attempt.exhausted': 'bad', 'message.attempt.failing': 'warn',
  'message.attempt.recovered': 'ok',
};

/** A value of the event's data as short text: objects as `key value` pairs, times in UTC. */
function text(value) {
  if (value && typeof value === 'object') {
    return Object.entries(value).map(([k, v]) => `${k} ${typeof v === 'object' ? JSON.stringify(v) : v}`).join(', ');
  }
  return String(value);
}

/** The event's data other than the ids shown in their own columns, as `key: value` lines. */
function details(appId, data) {
  const { appId: _app, endpointId: _endpoint, endpointUid: _uid, msgId, ...rest } = data || {};
  const lines = [];
  if (msgId && appId) lines.push(h('div', {}, h('span', { class: 'muted' }, 'message: '), link(h('code', {}, String(msgId)), ['app', appId, 'msg', String(msgId)])));
  const { lastAttempt, ...others } = rest;
  if (lastAttempt && typeof lastAttempt === 'object') {
    const code = lastAttempt.responseStatusCode ? `${lastAttempt.responseStatusCode} ` : '';
    lines.push(h('div', {}, h('span', { class: 'muted' }, 'last attempt: '), `${code}${lastAttempt.outcome || ''} at `, time(lastAttempt.timestamp)));
  }
  for (const [key, value] of Object.entries(others)) {
    const shown = text(value);
    lines.push(h('div', {}, h('span', { class: 'muted' }, `${key}: `), shown.length > 200 ? `${shown.slice(0, 200)}…` : shown));
  }
  return lines.length ? h('div', { class: 'small' }, lines) : h('span', { class: 'muted' }, '—');
}

export async function opsView(ctx) {
  const names = labels();
  const list = table(['Time (UTC)', 'Event', 'Application', 'Endpoint', 'Details'], [], 'No operational events.');
  const card = h('section', { class: 'card' }, list.element);
  append(ctx.root, h('h1', {}, 'Operational events'),
    h('p', { class: 'muted' }, 'Newest first. Each is also pushed, signed, to the operational webhook when one is configured.'), card);
  await pager(card, async (iterator) => {
    const page = await call('operationalEvents', {}, { query: { limit: pageSize(ctx.query, 50), iterator, order: 'descending' } });
    list.add(page.data.map((event) => {
      const data = event.data || {};
      const appId = event.appId ? String(event.appId) : '';
      const endpointId = data.endpointId ? String(data.endpointId) : '';
      return [
        time(event.timestamp),
        badge(event.eventType, TONE[event.eventType] || 'idle'),
        { cell: appId ? link(later(names.app(appId), appId), ['app', appId]) : '—', class: 'nowrap' },
        { cell: appId && endpointId ? link(data.endpointUid ? String(data.endpointUid) : later(names.endpoint(appId, endpointId), endpointId), ['app', appId, 'endpoint', endpointId]) : '—', class: 'nowrap' },
        details(appId, data),
      ];
    }));
    return page;
  }, 'Load older events');
}
