// An application's messages, filtered by time and event type: newest first (the message list) or oldest
// first (the reconciliation listing, whose cursor stays valid while new messages arrive).
import { call } from './api.js';
import { fillRows, h, isoOf, link, localOf, table, time } from './dom.js';
import { pager } from './view-apps.js';

export async function messagesView(ctx, appId) {
  const q = ctx.query;
  const order = q.get('order') === 'oldest' ? 'oldest' : 'newest';
  const since = h('input', { type: 'datetime-local', name: 'since', value: localOf(q.get('since')) });
  const until = h('input', { type: 'datetime-local', name: 'until', value: localOf(q.get('until')) });
  const types = h('input', { type: 'text', name: 'eventTypes', value: q.get('eventTypes') || '', placeholder: 'invoice.paid, …' });
  const orderSelect = h('select', { name: 'order' },
    h('option', { value: 'newest', selected: order === 'newest' }, 'Newest first'),
    h('option', { value: 'oldest', selected: order === 'oldest' }, 'Oldest first (reconciliation)'));
  const form = h('form', { class: 'row' },
    h('label', {}, 'Since', since), h('label', {}, 'Until', until),
    h('label', {}, 'Event types (comma-separated)', types), h('label', {}, 'Order', orderSelect),
    h('button', { type: 'submit' }, 'Apply'));
  form.addEventListener('submit', (event) => {
    event.preventDefault();
    const search = new URLSearchParams();
    if (since.value) search.set('since', isoOf(since.value));
    if (until.value) search.set('until', isoOf(until.value));
    if (types.value.trim()) search.set('eventTypes', types.value.trim());
    if (orderSelect.value === 'oldest') search.set('order', 'oldest');
    location.hash = `#/app/${encodeURIComponent(appId)}/messages?${search}`;
  });

  const list = table(['Created', 'Message', 'Event type', 'Event id', 'Channels']);
  const card = h('section', { class: 'card' }, list.element);
  ctx.root.append(h('h1', {}, 'Messages ', h('code', { class: 'muted' }, appId)), h('section', { class: 'card' }, form), card);

  const eventTypes = (q.get('eventTypes') || '').split(',').map((t) => t.trim()).filter(Boolean);
  await pager(card, async (iterator) => {
    const query = {
      limit: 50, iterator, with_content: 'false', since: q.get('since'), until: q.get('until'), eventTypes,
    };
    const page = await call(order === 'oldest' ? 'listEvents' : 'listMessages', { app_id: appId }, { query });
    fillRows(list.body, page.data.map((msg) => [
      time(msg.timestamp),
      link(h('code', {}, msg.id), ['app', appId, 'msg', msg.id]),
      msg.eventType,
      msg.eventId || '—',
      (msg.channels || []).join(', ') || '—',
    ]), 5, 'No messages in this window.');
    return page;
  });
}
