// An application's messages, filtered by time and event type: newest first (the message list) or oldest
// first (the reconciliation listing, whose cursor stays valid while new messages arrive).
import { call } from './api.js';
import { append, h, hrefOf, isoOf, link, localOf, named, pageSize, pager, table, time } from './dom.js';

export async function messagesView(ctx, appId) {
  const q = ctx.query;
  const app = await call('getApp', { app_id: appId });
  const order = q.get('order') === 'oldest' ? 'oldest' : 'newest';
  const since = h('input', { type: 'datetime-local', name: 'since', value: localOf(q.get('since')) });
  const until = h('input', { type: 'datetime-local', name: 'until', value: localOf(q.get('until')) });
  const types = h('input', { type: 'text', name: 'eventTypes', value: q.get('eventTypes') || '', placeholder: 'invoice.paid, …' });
  const orderSelect = h('select', { name: 'order' },
    h('option', { value: 'newest', selected: order === 'newest' }, 'Newest first'),
    h('option', { value: 'oldest', selected: order === 'oldest' }, 'Oldest first (reconciliation)'));
  const form = h('form', { class: 'row' },
    h('label', {}, 'Since (UTC)', since), h('label', {}, 'Until (UTC)', until),
    h('label', {}, 'Event types (comma-separated)', types), h('label', {}, 'Order', orderSelect),
    h('button', { type: 'submit' }, 'Apply'));
  form.addEventListener('submit', (event) => {
    event.preventDefault();
    location.hash = hrefOf(['app', app.id, 'messages'], {
      since: isoOf(since.value), until: isoOf(until.value), eventTypes: types.value.trim(),
      order: orderSelect.value === 'oldest' ? 'oldest' : '',
    });
  });

  const searched = q.get('searched');
  const list = table(['Created', 'Message', 'Event type', 'Event id', 'Channels'], [],
    searched ? `No message with id or eventId "${searched}", and no message of that event type in this window.` : 'No messages in this window.');
  const card = h('section', { class: 'card' }, list.element);
  append(ctx.root, 
    h('h1', {}, 'Messages · ', app.name, ' ', h('span', { class: 'muted' }, named(app))),
    searched ? h('p', { class: 'muted' }, `No message has the id or eventId "${searched}": showing messages of event type "${searched}".`) : null,
    h('section', { class: 'card' }, form),
    card,
  );

  const eventTypes = (q.get('eventTypes') || '').split(',').map((t) => t.trim()).filter(Boolean);
  await pager(card, async (iterator) => {
    const query = {
      limit: pageSize(q, 50), iterator, with_content: 'false', since: q.get('since'), until: q.get('until'), eventTypes,
    };
    const page = await call(order === 'oldest' ? 'listEvents' : 'listMessages', { app_id: app.id }, { query });
    list.add(page.data.map((msg) => [
      time(msg.timestamp),
      link(h('code', {}, msg.id), ['app', app.id, 'msg', msg.id]),
      msg.eventType,
      msg.eventId || h('span', { class: 'muted' }, '—'),
      (msg.channels || []).join(', ') || h('span', { class: 'muted' }, '—'),
    ]));
    return page;
  });
}
