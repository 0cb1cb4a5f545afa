//! Pull delivery: polling endpoints ("sinks"), the application message stream they read, and their
//! consumers' offsets, for every backend.
//!
//! Every message of an application gets a `seq` in `message_stream` when it commits (a trigger fills it,
//! see the `polling` migrations), in commit order, so a reader that pages by `seq` never skips a message
//! that committed after one it already read. A poll is one index range read of `(app_id, seq)`; the sink's
//! filters (event types, channels) are applied to the rows read, and a poll reads at most
//! [`SCAN_BUDGET`] rows, so a sink whose filters match nothing costs the same as one that matches all —
//! the position still advances past what was read.
//!
//! A long poll waits on a [`StreamSignal`]: this node's group-commit writer moves it at each commit of a
//! new message, and on PostgreSQL the node's stream watcher (`postgres/stream_watcher.rs`) moves it when
//! another node's commit shows in the stream's head, which it reads only while some signal is held.
//!
//! [`PollingStore`] is implemented once for both dialects, in `portable/polling.rs`.

use herald_core::clock::Millis;
use herald_core::id::{AppId, SinkId, SinkIdOrUid};
use herald_core::model::{Message, Metadata};

use tokio::sync::watch;

use crate::{StoreError, StoreResult};

/// The most stream rows one poll reads before it answers (possibly with fewer matches than asked for,
/// and `done = false`), so a poll's cost is bounded whatever the filters.
pub const SCAN_BUDGET: usize = 1_000;

/// A polling endpoint: an application's message stream filtered like an endpoint. `Debug` leaves the
/// secret out.
#[derive(Clone, PartialEq, Eq)]
pub struct PollingEndpoint {
    /// Its id.
    pub id: SinkId,
    /// The owning application's id.
    pub app_id: AppId,
    /// Optional client-chosen id, unique within the app.
    pub uid: Option<String>,
    /// Human description.
    pub description: String,
    /// Event types in the stream; `None` or empty means all.
    pub filter_types: Option<Vec<String>>,
    /// Channels in the stream; `None` or empty means all.
    pub channels: Option<Vec<String>>,
    /// Client labels.
    pub metadata: Metadata,
    /// The key `herald listen` signs forwarded messages with (`whsec_…`), as a pushed delivery would be.
    pub secret: String,
    /// Creation time.
    pub created_at: Millis,
    /// Last change.
    pub updated_at: Millis,
}

impl std::fmt::Debug for PollingEndpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PollingEndpoint")
            .field("id", &self.id)
            .field("app_id", &self.app_id)
            .field("uid", &self.uid)
            .field("filter_types", &self.filter_types)
            .field("channels", &self.channels)
            .field("secret", &"<redacted>")
            .finish_non_exhaustive()
    }
}

impl PollingEndpoint {
    /// Whether a message belongs to this sink's stream: the same subscription rule as an endpoint's
    /// (empty or absent filters match everything; a channel filter needs one channel in common).
    pub fn wants(&self, message: &Message) -> bool {
        herald_core::model::filters_match(
            self.filter_types.as_deref(),
            self.channels.as_deref(),
            &message.event_type,
            message.channels.as_deref(),
        )
    }
}

/// One message of an application's stream with its position.
#[derive(Debug, Clone)]
pub struct StreamEntry {
    /// Its position in the application's stream (the consumers' offset unit).
    pub seq: i64,
    /// The message.
    pub message: Message,
}

/// Where a consumer of a polling endpoint stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConsumerOffset {
    /// Everything up to this `seq` is processed (committed).
    pub committed: i64,
    /// The last `seq` handed out by a poll under a lease (at least `committed`).
    pub leased: i64,
    /// Until when that lease holds: before, the next poll continues after `leased`; after, the batch is
    /// served again from `committed`.
    pub lease_expires_at: Millis,
}

impl ConsumerOffset {
    /// A consumer positioned after `seq`, with nothing leased.
    pub fn at(seq: i64) -> Self {
        Self {
            committed: seq,
            leased: seq,
            lease_expires_at: Millis::EPOCH,
        }
    }

    /// Where the next poll at `now` starts reading: after the leased batch while its lease holds, else
    /// after the committed offset (an uncommitted batch whose lease ended is served again).
    pub fn next_from(&self, now: Millis) -> i64 {
        if now < self.lease_expires_at {
            self.leased.max(self.committed)
        } else {
            self.committed
        }
    }
}

/// Matching messages from one bounded read of a stream.
#[derive(Debug, Clone)]
pub struct StreamPage {
    /// The messages the filter kept, in stream order.
    pub entries: Vec<StreamEntry>,
    /// The position to continue after: the last entry's when the page is full, else the last row read.
    pub position: i64,
    /// Whether the read reached the end of the stream (nothing more is committed yet).
    pub done: bool,
}

impl StreamPage {
    /// Assemble a page from rows read after `from` in stream order: keep up to `limit` that `keep`
    /// accepts. `read_all` says the rows are everything after `from` (the read came back short).
    pub fn assemble(
        from: i64,
        rows: Vec<StreamEntry>,
        limit: usize,
        read_all: bool,
        keep: impl Fn(&Message) -> bool,
    ) -> Self {
        let mut entries = Vec::with_capacity(limit.min(rows.len()));
        let mut position = from;
        let total = rows.len();
        for (index, row) in rows.into_iter().enumerate() {
            position = row.seq;
            if keep(&row.message) {
                entries.push(row);
                if entries.len() == limit {
                    // Full: done only if this was the very last row that exists.
                    let last = index + 1 == total;
                    return Self {
                        entries,
                        position,
                        done: last && read_all,
                    };
                }
            }
        }
        Self {
            entries,
            position,
            done: read_all,
        }
    }
}

/// What a long poll waits on ([`PollingStore::stream_signal`]): it moves whenever a message commits — at
/// once through this node's ingest, and on PostgreSQL through any other node's within a few tens of
/// milliseconds (see [`crate::polling`]). While it lives it counts as a long poll waiting on this node.
pub struct StreamSignal {
    /// The moves, as the node's [`StreamSignals`] make them.
    moved: watch::Receiver<u64>,
    /// How many signals are held, this one counted until it is dropped.
    held: watch::Sender<usize>,
}

impl StreamSignal {
    /// Take every move so far as seen: [`changed`](Self::changed) then waits for the next one.
    pub fn mark_seen(&mut self) {
        self.moved.borrow_and_update();
    }

    /// Whether it moved since it was last marked seen (or made); a dropped store moves nothing.
    pub fn has_moved(&self) -> bool {
        self.moved.has_changed().unwrap_or(false)
    }

    /// Wait until it moves past what was seen (at once if it has already); `Closed` only after the store is
    /// dropped, never while it lives (it holds a sender of the moves).
    pub async fn changed(&mut self) -> StoreResult<()> {
        self.moved.changed().await.map_err(|_| StoreError::Closed)
    }
}

impl Drop for StreamSignal {
    fn drop(&mut self) {
        self.held.send_modify(|held| *held = held.saturating_sub(1));
    }
}

impl std::fmt::Debug for StreamSignal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StreamSignal").finish_non_exhaustive()
    }
}

/// A node's side of its [`StreamSignal`]s: what moves them (the group-commit writer; on PostgreSQL also the
/// stream watcher), and how many are held.
#[derive(Clone)]
pub(crate) struct StreamSignals {
    /// Moved at each commit of a new message.
    moved: watch::Sender<u64>,
    /// How many signals are held: long polls waiting on this node.
    held: watch::Sender<usize>,
}

impl StreamSignals {
    /// A node's signals, none held.
    pub(crate) fn new() -> Self {
        Self {
            moved: watch::Sender::new(0),
            held: watch::Sender::new(0),
        }
    }

    /// A new signal for a long poll, counted as held until it is dropped.
    pub(crate) fn signal(&self) -> StreamSignal {
        self.held.send_modify(|held| *held += 1);
        StreamSignal {
            moved: self.moved.subscribe(),
            held: self.held.clone(),
        }
    }

    /// A message committed: wake every long poll (nobody waiting is fine).
    pub(crate) fn moved(&self) {
        self.moved.send_modify(|version| *version = version.wrapping_add(1));
    }

    /// How many signals are held, as it changes.
    pub(crate) fn held(&self) -> watch::Receiver<usize> {
        self.held.subscribe()
    }
}

herald_sql::bounded_trait! {
/// What pull delivery needs from the store; every [`crate::Store`] is one.
pub trait PollingStore: [Send + Sync + 'static], bounded in crate::bounded::BoundedStore {
    /// Create a polling endpoint; `Conflict("uid")` if its uid is taken within the app, `NotFound` if the
    /// app does not exist. Its secret is sealed like an endpoint's (context: the sink id).
    async fn create_polling_endpoint(&self, sink: &PollingEndpoint) -> StoreResult<()>;
    /// Find a polling endpoint of an app by id or uid.
    async fn get_polling_endpoint(&self, app_id: &AppId, id_or_uid: &SinkIdOrUid) -> StoreResult<PollingEndpoint>;
    /// Up to `limit` polling endpoints of an app with an id after `after`, oldest first.
    async fn list_polling_endpoints(
        &self,
        app_id: &AppId,
        after: Option<&str>,
        limit: usize,
    ) -> StoreResult<Vec<PollingEndpoint>>;
    /// Replace a polling endpoint's fields (by app and id), except its secret.
    async fn update_polling_endpoint(&self, sink: &PollingEndpoint) -> StoreResult<()>;
    /// Delete a polling endpoint and its consumers' offsets.
    async fn delete_polling_endpoint(&self, app_id: &AppId, id: &SinkId) -> StoreResult<()>;
    /// Up to `limit` messages of an app's stream after position `after`, in commit order: one index range
    /// read (see [`crate::polling`]).
    async fn read_stream(&self, app_id: &AppId, after: i64, limit: usize) -> StoreResult<Vec<StreamEntry>>;
    /// The position just before the app's first message created at or after `time`, `None` if there
    /// is none yet.
    async fn stream_position_at(&self, app_id: &AppId, time: Millis) -> StoreResult<Option<i64>>;
    /// The newest position of an app's stream (`0` when it has no message).
    async fn stream_head(&self, app_id: &AppId) -> StoreResult<i64>;
    /// A consumer's offset in a polling endpoint's stream, `None` for a consumer never seen.
    async fn consumer_offset(&self, sink_id: &SinkId, consumer_id: &str) -> StoreResult<Option<ConsumerOffset>>;
    /// Set a consumer's offset and lease outright (creating the consumer); `NotFound` if the sink is gone.
    async fn put_consumer_offset(
        &self,
        sink_id: &SinkId,
        consumer_id: &str,
        offset: &ConsumerOffset,
        now: Millis,
    ) -> StoreResult<()>;
    /// Commit a consumer up to `seq`: the committed offset only moves forward, and a commit covering the
    /// leased batch ends the lease. `NotFound` if the sink is gone.
    async fn commit_consumer(&self, sink_id: &SinkId, consumer_id: &str, seq: i64, now: Millis) -> StoreResult<()>;
}
unbounded {
    /// A signal that moves whenever a new message (of any application) commits, so a long poll can wait
    /// for one instead of polling the database (see [`StreamSignal`]).
    fn stream_signal(&self) -> StreamSignal;
}
forwarded {
    fn stream_signal(&self) -> StreamSignal {
        self.inner.stream_signal()
    }
}
}

/// Rows read by the second and later reads of one poll (the first reads just one more than the page, which
/// is enough when the filters keep everything).
const SCAN_CHUNK: usize = 250;

/// Read the app's stream after `from` and keep up to `limit` messages that `keep` accepts: one index range
/// read when the filters keep most messages, a few more when they keep few, never more than
/// [`SCAN_BUDGET`] rows in all.
pub async fn scan(
    store: &dyn PollingStore,
    app_id: &AppId,
    from: i64,
    limit: usize,
    keep: impl Fn(&Message) -> bool,
) -> StoreResult<StreamPage> {
    let limit = limit.max(1);
    let mut page = StreamPage {
        entries: Vec::new(),
        position: from,
        done: false,
    };
    let mut scanned = 0;
    while scanned < SCAN_BUDGET && page.entries.len() < limit && !page.done {
        let missing = limit - page.entries.len();
        let chunk = if scanned == 0 { missing + 1 } else { SCAN_CHUNK };
        let want = chunk.min(SCAN_BUDGET - scanned);
        let rows = store.read_stream(app_id, page.position, want).await?;
        scanned += want;
        let read_all = rows.len() < want;
        let next = StreamPage::assemble(page.position, rows, missing, read_all, &keep);
        page.entries.extend(next.entries);
        page.position = next.position;
        page.done = next.done;
    }
    Ok(page)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    fn entry(seq: i64, event_type: &str) -> StreamEntry {
        StreamEntry {
            seq,
            message: Message {
                id: herald_core::id::MessageId::new(),
                app_id: herald_core::id::AppId::new(),
                event_id: None,
                event_type: event_type.into(),
                channels: None,
                payload: Arc::from(&b"{}"[..]),
                ordering_key: None,
                tags: None,
                deliver_at: None,
                created_at: Millis::from_unix_ms(seq),
            },
        }
    }

    #[test]
    fn a_page_advances_past_what_it_read_even_when_nothing_matches() {
        let rows = vec![entry(5, "a"), entry(6, "a"), entry(7, "a")];
        let page = StreamPage::assemble(4, rows, 10, false, |m| m.event_type == "b");
        assert!(page.entries.is_empty());
        assert_eq!(page.position, 7);
        assert!(!page.done);
    }

    #[test]
    fn a_full_page_stops_at_its_last_entry() {
        let rows = vec![entry(5, "a"), entry(6, "b"), entry(7, "a"), entry(8, "a")];
        let page = StreamPage::assemble(4, rows, 2, true, |m| m.event_type == "a");
        assert_eq!(page.entries.iter().map(|e| e.seq).collect::<Vec<_>>(), vec![5, 7]);
        assert_eq!(page.position, 7);
        assert!(!page.done, "row 8 is still to be read");
        let empty = StreamPage::assemble(9, Vec::new(), 2, true, |_| true);
        assert_eq!((empty.position, empty.done), (9, true));
    }

    #[test]
    fn a_lease_holds_the_batch_until_it_expires() {
        let offset = ConsumerOffset {
            committed: 10,
            leased: 20,
            lease_expires_at: Millis::from_unix_ms(1_000),
        };
        assert_eq!(offset.next_from(Millis::from_unix_ms(999)), 20);
        assert_eq!(offset.next_from(Millis::from_unix_ms(1_000)), 10);
        assert_eq!(ConsumerOffset::at(3).next_from(Millis::EPOCH), 3);
    }
}
