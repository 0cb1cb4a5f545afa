//! What an attempt's result means: delivered, retry later, or give up — the rules of the delivery contract.
//!
//! - 2xx: delivered.
//! - 408, 425, 429, 5xx, timeouts, connection errors: retried on the schedule.
//! - 3xx: a failure (redirects are never followed). It is retried, because the receiver's operator can fix
//!   a redirect on their side (an http→https move, a changed path) and the next attempt then succeeds.
//! - 410 Gone: terminal for the delivery, and the endpoint is disabled (the receiver said it is gone).
//! - other 4xx: terminal for the delivery (resending the identical bytes would be refused identically).
//! - an address refused by the policy: retried, since a name may resolve elsewhere later; no connection
//!   is ever made, so a retry costs nothing at the target.

use std::time::{Duration, SystemTime};

use crate::retry::RetrySchedule;

/// The observable result of one HTTP attempt, as the delivery client reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AttemptResult {
    /// The endpoint answered with a status code.
    Response {
        /// The HTTP status code.
        status: u16,
        /// The endpoint's `Retry-After`, already converted to a delay.
        retry_after: Option<Duration>,
    },
    /// No complete answer within the time limit.
    Timeout,
    /// The connection could not be made or broke (refused, reset, TLS failure).
    ConnectError,
    /// The address policy refused the destination; no connection was attempted.
    Blocked,
}

/// A stable, coarse label for an attempt's outcome, stored with the attempt and shown to operators.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutcomeClass {
    /// 2xx.
    Success,
    /// 1xx or 3xx.
    UnexpectedStatus,
    /// 408, 425 or 429.
    RetryableClientError,
    /// 410 Gone.
    Gone,
    /// Any other 4xx.
    ClientError,
    /// 5xx.
    ServerError,
    /// The request timed out.
    Timeout,
    /// The connection failed.
    ConnectError,
    /// The destination was refused by the address policy.
    Blocked,
}

impl OutcomeClass {
    /// Every class.
    pub const ALL: [OutcomeClass; 9] = [
        OutcomeClass::Success,
        OutcomeClass::UnexpectedStatus,
        OutcomeClass::RetryableClientError,
        OutcomeClass::Gone,
        OutcomeClass::ClientError,
        OutcomeClass::ServerError,
        OutcomeClass::Timeout,
        OutcomeClass::ConnectError,
        OutcomeClass::Blocked,
    ];

    /// The class whose [`OutcomeClass::as_str`] is `name`, if one is (how the store reads the log back).
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|class| class.as_str() == name)
    }

    /// The stable snake_case name stored in the attempt log.
    pub const fn as_str(self) -> &'static str {
        match self {
            OutcomeClass::Success => "success",
            OutcomeClass::UnexpectedStatus => "unexpected_status",
            OutcomeClass::RetryableClientError => "retryable_client_error",
            OutcomeClass::Gone => "gone",
            OutcomeClass::ClientError => "client_error",
            OutcomeClass::ServerError => "server_error",
            OutcomeClass::Timeout => "timeout",
            OutcomeClass::ConnectError => "connect_error",
            OutcomeClass::Blocked => "blocked",
        }
    }

    /// Classify a result.
    pub fn of(result: &AttemptResult) -> Self {
        match *result {
            AttemptResult::Response { status, .. } => match status {
                200..=299 => OutcomeClass::Success,
                408 | 425 | 429 => OutcomeClass::RetryableClientError,
                410 => OutcomeClass::Gone,
                400..=499 => OutcomeClass::ClientError,
                500..=599 => OutcomeClass::ServerError,
                _ => OutcomeClass::UnexpectedStatus,
            },
            AttemptResult::Timeout => OutcomeClass::Timeout,
            AttemptResult::ConnectError => OutcomeClass::ConnectError,
            AttemptResult::Blocked => OutcomeClass::Blocked,
        }
    }

    /// Whether this outcome says the endpoint is unwell, for its circuit breaker: everything that fails
    /// except a content rejection (a 4xx other than 408, 425 and 429), which shows the endpoint up and
    /// answering. 1xx/3xx and refused addresses count: they fail every delivery alike.
    pub const fn is_health_failure(self) -> bool {
        !matches!(
            self,
            OutcomeClass::Success | OutcomeClass::Gone | OutcomeClass::ClientError
        )
    }

    /// Whether another attempt could succeed where this one failed.
    pub const fn is_retryable(self) -> bool {
        !matches!(
            self,
            OutcomeClass::Success | OutcomeClass::Gone | OutcomeClass::ClientError
        )
    }
}

/// What happens to a delivery after an attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NextStep {
    /// The endpoint accepted it; the delivery is finished.
    Delivered,
    /// Try again after this delay.
    RetryIn(Duration),
    /// The failure is terminal for this delivery; no more attempts.
    Failed {
        /// The endpoint said it is gone: disable it.
        disable_endpoint: bool,
    },
    /// Every scheduled attempt failed; the delivery is dead (kept, listed, replayable).
    Dead,
}

/// Decide the next step after the `attempts_made`-th attempt ended with `result`.
///
/// `jitter` in `[-1, 1]` is drawn by the caller (see [`RetrySchedule::delay_after`]). A `Retry-After`
/// longer than the scheduled delay wins, but never beyond the schedule's whole window, so one answer
/// cannot park a delivery past the point where it would otherwise have died.
pub fn next_step(result: &AttemptResult, attempts_made: u32, schedule: &RetrySchedule, jitter: f64) -> NextStep {
    let class = OutcomeClass::of(result);
    match class {
        OutcomeClass::Success => return NextStep::Delivered,
        OutcomeClass::Gone => {
            return NextStep::Failed { disable_endpoint: true };
        }
        OutcomeClass::ClientError => {
            return NextStep::Failed {
                disable_endpoint: false,
            };
        }
        _ => {}
    }
    let Some(scheduled) = schedule.delay_after(attempts_made, jitter) else {
        return NextStep::Dead;
    };
    let requested = match result {
        AttemptResult::Response {
            retry_after: Some(wait),
            ..
        } => (*wait).min(schedule.window()),
        _ => Duration::ZERO,
    };
    NextStep::RetryIn(scheduled.max(requested))
}

/// Parse a `Retry-After` header value: delay-seconds or an HTTP date (RFC 9110 §10.2.3).
///
/// A date in the past means "now" (zero). Anything unparseable is ignored (`None`): a malformed header
/// must not change the schedule.
pub fn parse_retry_after(value: &str, now: SystemTime) -> Option<Duration> {
    let value = value.trim();
    if !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()) {
        // Saturate absurd values; next_step bounds them by the schedule's window anyway.
        return Some(Duration::from_secs(value.parse::<u64>().unwrap_or(u64::MAX)));
    }
    let when = httpdate::parse_http_date(value).ok()?;
    Some(when.duration_since(now).unwrap_or(Duration::ZERO))
}

/// How long the whole endpoint should be left alone after this result: the `Retry-After` of a 429 (too
/// many requests) or 503 (unavailable). Those answers speak for the endpoint, not for one delivery, so
/// every delivery to it waits (see `scheduler::Verdict`). Other statuses' `Retry-After` only moves their
/// own delivery's retry.
pub fn endpoint_hold(result: &AttemptResult) -> Option<Duration> {
    match result {
        AttemptResult::Response {
            status: 429 | 503,
            retry_after,
        } => *retry_after,
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(code: u16) -> AttemptResult {
        AttemptResult::Response {
            status: code,
            retry_after: None,
        }
    }

    #[test]
    fn classifies_every_status_family() {
        for code in 100..=599u16 {
            let class = OutcomeClass::of(&status(code));
            let expected_retryable =
                !(200..300).contains(&code) && (!(400..500).contains(&code) || [408, 425, 429].contains(&code));
            assert_eq!(class.is_retryable(), expected_retryable, "status {code}");
        }
        assert_eq!(OutcomeClass::of(&status(302)), OutcomeClass::UnexpectedStatus);
        assert_eq!(OutcomeClass::of(&status(410)), OutcomeClass::Gone);
        assert!(OutcomeClass::Timeout.is_retryable());
        assert!(OutcomeClass::ConnectError.is_retryable());
        assert!(OutcomeClass::Blocked.is_retryable());
    }

    #[test]
    fn an_outcome_class_reads_back_its_own_name() {
        for class in OutcomeClass::ALL {
            assert_eq!(OutcomeClass::parse(class.as_str()), Some(class));
        }
        assert_eq!(OutcomeClass::parse("Success"), None);
    }

    #[test]
    fn only_429_and_503_hold_the_endpoint() {
        let wait = Some(Duration::from_secs(7));
        for code in [429, 503] {
            let result = AttemptResult::Response {
                status: code,
                retry_after: wait,
            };
            assert_eq!(endpoint_hold(&result), wait);
            assert_eq!(endpoint_hold(&status(code)), None, "no header, no hold");
        }
        for code in [200, 302, 408, 500, 502] {
            let result = AttemptResult::Response {
                status: code,
                retry_after: wait,
            };
            assert_eq!(endpoint_hold(&result), None, "status {code}");
        }
        assert_eq!(endpoint_hold(&AttemptResult::Timeout), None);
    }

    #[test]
    fn next_step_follows_the_contract() {
        let schedule: RetrySchedule = "1s,2s".parse().unwrap();
        assert_eq!(next_step(&status(204), 1, &schedule, 0.0), NextStep::Delivered);
        assert_eq!(
            next_step(&status(400), 1, &schedule, 0.0),
            NextStep::Failed {
                disable_endpoint: false
            }
        );
        assert_eq!(
            next_step(&status(410), 1, &schedule, 0.0),
            NextStep::Failed { disable_endpoint: true }
        );
        assert_eq!(
            next_step(&status(503), 1, &schedule, 0.0),
            NextStep::RetryIn(Duration::from_secs(1))
        );
        assert_eq!(
            next_step(&AttemptResult::Timeout, 2, &schedule, 0.0),
            NextStep::RetryIn(Duration::from_secs(2))
        );
        assert_eq!(next_step(&status(500), 3, &schedule, 0.0), NextStep::Dead);
        assert_eq!(next_step(&status(301), 3, &schedule, 0.0), NextStep::Dead);
        // A success on the last attempt is still a success.
        assert_eq!(next_step(&status(200), 3, &schedule, 0.0), NextStep::Delivered);
    }

    #[test]
    fn retry_after_wins_when_longer_but_stays_in_the_window() {
        let schedule: RetrySchedule = "1s,2s".parse().unwrap();
        let with = |secs| AttemptResult::Response {
            status: 429,
            retry_after: Some(Duration::from_secs(secs)),
        };
        assert_eq!(
            next_step(&with(2), 1, &schedule, 0.0),
            NextStep::RetryIn(Duration::from_secs(2))
        );
        assert_eq!(
            next_step(&with(0), 1, &schedule, 0.0),
            NextStep::RetryIn(Duration::from_secs(1))
        );
        assert_eq!(
            next_step(&with(3600), 1, &schedule, 0.0),
            NextStep::RetryIn(Duration::from_secs(3))
        );
    }

    #[test]
    fn parses_retry_after_forms() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        assert_eq!(parse_retry_after("120", now), Some(Duration::from_secs(120)));
        assert_eq!(parse_retry_after(" 7 ", now), Some(Duration::from_secs(7)));
        let later = httpdate::fmt_http_date(now + Duration::from_secs(30));
        assert_eq!(parse_retry_after(&later, now), Some(Duration::from_secs(30)));
        let earlier = httpdate::fmt_http_date(now - Duration::from_secs(30));
        assert_eq!(parse_retry_after(&earlier, now), Some(Duration::ZERO));
        for bad in ["", "-1", "1.5", "soon", "Mon, 99 Foo"] {
            assert_eq!(parse_retry_after(bad, now), None, "{bad:?}");
        }
        assert!(parse_retry_after("99999999999999999999999", now).is_some());
    }
}
