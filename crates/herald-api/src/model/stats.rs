//! Statistics: an endpoint's attempts per time bucket (`routes/stats.rs`) and over a window
//! (`routes/attempt_stats.rs`).

use time::OffsetDateTime;

/// Answer of `GET …/endpoint/{endpoint_id}/attempt-stats` (Svix `EndpointAttemptStats`).
#[derive(Debug, Clone, serde::Serialize)]
pub struct EndpointAttemptStatsOut {
    /// Attempts that succeeded in the window.
    pub success: u64,
    /// Attempts that failed in the window.
    pub fail: u64,
    /// Deliveries of the window's messages canceled before they were made.
    pub canceled: u64,
}

/// An endpoint's attempts per time bucket (Svix `AttemptStatisticsResponse`).
#[derive(Debug, Clone, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AttemptStatisticsResponse {
    /// Start of the first bucket.
    #[serde(with = "time::serde::rfc3339")]
    pub start_date: OffsetDateTime,
    /// End of the window.
    #[serde(with = "time::serde::rfc3339")]
    pub end_date: OffsetDateTime,
    /// `FiveMinutes` or `OneDay`: the length of each bucket.
    pub period: &'static str,
    /// The series, one value per bucket.
    pub data: AttemptStatisticsData,
}

/// The series of [`AttemptStatisticsResponse`], oldest bucket first (absent for an empty window).
#[derive(Debug, Clone, Default, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AttemptStatisticsData {
    /// Successful attempts.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub success_count: Option<Vec<u64>>,
    /// Failed attempts.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub failure_count: Option<Vec<u64>>,
    /// Average response time in milliseconds, `null` without attempts (Herald extension).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub average_duration_ms: Option<Vec<Option<i64>>>,
    /// Slowest response time in milliseconds, `null` without attempts (Herald extension).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_duration_ms: Option<Vec<Option<i64>>>,
}
