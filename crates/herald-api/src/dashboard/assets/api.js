// The dashboard's only door to Herald: every API call goes through `call`, and every path it may call is
// in ROUTES, one `name: ['METHOD', 'path template'],` a line. crates/herald/tests/dashboard.rs reads this table
// from the served file and checks each entry against the OpenAPI document, so keep that format.

export const ROUTES = {
  listApps: ['GET', '/api/v1/app'],
  getApp: ['GET', '/api/v1/app/{app_id}'],
  listEndpoints: ['GET', '/api/v1/app/{app_id}/endpoint'],
  getEndpoint: ['GET', '/api/v1/app/{app_id}/endpoint/{endpoint_id}'],
  patchEndpoint: ['PATCH', '/api/v1/app/{app_id}/endpoint/{endpoint_id}'],
  endpointStats: ['GET', '/api/v1/app/{app_id}/endpoint/{endpoint_id}/stats'],
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
  get app() { return sessionStorage.getItem('herald.app') || ''; },
  get admin() { return sessionStorage.getItem('herald.role') === 'admin'; },
  save(token, app, admin) {
    sessionStorage.setItem('herald.token', token);
    sessionStorage.setItem('herald.app', app);
    sessionStorage.setItem('herald.role', admin ? 'admin' : 'app');
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

/** Call a route with the session's token; resolves to the JSON answer (null when empty), or throws ApiError. */
export async function call(name, params = {}, { query = {}, body } = {}) {
  const headers = { Authorization: `Bearer ${session.token}` };
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
    const detail = json && typeof json.detail === 'string' ? json.detail : `HTTP ${response.status}`;
    const error = new ApiError(response.status, json && json.code ? String(json.code) : 'error', detail);
    if (response.status === 401) window.dispatchEvent(new CustomEvent('herald:unauthorized'));
    throw error;
  }
  return json;
}
