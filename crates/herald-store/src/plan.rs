//! The backend-independent half of a group-commit batch: deciding what to write.
//!
//! A backend reads three things in the batch's transaction — which apps exist (with their defaults), each
//! app's endpoints and
//! the messages that already carry one of the batch's event ids or idempotency keys — and [`plan`] turns
//! them into each job's outcome, the new messages to insert and their fan-out. After inserting, the
//! backend hands the created deliveries back to [`Plan::finish`]. Only the reads and writes are dialect
//! specific; every decision lives here, once.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use herald_core::clock::Millis;
use herald_core::id::{AppId, EndpointId, MessageId};
use herald_core::model::Message;

use crate::group_commit::{IngestJob, Outcome, Outcomes};
use crate::rows::Columns;
use crate::subscribers::ByApp;
use crate::{AttemptRecord, CreatedDelivery, Ingested, StoreError, StoreResult};

/// Messages already stored, or earlier in this batch, by (app, event id) and (app, idempotency key).
#[derive(Default)]
pub(crate) struct Earlier {
    by_event_id: HashMap<(AppId, String), Message>,
    by_key: HashMap<(AppId, String), Message>,
}

impl Earlier {
    fn find(&self, app_id: &AppId, event_id: Option<&str>, key: Option<&str>) -> Option<Message> {
        let lookup = |map: &HashMap<(AppId, String), Message>, value: Option<&str>| {
            value.and_then(|v| map.get(&(app_id.clone(), v.to_owned())).cloned())
        };
        lookup(&self.by_event_id, event_id).or_else(|| lookup(&self.by_key, key))
    }

    /// Remember a message (read from the store, or created earlier in the batch) under its event id and
    /// idempotency key.
    pub(crate) fn remember(&mut self, message: &Message, key: Option<&str>) {
        if let Some(event_id) = &message.event_id {
            self.by_event_id
                .insert((message.app_id.clone(), event_id.clone()), message.clone());
        }
        if let Some(key) = key {
            self.by_key
                .insert((message.app_id.clone(), key.to_owned()), message.clone());
        }
    }
}

/// The apps of a batch that exist, by id, each with its default payload retention in milliseconds (the
/// app's `payloadRetentionPeriod`), read with the same query that checks they exist.
pub(crate) type Apps = HashMap<String, Option<i64>>;

/// Milliseconds in a day.
const DAY_MS: i64 = 24 * 3600 * 1000;

/// An app's stored default payload retention (days) in milliseconds.
pub(crate) fn retention_ms(days: Option<i64>) -> Option<i64> {
    days.map(|d| d.saturating_mul(DAY_MS))
}

/// The distinct apps of a batch.
pub(crate) fn app_ids(batch: &[IngestJob]) -> Vec<&str> {
    batch
        .iter()
        .map(|j| j.new.app_id.as_str())
        .collect::<HashSet<_>>()
        .into_iter()
        .collect()
}

/// The jobs that carry an event id or idempotency key (the only ones that can be duplicates).
pub(crate) fn keyed(batch: &[IngestJob]) -> Vec<&IngestJob> {
    batch
        .iter()
        .filter(|j| j.new.event_id.is_some() || j.new.idempotency_key.is_some())
        .collect()
}

/// A new message to insert: the index of its job, the message, its idempotency key.
pub(crate) struct NewRow<'a> {
    pub(crate) job: usize,
    pub(crate) message: Message,
    pub(crate) idempotency_key: Option<&'a str>,
    /// The one endpoint it goes to, when it does not go to the subscribers.
    pub(crate) to_endpoint: Option<&'a str>,
    /// When the payload expires (the message's `payloadRetentionPeriod`, else its app's), if it does.
    pub(crate) payload_expires_at: Option<Millis>,
}

/// One delivery to insert: the index of its job, its message and endpoint.
pub(crate) struct FanOut<'a> {
    pub(crate) job: usize,
    pub(crate) message: &'a Message,
    pub(crate) endpoint_id: &'a EndpointId,
}

/// What a batch writes, and each job's outcome.
pub(crate) struct Plan<'a> {
    outcomes: Outcomes,
    /// The messages to insert.
    pub(crate) messages: Vec<NewRow<'a>>,
}

/// Decide every job of a batch. Ids and creation times are assigned here, for the transaction that
/// commits them (inside it, or, for PostgreSQL's batches of one statement, just before it: see
/// `postgres::remembered`), so ids follow commit order. `held` says, by index, which jobs the batch holds back
/// unwritten ([`Outcome::Deferred`]; PostgreSQL, see [`crate::group_commit::held_back`]); a job past
/// its end is not held (SQLite passes none).
pub(crate) fn plan<'a>(batch: &'a [IngestJob], apps: &Apps, held: &[bool], mut earlier: Earlier) -> Plan<'a> {
    let now = herald_core::clock::now();
    let mut outcomes = Vec::with_capacity(batch.len());
    let mut messages = Vec::new();
    for (index, job) in batch.iter().enumerate() {
        let new = &job.new;
        if held.get(index).copied().unwrap_or(false) {
            outcomes.push(Outcome::Deferred);
            continue;
        }
        let Some(app_retention_ms) = apps.get(new.app_id.as_str()) else {
            outcomes.push(Outcome::Settled(Err(StoreError::NotFound)));
            continue;
        };
        if let Some(original) = earlier.find(&new.app_id, new.event_id.as_deref(), new.idempotency_key.as_deref()) {
            outcomes.push(Outcome::Settled(Ok(Ingested::Duplicate(original))));
            continue;
        }
        let message = Message {
            id: MessageId::new(),
            app_id: new.app_id.clone(),
            event_id: new.event_id.clone(),
            event_type: new.event_type.clone(),
            channels: new.channels.clone(),
            payload: new.payload.clone(),
            ordering_key: new.ordering_key.clone(),
            // A set: the tag index holds each tag of a message once.
            tags: new.tags.as_ref().map(|tags| {
                let mut tags = tags.clone();
                tags.sort();
                tags.dedup();
                tags
            }),
            deliver_at: new.deliver_at,
            created_at: now,
        };
        earlier.remember(&message, new.idempotency_key.as_deref());
        // Placeholder until the deliveries are written; replaced by `finish`.
        outcomes.push(Outcome::Settled(Err(StoreError::Closed)));
        messages.push(NewRow {
            job: index,
            message,
            idempotency_key: new.idempotency_key.as_deref(),
            to_endpoint: new.to_endpoint.as_deref(),
            // The message's own retention wins over its app's default.
            payload_expires_at: new
                .payload_retention_ms
                .or(*app_retention_ms)
                .map(|keep| now.add_ms(keep)),
        });
    }
    Plan { outcomes, messages }
}

impl Plan<'_> {
    /// The deliveries of the new messages: one per subscribed endpoint of the message's app (disabled
    /// endpoints included: their deliveries wait until the endpoint is enabled again or expire), or to
    /// its one endpoint when it names one.
    pub(crate) fn fan_out<'p>(&'p self, subscribers: &'p ByApp) -> Vec<FanOut<'p>> {
        self.messages
            .iter()
            .flat_map(|row| {
                let message = &row.message;
                subscribers
                    .get(message.app_id.as_str())
                    .into_iter()
                    .flat_map(|list| list.iter())
                    .filter(|ep| match row.to_endpoint {
                        Some(only) => ep.id == only,
                        None => ep.takes(message),
                    })
                    .map(move |ep| FanOut {
                        job: row.job,
                        message,
                        endpoint_id: &ep.id,
                    })
            })
            .collect()
    }

    /// Every job's outcome, given the created deliveries grouped by job index, and the endpoints of the
    /// messages whose fan-out was split (see [`crate::split`]), by job index.
    pub(crate) fn finish(
        self,
        mut deliveries: HashMap<usize, Vec<CreatedDelivery>>,
        mut split: HashMap<usize, Vec<EndpointId>>,
    ) -> Outcomes {
        let mut outcomes = self.outcomes;
        for row in self.messages {
            if let Some(endpoints) = split.remove(&row.job) {
                outcomes[row.job] = Outcome::Split {
                    splits: crate::split::split(row.message.clone(), &endpoints),
                    message: row.message,
                };
                continue;
            }
            let mut created = deliveries.remove(&row.job).unwrap_or_default();
            created.sort_by_key(|d| d.seq);
            outcomes[row.job] = Outcome::Settled(Ok(Ingested::Created {
                message: Arc::new(row.message),
                deliveries: created,
            }));
        }
        outcomes
    }
}

/// The rows of the tag index for new messages: (app id, tag, message id), one per message and tag.
pub(crate) fn tag_rows<'a>(messages: &'a [NewRow<'_>]) -> Vec<(&'a str, &'a str, &'a str)> {
    messages
        .iter()
        .flat_map(|row| {
            let m = &row.message;
            m.tags
                .iter()
                .flatten()
                .map(move |tag| (m.app_id.as_str(), tag.as_str(), m.id.as_str()))
        })
        .collect()
}

/// A new delivery's stored time window start: its message's due time when delivery was scheduled for
/// later (its retries and its lifetime count from then), else none (the message's creation is read).
pub(crate) fn window_start(message: &Message) -> Option<Millis> {
    message.deliver_at.map(|_| message.due_at())
}

/// Match the deliveries an insert returned (`RETURNING seq, message_id, endpoint_id`) back to their jobs,
/// by (message, endpoint), which is unique in a batch (the order of `RETURNING` rows is unspecified).
pub(crate) fn group_deliveries<'a>(
    fan_out: &[FanOut<'a>],
    returned: &[impl Columns],
    by_job: &mut HashMap<usize, Vec<CreatedDelivery>>,
) -> StoreResult<()> {
    let index_of: HashMap<(&str, &str), (usize, &EndpointId)> = fan_out
        .iter()
        .map(|f| ((f.message.id.as_str(), f.endpoint_id.as_str()), (f.job, f.endpoint_id)))
        .collect();
    for row in returned {
        let (seq, message_id, endpoint_id) = (row.int("seq")?, row.text("message_id")?, row.text("endpoint_id")?);
        let (index, endpoint_id) = index_of
            .get(&(message_id.as_str(), endpoint_id.as_str()))
            .copied()
            .ok_or_else(|| StoreError::Corrupt("a delivery came back that was not inserted".into()))?;
        by_job.entry(index).or_default().push(CreatedDelivery {
            seq,
            endpoint_id: endpoint_id.clone(),
        });
    }
    Ok(())
}

/// The record of each delivery's latest attempt in a batch of results. A delivery may appear more than
/// once (a fast retry finished before the previous result was written); its row takes the state of its
/// latest attempt.
pub(crate) fn latest_per_delivery(records: &[AttemptRecord]) -> Vec<&AttemptRecord> {
    let mut latest: HashMap<i64, &AttemptRecord> = HashMap::new();
    for record in records {
        let slot = latest.entry(record.delivery_seq).or_insert(record);
        if record.attempt.attempt_number > slot.attempt.attempt_number {
            *slot = record;
        }
    }
    latest.into_values().collect()
}
