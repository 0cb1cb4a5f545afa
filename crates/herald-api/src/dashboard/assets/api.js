// The dashboard's only door to Herald: every API call goes through `call`, and every path it may call is
// in ROUTES, one `name: ['METHOD', 'path template'],` a line. crates/herald/tests/dashboard.rs reads this table
// from the served file and checks each entry against the OpenAPI document, so keep that format.

export const ROUTES = {
  tokenInfo: ['GET', '/api/v1/auth/token'],
  listApps: ['GET', '/api/v1/app'],
  getApp: ['GET', '/api/v1/app/{app_id}'],
  listEndpoints: ['GET', '/api/v1/app/{app_id}/endpoint'],
  getEndpoint: ['GET', '/api/v1/app/{app_id}/endpoint/{endpoint_id}'],
  patchEndpoint: ['PATCH', '/api/v1/app/{app_id}/endpoint/{endpoint_id}'],
  endpointStats: ['GET', '/api/v1/app/{app_id}/endpoint/{endpoint_id}/stats'],
  attemptStats: ['GET', '/api/v1/stats/app/{app_id}/ep/{endpoint_id}/attempt'],
  endpointDeliveries: ['GET', '/api/v1/app/{app_id}/endpoint/{endpoint_id}/msg'],
  appDeliveries: ['GET', '/api/v1/app/{app_id}/delivery'],
  listMessages: ['GET', '/api/v1/app/{app_id}/msg'],
  listEvents: ['GET', '/api/v1/app/{app_id}/events'],
  getMessage: ['GET', '/api/v1/app/{app_id}/msg/{msg_id}'],
  messageDestinations: ['GET', '/api/v1/app/{app_id}/msg/{msg_id}/endpoint'],
  messageAttempts: ['GET', '/api/v1/app/{app_id}/attempt/msg/{msg_id}'],
  resend: ['POST', '/api/v1/app/{app_id}/msg/{msg_id}/endpoint/{endpoint_id}/resend'],
  recover: ['POST', '/api/v1/app/{app_id}/endpoint/{endpoint_id}/recover'],
  replayMissing: ['POST', '/api/v1/app/{app_id}/endpoint/{endpoint_id}/replay-missing'],
  getTask: ['GET', '/api/v1/background-task/{task_id}'],
  operationalEvents: ['GET', '/api/v1/operational-event'],
};

/** An error answer of the API: `{code, detail}` with its status (0 when the server could not be reached). */
export class ApiError extends Error {
  constructor(status, code, detail) {
    super(detail);
    this.status = status;
    this.code = code;
  }
}

/** The login of this tab, kept in sessionStorage: it goes when the tab closes. */
export const session = {
  get token() { return sessionStorage.getItem('herald.token') || ''; },
  /** The application of an application token (its id), '' for the admin token. */
  get app() { return sessionStorage.getItem('herald.app') || ''; },
  /** The application's uid or name, to show. */
  get appLabel() { return sessionStorage.getItem('herald.appLabel') || this.app; },
  get admin() { return sessionStorage.getItem('herald.role') === 'admin'; },
  /** A read-only token may only read: the dashboard shows it no button that changes anything. */
  get readOnly() { return sessionStorage.getItem('herald.readOnly') === 'true'; },
  save(token, info, appLabel) {
    sessionStorage.setItem('herald.token', token);
    sessionStorage.setItem('herald.role', info.kind);
    sessionStorage.setItem('herald.app', info.appId || '');
    sessionStorage.setItem('herald.appLabel', appLabel || info.appId || '');
    sessionStorage.setItem('herald.readOnly', String(Boolean(info.readOnly)));
  },
  clear() { sessionStorage.clear(); },
};

/** The URL of a route: each `{param}` filled (encoded), then the query's non-empty values. */
export function url(name, params = {}, query = {}) {
  const route = ROUTES[name];
  if (!route) throw new Error(`unknown API route ${name}`);
  const path = route[1].replace(/\{(\w+)\}/g, (_, key) => {
    if (params[key] == null || params[key] === '') throw new Error(`${name}: missing ${key}`);
    return encodeURIComponent(params[key]);
  });
  const search = new URLSearchParams();
  for (const [key, value] of Object.entries(query)) {
    for (const item of Array.isArray(value) ? value : [value]) {
      if (item != null && item !== '') search.append(key, String(item));
    }
  }
  const text = search.toString();
  return text ? `${path}?${text}` : path;
}

/**
 * The human detail of an error answer: Herald's `{code, detail: "…"}`, or the validation shape the Svix
 * SDKs expect, `{detail: [{loc, msg, type}]}` (each item as `field: message`).
 */
export function detailOf(json, status) {
  const detail = json && json.detail;
  if (typeof detail === 'string' && detail) return detail;
  if (Array.isArray(detail) && detail.length) {
    return detail.map((item) => {
      const loc = Array.isArray(item && item.loc) ? item.loc.filter((part) => part !== 'body').join('.') : '';
      const msg = item && item.msg ? String(item.msg) : 'invalid';
      return loc ? `${loc}: ${msg}` : msg;
    }).join('; ');
  }
  return `HTTP ${status}`;
}

/** Call a route with the session's token; resolves to the JSON answer (null when empty), or throws ApiError. */
export async function call(name, params = {}, { query = {}, body, token } = {}) {
  const headers = { Authorization: `Bearer ${token || session.token}` };
  if (body !== undefined) headers['Content-Type'] = 'application/json';
  let response;
  try {
    response = await fetch(url(name, params, query), {
      method: ROUTES[name][0],
      headers,
      body: body === undefined ? undefined : JSON.stringify(body),
      credentials: 'omit',
      cache: 'no-store',
    });
  } catch (error) {
    throw new ApiError(0, 'unreachable', `Herald could not be reached (${error.message})`);
  }
  const text = await response.text();
  let json = null;
  try { json = text ? JSON.parse(text) : null; } catch { json = null; }
  if (!response.ok) {
    const error = new ApiError(response.status, json && json.code ? String(json.code) : 'error', detailOf(json, response.status));
    if (response.status === 401 && !token) window.dispatchEvent(new CustomEvent('herald:unauthorized'));
    throw error;
  }
  return json;
}

/** Names to show for ids: an application's or endpoint's uid (else its id), read once per page view. */
export function labels() {
  const apps = new Map();
  const endpoints = new Map();
  return {
    /** Remember what a listing already told us. */
    know(endpoint) { if (endpoint && endpoint.id) endpoints.set(endpoint.id, Promise.resolve(endpoint.uid || endpoint.id)); },
    app(appId) {
      if (!apps.has(appId)) apps.set(appId, call('getApp', { app_id: appId }).then((a) => a.uid || a.name || a.id, () => appId));
      return apps.get(appId);
    },
    endpoint(appId, endpointId) {
      if (!endpoints.has(endpointId)) {
        endpoints.set(endpointId, call('getEndpoint', { app_id: appId, endpoint_id: endpointId })
          .then((e) => e.uid || e.id, () => endpointId));
      }
      return endpoints.get(endpointId);
    },
  };
}
