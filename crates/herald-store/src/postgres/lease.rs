//! Scale-out: partition leases, heartbeats and wake-ups for new work.
//!
//! Endpoints hash into [`PARTITIONS`] partitions ([`crate::partition_of`]); a node delivers only for the
//! partitions it leases. The *keeper* task, every quarter of the lease time:
//! 1. heartbeats in `node` (a node is live while its heartbeat is younger than the lease time);
//! 2. renews the leases it holds — any it does not get back were taken over (it was too slow) and are
//!    dropped at once;
//! 3. computes its fair share (`ceil(PARTITIONS / live nodes)`), takes free or expired partitions up to
//!    it (each takeover increments the partition's epoch) and gives up the ones above it.
//!
//! Giving a partition up is a hand-over, not a drop: the node stops scheduling its endpoints at once,
//! keeps the lease until nothing it sent is still in flight and every result is written (the engine's
//! word, [`Ownership::drained`]; at most `release_drain`, the longest attempt and a lease time), and
//! only then clears the lease. So an endpoint's concurrency cap holds across the cluster even while
//! partitions move. When the database cannot be reached, the node stops sending before its leases can
//! expire (a heartbeat early), since another node may then take them.
//!
//! Every write an owner makes (attempt results, expiries) is *fenced*: it share-locks the lease rows
//! and writes only where owner and epoch are still the ones this node holds ([`Leases::fence`]).
//!
//! The *watcher* finds new work for owned partitions. Ingest notifies [`WORK_CHANNEL`] at commit when
//! some of its deliveries are for partitions the ingesting node does not own (its own reach its engine
//! through the commit feed); the watcher (LISTEN, with a poll every heartbeat as the fallback for lost
//! notifications) reads which
//! owned endpoints have pending deliveries committed since its last look. `seq`s follow commit order
//! (see [`super::bulk`]), so "since" is a plain cursor on `seq`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use herald_core::id::EndpointId;
use sqlx::postgres::PgListener;
use sqlx::{PgConnection, PgPool};
use tokio::sync::{Notify, mpsc};
use tokio::task::JoinHandle;

use super::channels::{ENDPOINT_CHANNEL, WORK_CHANNEL};
use crate::{Change, Ownership, OwnershipEvent, PARTITIONS, StoreError, StoreOptions, StoreResult};

/// Dead nodes' rows are deleted after this long without a heartbeat.
const FORGET_NODES_AFTER_MS: i64 = 24 * 3600 * 1000;

/// The partitions this node holds, with their epochs.
#[derive(Default)]
struct Held {
    /// Owned: the engine schedules their endpoints.
    active: HashMap<i32, i64>,
    /// Being given up: not scheduled any more, but the lease is kept (and its writes are valid) until
    /// what was in flight has ended.
    draining: HashMap<i32, Draining>,
}

/// A partition being given up.
#[derive(Clone, Copy)]
struct Draining {
    epoch: i64,
    /// The engine reported nothing of it in flight any more ([`Ownership::drained`]).
    drained: bool,
}

/// This node's leases: what the engine may deliver, and the fence for the store's writes.
pub(crate) struct Leases {
    node_id: String,
    held: RwLock<Held>,
    events: mpsc::UnboundedSender<OwnershipEvent>,
    events_rx: Mutex<Option<mpsc::UnboundedReceiver<OwnershipEvent>>>,
    /// Held by the watcher across "which partitions do I own" and its query, and by a takeover across
    /// "own" and "list the backlog": so no committed delivery falls between the two.
    scan: tokio::sync::Mutex<()>,
    /// Woken when the engine reports partitions drained.
    drained_changed: Notify,
}

impl Ownership for Leases {
    fn owns_partition(&self, partition: i32) -> bool {
        self.held
            .read()
            .map(|held| held.active.contains_key(&partition))
            .unwrap_or(false)
    }

    fn take_events(&self) -> Option<mpsc::UnboundedReceiver<OwnershipEvent>> {
        self.events_rx.lock().ok()?.take()
    }

    fn drained(&self, partitions: &[i32]) {
        let Ok(mut held) = self.held.write() else {
            return;
        };
        // Only a partition still draining: word about one already cleared (its drain ran out) must not
        // cut short a later hand-over of the same partition.
        for partition in partitions {
            if let Some(draining) = held.draining.get_mut(partition) {
                draining.drained = true;
            }
        }
        drop(held);
        self.drained_changed.notify_waiters();
    }
}

impl Leases {
    pub(crate) fn node_id(&self) -> &str {
        &self.node_id
    }

    /// Every held lease (active and draining), as (partitions, epochs).
    fn held(&self, only: Option<&[i32]>) -> (Vec<i32>, Vec<i64>) {
        let Ok(held) = self.held.read() else {
            return (Vec::new(), Vec::new());
        };
        held.active
            .iter()
            .chain(held.draining.iter().map(|(p, d)| (p, &d.epoch)))
            .filter(|(p, _)| only.is_none_or(|only| only.contains(p)))
            .map(|(p, e)| (*p, *e))
            .unzip()
    }

    /// Whether this node owns (actively, not draining) every one of `partitions`: then no other node
    /// has to hear of deliveries in them.
    pub(crate) fn owns_all(&self, partitions: &[i32]) -> bool {
        self.held
            .read()
            .map(|held| partitions.iter().all(|p| held.active.contains_key(p)))
            .unwrap_or(false)
    }

    /// Whether this node holds the lease of every partition: it is the cluster's only node (or the only
    /// one that has joined so far).
    pub(crate) fn owns_every_partition(&self) -> bool {
        self.counts().0 >= crate::PARTITIONS as usize
    }

    fn counts(&self) -> (usize, usize) {
        self.held
            .read()
            .map(|h| (h.active.len(), h.draining.len()))
            .unwrap_or((0, 0))
    }

    /// The partitions whose leases this node still holds in the database, share-locked until the
    /// transaction on `conn` ends: writes made in it for these partitions cannot race a takeover.
    pub(crate) async fn fence(&self, conn: &mut PgConnection) -> StoreResult<Vec<i32>> {
        self.fence_in(conn, None).await
    }

    /// Like [`Leases::fence`], for the partitions in `wanted` only.
    pub(crate) async fn fence_some(&self, conn: &mut PgConnection, wanted: &[i32]) -> StoreResult<Vec<i32>> {
        self.fence_in(conn, Some(wanted)).await
    }

    async fn fence_in(&self, conn: &mut PgConnection, wanted: Option<&[i32]>) -> StoreResult<Vec<i32>> {
        let (partitions, epochs) = self.held(wanted);
        if partitions.is_empty() {
            return Ok(Vec::new());
        }
        // Locked in partition order, like the keeper's renewal, so the two never deadlock.
        Ok(sqlx::query_scalar(
            "SELECT l.partition FROM partition_lease l \
             JOIN UNNEST($1::int[], $2::bigint[]) AS h (partition, epoch) \
             ON h.partition = l.partition AND h.epoch = l.epoch \
             WHERE l.owner = $3 ORDER BY l.partition FOR SHARE OF l",
        )
        .bind(partitions)
        .bind(epochs)
        .bind(&self.node_id)
        .fetch_all(&mut *conn)
        .await?)
    }

    /// Leave the cluster (the node is stopping): stop owning anything, then release every lease and the
    /// node's row, so that the other nodes take the partitions over at their next heartbeat.
    pub(crate) async fn leave(&self, pool: &PgPool) -> StoreResult<()> {
        let (partitions, epochs) = self.held(None);
        self.update(|held| {
            held.active.clear();
            held.draining.clear();
        });
        self.emit(OwnershipEvent::Released(partitions.clone()));
        release(pool, &self.node_id, &partitions, &epochs).await?;
        sqlx::query("DELETE FROM node WHERE id = $1")
            .bind(&self.node_id)
            .execute(pool)
            .await?;
        Ok(())
    }

    /// Wait until the engine has reported some of `draining` drained ([`Ownership::drained`]); those.
    async fn next_drained(&self, draining: &[(i32, i64)]) -> Vec<(i32, i64)> {
        loop {
            // Registered before the check, so a report landing between the two still wakes this.
            let changed = self.drained_changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            let drained: Vec<(i32, i64)> = self
                .held
                .read()
                .map(|held| {
                    draining
                        .iter()
                        .filter(|(p, e)| held.draining.get(p).is_some_and(|d| d.epoch == *e && d.drained))
                        .copied()
                        .collect()
                })
                .unwrap_or_default();
            if !drained.is_empty() {
                return drained;
            }
            changed.await;
        }
    }

    /// Clear the leases of these drained partitions for their next owner, and stop holding them.
    async fn clear(&self, pool: &PgPool, drained: &[(i32, i64)]) {
        if drained.is_empty() {
            return;
        }
        let (partitions, epochs): (Vec<i32>, Vec<i64>) = drained.iter().copied().unzip();
        // If this fails the lease simply expires; either way this node is done with them.
        if let Err(error) = release(pool, &self.node_id, &partitions, &epochs).await {
            tracing::warn!(%error, "clearing released leases failed; they expire instead");
        }
        self.update(|held| {
            for (p, e) in drained {
                if held.draining.get(p).is_some_and(|d| d.epoch == *e) {
                    held.draining.remove(p);
                }
            }
        });
    }

    fn emit(&self, event: OwnershipEvent) {
        // Nobody listens when no engine runs on this store (e.g. in store tests): nothing to tell then.
        let _ = self.events.send(event);
    }

    fn update<T>(&self, change: impl FnOnce(&mut Held) -> T) -> Option<T> {
        self.held.write().ok().map(|mut held| change(&mut held))
    }
}

/// Lease timing derived from the lease time.
#[derive(Debug, Clone, Copy)]
struct Timing {
    ttl: Duration,
    heartbeat: Duration,
    drain: Duration,
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// Join the cluster: take this node's share of the partitions now (so a lone node owns everything as
/// soon as the store is open), then keep the leases and watch for work in the background.
pub(crate) async fn start(
    pool: PgPool,
    options: &StoreOptions,
    changes: mpsc::UnboundedSender<Change>,
) -> StoreResult<(Arc<Leases>, Vec<JoinHandle<()>>)> {
    let (events, events_rx) = mpsc::unbounded_channel();
    let leases = Arc::new(Leases {
        node_id: format!("node_{}", uuid::Uuid::new_v4().simple()),
        held: RwLock::new(Held::default()),
        events,
        events_rx: Mutex::new(Some(events_rx)),
        scan: tokio::sync::Mutex::new(()),
        drained_changed: Notify::new(),
    });
    let ttl = options.lease_ttl.max(Duration::from_secs(1));
    let timing = Timing {
        ttl,
        heartbeat: ttl / 4,
        drain: options.release_drain,
    };
    // Read before the first takeover: work committed after this is found by the watcher, work committed
    // before it by the takeover's own scan.
    let cursor: i64 = sqlx::query_scalar("SELECT COALESCE(MAX(seq), 0) FROM delivery")
        .fetch_one(&pool)
        .await?;
    let mut keeper = Keeper {
        pool: pool.clone(),
        leases: leases.clone(),
        timing,
        renewed_at: None,
        unscanned: Vec::new(),
    };
    keeper.round().await?;
    let wake = Arc::new(Notify::new());
    let tasks = vec![
        tokio::spawn(keeper.run()),
        tokio::spawn(listen(pool.clone(), leases.clone(), changes, wake.clone())),
        tokio::spawn(watch(pool, leases.clone(), cursor, wake, timing.heartbeat)),
    ];
    Ok((leases, tasks))
}

struct Keeper {
    pool: PgPool,
    leases: Arc<Leases>,
    timing: Timing,
    /// When the last successful renewal started: the leases are valid until about `ttl` after it.
    renewed_at: Option<Instant>,
    /// Partitions taken over whose pending work could not be listed yet.
    unscanned: Vec<i32>,
}

impl Keeper {
    async fn run(mut self) {
        let mut tick = tokio::time::interval(self.timing.heartbeat);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await;
        loop {
            tick.tick().await;
            // A slow round is fine as long as the leases stay valid: it starts at most a heartbeat after
            // the last renewal, so timing out after half the lease time lands exactly where the leases
            // must be given up (a heartbeat before they can expire). Shorter, a busy database or machine
            // would make the node drop its partitions for nothing.
            let result = match tokio::time::timeout(self.timing.ttl / 2, self.round()).await {
                Ok(Ok(())) => "ok",
                Ok(Err(error)) => {
                    tracing::warn!(%error, "partition lease round failed");
                    "error"
                }
                Err(_) => {
                    tracing::warn!("partition lease round timed out");
                    "timeout"
                }
            };
            self.give_up_if_stale();
            let (active, draining) = self.leases.counts();
            crate::metrics::lease_round(result, active, draining);
        }
    }

    /// Without a renewal for nearly a lease time, another node may take the partitions any moment:
    /// stop sending now (a heartbeat early, so clocks running at slightly different rates cannot
    /// overlap two owners).
    fn give_up_if_stale(&mut self) {
        let stale = self
            .renewed_at
            .is_some_and(|at| at.elapsed() + self.timing.heartbeat >= self.timing.ttl);
        if !stale {
            return;
        }
        let dropped: Vec<i32> = self
            .leases
            .update(|held| {
                held.active
                    .drain()
                    .map(|(p, _)| p)
                    .chain(held.draining.drain().map(|(p, _)| p))
                    .collect()
            })
            .unwrap_or_default();
        if !dropped.is_empty() {
            tracing::warn!(
                partitions = dropped.len(),
                "lost contact with the database: giving up every partition"
            );
            self.leases.emit(OwnershipEvent::Released(dropped));
        }
        self.renewed_at = None;
    }

    async fn round(&mut self) -> StoreResult<()> {
        let started = Instant::now();
        let node = &self.leases.node_id;
        let ttl = millis(self.timing.ttl);
        sqlx::query(
            "INSERT INTO node (id, started_at, heartbeat_at) VALUES ($1, now(), now()) \
             ON CONFLICT (id) DO UPDATE SET heartbeat_at = now()",
        )
        .bind(node)
        .execute(&self.pool)
        .await?;

        let (partitions, epochs) = self.leases.held(None);
        let renewed: Vec<i32> = if partitions.is_empty() {
            Vec::new()
        } else {
            sqlx::query_scalar(
                "UPDATE partition_lease l SET expires_at = now() + $4::bigint * interval '1 millisecond' \
                 WHERE l.partition IN (SELECT k.partition FROM partition_lease k \
                 JOIN UNNEST($1::int[], $2::bigint[]) AS h (partition, epoch) \
                 ON h.partition = k.partition AND h.epoch = k.epoch \
                 WHERE k.owner = $3 ORDER BY k.partition FOR UPDATE OF k) RETURNING l.partition",
            )
            .bind(&partitions)
            .bind(&epochs)
            .bind(node)
            .bind(ttl)
            .fetch_all(&self.pool)
            .await?
        };
        self.renewed_at = Some(started);
        let lost: Vec<i32> = self
            .leases
            .update(|held| {
                let lost: Vec<i32> = held.active.keys().filter(|p| !renewed.contains(p)).copied().collect();
                held.active.retain(|p, _| renewed.contains(p));
                held.draining.retain(|p, _| renewed.contains(p));
                lost
            })
            .unwrap_or_default();
        if !lost.is_empty() {
            tracing::warn!(partitions = lost.len(), "partitions were taken over by another node");
            self.leases.emit(OwnershipEvent::Released(lost));
        }

        let live: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM node WHERE heartbeat_at > now() - $1::bigint * interval '1 millisecond'",
        )
        .bind(ttl)
        .fetch_one(&self.pool)
        .await?;
        let live = usize::try_from(live.max(1)).unwrap_or(1);
        let total = usize::try_from(PARTITIONS).unwrap_or(0);
        let share = total.div_ceil(live);
        let (active, draining) = self.leases.counts();
        // Only active partitions are given up: the draining ones are already on their way out. Counting
        // them here gave up the rest of a node's partitions at its next heartbeat, so a second node's
        // arrival stopped every delivery of the cluster for the whole drain.
        if active > share {
            self.release(active - share);
        } else {
            let leases = self.leases.clone();
            let _scan = leases.scan.lock().await;
            if active + draining < share {
                self.take(share - active - draining).await?;
            }
            self.scan_taken().await?;
        }

        sqlx::query("DELETE FROM node WHERE heartbeat_at < now() - $1::bigint * interval '1 millisecond'")
            .bind(FORGET_NODES_AFTER_MS)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// Take up to `want` free or expired partitions.
    async fn take(&mut self, want: usize) -> StoreResult<()> {
        let taken: Vec<(i32, i64)> = sqlx::query_as(
            "UPDATE partition_lease SET owner = $1, epoch = epoch + 1, \
             expires_at = now() + $2::bigint * interval '1 millisecond' \
             WHERE partition IN (SELECT partition FROM partition_lease \
             WHERE owner IS NULL OR expires_at < now() ORDER BY partition LIMIT $3 FOR UPDATE SKIP LOCKED) \
             RETURNING partition, epoch",
        )
        .bind(&self.leases.node_id)
        .bind(millis(self.timing.ttl))
        .bind(i64::try_from(want).unwrap_or(0))
        .fetch_all(&self.pool)
        .await?;
        if taken.is_empty() {
            return Ok(());
        }
        tracing::info!(partitions = taken.len(), "took over partitions");
        // Owned before their work is listed, so the watcher cannot miss work committed in between.
        self.leases.update(|held| held.active.extend(taken.iter().copied()));
        self.unscanned.extend(taken.iter().map(|(p, _)| *p));
        Ok(())
    }

    /// Tell the engine about the pending deliveries of partitions just taken over: the previous owner's
    /// backlog, including what it had in flight (sent again: at-least-once, same `webhook-id`).
    async fn scan_taken(&mut self) -> StoreResult<()> {
        if self.unscanned.is_empty() {
            return Ok(());
        }
        let endpoints: Vec<String> =
            sqlx::query_scalar("SELECT DISTINCT endpoint_id FROM delivery WHERE status = 0 AND partition = ANY($1)")
                .bind(&self.unscanned)
                .fetch_all(&self.pool)
                .await?;
        let endpoints = endpoint_ids(endpoints)?;
        self.unscanned.clear();
        if !endpoints.is_empty() {
            self.leases.emit(OwnershipEvent::Work(endpoints));
        }
        Ok(())
    }

    /// Stop scheduling `count` partitions now, and clear their leases once what was in flight has ended.
    fn release(&self, count: usize) {
        let released: Vec<(i32, i64)> = self
            .leases
            .update(|held| {
                let mut highest: Vec<(i32, i64)> = held.active.iter().map(|(p, e)| (*p, *e)).collect();
                highest.sort_unstable_by_key(|&(p, _)| std::cmp::Reverse(p));
                highest.truncate(count);
                for (p, e) in &highest {
                    held.active.remove(p);
                    held.draining.insert(
                        *p,
                        Draining {
                            epoch: *e,
                            drained: false,
                        },
                    );
                }
                highest
            })
            .unwrap_or_default();
        if released.is_empty() {
            return;
        }
        tracing::info!(partitions = released.len(), "giving up partitions to other nodes");
        self.leases
            .emit(OwnershipEvent::Released(released.iter().map(|(p, _)| *p).collect()));
        let pool = self.pool.clone();
        let leases = self.leases.clone();
        let drain = self.timing.drain;
        tokio::spawn(async move {
            // Each partition is cleared as soon as the engine says nothing of it is in flight any more,
            // the rest when `release_drain` has passed (a store without an engine, an attempt that
            // hangs): one slow endpoint holds back only its own partition.
            let deadline = tokio::time::Instant::now() + drain;
            let mut waiting = released;
            while !waiting.is_empty() {
                let ready = tokio::time::timeout_at(deadline, leases.next_drained(&waiting)).await;
                let cleared: Vec<(i32, i64)> = match ready {
                    Ok(drained) => drained,
                    Err(_) => waiting.clone(),
                };
                waiting.retain(|held| !cleared.contains(held));
                leases.clear(&pool, &cleared).await;
            }
        });
    }
}

/// Clear leases this node holds (same owner and epoch), so that any node may take them at once. Rows are
/// locked in partition order, like every other lease write, so this never deadlocks with them.
async fn release(pool: &PgPool, node_id: &str, partitions: &[i32], epochs: &[i64]) -> StoreResult<()> {
    if partitions.is_empty() {
        return Ok(());
    }
    sqlx::query(
        "UPDATE partition_lease l SET owner = NULL, expires_at = '-infinity' \
         WHERE l.partition IN (SELECT k.partition FROM partition_lease k \
         JOIN UNNEST($1::int[], $2::bigint[]) AS h (partition, epoch) \
         ON h.partition = k.partition AND h.epoch = k.epoch \
         WHERE k.owner = $3 ORDER BY k.partition FOR UPDATE OF k)",
    )
    .bind(partitions)
    .bind(epochs)
    .bind(node_id)
    .execute(pool)
    .await?;
    Ok(())
}

/// Forward `NOTIFY herald_work` from other nodes to the watcher, and endpoint changes to the engine,
/// reconnecting as needed. A (re)connection wakes the watcher too: notifications sent while
/// disconnected are lost.
async fn listen(pool: PgPool, leases: Arc<Leases>, changes: mpsc::UnboundedSender<Change>, wake: Arc<Notify>) {
    loop {
        let mut listener = match PgListener::connect_with(&pool).await {
            Ok(listener) => listener,
            Err(error) => {
                tracing::debug!(%error, "work listener cannot connect; polling meanwhile");
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        if let Err(error) = listener.listen_all([WORK_CHANNEL, ENDPOINT_CHANNEL]).await {
            tracing::debug!(%error, "LISTEN failed; polling meanwhile");
            tokio::time::sleep(Duration::from_secs(1)).await;
            continue;
        }
        wake.notify_one();
        loop {
            match listener.try_recv().await {
                Ok(Some(notification)) if notification.channel() == ENDPOINT_CHANNEL => {
                    match EndpointId::parse(notification.payload()) {
                        // Into the change stream, where this node's own changes are announced too.
                        Ok(endpoint) => {
                            let _ = changes.send(Change::Endpoint(endpoint));
                        }
                        Err(error) => tracing::warn!(%error, "an endpoint change named no endpoint; ignored"),
                    }
                }
                Ok(Some(notification)) => {
                    // This node's own ingests reach its engine through the commit feed.
                    if notification.payload() != leases.node_id {
                        wake.notify_one();
                    }
                }
                Ok(None) => wake.notify_one(),
                Err(error) => {
                    tracing::debug!(%error, "work listener lost its connection");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    break;
                }
            }
        }
    }
}

/// Look for new work in owned partitions when notified, and every `poll` regardless.
async fn watch(pool: PgPool, leases: Arc<Leases>, mut cursor: i64, wake: Arc<Notify>, poll: Duration) {
    let mut tick = tokio::time::interval(poll);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = wake.notified() => {}
            _ = tick.tick() => {}
        }
        let _scan = leases.scan.lock().await;
        let owned: Vec<i32> = match leases.held.read() {
            Ok(held) => held.active.keys().copied().collect(),
            Err(_) => continue,
        };
        // One snapshot for both: everything up to `top` is visible in it, and anything committed later
        // has a greater seq.
        let found = sqlx::query_as::<_, (i64, Vec<String>)>(
            "SELECT (SELECT COALESCE(MAX(seq), 0) FROM delivery), \
             ARRAY(SELECT DISTINCT endpoint_id FROM delivery WHERE status = 0 AND seq > $1 AND partition = ANY($2))",
        )
        .bind(cursor)
        .bind(&owned)
        .fetch_one(&pool)
        .await
        .map_err(StoreError::from)
        .and_then(|(top, endpoints)| Ok((top, endpoint_ids(endpoints)?)));
        match found {
            Ok((top, endpoints)) => {
                cursor = cursor.max(top);
                if !endpoints.is_empty() {
                    leases.emit(OwnershipEvent::Work(endpoints));
                }
                // After the work it covers, on the same channel: the engine reads them in this order.
                leases.emit(OwnershipEvent::Seen(top));
            }
            Err(error) => tracing::debug!(%error, "looking for new work failed; retrying at the next poll"),
        }
    }
}
/// Endpoint ids read from the `delivery` table, checked.
fn endpoint_ids(texts: Vec<String>) -> StoreResult<Vec<EndpointId>> {
    texts
        .into_iter()
        .map(|text| crate::rows::id_of("endpoint_id", text))
        .collect()
}
