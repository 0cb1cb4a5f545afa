// Herald's Svix compatibility suite for the official JavaScript SDK (both pinned generations).
//
// The same contract as svix_sdk_suite.py: every operation of the installed `svix` package is found by
// walking the SDK's own client (resource getters of `Svix`, methods of each resource); operations Herald
// implements run in the scenario and must resolve to the SDK's parsed object (or reject with the SDK's
// own `ApiException` where the scenario expects an error); operations of Svix Cloud products Herald does
// not offer must reject with `ApiException` 501 whose body has code `not_implemented`; any other
// operation fails the suite. Deliveries go to a receiver on loopback and are verified with the SDK's own
// `Webhook` class.
//
// Usage: node svix_sdk_suite.mjs  (env: HERALD_URL, HERALD_TOKEN, SVIX_SDK_DIR = the npm prefix, and
// COMPAT_SIGNATURE_HEADERS = the names Herald sends the signature headers under: webhook, svix or both;
// each delivery must carry exactly those sets, and each set alone must verify).
// Output: the last stdout line is `COMPAT OK svix-javascript <version>: <n> operations (…)` on success.

import http from "node:http";
import { createRequire } from "node:module";
import path from "node:path";
import { pathToFileURL } from "node:url";

const sdkDir = process.env.SVIX_SDK_DIR;
const pkgDir = path.join(sdkDir, "node_modules", "svix");
const require = createRequire(path.join(sdkDir, "package.json"));
const version = require("svix/package.json").version;
const svix = await import(pathToFileURL(require.resolve("svix")).href);
const { Svix, ApiException, Webhook } = svix.Svix ? svix : svix.default;
void pkgDir;

// Operations of Svix Cloud products Herald does not offer, by prefix, and single operations that answer
// 501 in this version of Herald. docs/svix-compatibility.md lists them.
const NOT_OFFERED_PREFIXES = [
  "streaming.",
  "ingest.",
  "connector.",
  "environment.",
  "integration.",
  "operationalWebhook.",
  "operationalWebhookEndpoint.",
  "statistics.",
  "autoconfigSubscription.",
  "destination.",
  "application.destination.",
  "endpoint.transformation.",
  "authentication.stream",
  "authentication.getStreamPollerToken",
  "authentication.rotateStreamPollerToken",
];
const NOT_OFFERED = new Set([
  "endpoint.transformationPartialUpdate",
  "endpoint.transformationGet",
  "endpoint.patchTransformation",
]);

class Mismatch extends Error {}

function expect(cond, what) {
  if (!cond) throw new Mismatch(what);
}

/** Every operation of the SDK: dotted name -> { owner, name, params }. */
function discover(client) {
  const found = new Map();
  const walk = (obj, prefix, depth) => {
    for (let proto = Object.getPrototypeOf(obj); proto && proto !== Object.prototype; proto = Object.getPrototypeOf(proto)) {
      for (const name of Object.getOwnPropertyNames(proto)) {
        if (name === "constructor" || name.startsWith("_") || found.has(prefix + name)) continue;
        const d = Object.getOwnPropertyDescriptor(proto, name);
        if (d.get && depth < 4) walk(obj[name], `${prefix}${name}.`, depth + 1);
        else if (typeof d.value === "function") {
          const source = d.value.toString();
          const params = source.slice(source.indexOf("(") + 1, source.indexOf(")")).split(",")
            .map((p) => p.trim()).filter(Boolean).map((p) => ({ name: p.split("=")[0].trim(), optional: p.includes("=") }));
          found.set(prefix + name, { owner: obj, name, params });
        }
      }
    }
  };
  walk(client, "", 0);
  return found;
}

function describe(err) {
  if (err instanceof ApiException) return `HTTP ${err.code} ${typeof err.body === "string" ? err.body : JSON.stringify(err.body)}`;
  return `${err?.constructor?.name}: ${err?.message ?? err}`;
}

/** Wraps the client: every operation called through it is checked and recorded. */
function recorder(target, prefix, suite) {
  return new Proxy(target, {
    get(obj, name) {
      const value = obj[name];
      if (typeof name !== "string") return value;
      const dotted = prefix + name;
      if (typeof value === "function") return (...args) => suite.call(dotted, () => value.apply(obj, args));
      if (value && typeof value === "object") return recorder(value, `${dotted}.`, suite);
      return value;
    },
  });
}

class Suite {
  constructor(url, token) {
    this.url = url;
    this.client = new Svix(token, { serverUrl: url });
    this.noRetry = new Svix(token, { serverUrl: url, retryScheduleInMs: [], numRetries: 0 });
    this.sdk = recorder(this.client, "", this);
    this.called = new Set();
    this.failures = [];
    this.expected = null;
  }

  /** `await s.error(404).sdk.application.get(id)`: the next call must reject with this status. */
  error(status) {
    this.expected = status;
    return this;
  }

  async call(dotted, run) {
    this.called.add(dotted);
    const expected = this.expected;
    this.expected = null;
    let result;
    try {
      result = await run();
    } catch (err) {
      if (err instanceof ApiException) {
        if (expected === null) throw new Mismatch(`${dotted}: ${describe(err)}`);
        expect(err.code === expected, `${dotted}: expected HTTP ${expected}, got ${describe(err)}`);
        return err;
      }
      if (err instanceof Mismatch) throw err;
      throw new Mismatch(`${dotted}: the SDK crashed on Herald's answer: ${describe(err)}`);
    }
    expect(expected === null, `${dotted}: expected HTTP ${expected}, the call succeeded`);
    // The SDK resolves to a parsed object, or to nothing for operations without a body.
    expect(result === undefined || result === null || typeof result === "object", `${dotted}: resolved to ${typeof result}`);
    return result;
  }
}

// ---------------------------------------------------------------------------------------------------
// The receiver
// ---------------------------------------------------------------------------------------------------

async function startReceiver() {
  const requests = [];
  const server = http.createServer((req, res) => {
    const chunks = [];
    req.on("data", (c) => chunks.push(c));
    req.on("end", () => {
      requests.push({ path: req.url, headers: req.headers, body: Buffer.concat(chunks).toString("utf8") });
      res.writeHead(200, { "content-length": "0" }).end();
    });
  });
  await new Promise((resolve) => server.listen(0, "127.0.0.1", resolve));
  const url = `http://127.0.0.1:${server.address().port}/hook`;
  // The first delivery of `msgId` (to `path`, the receiver's URL path, when given).
  const waitFor = async (msgId, timeoutMs = 20000, path = null) => {
    const deadline = Date.now() + timeoutMs;
    while (Date.now() < deadline) {
      const found = requests.find((r) => [r.headers["webhook-id"], r.headers["svix-id"]].includes(msgId) && (path === null || r.path === path));
      if (found) return found;
      await sleep(50);
    }
    throw new Mismatch(`message ${msgId} was not delivered within ${timeoutMs / 1000}s`);
  };
  // Closing ends the keep-alive connections Herald holds to the receiver too: with `close()` alone, one of
  // them (seen when several suites ran side by side) stayed open and kept the script from exiting for
  // about two minutes after its last line.
  const close = () => {
    server.close();
    server.closeAllConnections();
  };
  return { url, waitFor, close };
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

// ---------------------------------------------------------------------------------------------------
// The scenario: every operation Herald implements
// ---------------------------------------------------------------------------------------------------

const HEADER_SETS = {
  webhook: ["webhook-id", "webhook-timestamp", "webhook-signature"],
  svix: ["svix-id", "svix-timestamp", "svix-signature"],
};

/** The delivery carries exactly the header sets of `mode` (by default the server's, which Herald was told to
 * send); each set alone verifies. */
function verifyDelivery(secret, { headers, body }, mode = process.env.COMPAT_SIGNATURE_HEADERS ?? "webhook") {
  const wanted = mode === "both" ? ["webhook", "svix"] : [mode];
  const signatureNames = Object.values(HEADER_SETS).flat();
  for (const [set, names] of Object.entries(HEADER_SETS)) {
    const present = names.filter((n) => n in headers);
    if (wanted.includes(set)) {
      expect(present.length === 3, `signature headers ${names} expected in ${mode} mode, got ${Object.keys(headers)}`);
      const only = Object.fromEntries(Object.entries(headers).filter(([k]) => !signatureNames.includes(k) || names.includes(k)));
      new Webhook(secret).verify(body, only);
    } else {
      expect(present.length === 0, `${present} sent in ${mode} mode`);
    }
  }
}

/** A request to Herald without the SDK (for its extensions, which the SDKs have no field for). */
async function heraldHttp(method, path, body) {
  const answer = await fetch(`${process.env.HERALD_URL}/api/v1${path}`, {
    method,
    headers: { authorization: `Bearer ${process.env.HERALD_TOKEN}`, "content-type": "application/json" },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await answer.text();
  return { status: answer.status, body: text ? JSON.parse(text) : null };
}

async function waitAttempts(s, appId, msgId, n = 1, timeoutMs = 20000) {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const page = await s.sdk.messageAttempt.listByMsg(appId, msgId);
    if (page.data.length >= n) return page.data;
    if (Date.now() > deadline) throw new Mismatch(`message ${msgId}: ${page.data.length} attempts, wanted ${n}`);
    await sleep(100);
  }
}

/** The background task once it is no longer running. */
async function waitTask(s, taskId, timeoutMs = 20000) {
  let task = await s.sdk.backgroundTask.get(taskId);
  for (const deadline = Date.now() + timeoutMs; task.status === "running" && Date.now() < deadline; ) {
    await sleep(100);
    task = await s.sdk.backgroundTask.get(taskId);
  }
  return task;
}

async function scenario(s, receiver, step) {
  const sdk = s.sdk;
  const suffix = Math.random().toString(16).slice(2, 12);
  const gen2 = typeof s.client.endpoint.upsert === "function";

  step("health");
  await sdk.health.get();

  step("applications");
  const app = await sdk.application.create({ name: `compat ${suffix}`, uid: `app-${suffix}`, metadata: { a: "1" } });
  expect(app.metadata.a === "1", `ApplicationOut.metadata ${JSON.stringify(app.metadata)}`);
  expect(app.createdAt instanceof Date, "ApplicationOut.createdAt is not a Date");
  expect((await sdk.application.get(`app-${suffix}`)).id === app.id, "GET by uid answers another app");
  const page = await sdk.application.list({ limit: 10 });
  expect(typeof page.done === "boolean", "ListResponse.done is not a boolean");
  const patched = await sdk.application.patch(app.id, { name: `renamed ${suffix}` });
  expect(patched.name === `renamed ${suffix}`, `patched name ${patched.name}`);
  const replaced = await (gen2 ? sdk.application.upsert : sdk.application.update)(app.id, { name: `replaced ${suffix}`, uid: `app-${suffix}` });
  expect(replaced.name === `replaced ${suffix}`, `replaced name ${replaced.name}`);
  const again = await sdk.application.getOrCreate({ name: "ignored", uid: `app-${suffix}` });
  expect(again.id === app.id, "getOrCreate of an existing uid made a new app");
  // `null` for an optional field means the default (issue 16, item 2), as the Python SDK sends for None.
  const nullApp = await sdk.application.create({ name: `nulls ${suffix}`, uid: null, metadata: null, throttleRate: null });
  expect(JSON.stringify(nullApp.metadata) === "{}" && nullApp.uid == null, `null fields on application create: ${JSON.stringify(nullApp)}`);
  const noMetadata = await sdk.application.patch(app.id, { metadata: null });
  expect(JSON.stringify(noMetadata.metadata) === "{}", `PATCH metadata null gave ${JSON.stringify(noMetadata.metadata)}`);
  await sdk.application.delete(nullApp.id);
  const other = await sdk.application.create({ name: `other ${suffix}` });
  await sdk.application.delete(other.id);
  await s.error(404).sdk.application.get(other.id);

  step("event types");
  const etName = `compat.${suffix}`;
  const et = await sdk.eventType.create({ name: etName, description: "compat event" });
  expect(et.name === etName, `EventTypeOut.name ${et.name}`);
  expect((await sdk.eventType.get(etName)).description === "compat event", "event type description lost");
  await sdk.eventType.list({ limit: 50 });
  await sdk.eventType.patch(etName, { description: "patched" });
  await (gen2 ? sdk.eventType.upsert : sdk.eventType.update)(etName, { description: "replaced" });
  // Svix's display group and feature flags are stored and echoed (duplicates collapse); a PATCH to null
  // removes them.
  const flaggedName = `compat.flagged.${suffix}`;
  const flagged = await sdk.eventType.create({ name: flaggedName, description: "flagged", featureFlags: ["beta", "beta", "gamma"], groupName: "Billing events" });
  const flagsOf = (e) => JSON.stringify([e.featureFlags, e.groupName ?? null]);
  expect(flagsOf(flagged) === JSON.stringify([["beta", "gamma"], "Billing events"]), `on create: ${JSON.stringify(flagged)}`);
  expect(flagsOf(await sdk.eventType.get(flaggedName)) === flagsOf(flagged), "featureFlags/groupName on get");
  const changed = await sdk.eventType.patch(flaggedName, { featureFlags: ["delta"], groupName: null });
  expect(flagsOf(changed) === JSON.stringify([["delta"], null]), `after a patch: ${JSON.stringify(changed)}`);
  const badFlag = await s.error(422).sdk.eventType.create({ name: `compat.bad.${suffix}`, description: "bad flag", featureFlags: ["no spaces"] });
  expect(badFlag.body.detail[0].loc.at(-1) === "featureFlags", `422 for a bad feature flag: ${describe(badFlag)}`);
  const gone = `compat.gone.${suffix}`;
  await sdk.eventType.create({ name: gone, description: "to delete" });
  await sdk.eventType.delete(gone);
  const spec = {
    openapi: "3.1.0",
    info: { title: "compat", version: "1" },
    webhooks: { [`imported.${suffix}`]: { post: { summary: "imported event", "x-svix-group-name": "Imported", "x-svix-feature-flags": ["imported-flag"], requestBody: { content: { "application/json": { schema: { type: "object" } } } } } } },
  };
  const preview = await sdk.eventType.importOpenapi({ spec, dryRun: true });
  expect(preview.data.toModify?.[0]?.name === `imported.${suffix}`, `dry run ${JSON.stringify(preview)}`);
  const done = await sdk.eventType.importOpenapi({ spec });
  expect(done.data.modified[0] === `imported.${suffix}`, `import ${JSON.stringify(done)}`);
  const imported = await sdk.eventType.get(`imported.${suffix}`);
  expect(imported.description === "imported event", "imported description");
  expect(flagsOf(imported) === JSON.stringify([["imported-flag"], "Imported"]), `imported extensions ${JSON.stringify(imported)}`);

  step("endpoints");
  const filter = gen2 ? { eventTypes: [etName] } : { filterTypes: [etName] };
  const ep = await sdk.endpoint.create(app.id, { url: receiver.url, description: "compat", metadata: { k: "v" }, ...filter });
  expect(ep.url === receiver.url, `EndpointOut.url ${ep.url}`);
  expect((await sdk.endpoint.get(app.id, ep.id)).id === ep.id, "GET endpoint answers another endpoint");
  // Newest first by default, as Svix lists endpoints; `order` turns it round.
  const newer = await sdk.endpoint.create(app.id, { url: receiver.url, description: "newer" });
  const newestFirst = (await sdk.endpoint.list(app.id, { limit: 10 })).data.map((e) => e.id);
  expect(newestFirst[0] === newer.id && newestFirst[1] === ep.id, `endpoint.list default order ${newestFirst}`);
  const oldestFirst = (await sdk.endpoint.list(app.id, { limit: 10, order: svix.Ordering.Ascending })).data.map((e) => e.id);
  expect(oldestFirst[0] === ep.id && oldestFirst[1] === newer.id, `order=ascending ${oldestFirst}`);
  await sdk.endpoint.delete(app.id, newer.id);
  await sdk.endpoint.patch(app.id, ep.id, { description: "patched" });
  await (gen2 ? sdk.endpoint.upsert : sdk.endpoint.update)(app.id, ep.id, { url: receiver.url, ...filter });
  const secret = await sdk.endpoint.getSecret(app.id, ep.id);
  expect(secret.key.startsWith("whsec_"), "EndpointSecretOut.key has no whsec_ prefix");
  if (!gen2) {
    await sdk.endpoint.headersUpdate(app.id, ep.id, { headers: { "X-Compat": "0" } });
    await sdk.endpoint.headersPatch(app.id, ep.id, { headers: { "X-Other": "0" } });
  }
  await (gen2 ? sdk.endpoint.setHeaders : sdk.endpoint.updateHeaders)(app.id, ep.id, { headers: { "X-Compat": "1", "X-Gone": "1" } });
  await sdk.endpoint.patchHeaders(app.id, ep.id, { headers: { "X-Other": "2" }, deleteHeaders: ["x-gone"] });
  const headers = await sdk.endpoint.getHeaders(app.id, ep.id);
  // Names come back as spelled; deleteHeaders removes (case-insensitively).
  expect(JSON.stringify(headers.headers) === JSON.stringify({ "X-Compat": "1", "X-Other": "2" }), `headers ${JSON.stringify(headers.headers)}`);
  const nullsEp = await sdk.endpoint.create(app.id, { url: receiver.url, uid: null, metadata: null, description: null, channels: null });
  expect(JSON.stringify(nullsEp.metadata) === "{}" && nullsEp.description === "", "null fields on endpoint create");
  await sdk.endpoint.delete(app.id, nullsEp.id);
  const stats = await sdk.endpoint.getStats(app.id, ep.id);
  expect(typeof stats.success === "number" && typeof stats.canceled === "number", "EndpointStats.success/canceled");
  if (typeof s.client.endpoint.getAttemptStats === "function") {
    const counted = await sdk.endpoint.getAttemptStats(app.id, ep.id);
    expect(counted.success === 0 && counted.fail === 0, `attempt stats before any message: ${JSON.stringify(counted)}`);
  }
  expect((await sdk.message.precheck(app.id, { eventType: etName })).active === true, "precheck: subscribed endpoint not active");
  expect((await sdk.message.precheck(app.id, { eventType: `${etName}.nobody`, channels: ["x"] })).active === false, "precheck: nobody is active");
  let sinkId = null;
  if (s.client.message.poller) {
    // Pull delivery: a polling endpoint (created over HTTP, a Herald resource the SDKs have no operation
    // for), read through the poller before any message is published.
    const created = await heraldHttp("POST", `/app/${app.id}/polling-endpoint`, { eventTypes: [etName] });
    expect(created.status === 201, `polling endpoint: HTTP ${created.status}`);
    sinkId = created.body.id;
    const head = await sdk.message.poller.poll(app.id, sinkId);
    expect(head.done === true && typeof head.iterator === "string", `poller.poll on an empty stream: ${JSON.stringify(head)}`);
    const polled = await sdk.message.poller.consumerPoll(app.id, sinkId, "compat");
    expect(polled.done === true, `poller.consumerPoll: ${JSON.stringify(polled)}`);
    const sought = await sdk.message.poller.consumerSeek(app.id, sinkId, "compat", { after: new Date() });
    expect(typeof sought.iterator === "string", `poller.consumerSeek: ${JSON.stringify(sought)}`);
  }
  const extra = await sdk.endpoint.create(app.id, { url: receiver.url });
  await sdk.endpoint.delete(app.id, extra.id);
  await s.error(404).sdk.endpoint.get(app.id, extra.id);
  // A disabled endpoint: it exists but gets no deliveries.
  const extraEp = await sdk.endpoint.create(app.id, { url: receiver.url, disabled: true });

  step("messages and deliveries");
  const payload = { type: etName, n: 1, text: "h\u00e9llo" };
  const msg = await sdk.message.create(app.id, { eventType: etName, payload, eventId: `evt-${suffix}` });
  expect(msg.eventType === etName, `MessageOut.eventType ${msg.eventType}`);
  if (sinkId) {
    // The message is on the polling endpoint's stream: the poller reads it with its payload, the consumer
    // (sought to before it) gets it until it commits, and a seek back serves it again.
    const page = await sdk.message.poller.poll(app.id, sinkId);
    const found = page.data.filter((m) => m.id === msg.id);
    expect(found.length === 1 && found[0].eventType === etName && JSON.stringify(found[0].payload) === JSON.stringify(payload),
      `poller.poll after publishing: ${JSON.stringify(page.data)}`);
    const first = await sdk.message.poller.consumerPoll(app.id, sinkId, "compat");
    expect(JSON.stringify(first.data.map((m) => m.id)) === JSON.stringify([msg.id]), `poller.consumerPoll after publishing: ${JSON.stringify(first)}`);
    // Coming back with the answer's iterator commits it (until then the page would be served again).
    const again = await sdk.message.poller.consumerPoll(app.id, sinkId, "compat", { iterator: first.iterator });
    expect(again.data.length === 0, `poller.consumerPoll after committing serves the message again: ${JSON.stringify(again)}`);
    await sdk.message.poller.consumerSeek(app.id, sinkId, "compat", { after: new Date(msg.timestamp.getTime() - 1000) });
    const replayed = await sdk.message.poller.consumerPoll(app.id, sinkId, "compat");
    expect(replayed.data.some((m) => m.id === msg.id), `poller.consumerPoll after a seek back: ${JSON.stringify(replayed)}`);
  }
  const got = await sdk.message.get(app.id, msg.id, { withContent: true });
  expect(JSON.stringify(got.payload) === JSON.stringify(payload), `MessageOut.payload ${JSON.stringify(got.payload)}`);
  await sdk.message.list(app.id, { limit: 10 });
  // An inline `application` creates the app named in the path (its uid) with the message.
  await sdk.message.create(`inline-${suffix}`, { eventType: etName, payload: { a: 1 }, application: { name: "inline" } });
  expect((await sdk.application.get(`inline-${suffix}`)).name === "inline", "inline application not created");
  const delivered = await receiver.waitFor(msg.id);
  verifyDelivery(secret.key, delivered);
  expect(JSON.stringify(JSON.parse(delivered.body)) === JSON.stringify(payload), `delivered body ${delivered.body}`);
  const attempts = await waitAttempts(s, app.id, msg.id);
  expect(attempts[0].msgId === msg.id, "attempt msgId");
  const one = await sdk.messageAttempt.get(app.id, msg.id, attempts[0].id);
  expect(one.id === attempts[0].id && one.endpointId === ep.id, `GET attempt answered ${one.id}`);
  await s.error(404).sdk.messageAttempt.get(app.id, msg.id, "atmpt_2AAAAAAAAAAAAAAAAAAAAAAAAAA");
  const onlyOther = await sdk.messageAttempt.listByMsg(app.id, msg.id, { endpointId: extraEp.id });
  expect(onlyOther.data.length === 0, "attempts filtered by another endpoint");
  const withMsg = await sdk.messageAttempt.listByEndpoint(app.id, ep.id, { withMsg: true });
  expect(withMsg.data[0].msg?.id === msg.id, "withMsg=true gave no msg");
  await sdk.messageAttempt.listByEndpoint(app.id, ep.id);
  await sdk.messageAttempt.listAttemptedDestinations(app.id, msg.id);
  await sdk.messageAttempt.listAttemptedMessages(app.id, ep.id);
  await sdk.messageAttempt.resend(app.id, msg.id, ep.id);
  await waitAttempts(s, app.id, msg.id, 2);
  // The delivery and its resend are counted (both succeeded).
  const deliveredStats = await sdk.endpoint.getStats(app.id, ep.id);
  expect(deliveredStats.success >= 1, `endpoint stats after a delivery: ${JSON.stringify(deliveredStats)}`);
  if (typeof s.client.endpoint.getAttemptStats === "function") {
    const counted = await sdk.endpoint.getAttemptStats(app.id, ep.id);
    expect(counted.success >= 2 && counted.fail === 0, `attempt stats after a delivery and a resend: ${JSON.stringify(counted)}`);
  }

  step("secret rotation, replay and recovery");
  await sdk.endpoint.rotateSecret(app.id, ep.id, {});
  const since = new Date(Date.now() - 3600 * 1000);
  await sdk.endpoint.replayMissing(app.id, ep.id, { since });
  const recovered = await sdk.endpoint.recover(app.id, ep.id, { since });
  await sdk.backgroundTask.get(recovered.id);
  // The message was delivered (and resent): a bulk replay of its event type sends it once more.
  const replay = await sdk.endpoint.bulkReplay(app.id, ep.id, { since, eventTypes: [etName] });
  expect(replay.task === "endpoint.bulk-replay", `ReplayOut.task ${replay.task}`);
  const task = await waitTask(s, replay.id);
  expect(task.status === "finished" && task.data.messagesSent === 1, `bulk replay task ${JSON.stringify(task)}`);
  await waitAttempts(s, app.id, msg.id, 3);
  await sdk.message.expungeContent(app.id, msg.id);
  if (typeof s.client.message.bulkExpungeContent === "function") {
    const bulk = await sdk.message.bulkExpungeContent(app.id, { ids: [msg.id, "msg_unknown"] });
    expect(bulk.results[msg.id] === "expunged" && bulk.results.msg_unknown === "not-found", `bulk expunge ${JSON.stringify(bulk)}`);
  }
  await sdk.messageAttempt.expungeContent(app.id, msg.id, attempts[0].id);
  expect((await sdk.messageAttempt.get(app.id, msg.id, attempts[0].id)).response === "", "attempt response not expunged");
  const purge = await sdk.message.expungeAllContents(app.id);
  expect(purge.task === "application.purge_content", `ExpungeAllContentsOut.task ${purge.task}`);
  const purged = await waitTask(s, purge.id);
  expect(purged.status === "finished" && "messagesPurged" in purged.data, `expunge-all task ${JSON.stringify(purged)}`);
  const listed = await sdk.backgroundTask.list({ limit: 250 });
  expect(listed.data.some((t) => t.id === purge.id), `backgroundTask.list lacks ${purge.id}`);
  const byKind = await sdk.backgroundTask.list({ task: "endpoint.bulk-replay" });
  expect(byKind.data.length === 1 && byKind.data[0].id === replay.id, `backgroundTask.list by kind ${JSON.stringify(byKind)}`);
  if (typeof s.client.backgroundTask.listByEndpoint === "function") {
    const again = await sdk.backgroundTask.listByEndpoint({ limit: 250 });
    expect(again.data.some((t) => t.id === purge.id), "backgroundTask.listByEndpoint");
  }

  step("message tags");
  const tag = `order/${suffix}#1`;
  const sameTags = (tags) => JSON.stringify([...(tags ?? [])].sort()) === JSON.stringify([tag, "compat"].sort());
  const tagged = await sdk.message.create(app.id, { eventType: etName, payload: { tagged: 1 }, tags: [tag, "compat"] });
  expect(sameTags(tagged.tags), `MessageOut.tags on create ${JSON.stringify(tagged.tags)}`);
  expect(sameTags((await sdk.message.get(app.id, tagged.id)).tags), "MessageOut.tags on get");
  const byTag = await sdk.message.list(app.id, { tag });
  expect(JSON.stringify(byTag.data.map((m) => m.id)) === JSON.stringify([tagged.id]), `message.list tag: ${JSON.stringify(byTag.data)}`);
  expect((await sdk.message.list(app.id, { tag: `none-${suffix}` })).data.length === 0, "unknown tag listed");
  // Svix's bounds: at most 5 tags, each of `[a-zA-Z0-9-_./\\#]`, 1-128 characters.
  await s.error(422).sdk.message.create(app.id, { eventType: etName, payload: {}, tags: ["no spaces"] });
  await s.error(422).sdk.message.create(app.id, { eventType: etName, payload: {}, tags: ["t0", "t1", "t2", "t3", "t4", "t5"] });
  await waitAttempts(s, app.id, tagged.id);
  const byEndpoint = await sdk.messageAttempt.listByEndpoint(app.id, ep.id, { tag, withMsg: true });
  expect(byEndpoint.data.length > 0 && byEndpoint.data.every((a) => a.msgId === tagged.id), `attempts by endpoint, tag: ${JSON.stringify(byEndpoint.data)}`);
  expect(sameTags(byEndpoint.data[0].msg?.tags), "withMsg message has no tags");
  expect((await sdk.messageAttempt.listByMsg(app.id, tagged.id, { tag })).data.length === 1, "attempts by message, its own tag");
  expect((await sdk.messageAttempt.listByMsg(app.id, msg.id, { tag })).data.length === 0, "attempts by message, a tag it does not carry");
  const attempted = await sdk.messageAttempt.listAttemptedMessages(app.id, ep.id, { tag });
  expect(JSON.stringify(attempted.data.map((m) => m.id)) === JSON.stringify([tagged.id]), `attempted messages, tag: ${JSON.stringify(attempted.data)}`);
  // A bulk replay filtered by the tag sends that message again, and only it.
  const byTagReplay = await sdk.endpoint.bulkReplay(app.id, ep.id, { since, tag });
  const byTagTask = await waitTask(s, byTagReplay.id);
  expect(byTagTask.status === "finished" && byTagTask.data.messagesSent === 1, `bulk replay by tag ${JSON.stringify(byTagTask)}`);
  await waitAttempts(s, app.id, tagged.id, 2);
  const badTag = await s.error(422).sdk.endpoint.bulkReplay(app.id, ep.id, { since, tag: "no spaces" });
  expect(badTag.body.detail[0].loc.at(-1) === "tag", `422 for a bad bulk-replay tag: ${describe(badTag)}`);

  step("listing options");
  // Every option the SDKs' listings send is taken (the document check below makes sure of it; these show
  // each one working): applications and event types in either order, applications by their endpoints,
  // attempts and an endpoint's messages by channel, event type and time.
  const bare = await sdk.application.create({ name: `bare ${suffix}` });
  const apps = (await sdk.application.list({ limit: 250 })).data.map((a) => a.id);
  const newestApps = (await sdk.application.list({ limit: 250, order: svix.Ordering.Descending })).data.map((a) => a.id);
  expect(JSON.stringify(newestApps) === JSON.stringify([...apps].reverse()), "application.list order=descending");
  const withEndpoints = (await sdk.application.list({ limit: 250, excludeAppsWithNoEndpoints: true, excludeAppsWithDisabledEndpoints: true })).data.map((a) => a.id);
  expect(withEndpoints.includes(app.id) && !withEndpoints.includes(bare.id), `excludeAppsWithNoEndpoints: ${withEndpoints}`);
  await sdk.application.delete(bare.id);
  const names = (await sdk.eventType.list({ limit: 250 })).data.map((e) => e.name);
  const backwards = (await sdk.eventType.list({ limit: 250, order: svix.Ordering.Descending })).data.map((e) => e.name);
  expect(JSON.stringify(backwards) === JSON.stringify([...names].sort().reverse()), `eventType.list order=descending ${backwards}`);
  const onChannel = await sdk.message.create(app.id, { eventType: etName, payload: { on: "channel" }, channels: [`ch-${suffix}`] });
  await waitAttempts(s, app.id, onChannel.id);
  const byChannel = (await sdk.messageAttempt.listByEndpoint(app.id, ep.id, { channel: `ch-${suffix}` })).data;
  expect(byChannel.length > 0 && byChannel.every((a) => a.msgId === onChannel.id), `attempts by endpoint, channel: ${JSON.stringify(byChannel)}`);
  expect((await sdk.messageAttempt.listByMsg(app.id, msg.id, { channel: `ch-${suffix}` })).data.length === 0, "attempts by message, a channel it is not on");
  const attemptedIds = async (options) => (await sdk.messageAttempt.listAttemptedMessages(app.id, ep.id, { limit: 250, ...options })).data.map((m) => m.id);
  expect(JSON.stringify(await attemptedIds({ channel: `ch-${suffix}` })) === JSON.stringify([onChannel.id]), "attempted messages, channel");
  expect(!(await attemptedIds({ eventTypes: [`${etName}.other`] })).includes(onChannel.id), "attempted messages, eventTypes");
  expect((await attemptedIds({ eventTypes: [etName] })).includes(onChannel.id), "attempted messages, its event type");
  expect(!(await attemptedIds({ before: onChannel.timestamp })).includes(onChannel.id), "attempted messages, before");
  expect((await attemptedIds({ after: onChannel.timestamp }))[0] === onChannel.id, "attempted messages, after");

  step("scheduled delivery");
  const at = new Date(Math.ceil(Date.now() / 1000) * 1000 + 2000);
  const scheduled = await sdk.message.create(app.id, { eventType: etName, payload: { scheduled: 1 }, deliverAt: at });
  expect(new Date(scheduled.deliverAt).getTime() === at.getTime(), `MessageOut.deliverAt ${scheduled.deliverAt}, sent ${at.toISOString()}`);
  expect(new Date((await sdk.message.get(app.id, scheduled.id)).deliverAt).getTime() === at.getTime(), "MessageOut.deliverAt on get");
  await s.error(422).sdk.message.create(app.id, { eventType: etName, payload: {}, deliverAt: new Date(Date.now() + 25 * 3600 * 1000) });
  await receiver.waitFor(scheduled.id);
  const scheduledAttempts = await waitAttempts(s, app.id, scheduled.id);
  const firstAttempt = scheduledAttempts[scheduledAttempts.length - 1];
  expect(new Date(firstAttempt.timestamp).getTime() >= at.getTime(), `attempted at ${firstAttempt.timestamp}, before its deliverAt ${at.toISOString()}`);

  step("send example");
  const exampleType = `compat.example.${suffix}`;
  const schema = { type: "object", examples: [{ first: 1 }, { second: 2 }] };
  await sdk.eventType.create({ name: exampleType, description: "with examples", schemas: { 1: schema } });
  // The endpoint does not subscribe to this event type: the example goes to it all the same, and only to it.
  const sent = await sdk.endpoint.sendExample(app.id, ep.id, { eventType: exampleType, exampleIndex: 1 });
  expect(sent.eventType === exampleType && JSON.stringify(sent.payload) === JSON.stringify({ second: 2 }), `sendExample answered ${JSON.stringify(sent)}`);
  const example = await receiver.waitFor(sent.id);
  // Signed with the endpoint's key as rotated above.
  verifyDelivery((await sdk.endpoint.getSecret(app.id, ep.id)).key, example);
  expect(JSON.stringify(JSON.parse(example.body)) === JSON.stringify({ second: 2 }), `example delivered as ${example.body}`);
  const destinations = await sdk.messageAttempt.listAttemptedDestinations(app.id, sent.id);
  expect(JSON.stringify(destinations.data.map((d) => d.id)) === JSON.stringify([ep.id]), `the example went to ${JSON.stringify(destinations.data)}`);
  const firstExample = await sdk.endpoint.sendExample(app.id, ep.id, { eventType: exampleType });
  expect(JSON.stringify(firstExample.payload) === JSON.stringify({ first: 1 }), `the default example is the first: ${JSON.stringify(firstExample.payload)}`);
  const ping = await sdk.endpoint.sendExample(app.id, ep.id, { eventType: "svix.ping" });
  expect(JSON.stringify(ping.payload) === JSON.stringify({ success: true }), `svix.ping example ${JSON.stringify(ping.payload)}`);
  await s.error(422).sdk.endpoint.sendExample(app.id, ep.id, { eventType: etName });
  await s.error(422).sdk.endpoint.sendExample(app.id, ep.id, { eventType: exampleType, exampleIndex: 2 });
  await s.error(404).sdk.endpoint.sendExample(app.id, ep.id, { eventType: `compat.none.${suffix}` });

  step("signature header names per endpoint");
  // Each endpoint may choose the names of its signature headers (Herald's `signatureHeaders`, set over HTTP:
  // the SDKs have no field for it); one message reaches an endpoint of each choice, and of none (the
  // server's), each delivery with exactly its sets, each set verified by the SDK's `Webhook`.
  const namesType = `compat.names.${suffix}`;
  const choices = { webhook: "webhook", svix: "svix", both: "both", server: null };
  const byChoice = {};
  for (const [choice, names] of Object.entries(choices)) {
    const created = await heraldHttp("POST", `/app/${app.id}/endpoint`, { url: `${receiver.url}/${choice}`, filterTypes: [namesType], signatureHeaders: names });
    expect(created.status === 201 && (created.body.signatureHeaders ?? null) === names, `signatureHeaders ${names}: ${JSON.stringify(created)}`);
    // The SDK reads the endpoint (and ignores the extension).
    expect((await sdk.endpoint.get(app.id, created.body.id)).id === created.body.id, "endpoint.get of an endpoint with signatureHeaders");
    byChoice[choice] = created.body.id;
  }
  const named = await sdk.message.create(app.id, { eventType: namesType, payload: { names: true } });
  for (const [choice, names] of Object.entries(choices)) {
    const delivery = await receiver.waitFor(named.id, 20000, `/hook/${choice}`);
    const key = (await sdk.endpoint.getSecret(app.id, byChoice[choice])).key;
    verifyDelivery(key, delivery, names ?? undefined);
  }
  // A PATCH to null gives the endpoint back to the server's setting; anything but the three names is a 422.
  const reset = await heraldHttp("PATCH", `/app/${app.id}/endpoint/${byChoice.svix}`, { signatureHeaders: null });
  expect(reset.status === 200 && !("signatureHeaders" in reset.body), `PATCH signatureHeaders null: ${JSON.stringify(reset)}`);
  const bad = await heraldHttp("PATCH", `/app/${app.id}/endpoint/${byChoice.svix}`, { signatureHeaders: "x-svix" });
  expect(bad.status === 422 && JSON.stringify(bad.body.detail[0].loc) === JSON.stringify(["body", "signatureHeaders"]), `a bad name: ${JSON.stringify(bad)}`);
  for (const id of Object.values(byChoice)) await sdk.endpoint.delete(app.id, id);

  step("portal access");
  const access = await sdk.authentication.appPortalAccess(app.id, {});
  expect(Boolean(access.token), "AppPortalAccessOut.token is empty");
  expect(/^https?:\/\//.test(access.url), `AppPortalAccessOut.url ${access.url} is not absolute`);
  if (typeof s.client.authentication.dashboardAccess === "function") {
    const dashboard = await sdk.authentication.dashboardAccess(app.id);
    expect(Boolean(dashboard.token) && /^https?:\/\//.test(dashboard.url), `dashboard access ${JSON.stringify(dashboard)}`);
  }
  // expireAll with sessionIds ends only the tokens issued for those sessions.
  const session = await sdk.authentication.appPortalAccess(app.id, { sessionId: "compat-session" });
  await sdk.authentication.expireAll(app.id, { sessionIds: ["compat-session"] });
  let sessionWorks = true;
  try {
    await new Svix(session.token, { serverUrl: s.url }).application.get(app.id);
  } catch (err) {
    sessionWorks = false;
    expect(err instanceof ApiException && err.code === 401, `a token of an expired session got ${describe(err)}`);
  }
  expect(!sessionWorks, "a token of an expired session still works");
  // A logout ends the portal token that makes it (still working: not of that session); the admin token
  // cannot log out.
  const portal = new Svix(access.token, { serverUrl: s.url });
  await s.call("authentication.logout", () => portal.authentication.logout());
  let stillWorks = true;
  try {
    await portal.application.get(app.id);
  } catch (err) {
    stillWorks = false;
    expect(err instanceof ApiException && err.code === 401, `a logged-out token got ${describe(err)}`);
  }
  expect(!stillWorks, "a logged-out portal token still works");
  await s.error(403).sdk.authentication.logout();
  await sdk.authentication.expireAll(app.id, {});
}

// ---------------------------------------------------------------------------------------------------
// Not offered: each must answer 501 not_implemented
// ---------------------------------------------------------------------------------------------------

const notOffered = (name) => NOT_OFFERED.has(name) || NOT_OFFERED_PREFIXES.some((p) => name.startsWith(p));

/** An argument for a not-offered operation: path parameters get a string, bodies an empty object (or,
 * `lists`, one whose every field is an empty list, for serializers that map over a required list). The
 * request never gets past routing, so any body will do. */
function placeholder(param, lists) {
  if (param.name === "options") return undefined;
  if (/(Id|Name|^name)$/.test(param.name)) return "placeholder";
  if (!lists) return {};
  return new Proxy({}, { get: (_, key) => (typeof key === "string" && key !== "then" && key !== "toJSON" ? [] : undefined) });
}

async function checkNotOffered(s, name) {
  const op = discover(s.noRetry).get(name);
  const call = (lists) => op.owner[op.name](...op.params.map((p) => placeholder(p, lists)));
  try {
    // A serializer that cannot take the empty body throws before sending anything: try the other one.
    await call(false).catch((err) => (err instanceof TypeError ? call(true) : Promise.reject(err)));
  } catch (err) {
    if (err instanceof ApiException) {
      let body = err.body;
      if (typeof body === "string") {
        try {
          body = JSON.parse(body);
        } catch {
          throw new Mismatch(`${name}: the 501 body is not JSON: ${err.body}`);
        }
      }
      expect(err.code === 501 && body?.code === "not_implemented", `${name}: expected 501 not_implemented, got ${describe(err)}`);
      return;
    }
    throw new Mismatch(`${name}: the SDK crashed on Herald's answer: ${describe(err)}`);
  }
  throw new Mismatch(`${name}: expected 501 not_implemented, the call succeeded`);
}

/** What the SDK can send, held against the document the server serves: for every operation Herald
 * implements, each query and header parameter it sets must be declared for that operation (the server
 * refuses undeclared ones), so a newer pinned SDK that sends something new fails here instead of at a
 * user's call. (The Python suite also checks the request bodies' fields.) */
async function checkDocument(operations) {
  const document = await (await fetch(`${process.env.HERALD_URL}/api/v1/openapi.json`)).json();
  const problems = [];
  const declared = (path, method) => {
    const item = document.paths[path];
    return new Set([...(item.parameters ?? []), ...(item[method].parameters ?? [])]
      .map((p) => (p.$ref ? document.components.parameters[p.$ref.split("/").pop()] : p))
      .map((p) => `${p.in}:${p.name}`));
  };
  for (const [name, { owner, name: method }] of [...operations.entries()].sort()) {
    if (notOffered(name)) continue;
    const source = owner[method].toString();
    const route = source.match(/SvixRequest\(\s*(?:[\w.]*HttpMethod\.)?"?(\w+)"?,\s*"([^"]+)"/);
    if (!route) continue; // calls another operation (1.x headersUpdate, …), which is checked itself
    const verb = route[1].toLowerCase();
    const path = route[2].replace("{event_type_name}", "{name}");
    if (!document.paths[path]?.[verb]) {
      problems.push(`${name}: ${verb.toUpperCase()} ${path} is not in the document`);
      continue;
    }
    const known = declared(path, verb);
    const query = [...source.matchAll(/setQueryParam\(\s*"([^"]+)"/g)].map((m) => m[1]);
    for (const [, block] of source.matchAll(/setQueryParams\(\{([^}]*)\}/g)) query.push(...[...block.matchAll(/(\w+):/g)].map((m) => m[1]));
    const headers = [...source.matchAll(/setHeaderParam\(\s*"([^"]+)"/g)].map((m) => m[1]);
    for (const key of query) if (!known.has(`query:${key}`)) problems.push(`${name}: the query parameter ${key} is not declared for ${verb.toUpperCase()} ${path}`);
    for (const key of headers) if (!known.has(`header:${key}`)) problems.push(`${name}: the header ${key} is not declared for ${verb.toUpperCase()} ${path}`);
  }
  return problems;
}

async function main() {
  const suite = new Suite(process.env.HERALD_URL, process.env.HERALD_TOKEN);
  const operations = discover(suite.client);
  const receiver = await startReceiver();
  let current = "setup";
  const step = (name) => {
    current = name;
    console.error(`compat: ${name}`);
  };
  try {
    await scenario(suite, receiver, step);
  } catch (err) {
    suite.failures.push(`step '${current}': ${err instanceof Mismatch ? err.message : describe(err)}`);
    if (process.env.COMPAT_DEBUG) console.error(err);
  }
  const unsupported = [...operations.keys()].filter(notOffered).sort();
  for (const name of unsupported) {
    if (suite.called.has(name)) {
      suite.failures.push(`${name} is listed as not offered but the scenario calls it`);
      continue;
    }
    try {
      await checkNotOffered(suite, name);
    } catch (err) {
      suite.failures.push(err instanceof Mismatch ? err.message : describe(err));
    }
  }
  suite.failures.push(...(await checkDocument(operations)));
  if (suite.failures.length === 0) {
    for (const name of [...operations.keys()].sort()) {
      if (!suite.called.has(name) && !notOffered(name)) {
        suite.failures.push(`${name}: an operation of svix ${version} the suite does not know (add it to the scenario or to NOT_OFFERED)`);
      }
    }
  }
  receiver.close();
  for (const failure of suite.failures) {
    console.log(`COMPAT FAILURE svix-javascript ${version}: ${failure}`);
    console.error(`COMPAT FAILURE svix-javascript ${version}: ${failure}`);
  }
  if (suite.failures.length > 0) process.exit(1);
  const supported = operations.size - unsupported.length;
  console.log(`COMPAT OK svix-javascript ${version}: ${operations.size} operations (${supported} supported, ${unsupported.length} not offered)`);
}

await main();
