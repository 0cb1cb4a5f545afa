//! [`PollingStore`] for both dialects: polling endpoints, the application message stream (`message_stream`,
//! numbered by a trigger in commit order, see the `polling` migrations) and consumer offsets, one SQL text
//! per statement.

use herald_core::clock::Millis;
use herald_core::id::{AppId, SinkId, SinkIdOrUid};

use crate::dialect::{Dialect, SqlStore};
use crate::polling::{ConsumerOffset, PollingEndpoint, PollingStore, StreamEntry};
use crate::rows::{self, Columns};
use crate::sql::{limit, map_constraint};
use crate::statement::Sql;
use crate::{StoreError, StoreResult};

use super::{decode_all, one_changed};

/// Decode a polling endpoint row, opening its secret (sealed with the sink id as context, as an
/// endpoint's is with its id).
fn decode<D: Dialect>(store: &SqlStore<D>, row: &D::Row) -> StoreResult<PollingEndpoint> {
    let id = row.id("id")?;
    let secret = crate::sealing::open_secret(&store.cipher, &id, &row.text("secret")?)?;
    Ok(PollingEndpoint {
        app_id: row.id("app_id")?,
        uid: row.opt_text("uid")?,
        description: row.free_text("description")?,
        filter_types: rows::decode_list(row.opt_text("filter_types")?)?,
        channels: rows::decode_list(row.opt_text("channels")?)?,
        metadata: rows::decode_metadata(&row.text("metadata")?)?,
        secret,
        created_at: row.time("created_at")?,
        updated_at: row.time("updated_at")?,
        id,
    })
}

/// Decode a consumer's offset row.
fn offset(row: &impl Columns) -> StoreResult<ConsumerOffset> {
    Ok(ConsumerOffset {
        committed: row.int("committed_seq")?,
        leased: row.int("leased_seq")?,
        lease_expires_at: row.time("lease_expires_at")?,
    })
}

#[async_trait::async_trait]
impl<D: Dialect> PollingStore for SqlStore<D> {
    async fn create_polling_endpoint(&self, sink: &PollingEndpoint) -> StoreResult<()> {
        let created = Sql::new(
            "INSERT INTO polling_endpoint (id, app_id, uid, description, filter_types, channels, metadata, secret, \
             created_at, updated_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
        )
        .bind(&sink.id)
        .bind(&sink.app_id)
        .bind(&sink.uid)
        .free(&sink.description)
        .bind(rows::encode_list(&sink.filter_types))
        .bind(rows::encode_list(&sink.channels))
        .bind(rows::encode_metadata(&sink.metadata))
        .bind(crate::sealing::seal_secret(&self.cipher, &sink.id, &sink.secret))
        .bind(sink.created_at)
        .bind(sink.updated_at)
        .execute(self.writes())
        .await
        .map_err(map_constraint);
        self.watched(created).map(drop)
    }

    async fn get_polling_endpoint(&self, app_id: &AppId, id_or_uid: &SinkIdOrUid) -> StoreResult<PollingEndpoint> {
        // An id and a uid may coincide only across kinds; ordering by id makes the pick deterministic.
        let row =
            Sql::new("SELECT * FROM polling_endpoint WHERE app_id = $1 AND (id = $2 OR uid = $2) ORDER BY id LIMIT 1")
                .bind(app_id)
                .bind(id_or_uid)
                .fetch_optional(self.reads())
                .await?
                .ok_or(StoreError::NotFound)?;
        decode(self, &row)
    }

    async fn list_polling_endpoints(
        &self,
        app_id: &AppId,
        after: Option<&str>,
        count: usize,
    ) -> StoreResult<Vec<PollingEndpoint>> {
        let found = Sql::new("SELECT * FROM polling_endpoint WHERE app_id = $1 AND id > $2 ORDER BY id LIMIT $3")
            .bind(app_id)
            .free(after.unwrap_or(""))
            .bind(limit(count))
            .fetch_all(self.reads())
            .await?;
        decode_all(&found, |row| decode(self, row))
    }

    async fn update_polling_endpoint(&self, sink: &PollingEndpoint) -> StoreResult<()> {
        // Never the secret: it is the key `herald listen` signs with, and changes only with the sink.
        let changed = Sql::new(
            "UPDATE polling_endpoint SET uid = $3, description = $4, filter_types = $5, channels = $6, \
             metadata = $7, updated_at = $8 WHERE app_id = $1 AND id = $2",
        )
        .bind(&sink.app_id)
        .bind(&sink.id)
        .bind(&sink.uid)
        .free(&sink.description)
        .bind(rows::encode_list(&sink.filter_types))
        .bind(rows::encode_list(&sink.channels))
        .bind(rows::encode_metadata(&sink.metadata))
        .bind(sink.updated_at)
        .execute(self.writes())
        .await
        .map_err(map_constraint);
        one_changed(self.watched(changed)?)
    }

    async fn delete_polling_endpoint(&self, app_id: &AppId, id: &SinkId) -> StoreResult<()> {
        // Its consumers' offsets go with it (ON DELETE CASCADE).
        let deleted = Sql::new("DELETE FROM polling_endpoint WHERE app_id = $1 AND id = $2")
            .bind(app_id)
            .bind(id)
            .execute(self.writes())
            .await;
        one_changed(self.watched(deleted.map_err(StoreError::from))?)
    }

    async fn read_stream(&self, app_id: &AppId, after: i64, count: usize) -> StoreResult<Vec<StreamEntry>> {
        // The poll: one range read of the `(app_id, seq)` index, joined to the messages it names.
        let text = format!(
            "SELECT s.seq AS seq, {} FROM message_stream s JOIN message m ON m.id = s.message_id \
             WHERE s.app_id = $1 AND s.seq > $2 ORDER BY s.seq LIMIT $3",
            rows::MESSAGE_COLUMNS
        );
        let found = Sql::new(text)
            .bind(app_id)
            .bind(after)
            .bind(limit(count))
            .fetch_all(self.reads())
            .await?;
        decode_all(&found, |row| {
            Ok(StreamEntry {
                seq: row.int("seq")?,
                message: rows::message(row)?,
            })
        })
    }

    async fn stream_position_at(&self, app_id: &AppId, time: Millis) -> StoreResult<Option<i64>> {
        // Through the `(app_id, created_at)` index of `message`: the first message at or after the time.
        let row = Sql::new(
            "SELECT s.seq AS seq FROM message m JOIN message_stream s ON s.message_id = m.id \
             WHERE m.app_id = $1 AND m.created_at >= $2 ORDER BY m.created_at, m.id LIMIT 1",
        )
        .bind(app_id)
        .bind(time)
        .fetch_optional(self.reads())
        .await?;
        row.map(|row| Ok(row.int("seq")? - 1)).transpose()
    }

    async fn stream_head(&self, app_id: &AppId) -> StoreResult<i64> {
        let row = Sql::new("SELECT COALESCE(MAX(seq), 0) AS seq FROM message_stream WHERE app_id = $1")
            .bind(app_id)
            .fetch_one(self.reads())
            .await?;
        row.int("seq")
    }

    async fn consumer_offset(&self, sink_id: &SinkId, consumer_id: &str) -> StoreResult<Option<ConsumerOffset>> {
        let row = Sql::new(
            "SELECT committed_seq, leased_seq, lease_expires_at FROM polling_consumer \
             WHERE sink_id = $1 AND consumer_id = $2",
        )
        .bind(sink_id)
        .free(consumer_id)
        .fetch_optional(self.reads())
        .await?;
        row.as_ref().map(offset).transpose()
    }

    async fn put_consumer_offset(
        &self,
        sink_id: &SinkId,
        consumer_id: &str,
        offset: &ConsumerOffset,
        now: Millis,
    ) -> StoreResult<()> {
        let written = Sql::new(
            "INSERT INTO polling_consumer (sink_id, consumer_id, committed_seq, leased_seq, lease_expires_at, \
             updated_at) VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (sink_id, consumer_id) DO UPDATE SET \
             committed_seq = excluded.committed_seq, leased_seq = excluded.leased_seq, \
             lease_expires_at = excluded.lease_expires_at, updated_at = excluded.updated_at",
        )
        .bind(sink_id)
        .free(consumer_id)
        .bind(offset.committed)
        .bind(offset.leased)
        .bind(offset.lease_expires_at)
        .bind(now)
        .execute(self.writes())
        .await
        .map_err(map_constraint);
        self.watched(written).map(drop)
    }

    async fn commit_consumer(&self, sink_id: &SinkId, consumer_id: &str, seq: i64, now: Millis) -> StoreResult<()> {
        // The offset only moves forward (a late, older commit never undoes a newer one); a commit that
        // covers the whole lease ends it.
        let written = Sql::new(
            "INSERT INTO polling_consumer (sink_id, consumer_id, committed_seq, leased_seq, lease_expires_at, \
             updated_at) VALUES ($1, $2, $3, $3, 0, $4) ON CONFLICT (sink_id, consumer_id) DO UPDATE SET \
             committed_seq = CASE WHEN polling_consumer.committed_seq < excluded.committed_seq \
                 THEN excluded.committed_seq ELSE polling_consumer.committed_seq END, \
             lease_expires_at = CASE WHEN polling_consumer.leased_seq <= excluded.committed_seq \
                 THEN 0 ELSE polling_consumer.lease_expires_at END, \
             updated_at = excluded.updated_at",
        )
        .bind(sink_id)
        .free(consumer_id)
        .bind(seq)
        .bind(now)
        .execute(self.writes())
        .await
        .map_err(map_constraint);
        self.watched(written).map(drop)
    }

    fn stream_signal(&self) -> crate::polling::StreamSignal {
        self.stream.signal()
    }
}
