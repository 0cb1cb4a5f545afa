//! `GET /stats/app/{app_id}/ep/{endpoint_id}/attempt` (Svix's `v1.stats.endpoint-attempts`): an
//! endpoint's attempts over a window, counted per time bucket by outcome, with Herald's latency figures —
//! what the dashboard draws its charts from.

use axum::extract::{OriginalUri, Path, State};
use axum::routing::get;
use axum::{Json, Router};
use herald_core::clock::now_ms;

use super::{apps, endpoints};
use crate::convert;
use crate::error::{ApiError, ApiResult};
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
    start: i64,
    end: i64,
    length: i64,
    period: &'static str,
}

impl Buckets {
    /// The buckets of `[start, end)` as asked (both or neither), checked; an end after `now` becomes now.
    fn of(start: Option<i64>, end: Option<i64>, now: i64) -> ApiResult<Self> {
        let (start, end) = match (start, end) {
            (None, None) => (now - DEFAULT_WINDOW_MS, now),
            (Some(start), Some(end)) => (start, end),
            (Some(_), None) => {
                return Err(ApiError::query(
                    "endDate",
                    "missing; give both startDate and endDate, or neither",
                ));
            }
            (None, Some(_)) => {
                return Err(ApiError::query(
                    "startDate",
                    "missing; give both startDate and endDate, or neither",
                ));
            }
        };
        // An empty window (start = end) is valid and counts nothing.
        if start > end {
            return Err(ApiError::query("startDate", "must not be after endDate"));
        }
        if end - start > MAX_WINDOW_MS {
            return Err(ApiError::query("endDate", "the window may be 31 days long at most"));
        }
        let end = if start < now { end.min(now) } else { end };
        let (length, period) = if end - start <= DAY_MS {
            (FIVE_MINUTES_MS, "FiveMinutes")
        } else {
            (DAY_MS, "OneDay")
        };
        Ok(Self {
            start: start - start.rem_euclid(length),
            end,
            length,
            period,
        })
    }

    /// How many buckets the window has (the last one may be partial: it is still filling).
    fn count(&self) -> usize {
        usize::try_from((self.end - self.start + self.length - 1) / self.length).unwrap_or(0)
    }
}

async fn endpoint_attempts(
    State(state): State<AppState>,
    Path((app_id, endpoint_id)): Path<(String, String)>,
    OriginalUri(uri): OriginalUri,
) -> ApiResult<Json<AttemptStatisticsResponse>> {
    let query = Query::of(&uri);
    let buckets = Buckets::of(
        query.time_ms(&["startDate", "start_date"])?,
        query.time_ms(&["endDate", "end_date"])?,
        now_ms(),
    )?;
    let app = apps::find(&state, &app_id).await?;
    let endpoint = endpoints::find(&state, &app.id, &endpoint_id).await?;
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
        start_date: convert::datetime(buckets.start),
        end_date: convert::datetime(buckets.end),
        period: buckets.period,
        data,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: i64 = 1_764_590_400_000; // 2025-12-01T12:00:00Z

    #[test]
    fn windows_are_cut_into_five_minutes_up_to_a_day_then_days() {
        let default = Buckets::of(None, None, NOW + 61_000).unwrap();
        assert_eq!((default.period, default.length), ("FiveMinutes", FIVE_MINUTES_MS));
        assert_eq!(default.start % FIVE_MINUTES_MS, 0);
        assert_eq!(default.end, NOW + 61_000);
        assert_eq!(default.count(), 73, "6 hours and the bucket still filling");
        let week = Buckets::of(Some(NOW - 7 * DAY_MS), Some(NOW + DAY_MS), NOW).unwrap();
        assert_eq!((week.period, week.end, week.count()), ("OneDay", NOW, 8));
        assert_eq!(week.start % DAY_MS, 0);
    }

    #[test]
    fn bad_windows_are_refused_with_the_parameter_named() {
        for (start, end, named) in [
            (Some(NOW), None, "endDate"),
            (None, Some(NOW), "startDate"),
            (Some(NOW), Some(NOW - 1), "startDate"),
            (Some(NOW - 32 * DAY_MS), Some(NOW), "endDate"),
        ] {
            let error = Buckets::of(start, end, NOW).unwrap_err();
            assert_eq!(error.field_errors()[0].loc, ["query", named], "{}", error.detail_text());
        }
        // An empty window is valid: it counts nothing.
        assert!(Buckets::of(Some(NOW), Some(NOW), NOW).is_ok());
    }
}
