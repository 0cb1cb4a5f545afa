// A message's delivery timeline, failing deliveries (dead letters) with their last outcome, and the bulk
// repairs (recover, replay-missing) with their progress.
import { call } from './api.js';
import {
  action, age, badge, describe, duration, fillRows, flash, h, isoOf, link, replace, stat, table, time,
} from './dom.js';
import { pager } from './view-apps.js';

const STATUS_TONE = { delivered: 'ok', pending: 'warn', failed: 'bad', dead: 'bad', cancelled: 'idle' };

/** A delivery's status as a badge. */
export function deliveryBadge(status) {
  return badge(status, STATUS_TONE[status]);
}

/** The outcome of one attempt, e.g. `503 server_error` or `timeout`. */
function outcome(attempt) {
  const code = attempt.responseStatusCode;
  const tone = attempt.status === 0 ? 'ok' : 'bad';
  return h('span', { class: tone }, code ? `${code} ${attempt.outcome}` : attempt.outcome);
}

/** A response body, capped by Herald, folded away. */
function responseBody(text) {
  if (!text) return h('span', { class: 'muted' }, '(empty)');
  return h('details', {}, h('summary', {}, `${text.length} characters`), h('pre', { class: 'body' }, text));
}

/** Resend one message to one endpoint (a manual attempt). */
function resendButton(appId, msgId, endpointId, done) {
  return action('Resend', async () => {
    await call('resend', { app_id: appId, msg_id: msgId, endpoint_id: endpointId });
    flash('Resend queued.');
    if (done) await done();
  }, 'secondary');
}

export async function timelineView(ctx, appId, msgId) {
  const message = await call('getMessage', { app_id: appId, msg_id: msgId });
  const created = new Date(message.timestamp).getTime();
  const content = h('div');
  ctx.root.append(
    h('h1', {}, 'Message ', h('code', {}, message.id)),
    h('section', { class: 'card' },
      h('div', { class: 'grid' },
        stat('Event type', message.eventType), stat('Event id', message.eventId || '—'),
        stat('Created', time(message.timestamp)), stat('Channels', (message.channels || []).join(', ') || '—')),
      h('details', {}, h('summary', {}, 'Payload'), h('pre', { class: 'body' }, JSON.stringify(message.payload, null, 2)))),
    content,
  );
  const render = async () => {
    const [destinations, attempts] = await Promise.all([
      call('messageDestinations', { app_id: appId, msg_id: msgId }, { query: { limit: 250 } }),
      call('messageAttempts', { app_id: appId, msg_id: msgId }, { query: { limit: 250 } }),
    ]);
    const byEndpoint = new Map();
    for (const attempt of attempts.data.slice().reverse()) {
      if (!byEndpoint.has(attempt.endpointId)) byEndpoint.set(attempt.endpointId, []);
      byEndpoint.get(attempt.endpointId).push(attempt);
    }
    const cards = destinations.data.map((ep) => {
      const list = table(['#', 'Sent', { text: 'After creation', class: 'num' }, 'Outcome',
        { text: 'Latency', class: 'num' }, 'Trigger', 'Response']);
      fillRows(list.body, (byEndpoint.get(ep.id) || []).map((a, i) => [
        String(i + 1), time(a.timestamp),
        { cell: duration(new Date(a.timestamp).getTime() - created), class: 'num' },
        outcome(a), { cell: `${a.responseDurationMs} ms`, class: 'num' }, a.trigger, responseBody(a.response),
      ]), 7, 'No attempt yet.');
      return h('section', { class: 'card' },
        h('div', { class: 'row' },
          h('h2', {}, link(ep.uid || ep.id, ['app', appId, 'endpoint', ep.id])),
          deliveryBadge(ep.deliveryStatus),
          h('span', { class: 'muted' }, `${ep.attempts} attempt(s)`),
          ep.nextAttempt ? h('span', { class: 'muted' }, `next ${age(ep.nextAttempt)}`) : null,
          resendButton(appId, message.id, ep.id, render)),
        h('div', { class: 'url muted' }, ep.url),
        list.element);
    });
    replace(content, cards.length ? cards : h('section', { class: 'card muted' }, 'No endpoint was subscribed to this message.'));
  };
  await render();
}

/** The failing-deliveries table: each delivery with its last attempt; rows are added by `add(page)`. */
export function deliveryTable(appId, showEndpoint) {
  const headers = ['Message', 'Event type', ...(showEndpoint ? ['Endpoint'] : []), 'Status',
    { text: 'Attempts', class: 'num' }, 'Last outcome', 'Last response', ''];
  const list = table(headers, []);
  const add = (page) => fillRows(list.body, page.data.map((d) => [
    h('div', {}, link(h('code', {}, d.id), ['app', appId, 'msg', d.id]), h('div', { class: 'muted' }, time(d.timestamp))),
    d.eventType,
    ...(showEndpoint ? [link(d.endpointId, ['app', appId, 'endpoint', d.endpointId])] : []),
    deliveryBadge(d.deliveryStatus),
    { cell: String(d.attempts), class: 'num' },
    d.lastAttempt ? h('div', {}, outcome(d.lastAttempt), h('div', { class: 'muted' }, age(d.lastAttempt.timestamp))) : '—',
    d.lastAttempt ? responseBody(d.lastAttempt.response) : '—',
    d.deliveryStatus === 'pending' ? '' : resendButton(appId, d.id, d.endpointId),
  ]), headers.length, 'No deliveries with this status.');
  return { element: list.element, add };
}

/** Deliveries of an app (or one endpoint) with a given status, paged. */
export async function deliveryListing(container, appId, endpointId, status) {
  const listing = deliveryTable(appId, !endpointId);
  replace(container, listing.element);
  await pager(container, async (iterator) => {
    const query = { limit: 50, iterator, with_content: 'false', deliveryStatus: status };
    const page = endpointId
      ? await call('endpointDeliveries', { app_id: appId, endpoint_id: endpointId }, { query })
      : await call('appDeliveries', { app_id: appId }, { query });
    listing.add(page);
    return page;
  });
}

/** A status filter for the failing-deliveries listings. */
export function statusSelect(value, onChange) {
  const select = h('select', {}, ['dead', 'failed', 'pending', 'delivered', 'cancelled']
    .map((s) => h('option', { value: s, selected: s === value }, s)));
  select.addEventListener('change', () => onChange(select.value));
  return h('label', {}, 'Status', select);
}

/** Poll a background task into a progress bar until it ends, then show its summary. */
async function follow(box, taskId) {
  const bar = h('progress', { max: 1, value: 0 });
  const text = h('div', { class: 'muted' }, 'starting…');
  replace(box, h('div', {}, `Task ${taskId}`), bar, text);
  for (;;) {
    let task;
    try {
      task = await call('getTask', { task_id: taskId });
    } catch (error) {
      text.textContent = `cannot read the task: ${describe(error)}`;
      return;
    }
    bar.max = Math.max(task.total, 1);
    bar.value = task.status === 'finished' ? bar.max : task.processed;
    text.textContent = `${task.status}: ${task.processed} of ${task.total} processed`;
    if (task.status !== 'running') {
      const data = task.data || {};
      const summary = task.status === 'finished'
        ? `Finished: ${task.processed} processed, ${data.queued ?? 0} queued for delivery (${duration(new Date(task.updatedAt) - new Date(task.createdAt))}).`
        : `Failed after ${task.processed} of ${task.total}: ${data.error || 'unknown error'}`;
      box.append(h('div', { class: task.status === 'finished' ? 'ok' : 'bad' }, summary));
      return;
    }
    if (!box.isConnected) return;
    await new Promise((resolve) => setTimeout(resolve, 1000));
  }
}

/** Recover (resend what failed) or replay-missing (send what was never attempted) over a time window. */
export function repairPanel(appId, endpoints) {
  const endpoint = h('select', {}, endpoints.map((ep) => h('option', { value: ep.id }, ep.uid || ep.id)));
  const since = h('input', { type: 'datetime-local', required: true });
  const until = h('input', { type: 'datetime-local' });
  const progress = h('div', { class: 'task' });
  const start = (name, label) => action(label, async () => {
    if (!endpoint.value) throw new Error('Choose an endpoint.');
    if (!since.value) throw new Error('Choose where the window starts (since).');
    const body = { since: isoOf(since.value) };
    if (until.value) body.until = isoOf(until.value);
    const task = await call(name, { app_id: appId, endpoint_id: endpoint.value }, { body });
    await follow(progress, task.id);
  });
  return h('section', { class: 'card' },
    h('h2', {}, 'Repair'),
    h('p', { class: 'muted' }, 'Recover resends the deliveries that failed in the window; replay missing sends the messages the endpoint never got. Both run in the background through the endpoint\u2019s caps.'),
    h('div', { class: 'row' },
      endpoints.length > 1 ? h('label', {}, 'Endpoint', endpoint) : null,
      h('label', {}, 'Since', since), h('label', {}, 'Until (default: now)', until),
      start('recover', 'Recover failed'), start('replayMissing', 'Replay missing')),
    progress);
}

export async function deadView(ctx, appId) {
  const status = ctx.query.get('status') || 'dead';
  const endpointId = ctx.query.get('endpoint') || '';
  const endpoints = (await call('listEndpoints', { app_id: appId }, { query: { limit: 250 } })).data;
  const navigate = (s, ep) => {
    const search = new URLSearchParams({ status: s });
    if (ep) search.set('endpoint', ep);
    location.hash = `#/app/${encodeURIComponent(appId)}/failing?${search}`;
  };
  const endpointSelect = h('select', {}, h('option', { value: '' }, 'All endpoints'),
    endpoints.map((ep) => h('option', { value: ep.id, selected: ep.id === endpointId }, ep.uid || ep.id)));
  endpointSelect.addEventListener('change', () => navigate(status, endpointSelect.value));
  const listing = h('section', { class: 'card' });
  ctx.root.append(
    h('h1', {}, 'Failing deliveries ', h('code', { class: 'muted' }, appId)),
    h('section', { class: 'card row' }, statusSelect(status, (s) => navigate(s, endpointId)), h('label', {}, 'Endpoint', endpointSelect)),
    listing,
    endpoints.length ? repairPanel(appId, endpoints) : null,
  );
  await deliveryListing(listing, appId, endpointId, status);
}
