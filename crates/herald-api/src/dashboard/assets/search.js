// The search box: a message id or eventId goes straight to that message's timeline; anything else is taken
// as an event type and lists that type's messages in the chosen window.
import { ApiError, call } from './api.js';
import { flash, h, hrefOf, utc } from './dom.js';

/** The windows an event-type search covers, in hours. */
const WINDOWS = [[1, 'last hour'], [24, 'last 24 hours'], [168, 'last 7 days'], [720, 'last 30 days']];

/** The search form; `appId` is the application in view ('' on the admin's home: then it asks for one). */
export function searchForm(appId) {
  const query = h('input', {
    type: 'search', name: 'q', required: true, autocomplete: 'off', 'aria-label': 'Message id, eventId or event type',
    placeholder: 'msg_…, eventId or event type',
  });
  const app = appId ? null : h('input', {
    type: 'text', name: 'app', required: true, autocomplete: 'off', 'aria-label': 'Application id or uid',
    placeholder: 'application id or uid', class: 'narrow-input',
  });
  const window = h('select', { name: 'window', 'aria-label': 'Window for an event type' },
    WINDOWS.map(([hours, label]) => h('option', { value: hours, selected: hours === 24 }, label)));
  const form = h('form', { class: 'search', role: 'search' }, app, query, window, h('button', { type: 'submit' }, 'Find'));
  form.addEventListener('submit', async (event) => {
    event.preventDefault();
    const target = appId || app.value.trim();
    const text = query.value.trim();
    if (!target || !text) return;
    try {
      location.hash = await destination(target, text, Number(window.value));
    } catch (error) {
      flash(error.message, 'error');
    }
  });
  return form;
}

/** Where a search leads: the message's timeline, or the event type's messages in the window. */
async function destination(appId, text, hours) {
  try {
    // `GET …/msg/{msg_id}` takes the message id or its eventId.
    const message = await call('getMessage', { app_id: appId, msg_id: text }, { query: { with_content: 'false' } });
    return hrefOf(['app', appId, 'msg', message.id]);
  } catch (error) {
    if (!(error instanceof ApiError) || error.status !== 404) throw error;
    if (error.message.includes('application')) throw new Error(`No application ${appId}.`);
  }
  if (/^msg_[0-9A-Za-z]{22}$/.test(text)) throw new Error(`No message ${text} in this application.`);
  const since = utc(new Date(Date.now() - hours * 3600e3).toISOString());
  return hrefOf(['app', appId, 'messages'], { eventTypes: text, since, searched: text });
}
