// DOM helpers. Data from the API (URLs, response bodies, event types…) is attacker-controlled: it only ever
// becomes text nodes or attribute values here, never markup.

/** Build an element: `attrs` are attributes (`on…` functions become listeners), children are nodes or text. */
export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value == null || value === false) continue;
    if (key.startsWith('on') && typeof value === 'function') el.addEventListener(key.slice(2), value);
    else if (key === 'class') el.className = value;
    else el.setAttribute(key, value === true ? '' : String(value));
  }
  append(el, children);
  return el;
}

/** Append children (nested arrays, nodes, text; null and false are skipped). */
export function append(el, children) {
  for (const child of children.flat(Infinity)) {
    if (child == null || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

/** Replace an element's content. */
export function replace(el, ...children) {
  el.replaceChildren();
  return append(el, children);
}

/** A link inside the dashboard: `parts` are path segments, each encoded, so data cannot change the target. */
export function link(text, parts, query) {
  let href = '#/' + parts.map((p) => encodeURIComponent(p)).join('/');
  if (query) {
    const search = new URLSearchParams(Object.entries(query).filter(([, v]) => v != null && v !== ''));
    if (search.toString()) href += '?' + search.toString();
  }
  return h('a', { href }, text);
}

/** A table with a header row; `rows` are arrays of cells (node, text, or {cell, class}). */
export function table(headers, rows, empty = 'Nothing to show.') {
  const head = h('tr', {}, headers.map((t) => (typeof t === 'string' ? h('th', {}, t) : h('th', { class: t.class }, t.text))));
  const body = h('tbody');
  fillRows(body, rows, headers.length, empty);
  return { element: h('div', { class: 'table-wrap' }, h('table', {}, h('thead', {}, head), body)), body };
}

/** Append rows to a table body; shows `empty` when there are none at all. */
export function fillRows(body, rows, width, empty) {
  if (!rows.length && !body.children.length && empty) {
    body.append(h('tr', {}, h('td', { colspan: width, class: 'muted' }, empty)));
  }
  for (const row of rows) {
    body.append(h('tr', {}, row.map((c) => (c && c.cell !== undefined ? h('td', { class: c.class }, c.cell) : h('td', {}, c)))));
  }
}

/** A coloured badge. */
export function badge(text, tone) {
  return h('span', { class: `badge ${tone || 'idle'}` }, text);
}

/** A labelled figure. */
export function stat(label, value, tone) {
  return h('div', { class: 'stat' }, h('div', { class: `value ${tone || ''}` }, value), h('div', { class: 'label' }, label));
}

/** Local date and time of an RFC 3339 string. */
export function time(iso) {
  if (!iso) return '—';
  const date = new Date(iso);
  return Number.isNaN(date.getTime()) ? String(iso) : date.toLocaleString();
}

/** A duration in ms as `1h 2m`, `3m 4s`, `5.6 s` or `78 ms`. */
export function duration(ms) {
  if (ms == null || Number.isNaN(ms)) return '—';
  const sign = ms < 0 ? '-' : '';
  ms = Math.abs(ms);
  if (ms < 1000) return `${sign}${Math.round(ms)} ms`;
  const s = ms / 1000;
  if (s < 60) return `${sign}${s.toFixed(1)} s`;
  const m = Math.floor(s / 60);
  if (m < 60) return `${sign}${m}m ${Math.floor(s % 60)}s`;
  const hours = Math.floor(m / 60);
  if (hours < 48) return `${sign}${hours}h ${m % 60}m`;
  return `${sign}${Math.floor(hours / 24)}d ${hours % 24}h`;
}

/** How long ago (or, negative, how far ahead) an RFC 3339 time is. */
export function age(iso) {
  if (!iso) return '—';
  const ms = Date.now() - new Date(iso).getTime();
  return ms >= 0 ? `${duration(ms)} ago` : `in ${duration(-ms)}`;
}

/** Show a message above the page (errors stay until the next one; info fades). */
export function flash(message, kind = 'info') {
  const box = document.getElementById('flash');
  replace(box, h('div', { class: `flash ${kind}` }, message));
  if (kind === 'info') setTimeout(() => { if (box.textContent === message) box.replaceChildren(); }, 4000);
}

/** The text to show for a failed call. */
export function describe(error) {
  if (error && error.status === 403) return `Not allowed with this token: ${error.message}`;
  if (error && error.status === 404) return `Not found: ${error.message}`;
  return error && error.message ? error.message : String(error);
}

/** A `datetime-local` input's value as RFC 3339 (UTC), or '' when empty. */
export function isoOf(local) {
  if (!local) return '';
  const date = new Date(local);
  return Number.isNaN(date.getTime()) ? '' : date.toISOString();
}

/** RFC 3339 as a `datetime-local` value, in local time. */
export function localOf(iso) {
  if (!iso) return '';
  const date = new Date(iso);
  if (Number.isNaN(date.getTime())) return '';
  const pad = (n) => String(n).padStart(2, '0');
  return `${date.getFullYear()}-${pad(date.getMonth() + 1)}-${pad(date.getDate())}T${pad(date.getHours())}:${pad(date.getMinutes())}`;
}

/** A button that disables itself while its async action runs, and reports a failure. */
export function action(label, run, cls) {
  const button = h('button', { type: 'button', class: cls });
  button.textContent = label;
  button.addEventListener('click', async () => {
    button.disabled = true;
    try { await run(); } catch (error) { flash(describe(error), 'error'); } finally { button.disabled = false; }
  });
  return button;
}
