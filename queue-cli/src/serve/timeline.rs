//! `/api/timeline`: what the dashboard's chart draws, per minute.
//! Completions, failures and cancels come from the table's finish times
//! ([`Admin::finished_timeline`](queue_core::Admin::finished_timeline)),
//! so they reach back as far as finished rows are kept. How many jobs
//! wait cannot be read back from a table, so the server samples it
//! whenever it counts the jobs (every [`SAMPLE_EVERY`] while it runs, and
//! on every `/api/stats`) and keeps a day of samples: the depth line
//! starts when the server did.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::Duration;

use axum::extract::State;
use axum::Json;
use chrono::{DateTime, DurationRound, TimeDelta, Utc};
use queue_core::{JobState, QueueStats, TimelineParams};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::api::{Api, ApiError, ApiQuery, ErrorBody};

/// How often a running server samples the depth.
pub const SAMPLE_EVERY: Duration = Duration::from_secs(15);
/// How long samples are kept.
const KEEP: TimeDelta = TimeDelta::hours(24);
/// Samples closer together than this replace each other.
const COALESCE: TimeDelta = TimeDelta::seconds(5);

/// How many jobs waited and ran at one time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct DepthSample {
    at: DateTime<Utc>,
    waiting: u64,
    processing: u64,
}

/// The depth samples of the last day.
#[derive(Debug, Default)]
pub struct DepthHistory {
    samples: Mutex<VecDeque<DepthSample>>,
}

impl DepthHistory {
    /// Records the depth `stats` found.
    pub fn record(&self, stats: &QueueStats) {
        let sample = DepthSample {
            at: stats.now,
            waiting: stats.total(JobState::Queued) + stats.total(JobState::Errored),
            processing: stats.total(JobState::Processing),
        };
        let mut samples = self.samples.lock().unwrap_or_else(|p| p.into_inner());
        if samples
            .back()
            .is_some_and(|last| sample.at - last.at < COALESCE && sample.at >= last.at)
        {
            samples.pop_back();
        }
        samples.push_back(sample);
        while samples.front().is_some_and(|s| stats.now - s.at > KEEP) {
            samples.pop_front();
        }
    }

    /// The last sample in `[from, until)`.
    fn last_in(&self, from: DateTime<Utc>, until: DateTime<Utc>) -> Option<DepthSample> {
        let samples = self.samples.lock().unwrap_or_else(|p| p.into_inner());
        samples
            .iter()
            .rev()
            .find(|s| s.at >= from && s.at < until)
            .copied()
    }
}

/// Which minutes to show.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct TimelineQuery {
    /// How many minutes back from now, 1 to 1440 (default 60).
    #[param(minimum = 1, maximum = 1440)]
    pub minutes: Option<u32>,
}

/// One minute of the queue.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct TimelinePoint {
    /// Where the minute starts.
    pub start: DateTime<Utc>,
    /// Jobs that completed in it.
    pub completed: u64,
    /// Jobs that failed for good in it.
    pub failed: u64,
    /// Jobs canceled in it.
    pub canceled: u64,
    /// Jobs that completed in it, per kind: each kind's throughput (empty
    /// for a table without a kind column).
    pub completed_by_kind: std::collections::BTreeMap<String, u64>,
    /// Jobs waiting (queued, or errored and waiting to be retried) at the
    /// minute's last sample; `null` when the server took none in it.
    pub waiting: Option<u64>,
    /// Jobs running at that sample.
    pub processing: Option<u64>,
}

/// The queue minute by minute, oldest first; the last minute is the
/// current one.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct Timeline {
    /// The length of each point, in seconds.
    pub bucket_seconds: u32,
    /// Whether the table keeps finish times; without them the finished
    /// counts are all zero.
    pub finish_times_kept: bool,
    pub points: Vec<TimelinePoint>,
}

/// Jobs finished per minute and the depth, over the last hour (or
/// `minutes`).
#[utoipa::path(
    get, path = "/api/timeline", tag = "queue",
    params(TimelineQuery),
    responses(
        (status = 200, description = "The queue minute by minute", body = Timeline),
        (status = 400, description = "A bad option", body = ErrorBody),
        (status = 401, description = "No valid token", body = ErrorBody),
        (status = 503, description = "The database is unavailable", body = ErrorBody),
    ),
    security((), ("bearer" = []))
)]
pub async fn timeline(
    State(api): State<Api>,
    ApiQuery(query): ApiQuery<TimelineQuery>,
) -> Result<Json<Timeline>, ApiError> {
    let minutes = query.minutes.unwrap_or(60);
    if !(1..=1440).contains(&minutes) {
        return Err(ApiError::bad_request("minutes must be between 1 and 1440"));
    }
    let minute = TimeDelta::minutes(1);
    let now = Utc::now();
    let this_minute = now.duration_trunc(minute).unwrap_or(now);
    let params = TimelineParams::ending(this_minute + minute, minute, minutes);
    let finished = api.admin.finished_timeline(&params).await?;
    let finish_times_kept = finished.is_some();
    let points = finished
        .unwrap_or_else(|| params.empty())
        .into_iter()
        .map(|bucket| {
            let depth = api.depth.last_in(bucket.start, bucket.start + minute);
            TimelinePoint {
                start: bucket.start,
                completed: bucket.completed,
                failed: bucket.failed,
                canceled: bucket.canceled,
                completed_by_kind: bucket.completed_by_kind,
                waiting: depth.map(|d| d.waiting),
                processing: depth.map(|d| d.processing),
            }
        })
        .collect();
    Ok(Json(Timeline {
        bucket_seconds: 60,
        finish_times_kept,
        points,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use queue_core::StateCount;

    fn stats(at: DateTime<Utc>, queued: u64, processing: u64) -> QueueStats {
        let count =
            |state: JobState, count| StateCount::new(Some(state), state.as_str(), None, count);
        QueueStats::new(
            vec![
                count(JobState::Queued, queued),
                count(JobState::Errored, 1),
                count(JobState::Processing, processing),
            ],
            None,
            Some(0),
            at,
        )
    }

    #[test]
    fn close_samples_replace_each_other_and_old_ones_go() {
        let history = DepthHistory::default();
        let t = DateTime::<Utc>::from_timestamp(1_800_000_000, 0).expect("a time");
        history.record(&stats(t, 10, 2));
        history.record(&stats(t + TimeDelta::seconds(2), 20, 3));
        history.record(&stats(t + TimeDelta::seconds(30), 30, 4));
        let first = history.last_in(t, t + TimeDelta::seconds(10));
        assert_eq!(
            first.map(|s| (s.waiting, s.processing)),
            Some((21, 3)),
            "the sample 2 s later replaced the first; waiting counts errored jobs"
        );
        assert_eq!(
            history
                .last_in(t, t + TimeDelta::minutes(1))
                .map(|s| s.waiting),
            Some(31)
        );
        history.record(&stats(t + TimeDelta::hours(25), 1, 0));
        assert_eq!(
            history.last_in(t, t + TimeDelta::minutes(1)),
            None,
            "samples older than a day are dropped"
        );
    }
}
