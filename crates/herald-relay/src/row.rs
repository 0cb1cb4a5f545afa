//! One outbox row as the relay reads it.

/// An event a producer committed to its outbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboxRow {
    /// The row's position in the outbox (its primary key, increasing in insertion order).
    pub seq: i64,
    /// The producer's id for the event: sent as `eventId`, so a second publish of the row is recognised by
    /// Herald and adds no message.
    pub event_id: String,
    /// The application's id or uid.
    pub app: String,
    /// The event type name.
    pub event_type: String,
    /// The payload, JSON text.
    pub payload: String,
    /// The channels, a JSON array of strings, if any.
    pub channels: Option<String>,
    /// Rows with the same key are published in outbox order.
    pub ordering_key: Option<String>,
    /// When the row was written (Unix milliseconds, the database's clock).
    pub created_at_ms: i64,
}
