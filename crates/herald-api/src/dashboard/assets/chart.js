// Plain SVG charts (no library, no inline style: colours come from style.css classes): attempts per time
// bucket by outcome, and their latency.
import { h, utc } from './dom.js';

const SVG = 'http://www.w3.org/2000/svg';
const WIDTH = 720;
const HEIGHT = 170;
const PAD = { left: 44, right: 8, top: 10, bottom: 22 };

function svg(tag, attrs = {}, ...children) {
  const el = document.createElementNS(SVG, tag);
  for (const [key, value] of Object.entries(attrs)) if (value != null) el.setAttribute(key, String(value));
  for (const child of children) if (child) el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  return el;
}

/** A round upper bound for an axis of four steps, each 1, 2, 2.5 or 5 times a power of ten (at least 1). */
function niceMax(value) {
  const step = Math.max(value / 4, 1);
  const power = 10 ** Math.floor(Math.log10(step));
  return 4 * [1, 2, 2.5, 5, 10].map((m) => m * power).find((m) => m >= step - 1e-9);
}

/** The frame shared by both charts: horizontal grid lines with labels, and time labels under the x axis. */
function frame(max, format, starts) {
  const plotHeight = HEIGHT - PAD.top - PAD.bottom;
  const root = svg('svg', { viewBox: `0 0 ${WIDTH} ${HEIGHT}`, class: 'chart', role: 'img' });
  for (let i = 0; i <= 4; i += 1) {
    const y = PAD.top + plotHeight - (plotHeight * i) / 4;
    root.append(svg('line', { x1: PAD.left, x2: WIDTH - PAD.right, y1: y, y2: y, class: 'grid-line' }));
    root.append(svg('text', { x: PAD.left - 6, y: y + 4, class: 'axis', 'text-anchor': 'end' }, format((max * i) / 4)));
  }
  const width = (WIDTH - PAD.left - PAD.right) / Math.max(starts.length, 1);
  const every = Math.max(1, Math.ceil(starts.length / 6));
  starts.forEach((start, i) => {
    if (i % every) return;
    const label = utc(start.toISOString());
    const text = starts.length > 31 || (starts[1] && starts[1] - starts[0] < 86400e3) ? label.slice(11, 16) : label.slice(5, 10);
    root.append(svg('text', { x: PAD.left + i * width + 2, y: HEIGHT - 6, class: 'axis' }, text));
  });
  return { root, plotHeight, width };
}

/** The start of each bucket of an attempt-statistics answer. */
export function bucketStarts(stats) {
  const count = Math.max((stats.data.successCount || []).length, (stats.data.failureCount || []).length);
  const step = stats.period === 'OneDay' ? 86400e3 : 300e3;
  const first = new Date(stats.startDate).getTime();
  return Array.from({ length: count }, (_, i) => new Date(first + i * step));
}

/** Stacked bars: successful attempts (bottom) and failed ones (top) per bucket. */
export function outcomeChart(stats) {
  const starts = bucketStarts(stats);
  const ok = stats.data.successCount || [];
  const failed = stats.data.failureCount || [];
  const max = niceMax(Math.max(0, ...starts.map((_, i) => (ok[i] || 0) + (failed[i] || 0))));
  const { root, plotHeight, width } = frame(max, (v) => String(Math.round(v)), starts);
  starts.forEach((start, i) => {
    const x = PAD.left + i * width + Math.min(1, width * 0.1);
    const w = Math.max(width - Math.min(2, width * 0.2), 0.5);
    let y = PAD.top + plotHeight;
    for (const [n, cls, what] of [[ok[i] || 0, 'bar-ok', 'succeeded'], [failed[i] || 0, 'bar-bad', 'failed']]) {
      if (!n) continue;
      const height = (plotHeight * n) / max;
      y -= height;
      root.append(svg('rect', { x, y, width: w, height, class: cls }, svg('title', {}, `${utc(start.toISOString())}: ${n} ${what}`)));
    }
  });
  return h('figure', { class: 'chart-box' }, root,
    h('figcaption', {}, h('span', { class: 'key ok-key' }), 'succeeded ', h('span', { class: 'key bad-key' }), 'failed · attempts per ',
      stats.period === 'OneDay' ? 'day' : '5 minutes'));
}

/** Lines: average and slowest attempt latency per bucket (gaps where there was no attempt). */
export function latencyChart(stats) {
  const starts = bucketStarts(stats);
  const average = stats.data.averageDurationMs || [];
  const slowest = stats.data.maxDurationMs || [];
  const max = niceMax(Math.max(0, ...slowest.filter((v) => v != null), ...average.filter((v) => v != null)));
  const { root, plotHeight, width } = frame(max, (v) => (v >= 1000 ? `${(v / 1000).toFixed(1)}s` : `${Math.round(v)}ms`), starts);
  for (const [values, cls, what] of [[slowest, 'line-max', 'slowest'], [average, 'line-avg', 'average']]) {
    let path = '';
    let open = false;
    values.forEach((v, i) => {
      if (v == null) { open = false; return; }
      const x = PAD.left + i * width + width / 2;
      const y = PAD.top + plotHeight - (plotHeight * v) / max;
      path += `${open ? 'L' : 'M'}${x.toFixed(1)},${y.toFixed(1)} `;
      open = true;
      root.append(svg('circle', { cx: x, cy: y, r: 2.5, class: cls }, svg('title', {}, `${utc(starts[i].toISOString())}: ${what} ${v} ms`)));
    });
    if (path) root.append(svg('path', { d: path.trim(), class: cls }));
  }
  return h('figure', { class: 'chart-box' }, root,
    h('figcaption', {}, h('span', { class: 'key avg-key' }), 'average ', h('span', { class: 'key max-key' }), 'slowest · response time'));
}
