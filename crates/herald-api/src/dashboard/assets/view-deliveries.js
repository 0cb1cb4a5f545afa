// A message's delivery timeline (every attempt, and why each delivery stands where it does), failing
// deliveries (dead letters) with their last outcome, and the bulk repairs (recover, replay-missing) with
// their progress.
import { call, labels, session } from './api.js';
import {
  action, age, append, badge, describe, duration, flash, h, hrefOf, isoOf, later, link, named, pageSize, pager, replace, stat,
  table, time,
} from './dom.js';

const STATUS_TONE = { delivered: 'ok', pending: 'warn', failed: 'bad', dead: 'bad', cancelled: 'idle' };

/** Pages of a message's attempts read before the timeline offers a button for older ones. */
const AUTO_PAGES = 50;

/** `1 attempt`, `2 attempts`. */
export function attemptsText(n) {
  return `${n} attempt${n === 1 ? '' : 's'}`;
}

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

/** Resend one message to one endpoint (a manual attempt); nothing for a read-only token. */
function resendButton(appId, msgId, endpointId, done) {
  if (session.readOnly) return null;
  return action('Resend', async () => {
    await call('resend', { app_id: appId, msg_id: msgId, endpoint_id: endpointId });
    flash('Resend queued.');
    if (done) await done();
  }, 'secondary');
}

/**
 * Why a delivery stands where it does, in a sentence: the answer to "did it arrive, and if not, why?",
 * including the deliveries that ended (or wait) without any attempt.
 */
export function reason(destination, attempts, endpoint) {
  const last = attempts[attempts.length - 1];
  const lastText = last ? `${last.responseStatusCode ? `${last.responseStatusCode} ` : ''}${last.outcome}` : '';
  const health = (endpoint && endpoint.health) || {};
  const paused = endpoint ? endpoint.disabled : destination.disabled;
  const waiting = () => {
    if (paused) return ['The endpoint is paused', endpoint && endpoint.disabledReason ? ` (${endpoint.disabledReason})` : '', ': it waits until the endpoint is resumed.'];
    if (health.state === 'open') return ['The endpoint\u2019s circuit breaker is open after repeated failures; the next probe is ', age(health.nextProbeAt), '.'];
    if (health.heldUntil) return ['The endpoint asked to be left alone (Retry-After) until ', time(health.heldUntil), '.'];
    return destination.nextAttempt ? ['Next attempt ', age(destination.nextAttempt), '.'] : 'It is queued for sending.';
  };
  switch (destination.deliveryStatus) {
    case 'delivered':
      return `Delivered${last ? `: the endpoint answered ${lastText} on attempt ${attempts.length}` : ''}.`;
    case 'pending':
      return attempts.length
        ? [`Retrying: attempt ${attempts.length} failed (${lastText}). `, waiting()]
        : ['Not sent yet. ', waiting()];
    case 'failed':
      return `Failed for good: the endpoint answered ${lastText || 'an error'}, which is not retried (a client error). Fix the receiver, then resend.`;
    case 'dead':
      return attempts.length
        ? [`Dead: ${attemptsText(attempts.length)} failed, the last with ${lastText}, and no more will be made: the retry schedule ran out, `,
          'or the delivery\u2019s window ended while the endpoint was paused or its breaker open. Resend it, or recover the endpoint\u2019s window once it works.']
        : ['Dead without an attempt: its delivery window ended while it waited, because the endpoint was paused or its circuit breaker open',
          paused ? ' (the endpoint is paused now)' : health.state === 'open' ? ' (the breaker is open now)' : '', '. Resend it, or recover the window.'];
    case 'cancelled':
      return attempts.length
        ? `Cancelled by an operator after ${attemptsText(attempts.length)}; it will not be sent again unless resent.`
        : 'Cancelled by an operator before any attempt; it will not be sent unless resent.';
    default:
      return '';
  }
}

/** Read every attempt of a message (newest first from the API), up to AUTO_PAGES pages. */
async function messageAttempts(appId, msgId, limit) {
  const all = [];
  let iterator = null;
  for (let page = 0; page < AUTO_PAGES; page += 1) {
    const found = await call('messageAttempts', { app_id: appId, msg_id: msgId }, { query: { limit, iterator } });
    all.push(...found.data);
    if (found.done || !found.iterator) return { attempts: all, complete: true };
    iterator = found.iterator;
  }
  return { attempts: all, complete: false };
}

/** One destination's card: its status, the reason, and its attempts oldest first. */
function destinationCard(appId, message, destination, attempts, complete, endpoint, render) {
  const created = new Date(message.timestamp).getTime();
  const list = table(['#', 'Sent (UTC)', { text: 'After creation', class: 'num' }, 'Outcome',
    { text: 'Latency', class: 'num' }, 'Trigger', 'Response'], [], 'No attempt.');
  const offset = complete ? 0 : Math.max(destination ? destination.attempts - attempts.length : 0, 0);
  list.add(attempts.map((a, i) => [
    String(offset + i + 1), time(a.timestamp),
    { cell: duration(new Date(a.timestamp).getTime() - created), class: 'num' },
    outcome(a), { cell: `${a.responseDurationMs} ms`, class: 'num' }, a.trigger, responseBody(a.response),
  ]));
  if (!destination) {
    const endpointId = attempts[0].endpointId;
    return h('section', { class: 'card destination' },
      h('div', { class: 'row' }, h('h2', {}, h('code', {}, endpointId)), badge('endpoint deleted', 'idle')),
      h('p', { class: 'why' }, 'This endpoint was deleted; its deliveries went with it. The attempts it had:'),
      list.element);
  }
  // The delivery's own counter starts again at a resend; the rows are every attempt still kept.
  const counted = complete && destination.attempts > attempts.length
    ? `${attemptsText(attempts.length)} (older ones were removed by retention)`
    : `${complete ? '' : 'the latest '}${attemptsText(attempts.length)}`;
  return h('section', { class: 'card destination', 'data-endpoint': destination.id },
    h('div', { class: 'row' },
      h('h2', {}, link(destination.uid || destination.id, ['app', appId, 'endpoint', destination.id])),
      deliveryBadge(destination.deliveryStatus),
      h('span', { class: 'muted' }, counted),
      h('span', { class: 'grow' }),
      resendButton(appId, message.id, destination.id, render)),
    h('div', { class: 'url muted small' }, destination.url),
    h('p', { class: `why ${STATUS_TONE[destination.deliveryStatus] || ''}` }, reason(destination, attempts, endpoint)),
    attempts.length ? list.element : null,
    complete ? null : h('p', { class: 'muted' }, 'Older attempts are not shown: there are too many to read at once.'));
}

export async function timelineView(ctx, appId, msgId) {
  const app = await call('getApp', { app_id: appId });
  const message = await call('getMessage', { app_id: app.id, msg_id: msgId });
  const content = h('div');
  append(ctx.root, 
    h('h1', {}, 'Message ', h('code', {}, message.id)),
    h('section', { class: 'card' },
      h('div', { class: 'grid' },
        stat('Application', named(app)), stat('Event type', message.eventType),
        stat('Event id', message.eventId || '—'), stat('Created (UTC)', time(message.timestamp)),
        stat('Channels', (message.channels || []).join(', ') || '—')),
      h('details', {}, h('summary', {}, 'Payload'), h('pre', { class: 'body' },
        message.payload == null ? '(expunged)' : JSON.stringify(message.payload, null, 2)))),
    content,
  );
  const render = async () => {
    const [destinations, found] = await Promise.all([
      call('messageDestinations', { app_id: app.id, msg_id: message.id }, { query: { limit: 250 } }),
      messageAttempts(app.id, message.id, pageSize(ctx.query, 100)),
    ]);
    const byEndpoint = new Map();
    for (const attempt of found.attempts.slice().reverse()) {
      if (!byEndpoint.has(attempt.endpointId)) byEndpoint.set(attempt.endpointId, []);
      byEndpoint.get(attempt.endpointId).push(attempt);
    }
    // The live state (pause, breaker) explains deliveries that wait or ended without an attempt.
    const endpoints = new Map(await Promise.all(destinations.data
      .filter((d) => d.deliveryStatus === 'pending' || (d.deliveryStatus === 'dead' && !d.attempts))
      .map((d) => call('getEndpoint', { app_id: app.id, endpoint_id: d.id }).then((e) => [d.id, e], () => [d.id, null]))));
    const cards = destinations.data.map((d) =>
      destinationCard(app.id, message, d, byEndpoint.get(d.id) || [], found.complete, endpoints.get(d.id), render));
    const known = new Set(destinations.data.map((d) => d.id));
    for (const [endpointId, attempts] of byEndpoint) {
      if (!known.has(endpointId)) cards.push(destinationCard(app.id, message, null, attempts, found.complete, null, render));
    }
    replace(content, cards.length ? cards : h('section', { class: 'card' }, h('p', { class: 'why' },
      `No endpoint received this message: none was subscribed to event type ${message.eventType}`,
      (message.channels || []).length ? ` on channels ${message.channels.join(', ')}` : '',
      ' when it was published, or the endpoints it went to were deleted since.')));
  };
  await render();
}

/** The failing-deliveries table: each delivery with its last attempt; rows are added by `add(page)`. */
export function deliveryTable(appId, showEndpoint, refresh) {
  const names = labels();
  const headers = ['Message', 'Event type', ...(showEndpoint ? ['Endpoint'] : []), 'Status',
    { text: 'Attempts', class: 'num' }, 'Last outcome', 'Last response', ...(session.readOnly ? [] : [''])];
  const list = table(headers, [], 'No deliveries with this status.');
  const add = (page) => list.add(page.data.map((d) => [
    h('div', {}, link(h('code', {}, d.id), ['app', appId, 'msg', d.id]), h('div', { class: 'muted small' }, time(d.timestamp))),
    d.eventType,
    ...(showEndpoint ? [link(later(names.endpoint(appId, d.endpointId), d.endpointId), ['app', appId, 'endpoint', d.endpointId])] : []),
    deliveryBadge(d.deliveryStatus),
    { cell: String(d.attempts), class: 'num' },
    d.lastAttempt ? h('div', {}, outcome(d.lastAttempt), h('div', { class: 'muted small' }, age(d.lastAttempt.timestamp))) : h('span', { class: 'muted' }, 'no attempt'),
    d.lastAttempt ? responseBody(d.lastAttempt.response) : '—',
    ...(session.readOnly ? [] : [d.deliveryStatus === 'pending' ? '' : resendButton(appId, d.id, d.endpointId, refresh)]),
  ]));
  return { element: list.element, add, names };
}

/** Deliveries of an app (or one endpoint) with a given status, paged; returns a function that reloads it. */
export async function deliveryListing(container, appId, endpointId, status, limit, endpoints = []) {
  const reload = async () => {
    const listing = deliveryTable(appId, !endpointId, reload);
    for (const endpoint of endpoints) listing.names.know(endpoint);
    replace(container, listing.element);
    await pager(container, async (iterator) => {
      const query = { limit, iterator, with_content: 'false', deliveryStatus: status };
      const page = endpointId
        ? await call('endpointDeliveries', { app_id: appId, endpoint_id: endpointId }, { query })
        : await call('appDeliveries', { app_id: appId }, { query });
      listing.add(page);
      return page;
    });
  };
  await reload();
  return reload;
}

/** A status filter for the failing-deliveries listings. */
export function statusSelect(value, onChange) {
  const select = h('select', { name: 'status' }, ['dead', 'failed', 'pending', 'delivered', 'cancelled']
    .map((s) => h('option', { value: s, selected: s === value }, s)));
  select.addEventListener('change', () => onChange(select.value));
  return h('label', {}, 'Status', select);
}

/** Poll a background task into a progress bar until it ends, show its summary, then call `done`. */
async function follow(box, taskId, done) {
  const bar = h('progress', { max: 1, value: 0 });
  const text = h('div', { class: 'muted' }, 'starting…');
  replace(box, h('div', {}, 'Task ', h('code', {}, taskId)), bar, text);
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
      box.append(h('div', { class: `task-result ${task.status === 'finished' ? 'ok' : 'bad'}` }, summary));
      if (done) await done();
      return;
    }
    if (!box.isConnected) return;
    await new Promise((resolve) => setTimeout(resolve, 500));
  }
}

/**
 * Recover (resend what failed) or replay-missing (send what was never attempted) over a time window, then
 * `done()` (the listings beside it read again); nothing for a read-only token.
 */
export function repairPanel(appId, endpoints, done) {
  if (session.readOnly) return null;
  const endpoint = h('select', { name: 'endpoint' }, endpoints.map((ep) => h('option', { value: ep.id }, ep.uid || ep.id)));
  const since = h('input', { type: 'datetime-local', name: 'since', required: true });
  const until = h('input', { type: 'datetime-local', name: 'until' });
  const progress = h('div', { class: 'task' });
  const start = (name, label) => action(label, async () => {
    if (!endpoint.value) throw new Error('Choose an endpoint.');
    if (!since.value) throw new Error('Choose where the window starts (since).');
    const body = { since: isoOf(since.value) };
    if (until.value) body.until = isoOf(until.value);
    const task = await call(name, { app_id: appId, endpoint_id: endpoint.value }, { body });
    await follow(progress, task.id, done);
  });
  return h('section', { class: 'card' },
    h('h2', {}, 'Repair'),
    h('p', { class: 'muted' }, 'Recover resends the deliveries that failed in the window; replay missing sends the messages the endpoint never got. Both run in the background through the endpoint\u2019s caps.'),
    h('div', { class: 'row' },
      endpoints.length > 1 ? h('label', {}, 'Endpoint', endpoint) : null,
      h('label', {}, 'Since (UTC)', since), h('label', {}, 'Until (UTC, default: now)', until),
      start('recover', 'Recover failed'), start('replayMissing', 'Replay missing')),
    progress);
}

export async function deadView(ctx, appId) {
  const app = await call('getApp', { app_id: appId });
  const status = ctx.query.get('status') || 'dead';
  const endpointId = ctx.query.get('endpoint') || '';
  const endpoints = (await call('listEndpoints', { app_id: app.id }, { query: { limit: 250, order: 'ascending' } })).data;
  const navigate = (s, ep) => { location.hash = hrefOf(['app', app.id, 'failing'], { status: s, endpoint: ep }); };
  const endpointSelect = h('select', { name: 'endpoint' }, h('option', { value: '' }, 'All endpoints'),
    endpoints.map((ep) => h('option', { value: ep.id, selected: ep.id === endpointId }, ep.uid || ep.id)));
  endpointSelect.addEventListener('change', () => navigate(status, endpointSelect.value));
  const listing = h('section', { class: 'card' });
  let reload = async () => {};
  append(ctx.root, 
    h('h1', {}, 'Failing deliveries · ', app.name, ' ', h('span', { class: 'muted' }, named(app))),
    h('section', { class: 'card row' }, statusSelect(status, (s) => navigate(s, endpointId)), h('label', {}, 'Endpoint', endpointSelect)),
    listing,
    endpoints.length ? repairPanel(app.id, endpoints, () => reload()) : null,
  );
  reload = await deliveryListing(listing, app.id, endpointId, status, pageSize(ctx.query, 50), endpoints);
}
