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

/** Append children (nodes, text, nested arrays of them; null, undefined and false are skipped). */
export function append(el, ...children) {
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

/** The hash of a dashboard page: `parts` are path segments, each encoded, so data cannot change the target. */
export function hrefOf(parts, query) {
  let href = '#/' + parts.map((p) => encodeURIComponent(p)).join('/');
  if (query) {
    const search = new URLSearchParams(Object.entries(query).filter(([, v]) => v != null && v !== ''));
    if (search.toString()) href += '?' + search.toString();
  }
  return href;
}

/** A link inside the dashboard (see `hrefOf`). */
export function link(text, parts, query) {
  return h('a', { href: hrefOf(parts, query) }, text);
}

/**
 * A table with a header row. `add(rows)` appends rows (arrays of cells: node, text, or {cell, class});
 * the `empty` line shows only while the table has no row at all, so it never sits beside data.
 */
export function table(headers, rows = [], empty = 'Nothing to show.') {
  const head = h('tr', {}, headers.map((t) => (typeof t === 'string' ? h('th', {}, t) : h('th', { class: t.class }, t.text))));
  const body = h('tbody');
  const placeholder = h('tr', { class: 'empty' }, h('td', { colspan: headers.length, class: 'muted' }, empty));
  const add = (more) => {
    placeholder.remove();
    for (const row of more) {
      body.append(h('tr', {}, row.map((c) => (c && c.cell !== undefined ? h('td', { class: c.class }, c.cell) : h('td', {}, c)))));
    }
    if (!body.children.length && empty) body.append(placeholder);
  };
  const clear = () => { body.replaceChildren(); };
  add(rows);
  return { element: h('div', { class: 'table-wrap' }, h('table', {}, h('thead', {}, head), body)), body, add, clear };
}

/** A coloured badge. */
export function badge(text, tone) {
  return h('span', { class: `badge ${tone || 'idle'}` }, text);
}

/** A labelled figure. */
export function stat(label, value, tone) {
  return h('div', { class: 'stat' }, h('div', { class: `value ${tone || ''}` }, value), h('div', { class: 'label' }, label));
}

/** An RFC 3339 time in UTC to the second, as the API and the CLI write it (`2026-12-01T14:03:07Z`). */
export function utc(iso) {
  const date = new Date(iso);
  return Number.isNaN(date.getTime()) ? String(iso) : date.toISOString().replace(/\.\d{3}Z$/, 'Z');
}

/** A time as UTC RFC 3339, with the local time on hover. */
export function time(iso) {
  if (!iso) return h('span', { class: 'muted' }, '—');
  const date = new Date(iso);
  if (Number.isNaN(date.getTime())) return h('span', {}, String(iso));
  return h('time', { datetime: date.toISOString(), title: `${date.toLocaleString()} (local time)` }, utc(iso));
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

/** How long ago (or, negative, how far ahead) an RFC 3339 time is, with the exact time on hover. */
export function age(iso) {
  if (!iso) return h('span', { class: 'muted' }, '—');
  const ms = Date.now() - new Date(iso).getTime();
  return h('span', { title: utc(iso) }, ms >= 0 ? `${duration(ms)} ago` : `in ${duration(-ms)}`);
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

/** A `datetime-local` input's value (UTC, see `localOf`) as RFC 3339, or '' when empty. */
export function isoOf(value) {
  if (!value) return '';
  const date = new Date(`${value}Z`);
  return Number.isNaN(date.getTime()) ? '' : utc(date.toISOString());
}

/** RFC 3339 as a `datetime-local` value. The dashboard speaks UTC everywhere, so its inputs are UTC too. */
export function localOf(iso) {
  if (!iso) return '';
  const date = new Date(iso);
  if (Number.isNaN(date.getTime())) return '';
  return date.toISOString().slice(0, 16);
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

/**
 * A "Load more" button under a cursor listing: `load(iterator)` renders one page and resolves to it. The
 * first page loads at once; the button hides when the listing is done. Returns the first load.
 */
export function pager(container, load, label = 'Load more') {
  const more = h('button', { type: 'button', class: 'secondary more', hidden: true }, label);
  let iterator = null;
  const next = async () => {
    more.disabled = true;
    try {
      const page = await load(iterator);
      iterator = page.iterator;
      more.hidden = page.done || !page.iterator;
    } catch (error) {
      flash(describe(error), 'error');
    } finally {
      more.disabled = false;
    }
  };
  more.addEventListener('click', next);
  container.append(more);
  return next();
}

/** The page size of a view's listings: `?limit=` in the page's address (1–250), else `fallback`. */
export function pageSize(query, fallback) {
  const wanted = Number(query.get('limit'));
  return Number.isInteger(wanted) && wanted >= 1 && wanted <= 250 ? wanted : fallback;
}

/** A text (or node) that arrives later: shows `placeholder` until `promise` resolves. */
export function later(promise, placeholder = '…') {
  const span = h('span', {}, placeholder);
  promise.then((value) => replace(span, value), () => {});
  return span;
}

/** The uid (or id) of an object as its title, with the id beside it when both exist. */
export function named(object) {
  if (!object) return '—';
  if (object.uid && object.uid !== object.id) return [object.uid, ' ', h('code', { class: 'muted' }, object.id)];
  return h('code', {}, object.id);
}
