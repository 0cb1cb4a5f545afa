//! Who a new message fans out to: each application's endpoints as fan-out sees them, and a cache of them.
//!
//! Fan-out needs three things of an endpoint — its id and its subscription (event types and channels) —
//! so that is all the ingest writer reads ([`COLUMNS`]), never the secrets, headers or metadata a full
//! [`Endpoint`](herald_core::model::Endpoint) decodes.
//!
//! An application with 1,000 endpoints would still have 1,000 rows read and decoded for every message,
//! although endpoints change rarely and messages often. So each ingest writer keeps each application's
//! list in a [`Cache`], checked against the application's `endpoints_version`: a counter that triggers on
//! the `endpoint` table bump in the same transaction as every insert and delete of one of the
//! application's endpoints and every update of one (SQLite's migration `0026_endpoints_version.sql`), or
//! every update of what fan-out reads of one (PostgreSQL's `0028_fan_out_without_row_checks.sql`). The
//! batch reads the counter with the query that checks the application exists, inside its own
//! transaction — or, on SQLite, when the writer remembers the app's row, checks the remembered counter in
//! its inserts instead (`sqlite::known_apps`) — so a cached list is used only while it is exactly what
//! the table holds: no endpoint write path can forget to invalidate it, since the database does it. On PostgreSQL the batch reads the
//! counters `FOR SHARE`: an endpoint write on any node that bumps the counter waits for the batches
//! fanning out to that application; a batch that finds the row held by such a write skips it and defers
//! the application's messages to a later batch (see `postgres::bulk`), rather than wait with the ingest
//! lock held.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};

use herald_core::id::{AppId, EndpointId};
use herald_core::model::{Message, filters_match};

use crate::StoreResult;
use crate::plan::Apps;
use crate::rows::{Columns, decode_list};

/// The `endpoint` columns [`Subscriber::from_row`] reads.
pub(crate) const COLUMNS: &str = "id, app_id, filter_types, channels";

/// An endpoint as fan-out sees it (disabled endpoints included: their deliveries wait until the endpoint
/// is enabled again, or expire).
#[derive(Debug, Clone)]
pub(crate) struct Subscriber {
    pub(crate) id: EndpointId,
    pub(crate) app_id: AppId,
    filter_types: Option<Vec<String>>,
    channels: Option<Vec<String>>,
}

impl Subscriber {
    /// Decode the [`COLUMNS`] of a row of `endpoint`.
    pub(crate) fn from_row(row: &impl Columns) -> StoreResult<Self> {
        Ok(Self {
            id: row.id("id")?,
            app_id: row.id("app_id")?,
            filter_types: decode_list(row.opt_text("filter_types")?)?,
            channels: decode_list(row.opt_text("channels")?)?,
        })
    }

    /// Whether `message` goes to this endpoint by subscription (the endpoints' rule, see
    /// [`filters_match`]).
    pub(crate) fn takes(&self, message: &Message) -> bool {
        filters_match(
            self.filter_types.as_deref(),
            self.channels.as_deref(),
            &message.event_type,
            message.channels.as_deref(),
        )
    }
}

/// Each application's subscribers, by application id.
pub(crate) type ByApp = HashMap<AppId, Arc<[Subscriber]>>;

/// Group decoded subscribers by application; every app of `app_ids` gets an entry, empty when it has no
/// endpoint (so an app without endpoints is cached too).
pub(crate) fn group(app_ids: &[&str], subscribers: Vec<Subscriber>) -> StoreResult<ByApp> {
    let mut lists: HashMap<AppId, Vec<Subscriber>> = HashMap::with_capacity(app_ids.len());
    for app_id in app_ids {
        lists.insert(crate::rows::id_of("app_id", (*app_id).to_owned())?, Vec::new());
    }
    for subscriber in subscribers {
        lists.entry(subscriber.app_id.clone()).or_default().push(subscriber);
    }
    Ok(lists.into_iter().map(|(app, list)| (app, Arc::from(list))).collect())
}

/// What the batch's first read gives of each application that exists: its id, its default payload
/// retention in days, and its `endpoints_version`.
pub(crate) type AppRow = (String, Option<i64>, i64);

/// The apps of a batch that exist, with their payload retention ([`Apps`]), and each one's
/// `endpoints_version` (for [`Cache::resolve`]).
pub(crate) fn existing_apps(found: Vec<AppRow>) -> (Apps, Vec<(String, i64)>) {
    let mut apps = Apps::with_capacity(found.len());
    let mut versions = Vec::with_capacity(found.len());
    for (id, days, version) in found {
        apps.insert(id.clone(), crate::plan::retention_ms(days));
        versions.push((id, version));
    }
    (apps, versions)
}

/// The most subscribers (plus one per application) the [`Cache`] holds; past it, it starts again empty
/// (a node serving more endpoints than this reads the lists of the apps in each batch afresh, as without
/// a cache). About 200 bytes each with their filters: tens of megabytes at most.
const MAX_CACHED: usize = 200_000;

/// Each application's subscribers as last read, with the `endpoints_version` they were read at.
#[derive(Default)]
pub(crate) struct Cache {
    apps: Mutex<CacheState>,
}

#[derive(Default)]
struct CacheState {
    lists: HashMap<AppId, (i64, Arc<[Subscriber]>)>,
    held: usize,
}

impl Cache {
    /// Split `versions` (each app of a batch and an `endpoints_version`: the current one, read in the
    /// batch's transaction, or one the batch's inserts check) into the lists the cache holds at exactly
    /// that version, and the apps whose list must be read.
    pub(crate) fn lookup<'a>(&self, versions: &[(&'a str, i64)]) -> (ByApp, Vec<&'a str>) {
        let state = self.apps.lock().unwrap_or_else(PoisonError::into_inner);
        let mut found = ByApp::with_capacity(versions.len());
        let mut stale = Vec::new();
        for &(app_id, version) in versions {
            match state.lists.get_key_value(app_id) {
                Some((app, (cached, list))) if *cached == version => {
                    found.insert(app.clone(), list.clone());
                }
                _ => stale.push(app_id),
            }
        }
        (found, stale)
    }

    /// Each app's subscribers at its `endpoints_version` in `versions`: from the cache where it holds the
    /// app's list at exactly that version, else read by `read` (given the apps whose lists it must read)
    /// and remembered. `versions` must have been read in the batch's transaction, as `read` is run, so
    /// that no endpoint write commits in between (SQLite: its one writer; PostgreSQL: the application
    /// rows read `FOR SHARE`, see `postgres::bulk`).
    pub(crate) async fn resolve<'a, Fut>(
        &self,
        versions: &'a [(String, i64)],
        read: impl FnOnce(Vec<&'a str>) -> Fut,
    ) -> StoreResult<ByApp>
    where
        Fut: Future<Output = StoreResult<Vec<Subscriber>>>,
    {
        let versions: Vec<(&str, i64)> = versions.iter().map(|(id, v)| (id.as_str(), *v)).collect();
        let (mut found, stale) = self.lookup(&versions);
        if stale.is_empty() {
            return Ok(found);
        }
        let read = group(&stale, read(stale.clone()).await?)?;
        self.remember(&versions, &read);
        found.extend(read);
        Ok(found)
    }

    /// Remember lists read at `versions` (the same versions [`Cache::lookup`] was given).
    pub(crate) fn remember(&self, versions: &[(&str, i64)], read: &ByApp) {
        let mut state = self.apps.lock().unwrap_or_else(PoisonError::into_inner);
        for &(app_id, version) in versions {
            let Some((app, list)) = read.get_key_value(app_id) else {
                continue;
            };
            if let Some((_, old)) = state.lists.remove(app_id) {
                state.held -= cost(&old);
            }
            if state.held + cost(list) > MAX_CACHED {
                state.lists.clear();
                state.held = 0;
            }
            state.held += cost(list);
            state.lists.insert(app.clone(), (version, list.clone()));
        }
    }
}

/// What a list counts against [`MAX_CACHED`]: its subscribers, and one for the entry itself, so that many
/// apps without endpoints (or deleted ones, never looked up again) cannot grow the cache without bound.
fn cost(list: &[Subscriber]) -> usize {
    list.len() + 1
}

#[cfg(test)]
mod tests {
    use super::*;

    fn subscriber(app: &AppId) -> Subscriber {
        Subscriber {
            id: EndpointId::new(),
            app_id: app.clone(),
            filter_types: None,
            channels: None,
        }
    }

    #[test]
    fn a_list_is_used_only_at_the_version_it_was_read_at() {
        let app = AppId::new();
        let cache = Cache::default();
        let at_one = [(app.as_str(), 1)];
        let (found, stale) = cache.lookup(&at_one);
        assert!(found.is_empty());
        assert_eq!(stale, vec![app.as_str()]);

        let read = group(&[app.as_str()], vec![subscriber(&app), subscriber(&app)]).expect("grouped");
        cache.remember(&at_one, &read);
        let (found, stale) = cache.lookup(&at_one);
        assert!(stale.is_empty());
        assert_eq!(found.get(app.as_str()).map(|l| l.len()), Some(2));

        let at_two = [(app.as_str(), 2)];
        let (found, stale) = cache.lookup(&at_two);
        assert!(found.is_empty(), "a list read at version 1 is stale at version 2");
        assert_eq!(stale, vec![app.as_str()]);
    }

    #[test]
    fn an_app_without_endpoints_is_cached_as_an_empty_list() {
        let app = AppId::new();
        let cache = Cache::default();
        let versions = [(app.as_str(), 0)];
        let read = group(&[app.as_str()], Vec::new()).expect("grouped");
        cache.remember(&versions, &read);
        let (found, stale) = cache.lookup(&versions);
        assert!(stale.is_empty());
        assert_eq!(found.get(app.as_str()).map(|l| l.len()), Some(0));
    }

    #[test]
    fn the_cache_starts_again_when_it_would_hold_too_many() {
        let (big, small) = (AppId::new(), AppId::new());
        let cache = Cache::default();
        let big_list: Vec<_> = (0..MAX_CACHED - 1).map(|_| subscriber(&big)).collect();
        let versions = [(big.as_str(), 0)];
        cache.remember(&versions, &group(&[big.as_str()], big_list).expect("grouped"));
        let other = [(small.as_str(), 0)];
        cache.remember(
            &other,
            &group(&[small.as_str()], vec![subscriber(&small)]).expect("grouped"),
        );
        let (_, stale) = cache.lookup(&versions);
        assert_eq!(stale, vec![big.as_str()], "the big list was dropped to make room");
        let (found, _) = cache.lookup(&other);
        assert_eq!(found.get(small.as_str()).map(|l| l.len()), Some(1));
    }
}
