//! `GET /stats/app/{app_id}/ep/{endpoint_id}/attempt` (Svix's `v1.stats.endpoint-attempts`): an
//! endpoint's attempts over a window, counted per time bucket by outcome, with Herald's latency figures —
//! what the dashboard draws its charts from.

use axum::extract::{OriginalUri, Path, State};
use axum::routing::get;
use axum::{Json, Router};
use herald_core::clock::{self, Millis};
use herald_core::id::{AppIdOrUid, EndpointIdOrUid};

use crate::error::{ApiError, ApiResult};
use crate::lookup;
use crate::model::{AttemptStatisticsData, AttemptStatisticsResponse};
use crate::query::Query;
use crate::state::AppState;

const FIVE_MINUTES_MS: i64 = 5 * 60 * 1000;
const DAY_MS: i64 = 24 * 60 * 60 * 1000;
/// The window when none is given (as Svix).
const DEFAULT_WINDOW_MS: i64 = 6 * 60 * 60 * 1000;
/// The longest window: a month of daily buckets.
const MAX_WINDOW_MS: i64 = 31 * DAY_MS;

pub(super) fn routes() -> Router<AppState> {
    Router::new().route("/stats/app/{app_id}/ep/{endpoint_id}/attempt", get(endpoint_attempts))
}

/// A window cut into buckets: its start (on a bucket boundary), its end, the bucket length and its name.
#[derive(Debug, PartialEq, Eq)]
struct Buckets {
    start: Millis,
    end: Millis,
    /// In milliseconds.
    length: i64,
    period: &'static str,
}

impl Buckets {
    /// The buckets of `[start, end)` as asked. Every pair of times is accepted (the document cannot state
    /// a rule between two parameters, and a client need not know one): a missing end is now, a missing
    /// start the default window before the end, a start after the end an empty window at the end, and a
    /// window longer than the longest its last [`MAX_WINDOW_MS`]. The answer's `startDate` and `endDate`
    /// say which window was counted. An end after `now` becomes now.
    fn of(start: Option<Millis>, end: Option<Millis>, now: Millis) -> Self {
        let end = end.unwrap_or(now);
        let start = start.unwrap_or(end.add_ms(-DEFAULT_WINDOW_MS)).min(end);
        let start = start.max(end.add_ms(-MAX_WINDOW_MS));
        let end = if start < now { end.min(now) } else { end };
        let (length, period) = if end.ms_since(start) <= DAY_MS {
            (FIVE_MINUTES_MS, "FiveMinutes")
        } else {
            (DAY_MS, "OneDay")
        };
        Self {
            // Buckets are whole multiples of their length since the epoch (UTC days, five minutes).
            start: start.add_ms(-start.as_unix_ms().rem_euclid(length)),
            end,
            length,
            period,
        }
    }

    /// How many buckets the window has (the last one may be partial: it is still filling).
    fn count(&self) -> usize {
        usize::try_from((self.end.ms_since(self.start) + self.length - 1) / self.length).unwrap_or(0)
    }
}

async fn endpoint_attempts(
    State(state): State<AppState>,
    Path((app_id, endpoint_id)): Path<(AppIdOrUid, EndpointIdOrUid)>,
    OriginalUri(uri): OriginalUri,
) -> ApiResult<Json<AttemptStatisticsResponse>> {
    let query = Query::of(&uri);
    let buckets = Buckets::of(
        query.time(&["startDate", "start_date"])?,
        query.time(&["endDate", "end_date"])?,
        clock::now(),
    );
    let app = lookup::app(&state, &app_id).await?;
    let endpoint = lookup::endpoint(&state, &app.id, &endpoint_id).await?;
    let found = state
        .store
        .attempt_buckets(&endpoint.id, buckets.start, buckets.end, buckets.length)
        .await
        .map_err(|e| ApiError::from_store(e, "endpoint"))?;
    let count = buckets.count();
    let mut data = AttemptStatisticsData {
        success_count: Some(vec![0; count]),
        failure_count: Some(vec![0; count]),
        average_duration_ms: Some(vec![None; count]),
        max_duration_ms: Some(vec![None; count]),
    };
    for bucket in found {
        let Some(i) = usize::try_from(bucket.index).ok().filter(|i| *i < count) else {
            continue;
        };
        let attempts = bucket.succeeded + bucket.failed;
        if let (Some(ok), Some(failed), Some(average), Some(max)) = (
            data.success_count.as_mut(),
            data.failure_count.as_mut(),
            data.average_duration_ms.as_mut(),
            data.max_duration_ms.as_mut(),
        ) {
            ok[i] = bucket.succeeded;
            failed[i] = bucket.failed;
            average[i] = i64::try_from(attempts)
                .ok()
                .filter(|n| *n > 0)
                .map(|n| bucket.total_duration_ms / n);
            max[i] = Some(bucket.max_duration_ms);
        }
    }
    if count == 0 {
        data = AttemptStatisticsData::default();
    }
    Ok(Json(AttemptStatisticsResponse {
        start_date: buckets.start.to_datetime(),
        end_date: buckets.end.to_datetime(),
        period: buckets.period,
        data,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: Millis = Millis::from_unix_ms(1_764_590_400_000); // 2025-12-01T12:00:00Z

    #[test]
    fn windows_are_cut_into_five_minutes_up_to_a_day_then_days() {
        let default = Buckets::of(None, None, NOW.add_ms(61_000));
        assert_eq!((default.period, default.length), ("FiveMinutes", FIVE_MINUTES_MS));
        assert_eq!(default.start.as_unix_ms() % FIVE_MINUTES_MS, 0);
        assert_eq!(default.end, NOW.add_ms(61_000));
        assert_eq!(default.count(), 73, "6 hours and the bucket still filling");
        let week = Buckets::of(Some(NOW.add_ms(-(7 * DAY_MS))), Some(NOW.add_ms(DAY_MS)), NOW);
        assert_eq!((week.period, week.end, week.count()), ("OneDay", NOW, 8));
        assert_eq!(week.start.as_unix_ms() % DAY_MS, 0);
    }

    #[test]
    fn every_pair_of_times_is_answered_with_the_window_counted() {
        // Only a start: up to now.
        let since = Buckets::of(Some(NOW.add_ms(-DAY_MS)), None, NOW);
        assert_eq!((since.start, since.end), (NOW.add_ms(-DAY_MS), NOW));
        // Only an end: the default window before it.
        let until = Buckets::of(None, Some(NOW.add_ms(-DAY_MS)), NOW);
        assert_eq!(until.end, NOW.add_ms(-DAY_MS));
        assert_eq!(until.start, NOW.add_ms(-DAY_MS - DEFAULT_WINDOW_MS));
        // A start after the end: an empty window, counting nothing.
        let reversed = Buckets::of(Some(NOW), Some(NOW.add_ms(-DAY_MS)), NOW);
        assert_eq!((reversed.end, reversed.count()), (NOW.add_ms(-DAY_MS), 0));
        // Too long: its last 31 days (from the start of the first day's bucket).
        let long = Buckets::of(Some(NOW.add_ms(-(400 * DAY_MS))), Some(NOW), NOW);
        let from = NOW.add_ms(-31 * DAY_MS);
        assert_eq!(
            (long.start, long.end),
            (from.add_ms(-from.as_unix_ms().rem_euclid(DAY_MS)), NOW)
        );
        assert_eq!(long.count(), 32, "31 days from noon span 32 daily buckets");
        // An empty window is valid: it counts nothing.
        assert_eq!(Buckets::of(Some(NOW), Some(NOW), NOW).count(), 0);
    }
}
