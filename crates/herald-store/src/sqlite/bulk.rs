//! SQLite's half of group commit: the reads that plan a batch and the multi-row writes.
//!
//! Per message, the careful path (see [`crate::group_commit`]) costs a savepoint, a duplicate lookup, an
//! insert and one insert per delivery — each a round trip to SQLite's connection thread. Here the batch
//! is *planned* first ([`crate::plan`]: which apps exist, which messages repeat an earlier `eventId` or
//! `idempotency-key`, which endpoints each new message fans out to) with one query each, and then
//! written in as few calls as its size allows: the multi-row `INSERT`s of every table in one statement
//! text (see [`insert_rows`]). Anything the plan did not foresee fails a statement; the writer then rolls
//! back and replays the batch on the careful path, so a surprise costs speed, never custody. The apps'
//! read is skipped when the writer remembers every app of the batch ([`KnownApps`], checked by the
//! inserts themselves), so that a batch of new messages (up to 1,024 deliveries, with no attempt results
//! beside it) is one call to SQLite's thread, `BEGIN` to `COMMIT`.
//!
//! Several statements in one text with bound values is a feature of sqlx's SQLite driver alone, which
//! sqlx has marked deprecated for its `*_many` calls (launchbadge/sqlx#3108). The store tests pin what
//! these calls rely on — every statement runs, its values bound in order, the last rowid is the last
//! statement's — (`the_seqs_an_ingest_answers_are_the_rows_it_stored`,
//! `attempts_update_deliveries_and_can_disable_the_endpoint`), so an sqlx that changed it fails them.
//! A transaction the batch opens or commits itself ([`Frame::Own`], and an ingest batch's with attempt
//! results, [`Frame::Opens`] then [`Frame::Closes`]) also relies on a failing statement ending its call,
//! so that the `COMMIT` at the end of the text never runs after a failure: pinned by
//! `sqlite_a_batch_failing_on_one_row_rolls_back_its_own_transaction_and_the_rest_is_stored`.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::Arc;

use futures::TryStreamExt;
use futures::future::BoxFuture;
use sqlx::sqlite::{SqliteArguments, SqliteQueryResult};
use sqlx::{AssertSqlSafe, Executor, Row, Sqlite, SqliteConnection};

use super::chunk::{ROWS_PER_INSERT, marks, statements};
use crate::group_commit::{self, BatchWriter, IngestJob, Outcomes, WriteDemand};
use crate::known_apps::{KnownApp, KnownApps, Recalled};
use crate::plan::{self, Apps, Earlier, FanOut, NewRow};
use crate::subscribers::{self, Subscriber};
use crate::{AttemptRecord, CreatedDelivery, StoreError, StoreResult, rows};

/// SQLite's [`BatchWriter`], with each application's subscribers cached between batches (see
/// [`subscribers`]).
pub(crate) struct SqliteBatches {
    subscribers: subscribers::Cache,
    /// Each application's row as last read, which a batch may skip reading (see [`KnownApps`]).
    known: KnownApps,
    /// Who else wants the one write connection, which the writer keeps while it is busy.
    demand: Arc<WriteDemand>,
    /// Whether the file is in WAL mode (see [`super::results_begin`]).
    wal: bool,
}

impl SqliteBatches {
    /// A writer that gives the write connection back whenever `demand` says another write wants it, on
    /// a file in WAL mode or not (`wal`).
    pub(crate) fn new(demand: Arc<WriteDemand>, wal: bool) -> Self {
        Self {
            subscribers: subscribers::Cache::default(),
            known: KnownApps::default(),
            demand,
            wal,
        }
    }
}

impl BatchWriter for SqliteBatches {
    type Db = Sqlite;

    // Every ingest transaction says it waits for the disk itself: the writer keeps its connection from
    // one transaction to the next, and a transaction of attempt results alone before it may have
    // lowered the setting for its own commit (see `super::results_begin`). Setting it costs no call of
    // its own: it rides on the transaction's first.
    const BEGIN: &'static str = super::BEGIN_DURABLE;

    // The writer's connection is the one every write of the store goes through (see `WriteDemand`).
    fn hands_back(&self, held: u32) -> bool {
        self.demand.hands_back(held)
    }

    fn write<'c>(
        &'c self,
        conn: &'c mut SqliteConnection,
        batch: &'c [IngestJob],
    ) -> BoxFuture<'c, StoreResult<Outcomes>> {
        // A message of the careful path fails alone on an error of its write, so it never trusts
        // remembered app rows, whose check fails the statement too: it reads them.
        Box::pin(write(conn, batch, self, Frame::Callers, None))
    }

    fn write_committed<'c>(
        &'c self,
        conn: &'c mut SqliteConnection,
        batch: &'c [IngestJob],
    ) -> BoxFuture<'c, StoreResult<Outcomes>> {
        Box::pin(self.write_own(conn, batch, None))
    }

    fn write_results<'c>(
        &'c self,
        conn: &'c mut SqliteConnection,
        records: &'c [AttemptRecord],
    ) -> BoxFuture<'c, StoreResult<()>> {
        Box::pin(super::write_results(
            conn,
            super::results_begin(self.wal, records),
            records,
        ))
    }

    // The batch opens the transaction and the results commit it: one commit, the batch's (`BEGIN` waits
    // for the disk, as the batch must).
    fn write_committed_with_results<'c>(
        &'c self,
        conn: &'c mut SqliteConnection,
        batch: &'c [IngestJob],
        records: &'c [AttemptRecord],
    ) -> BoxFuture<'c, StoreResult<Outcomes>> {
        Box::pin(self.write_own(conn, batch, Some(records)))
    }
}

impl SqliteBatches {
    /// A batch in a transaction of its own, which it commits — or, with `records`, which their write
    /// commits (see [`BatchWriter::write_committed_with_results`]).
    ///
    /// When the writer remembers the rows of every app of the batch and holds their subscribers at the
    /// remembered versions, the batch skips reading them and checks them in its inserts instead (see
    /// [`KnownApps`]): one call to SQLite's thread fewer. If the batch's rows then fail on anything but a
    /// storage fault — a remembered row that moved, or an error of a message, which the batch cannot tell
    /// apart — it is rolled back, the rows forgotten, and the batch written again with its apps read.
    /// The results' own failures are not the remembered rows': they are answered as they are.
    async fn write_own(
        &self,
        conn: &mut SqliteConnection,
        batch: &[IngestJob],
        records: Option<&[AttemptRecord]>,
    ) -> StoreResult<Outcomes> {
        let frame = match records {
            Some(_) => Frame::Opens(Self::BEGIN),
            None => Frame::Own(Self::BEGIN),
        };
        if let Some(recalled) = self.known.recall(batch, &self.subscribers) {
            match write(conn, batch, self, frame, Some(recalled)).await {
                Ok(outcomes) => return self.commit_with(conn, Ok(outcomes), records).await,
                Err(error) => {
                    // Always an error: the batch's own, rolled back, or a fault (a rollback that failed).
                    let Err(error) =
                        group_commit::close_own_transaction(Err::<Infallible, _>(error), || roll_back(conn)).await;
                    if error.fault().is_some() {
                        return Err(error);
                    }
                    tracing::debug!(%error, "a batch trusting remembered app rows failed; reading them");
                    self.known.forget();
                }
            }
        }
        let written = write(conn, batch, self, frame, None).await;
        self.commit_with(conn, written, records).await
    }

    /// What a batch of [`SqliteBatches::write_own`] answers once its rows are `written`: with `records`,
    /// those written after it, committing its transaction; rolled back if anything failed (see
    /// [`group_commit::close_own_transaction`]).
    async fn commit_with(
        &self,
        conn: &mut SqliteConnection,
        written: StoreResult<Outcomes>,
        records: Option<&[AttemptRecord]>,
    ) -> StoreResult<Outcomes> {
        let written = match (written, records) {
            (Ok(outcomes), Some(records)) => write_attempts(conn, records, Frame::Closes).await.map(|()| outcomes),
            (written, _) => written,
        };
        group_commit::close_own_transaction(written, || roll_back(conn)).await
    }
}

/// Whose transaction a batch's statements run in: one the batch's own calls open (with the text given,
/// riding on its first call) and commit (riding on its last) — the fast path, two round trips to
/// SQLite's thread fewer than a transaction of sqlx's, which takes a call for each — or the caller's (a
/// savepoint of the careful path, see [`crate::group_commit`]); or, for an ingest batch and attempt
/// results written together, one the batch opens and the results commit.
#[derive(Clone, Copy)]
pub(crate) enum Frame {
    /// The batch opens its transaction with this text and commits it.
    Own(&'static str),
    /// The batch opens a transaction with this text, which a later write of the same caller commits.
    Opens(&'static str),
    /// The batch commits the transaction an earlier write of the same caller opened.
    Closes,
    /// The batch writes inside the caller's transaction.
    Callers,
}

impl Frame {
    /// Whether the batch commits its transaction.
    fn commits(self) -> bool {
        matches!(self, Frame::Own(_) | Frame::Closes)
    }

    /// What the batch's first call starts with.
    fn begin(self) -> String {
        match self {
            Frame::Own(begin) | Frame::Opens(begin) => format!("{begin};\n"),
            Frame::Closes | Frame::Callers => String::new(),
        }
    }

    /// How many statements [`Frame::begin`] holds: the results a call that starts with it reports first.
    /// Counted by their `;`, which the texts it is given (`SqliteBatches::BEGIN`, `results_begin`) hold
    /// only between statements.
    fn begin_statements(self) -> usize {
        self.begin().matches(';').count()
    }

    /// The frame of the batch's calls after one that started with [`Frame::begin`].
    fn opened(self) -> Frame {
        match self {
            Frame::Own(_) | Frame::Closes => Frame::Closes,
            Frame::Opens(_) | Frame::Callers => Frame::Callers,
        }
    }
}

/// Roll back the transaction a batch of [`Frame::Own`] (or [`Frame::Opens`]) opened and nothing
/// committed: sqlx knows nothing of it, so it is closed with a statement of its own (see
/// [`group_commit::close_own_transaction`]). It fails when there is none: the failed call stopped before
/// its `BEGIN`, or the batch's check of its rows failed after the call that committed ([`note_seqs`]).
/// The write pool's release check refuses a connection left in a transaction anyway
/// (`herald_sql::custody`).
pub(crate) async fn roll_back(conn: &mut SqliteConnection) -> Result<(), sqlx::Error> {
    conn.execute("ROLLBACK").await?;
    Ok(())
}

/// The batch's rows: with its apps and their subscribers read (and remembered) in its first call, or,
/// `recalled`, as the writer remembers them, checked by its inserts instead (see [`KnownApps`]).
async fn write(
    conn: &mut SqliteConnection,
    batch: &[IngestJob],
    writer: &SqliteBatches,
    frame: Frame,
    recalled: Option<Recalled>,
) -> StoreResult<Outcomes> {
    let (apps, subscribers, checked, frame) = match recalled {
        Some(Recalled {
            apps,
            subscribers,
            rows,
        }) => (apps, subscribers, Some(rows), frame),
        None => {
            let app_ids = plan::app_ids(batch);
            let (apps, versions) = existing_apps(conn, &app_ids, frame, &writer.known).await?;
            let subscribers = writer
                .subscribers
                .resolve(&versions, |stale| read_subscribers(conn, stale))
                .await?;
            (apps, subscribers, None, frame.opened())
        }
    };
    let (earlier, frame) = earlier_messages(conn, batch, frame).await?;
    // No row locks (one writer): nothing is ever held back.
    let plan = plan::plan(batch, &apps, &[], earlier);
    let fan_out = plan.fan_out(&subscribers);
    let deliveries = insert_rows(conn, &plan.messages, &fan_out, frame, checked.as_ref()).await?;
    drop(fan_out);
    Ok(plan.finish(deliveries, HashMap::new()))
}

/// The apps that exist, with their default payload retention, and each one's `endpoints_version`, which
/// `known` remembers: the batch's first call then, which opens a transaction of the batch's
/// [own](Frame::Own).
async fn existing_apps(
    conn: &mut SqliteConnection,
    app_ids: &[&str],
    frame: Frame,
    known: &KnownApps,
) -> StoreResult<(Apps, Vec<(String, i64)>)> {
    let sql = format!(
        "{}SELECT id, payload_retention_period, endpoints_version FROM application WHERE id IN ({})",
        frame.begin(),
        marks(app_ids.len())
    );
    let mut query = sqlx::query_as::<_, subscribers::AppRow>(AssertSqlSafe(sql));
    for id in app_ids {
        query = query.bind(*id);
    }
    let found = query.fetch_all(&mut *conn).await?;
    known.remember(&found);
    Ok(subscribers::existing_apps(found))
}

/// The subscribers of the apps `stale`, whose lists the cache does not hold at their current version.
async fn read_subscribers(conn: &mut SqliteConnection, stale: Vec<&str>) -> StoreResult<Vec<Subscriber>> {
    let sql = format!(
        "SELECT {} FROM endpoint WHERE app_id IN ({})",
        subscribers::COLUMNS,
        marks(stale.len())
    );
    let mut query = sqlx::query(AssertSqlSafe(sql));
    for id in &stale {
        query = query.bind(*id);
    }
    let found = query.fetch_all(&mut *conn).await?;
    found.iter().map(Subscriber::from_row).collect()
}

/// The stored messages that the batch's messages with an `eventId` or `idempotency-key` repeat, and the
/// frame the batch's next call is in: the first of these reads opens the batch's transaction when no call
/// has yet.
async fn earlier_messages(
    conn: &mut SqliteConnection,
    batch: &[IngestJob],
    mut frame: Frame,
) -> StoreResult<(Earlier, Frame)> {
    let mut earlier = Earlier::default();
    for chunk in plan::keyed(batch).chunks(ROWS_PER_INSERT) {
        let pairs = vec!["(?, ?, ?)"; chunk.len()].join(", ");
        let sql = format!(
            "{}WITH wanted (app_id, event_id, idem) AS (VALUES {pairs}) \
             SELECT {}, m.idempotency_key AS m_idempotency_key FROM message m JOIN wanted w \
             ON m.app_id = w.app_id AND (m.event_id = w.event_id OR m.idempotency_key = w.idem)",
            frame.begin(),
            rows::MESSAGE_COLUMNS
        );
        frame = frame.opened();
        let mut query = sqlx::query(AssertSqlSafe(sql));
        for job in chunk {
            query = query
                .bind(job.new.app_id.as_str())
                .bind(&job.new.event_id)
                .bind(&job.new.idempotency_key);
        }
        for row in query.fetch_all(&mut *conn).await? {
            let message = rows::message(&row)?;
            let key: Option<String> = row.try_get("m_idempotency_key")?;
            earlier.remember(&message, key.as_deref());
        }
    }
    Ok((earlier, frame))
}

/// How many delivery rows one call inserts at most: a wide fan-out's rows beyond those of the first call
/// go in calls of their own, so that no call's statement text and bound values grow with the fan-out
/// (a batch of 512 messages to 10,000 endpoints each would make one text of 5,120,000 rows).
const DELIVERIES_PER_CALL: usize = 4 * ROWS_PER_INSERT;

const MESSAGE_INSERT: &str = "INSERT INTO message (id, app_id, event_id, idempotency_key, event_type, channels, \
                              payload, ordering_key, created_at, payload_expires_at, tags, deliver_at) VALUES ";
const MESSAGE_ROW: &str = "(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)";
/// [`MESSAGE_ROW`] with its `app_id` checked against the app's row as remembered (see [`KnownApps`]): the
/// id if the app's row still has the `endpoints_version` and payload retention (in days, `NULL` for
/// none) bound after it, else `NULL`, which the column refuses.
const MESSAGE_ROW_CHECKED: &str = "(?, (SELECT id FROM application WHERE id = ? AND endpoints_version = ? \
                                   AND payload_retention_period IS ?), ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)";
const TAG_INSERT: &str = "INSERT INTO message_tag (app_id, tag, message_id) VALUES ";
const TAG_ROW: &str = "(?, ?, ?)";
const DELIVERY_INSERT: &str = "INSERT INTO delivery (message_id, endpoint_id, status, attempts, next_attempt_at, \
                               updated_at, window_start) VALUES ";
const DELIVERY_ROW: &str = "(?, ?, 0, 0, ?, ?, ?)";

/// The batch's rows in as few calls to SQLite's thread as its size allows: the messages, their tags and
/// their first [`DELIVERIES_PER_CALL`] deliveries in one call (one statement text of multi-row
/// `INSERT`s of up to [`ROWS_PER_INSERT`] rows), the rest of a wide fan-out's deliveries in calls of that
/// many. A batch in a transaction of its [own](Frame::Own) commits it at the end of the last call.
///
/// Why few calls: each call is a round trip between this task and the connection's thread, and the one
/// writer's batch is a chain of them; on a busy machine every hop wakes a thread that then waits for a
/// core, so the batch takes several times its CPU (docs/performance.md, "The SQLite writer's batch").
/// A statement that fails stops its call there, and the writer rolls the whole batch back as before.
///
/// A batch whose apps were not read (`checked`: their rows as remembered) checks them in its message
/// rows instead (see [`KnownApps`]), and opens its transaction in its first call here, unless the read of
/// earlier messages did.
///
/// Returns the deliveries' seqs, grouped by the index of the job they belong to (see [`note_seqs`]).
async fn insert_rows(
    conn: &mut SqliteConnection,
    messages: &[NewRow<'_>],
    fan_out: &[FanOut<'_>],
    frame: Frame,
    checked: Option<&HashMap<String, KnownApp>>,
) -> StoreResult<HashMap<usize, Vec<CreatedDelivery>>> {
    let tags = plan::tag_rows(messages);
    let (with_messages, later) = fan_out.split_at(fan_out.len().min(DELIVERIES_PER_CALL));
    let later: Vec<_> = later.chunks(DELIVERIES_PER_CALL).collect();
    let commits_first = frame.commits() && later.is_empty();
    let mut by_job = HashMap::new();
    let mut sql = frame.begin();
    let message_row = if checked.is_some() {
        MESSAGE_ROW_CHECKED
    } else {
        MESSAGE_ROW
    };
    statements(&mut sql, MESSAGE_INSERT, message_row, "", messages.len());
    statements(&mut sql, TAG_INSERT, TAG_ROW, "", tags.len());
    statements(&mut sql, DELIVERY_INSERT, DELIVERY_ROW, "", with_messages.len());
    if commits_first {
        sql.push_str(COMMIT);
    }
    if sql.is_empty() {
        return Ok(by_job);
    }
    let rows = messages.len() + tags.len() + with_messages.len();
    let app_marks = if checked.is_some() { 3 } else { 1 };
    debug_assert_eq!(
        marks_in(&sql),
        (11 + app_marks) * messages.len() + 3 * tags.len() + 5 * with_messages.len()
    );
    let mut query = sqlx::query(AssertSqlSafe(sql)).persistent(cached(rows));
    // Ids are bound as their shared text (`shared`): sqlx copies a bound `&str` into a new `Arc<String>`
    // and keeps an `Arc<str>` as it is, and these binds are on the one writer's path.
    for row in messages {
        let m = &row.message;
        query = query.bind(m.id.shared()).bind(m.app_id.shared());
        if let Some(checked) = checked {
            // An app missing here binds a version no row has: the check fails the statement.
            let known = checked.get(m.app_id.as_str());
            query = query
                .bind(known.map(|k| k.endpoints_version))
                .bind(known.and_then(|k| k.retention_days));
        }
        query = query
            .bind(&m.event_id)
            .bind(row.idempotency_key)
            .bind(&m.event_type)
            .bind(rows::encode_list(&m.channels))
            .bind(Arc::clone(&m.payload))
            .bind(&m.ordering_key)
            .bind(m.created_at)
            .bind(row.payload_expires_at)
            .bind(rows::encode_list(&m.tags))
            .bind(m.deliver_at);
    }
    for (app_id, tag, message_id) in &tags {
        query = query.bind(*app_id).bind(*tag).bind(*message_id);
    }
    let done = run_call(
        conn,
        bind_deliveries(query, with_messages),
        frame.begin_statements(),
        commits_first,
    )
    .await?;
    note_seqs(&done, messages.len() + tags.len(), with_messages, &mut by_job)?;
    let frame = frame.opened();
    for (i, chunk) in later.iter().enumerate() {
        let commits = frame.commits() && i + 1 == later.len();
        let mut sql = String::new();
        statements(&mut sql, DELIVERY_INSERT, DELIVERY_ROW, "", chunk.len());
        if commits {
            sql.push_str(COMMIT);
        }
        let query = sqlx::query(AssertSqlSafe(sql)).persistent(cached(chunk.len()));
        let done = run_call(conn, bind_deliveries(query, chunk), 0, commits).await?;
        note_seqs(&done, 0, chunk, &mut by_job)?;
    }
    Ok(by_job)
}

/// The statement that ends a call committing a transaction of the batch's [own](Frame::Own).
const COMMIT: &str = "COMMIT;\n";

/// Run one call to SQLite's thread; it starts with `begun` statements that open the transaction (see
/// [`Frame::begin`]), and `commits` says it ends with [`COMMIT`]. Their results are left out of the
/// call's: for a statement that writes no row, SQLite reports the changes of the last write before it
/// again (`sqlite3_changes` is the connection's, not the statement's), which would make the call's rows
/// look more than it inserted. Its last rowid stays the last `INSERT`'s.
async fn run_call(
    conn: &mut SqliteConnection,
    query: sqlx::query::Query<'_, Sqlite, SqliteArguments>,
    begun: usize,
    commits: bool,
) -> StoreResult<SqliteQueryResult> {
    if begun == 0 && !commits {
        return Ok(query.execute(&mut *conn).await?);
    }
    let mut results: Vec<SqliteQueryResult> = conn.execute_many(query).try_collect().await?;
    if commits {
        results.pop();
    }
    let mut done = SqliteQueryResult::default();
    done.extend(results.into_iter().skip(begun));
    Ok(done)
}

/// Whether sqlx keeps a call's prepared statements for the next call with the same text: only for calls
/// of up to [`DELIVERIES_PER_CALL`] rows. Prepared, a 256-row `INSERT` holds 140–340 KB, and sqlx caches
/// 100 texts by count, whatever their size; the texts of calls this size and below repeat (a batch's
/// size follows the load), the larger ones rarely do, and preparing costs little beside writing their
/// rows.
fn cached(rows: usize) -> bool {
    rows <= DELIVERIES_PER_CALL
}

/// How many `?` marks `sql` holds (a call's bound values must match them one for one: sqlx binds a
/// missing value as `NULL` and drops an extra one, and a shift would carry into the next table's rows).
fn marks_in(sql: &str) -> usize {
    sql.matches('?').count()
}

/// Bind the values of [`DELIVERY_ROW`] for each of `deliveries`.
fn bind_deliveries<'q>(
    mut query: sqlx::query::Query<'q, Sqlite, SqliteArguments>,
    deliveries: &'q [FanOut<'_>],
) -> sqlx::query::Query<'q, Sqlite, SqliteArguments> {
    for f in deliveries {
        query = query
            .bind(f.message.id.shared())
            .bind(f.endpoint_id.shared())
            .bind(f.message.due_at())
            .bind(f.message.created_at)
            .bind(plan::window_start(f.message));
    }
    query
}

/// Check that a call inserted its `others` rows and its `deliveries` (inserted last), and note the
/// deliveries' seqs in `by_job`.
///
/// No `RETURNING`: each returned row would cross from SQLite's thread to this task on its own (sqlx
/// streams rows one by one). The seqs are known without them: the one writer draws `seq`s one after the
/// other in the order the rows are listed (`AUTOINCREMENT`: the largest seq so far plus one; no trigger
/// writes to `delivery`), so the call's last `n` rows got `last - n + 1 ..= last`, `last` being its last
/// inserted rowid.
///
/// The check runs after the call: on a batch's last call that is after its `COMMIT`, so a mismatch there
/// fails a batch that is stored — its requests are answered an error and a retry may store a message
/// twice (at-least-once; an `eventId` deduplicates). It guards against an sqlx whose multi-statement
/// calls changed, which the store tests would catch first.
fn note_seqs(
    done: &SqliteQueryResult,
    others: usize,
    deliveries: &[FanOut<'_>],
    by_job: &mut HashMap<usize, Vec<CreatedDelivery>>,
) -> StoreResult<()> {
    let expected = others + deliveries.len();
    if u64::try_from(expected).ok() != Some(done.rows_affected()) {
        return Err(StoreError::Corrupt(format!(
            "{} rows inserted of {expected}",
            done.rows_affected()
        )));
    }
    let inserted = i64::try_from(deliveries.len()).map_err(|_| StoreError::Corrupt("a fan-out beyond i64".into()))?;
    let first = done.last_insert_rowid() - inserted + 1;
    for (seq, f) in (first..).zip(deliveries) {
        by_job.entry(f.job).or_default().push(CreatedDelivery {
            seq,
            endpoint_id: f.endpoint_id.clone(),
        });
    }
    Ok(())
}

const ATTEMPT_INSERT: &str = "INSERT INTO attempt (id, delivery_seq, app_id, message_id, endpoint_id, url, \
                              attempt_number, success, outcome, response_status, response, duration_ms, trigger_type, \
                              created_at) VALUES ";
const ATTEMPT_ROW: &str = "(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)";
/// A delivery's move after its attempt, a row per delivery between the head and the tail: only a delivery
/// still pending is moved.
const DELIVERY_MOVE_HEAD: &str = "WITH v (seq, status, attempts, next_at, changed_at) AS (VALUES ";
const DELIVERY_MOVE_ROW: &str = "(?, ?, ?, ?, ?)";
const DELIVERY_MOVE_TAIL: &str = ") UPDATE delivery SET status = v.status, attempts = v.attempts, \
                                  next_attempt_at = v.next_at, updated_at = v.changed_at, next_trigger = 0 \
                                  FROM v WHERE delivery.seq = v.seq AND delivery.status = 0";

/// Append a batch of attempts and move their deliveries on: the attempt rows and the deliveries' updates
/// in one call to SQLite's thread (see [`insert_rows`] on why), a multi-row statement per chunk. Only
/// deliveries still pending are updated. In a transaction of the batch's [own](Frame::Own), a batch that
/// records no operational event is that one call, `BEGIN` to `COMMIT`; one that may record events
/// commits in a call after them. [`Frame::Closes`] commits the same way a transaction an ingest batch
/// opened.
pub(crate) async fn write_attempts(
    conn: &mut SqliteConnection,
    records: &[AttemptRecord],
    frame: Frame,
) -> StoreResult<()> {
    let latest = plan::latest_per_delivery(records);
    let commits_at_once = frame.commits() && !crate::events::may_record_events(records);
    let mut sql = frame.begin();
    statements(&mut sql, ATTEMPT_INSERT, ATTEMPT_ROW, "", records.len());
    statements(
        &mut sql,
        DELIVERY_MOVE_HEAD,
        DELIVERY_MOVE_ROW,
        DELIVERY_MOVE_TAIL,
        latest.len(),
    );
    if commits_at_once {
        sql.push_str(COMMIT);
    }
    if sql.is_empty() {
        return Ok(());
    }
    debug_assert_eq!(marks_in(&sql), 14 * records.len() + 5 * latest.len());
    let mut query = sqlx::query(AssertSqlSafe(sql)).persistent(cached(records.len() + latest.len()));
    for record in records {
        let a = &record.attempt;
        query = query
            .bind(a.id.shared())
            .bind(record.delivery_seq)
            .bind(record.app_id.shared())
            .bind(a.message_id.shared())
            .bind(a.endpoint_id.shared())
            .bind(&a.url)
            .bind(i64::from(a.attempt_number))
            .bind(a.success)
            .bind(a.outcome.as_str())
            .bind(a.response_status.map(i64::from))
            .bind(&a.response)
            .bind(a.duration_ms)
            .bind(a.trigger.code())
            .bind(a.created_at);
    }
    for record in &latest {
        let a = &record.attempt;
        query = query
            .bind(record.delivery_seq)
            .bind(record.status.code())
            .bind(i64::from(a.attempt_number))
            .bind(record.next_attempt_at)
            .bind(a.finished_at());
    }
    query.execute(&mut *conn).await?;
    if commits_at_once {
        return Ok(());
    }
    super::events::record_attempt_events(conn, records).await?;
    if frame.commits() {
        conn.execute(COMMIT).await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The writer keeps its connection from a transaction of attempt results alone, which commits
    /// without waiting for the disk, to its next transaction: an ingest batch, or results that may record
    /// an operational event, and both must wait.
    #[tokio::test]
    async fn a_transaction_that_must_wait_for_the_disk_does_whatever_the_results_before_it_set() {
        use crate::events::tests::record;
        use herald_core::model::AttemptTrigger;
        use sqlx::Connection;
        let dir = tempfile::tempdir().expect("a temporary directory");
        let url = format!("sqlite://{}", dir.path().join("sync.db").display());
        let options = url.parse::<sqlx::sqlite::SqliteConnectOptions>().expect("a SQLite URL");
        let mut conn = SqliteConnection::connect_with(&options.create_if_missing(true))
            .await
            .expect("a connection");
        let first_try = [record(1, true, AttemptTrigger::Scheduled)];
        let failing = [record(1, false, AttemptTrigger::Scheduled)];
        let durable = [
            ("an ingest batch", SqliteBatches::BEGIN),
            ("results with an event", super::super::results_begin(true, &failing)),
        ];
        for (what, begin) in durable {
            let results = super::super::results_begin(true, &first_try);
            sqlx::raw_sql(AssertSqlSafe(format!("{results}; COMMIT")))
                .execute(&mut conn)
                .await
                .expect("a results transaction");
            assert_eq!(synchronous(&mut conn).await, 1, "NORMAL for results alone");
            sqlx::raw_sql(AssertSqlSafe(format!("{begin}; COMMIT")))
                .execute(&mut conn)
                .await
                .expect("a transaction");
            assert_eq!(synchronous(&mut conn).await, 2, "FULL for {what}");
        }
    }

    /// The connection's `synchronous` setting (1 NORMAL, 2 FULL).
    async fn synchronous(conn: &mut SqliteConnection) -> i64 {
        let row = sqlx::raw_sql("PRAGMA synchronous").fetch_one(conn).await.expect("read");
        row.get::<i64, _>(0)
    }

    #[test]
    fn the_writer_gives_the_write_connection_back_while_another_write_wants_it() {
        let demand = Arc::new(WriteDemand::default());
        let writer = SqliteBatches::new(demand.clone(), true);
        assert!(!writer.hands_back(1), "nobody else wants it");
        let wanting = demand.want();
        assert!(writer.hands_back(1));
        drop(wanting);
        assert!(!writer.hands_back(1));
    }
}
