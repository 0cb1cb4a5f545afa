// Drives Herald's dashboard in Debian's Chromium (never a downloaded browser) with playwright-core.
// Started by crates/herald/tests/browser.rs, which runs a seeded `herald serve` and passes what it seeded
// in HERALD_BROWSER_SEED (JSON). Every view is opened and asserted on; any console error or uncaught
// exception fails the run; a screenshot of every view goes to the seed's `screenshots` directory.
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { chromium } from 'playwright-core';

const seed = JSON.parse(process.env.HERALD_BROWSER_SEED || '{}');
const { app, endpoints, messages } = seed;
const TIMEOUT = 15000;

const profile = mkdtempSync(join(tmpdir(), 'herald-chromium-'));
const context = await chromium.launchPersistentContext(profile, {
  executablePath: seed.chromium || '/usr/bin/chromium',
  headless: true,
  viewport: { width: 1280, height: 900 },
  args: ['--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run', '--disable-background-networking',
    '--disable-component-update', '--disable-sync'],
});
const page = context.pages()[0] || await context.newPage();
page.setDefaultTimeout(TIMEOUT);

// Any console error or uncaught exception fails the run, except a failed request a step expects (the
// browser logs every 4xx answer as a console error).
const problems = [];
let expectedFailures = [];
page.on('pageerror', (error) => problems.push(`uncaught exception: ${error.message}`));
page.on('console', (message) => {
  if (message.type() !== 'error') return;
  const where = message.location().url || '';
  if (message.text().startsWith('Failed to load resource') && expectedFailures.some((part) => where.includes(part))) return;
  problems.push(`console error: ${message.text()} (${where})`);
});
page.on('dialog', (dialog) => dialog.accept());

let shots = 0;
async function shot(name) {
  shots += 1;
  await page.screenshot({ path: join(seed.screenshots, `${String(shots).padStart(2, '0')}-${name}.png`), fullPage: true });
}

function check(condition, message) {
  if (!condition) throw new Error(message);
}

async function step(name, run, { failing = [], flashes = false } = {}) {
  const started = Date.now();
  expectedFailures = failing;
  try {
    await run();
  } catch (error) {
    await page.screenshot({ path: join(seed.screenshots, `failed-${name.replace(/\W+/g, '-')}.png`), fullPage: true }).catch(() => {});
    throw new Error(`step "${name}": ${error.message}`);
  } finally {
    expectedFailures = [];
  }
  check(!problems.length, `step "${name}": ${problems.join('; ')}`);
  // A view that failed shows its error above the page: unexpected there too.
  const flashed = await page.locator('#flash .flash.error').allTextContents();
  check(flashes || !flashed.length, `step "${name}": the page shows the error ${flashed.join('; ')}`);
  // Nothing a script failed to fill in: no null, undefined, NaN or [object Object] on the page.
  const shown = await page.locator('body').innerText();
  const junk = shown.match(/\b(null|undefined|NaN)\b|\[object Object\]/);
  check(!junk, `step "${name}": the page shows "${junk && junk[0]}"`);
  // The wall-clock time too: a failure is read beside the server's attempt timestamps.
  console.log(`ok  ${name} (${Date.now() - started} ms, done ${new Date().toISOString()})`);
}

/** Show a dashboard page by its hash, as a bookmark would. */
async function open(hash) {
  await page.evaluate((target) => { location.hash = target; }, hash);
}

const main = page.locator('main');
const heading = (text) => page.locator('main h1', { hasText: text });
/** The card of one destination on a timeline. */
const card = (endpointId) => page.locator(`section.destination[data-endpoint="${endpointId}"]`);
/** The row of an endpoint in a table, by its uid. */
const row = (text) => main.locator('tbody tr', { hasText: text });

/**
 * Poll until `probe` resolves truthy (re-opening the page in `again` between tries). A probe may set
 * `seen.last` to what it found, which a timeout reports: a failure on a loaded CI machine must say what the
 * page showed, not only what it did not.
 */
const seen = { last: '' };
async function eventually(what, probe, again, { within = 20000 } = {}) {
  const deadline = Date.now() + within;
  seen.last = '';
  for (;;) {
    const value = await probe().catch((error) => { seen.last = `the probe failed: ${error.message}`; return false; });
    if (value) return value;
    if (Date.now() > deadline) throw new Error(`timed out after ${within} ms: ${what}${seen.last ? ` (last seen: ${seen.last})` : ''}`);
    await page.waitForTimeout(300);
    if (again) await again();
  }
}

/** The server's view of one message's delivery to one endpoint (`MessageEndpointOut`), or null. */
async function serverDelivery(msgId, endpointId) {
  const answer = await fetch(`${seed.base}/api/v1/app/${app.id}/msg/${msgId}/endpoint?limit=250`, {
    headers: { Authorization: `Bearer ${seed.adminToken}` },
  });
  if (!answer.ok) return null;
  const { data } = await answer.json();
  return data.find((d) => d.id === endpointId) || null;
}

async function logIn(token) {
  await page.fill('input[name=token]', token);
  await page.click('#login-form button[type=submit]');
}

async function logOut() {
  await page.click('#logout');
  await page.locator('#login-form').waitFor();
}

const appPath = (...parts) => ['#', 'app', app.id, ...parts].join('/');

try {
  await step('the login form is shown and a bad token is refused', async () => {
    await page.goto(`${seed.base}/dashboard/`);
    await page.locator('#login-form').waitFor();
    await shot('login');
    await logIn('not-a-token');
    await page.locator('#flash', { hasText: 'not valid' }).waitFor();
  }, { failing: ['/api/v1/auth/token'], flashes: true });

  await step('admin: the applications, with their uids', async () => {
    await logIn(seed.adminToken);
    await heading('Applications').waitFor();
    await row('Acme Corp').waitFor();
    check(await row('Acme Corp').textContent().then((t) => t.includes('acme') && t.includes(app.id)), 'uid and id of Acme Corp');
    await row('Globex').waitFor();
    check(!(await main.getByText('Nothing to show').count()), 'no empty-table line beside rows');
    await check(await page.locator('#who').textContent() === 'admin token', 'who is logged in');
    await shot('applications');
  });

  await step('an application: every endpoint with its state', async () => {
    await main.getByRole('link', { name: 'Acme Corp' }).click();
    await heading('Acme Corp').waitFor();
    await row('billing-healthy').locator('.badge', { hasText: 'healthy' }).waitFor();
    await row('analytics-paused').locator('.badge', { hasText: 'paused' }).waitFor();
    await row('legacy-gone').locator('.badge', { hasText: 'disabled' }).waitFor();
    const failing = await row('crm-failing').locator('.badge').textContent();
    check(['breaker open', 'probing'].includes(failing), `crm-failing shows ${failing}`);
    check(await main.locator('tbody tr').count() === 5, 'five endpoints');
    await shot('endpoints');
  });

  await step('find a message by eventId, and read why each delivery stands where it does', async () => {
    await page.fill('#search input[name=q]', messages.invoice.eventId);
    await page.click('#search button[type=submit]');
    await heading(messages.invoice.id).waitFor();
    const dead = card(endpoints['warehouse-dead']);
    await dead.locator('.badge', { hasText: 'dead' }).waitFor();
    const why = await dead.locator('p.why').textContent();
    check(why.includes('Dead: 3 attempts failed') && why.includes('500'), `the dead delivery's reason: ${why}`);
    check(await dead.locator('tbody tr').count() === 3, 'three attempt rows for three attempts');
    check((await dead.textContent()).includes('database is down'), 'the response body is there');
    const gone = await card(endpoints['legacy-gone']).locator('p.why').textContent();
    check(gone.includes('Failed for good') && gone.includes('410'), `the 410's reason: ${gone}`);
    const healthy = await card(endpoints['billing-healthy']).locator('p.why').textContent();
    check(healthy.startsWith('Delivered'), `the delivered one: ${healthy}`);
    check(!(await main.getByText('No attempt.').count()), 'no "No attempt." row beside attempts');
    check(page.url().includes(`/msg/${messages.invoice.id}`), 'straight to the timeline');
    await shot('timeline-dead-letter');
  });

  await step('resend the dead delivery; the timeline pages through every attempt', async () => {
    await card(endpoints['warehouse-dead']).getByRole('button', { name: 'Resend' }).click();
    await page.locator('#flash', { hasText: 'Resend queued.' }).waitFor();
    // Two attempts a page: the timeline must read past the first page by itself.
    const paged = `${appPath('msg', messages.invoice.id)}?limit=2`;
    await eventually('the resent delivery failed again and every attempt is listed', async () => {
      const dead = card(endpoints['warehouse-dead']);
      const badges = await dead.locator('.badge').allTextContents();
      const rows = await dead.locator('tbody tr').count();
      const counter = await dead.locator('.row .muted').first().textContent();
      const why = await dead.locator('p.why').textContent();
      // What the server holds, beside what the page shows: the step ends only once both say dead.
      const server = await serverDelivery(messages.invoice.id, endpoints['warehouse-dead']);
      seen.last = `badges ${JSON.stringify(badges)}, ${rows} rows, counter "${counter}", why "${why}"; `
        + `the server: ${JSON.stringify(server)}`;
      return server && server.deliveryStatus === 'dead' && server.attempts === rows - 3
        && badges.includes('dead') && rows > 3 && counter === `${rows} attempts`;
      // The resent delivery meets the breaker its three failures opened: each try waits out a cool-down.
    }, async () => { await open('#/'); await open(paged); await heading(messages.invoice.id).waitFor(); }, { within: 60000 });
    const triggers = await card(endpoints['warehouse-dead']).locator('tbody tr td:nth-child(6)').allTextContents();
    check(triggers.includes('manual'), `a manual attempt among ${triggers}`);
  });

  await step('a paused endpoint and an open breaker explain themselves', async () => {
    await page.fill('#search input[name=q]', messages.order.eventId);
    await page.click('#search button[type=submit]');
    await heading(messages.order.id).waitFor();
    const paused = await card(endpoints['analytics-paused']).locator('p.why').textContent();
    check(paused.includes('Dead without an attempt') && paused.includes('paused now'), `the expired delivery: ${paused}`);
    check(!(await card(endpoints['analytics-paused']).locator('table').count()), 'no attempt table without attempts');
    check((await card(endpoints['analytics-paused']).textContent()).includes('0 attempts'), 'the counter says none');
    const failing = await card(endpoints['crm-failing']).locator('p.why').textContent();
    check(/Retrying|Dead/.test(failing) && failing.includes('503'), `the failing delivery: ${failing}`);
    await shot('timeline-paused-and-failing');
  });

  await step('search by event type lists that type in the window', async () => {
    await page.fill('#search input[name=q]', 'order.created');
    await page.click('#search button[type=submit]');
    await heading('Messages').waitFor();
    await main.getByText('showing messages of event type "order.created"').waitFor();
    await eventually('four order.created messages', async () => (await main.locator('tbody tr').count()) === 4);
    check(!(await main.getByText('invoice.paid').count()), 'only that event type');
    await shot('search-by-event-type');
  }, { failing: ['/msg/order.created'] });

  await step('the messages of the application, newest first', async () => {
    await page.locator('#subnav').getByRole('link', { name: 'Messages' }).click();
    await heading('Messages').waitFor();
    await eventually('five messages', async () => (await main.locator('tbody tr').count()) === 5);
    const times = await main.locator('tbody time').allTextContents();
    check(times.every((t) => /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$/.test(t)), `UTC RFC 3339 times: ${times}`);
    check(await main.locator('tbody time').first().getAttribute('title').then((t) => t.includes('local')), 'local time on hover');
    check([...times].sort().reverse().join() === times.join(), 'newest first');
    await shot('messages');
  });

  await step('an endpoint: charts of its attempts, counts and its dead letters', async () => {
    await open(appPath('endpoint', endpoints['warehouse-dead']));
    await heading('warehouse-dead').waitFor();
    await main.locator('svg.chart rect.bar-bad').first().waitFor();
    await main.locator('svg.chart circle.line-avg').first().waitFor();
    await main.locator('.stat', { hasText: 'Failed or dead' }).waitFor();
    // Listed among the dead letters once the server holds it dead (the resend step waited for that);
    // re-read, as an operator would press reload, should a loaded machine be slower still.
    await eventually('the dead delivery among the dead letters', async () => {
      seen.last = `rows ${JSON.stringify(await main.locator('tbody tr').allInnerTexts())}; `
        + `the server: ${JSON.stringify(await serverDelivery(messages.invoice.id, endpoints['warehouse-dead']))}`;
      return (await row(messages.invoice.id).count()) > 0;
    }, async () => { await open('#/'); await open(appPath('endpoint', endpoints['warehouse-dead'])); await heading('warehouse-dead').waitFor(); },
    { within: 30000 });
    // Depth and oldest age beside the breaker, and the last outcomes the engine saw, failures in red.
    await main.locator('th', { hasText: 'Queued' }).first().waitFor();
    await main.locator('th', { hasText: 'Oldest pending' }).first().waitFor();
    await main.locator('.recent-outcomes .badge.bad').first().waitFor();
    await shot('endpoint-charts');
    await open(`${appPath('endpoint', endpoints['billing-healthy'])}?window=168`);
    await heading('billing-healthy').waitFor();
    await main.locator('svg.chart rect.bar-ok').first().waitFor();
    await main.locator('.recent-outcomes .badge.ok', { hasText: 'success' }).first().waitFor();
    check((await main.locator('.recent-outcomes .badge.bad').count()) === 0, 'a healthy endpoint shows no failed outcome');
    await shot('endpoint-week');
  });

  await step('pause and resume an endpoint', async () => {
    await open(appPath());
    await heading('Acme Corp').waitFor();
    await row('billing-healthy').getByRole('button', { name: 'Pause' }).click();
    await row('billing-healthy').locator('.badge', { hasText: 'paused' }).waitFor();
    await row('billing-healthy').getByRole('button', { name: 'Resume' }).click();
    await row('billing-healthy').locator('.badge', { hasText: 'healthy' }).waitFor();
    await row('analytics-paused').getByRole('button', { name: 'Resume' }).click();
    await row('analytics-paused').locator('.badge', { hasText: 'healthy' }).waitFor();
    await shot('endpoints-resumed');
    // Its delivery died while it was paused: resend it now that the endpoint takes deliveries again.
    await open(appPath('msg', messages.order.id));
    await heading(messages.order.id).waitFor();
    await card(endpoints['analytics-paused']).getByRole('button', { name: 'Resend' }).click();
    await eventually('the resumed endpoint got the resent message', async () =>
      (await card(endpoints['analytics-paused']).locator('.badge', { hasText: 'delivered' }).count()) > 0,
    async () => { await open('#/'); await open(appPath('msg', messages.order.id)); await heading(messages.order.id).waitFor(); });
  });

  await step('recover a window and watch the progress finish', async () => {
    // The warehouse moved: point its endpoint at a receiver that works, then recover what died.
    const moved = await fetch(`${seed.base}/api/v1/app/${app.id}/endpoint/${endpoints['warehouse-dead']}`, {
      method: 'PATCH',
      headers: { Authorization: `Bearer ${seed.adminToken}`, 'Content-Type': 'application/json' },
      body: JSON.stringify({ url: seed.healthyUrl }),
    });
    check(moved.ok, `moving the endpoint: ${moved.status}`);
    await page.locator('#subnav').getByRole('link', { name: 'Failing deliveries' }).click();
    await heading('Failing deliveries').waitFor();
    await row('warehouse-dead').waitFor();
    await shot('failing-deliveries');
    const repair = main.locator('section.card', { has: page.locator('h2', { hasText: 'Repair' }) });
    await repair.locator('select[name=endpoint]').selectOption(endpoints['warehouse-dead']);
    await repair.locator('input[name=since]').fill(seed.since.slice(0, 16));
    await repair.getByRole('button', { name: 'Recover failed' }).click();
    await repair.locator('.task-result', { hasText: 'Finished: 1 processed, 1 queued' }).waitFor();
    check(await repair.locator('progress').evaluate((bar) => bar.value === bar.max), 'the progress bar is full');
    // The listing read again: the recovered delivery is no longer dead.
    await eventually('the recovered row is gone', async () => (await row('warehouse-dead').count()) === 0);
    await shot('recovered');
  });

  await step('operational events, newest first, a page at a time', async () => {
    await open('#/ops?limit=3');
    await heading('Operational events').waitFor();
    await eventually('a first page of three', async () => (await main.locator('tbody tr').count()) === 3);
    await main.getByRole('button', { name: 'Load older events' }).click();
    await eventually('a second page', async () => (await main.locator('tbody tr').count()) === 6);
    const times = await main.locator('tbody time').allTextContents();
    check([...times].sort().reverse().join() === times.join(), `newest first: ${times}`);
    await open('#/ops');
    // Other endpoints may be disabled later than the 410 one (the pause above, the failing endpoint), so
    // the newest `endpoint.disabled` row need not be its: find its row, which names it by its uid.
    await row('endpoint.disabled').first().waitFor();
    await eventually('the 410 endpoint by its uid', async () =>
      (await row('endpoint.disabled').filter({ hasText: 'legacy-gone' }).count()) > 0, () => open('#/ops'));
    await shot('operational-events');
  });

  await step('an application token sees its application only', async () => {
    await logOut();
    await logIn(seed.appToken);
    await heading('Acme Corp').waitFor();
    check((await page.locator('#who').textContent()) === 'application token · acme', 'who is logged in');
    check(!(await page.locator('#nav').getByRole('link', { name: 'Applications' }).count()), 'no applications link');
    check(!(await page.locator('#nav').getByRole('link', { name: 'Operational events' }).count()), 'no operational events link');
    await row('billing-healthy').getByRole('button', { name: 'Pause' }).waitFor();
    await shot('application-token');
  });

  await step('a read-only portal link logs in and shows no button it may not press', async () => {
    await logOut();
    await page.goto(seed.readOnlyUrl);
    await heading('Acme Corp').waitFor();
    check(!page.url().includes('key='), `the token left the address bar: ${page.url()}`);
    check((await page.locator('#who').textContent()).endsWith('read-only'), 'read-only is shown');
    await row('billing-healthy').waitFor();
    check(!(await main.getByRole('button').count()), 'no buttons on the endpoints');
    await shot('read-only-endpoints');
    await open(appPath('msg', messages.invoice.id));
    await heading(messages.invoice.id).waitFor();
    check(!(await main.getByRole('button', { name: 'Resend' }).count()), 'no resend');
    await open(appPath('failing'));
    await heading('Failing deliveries').waitFor();
    check(!(await main.getByRole('heading', { name: 'Repair' }).count()), 'no repair panel');
    check(!(await main.getByRole('button', { name: 'Resend' }).count()), 'no resend in the listing');
    await shot('read-only-failing');
  });

  console.log(`all dashboard checks passed (${shots} screenshots in ${seed.screenshots})`);
} finally {
  await context.close();
  rmSync(profile, { recursive: true, force: true });
}
