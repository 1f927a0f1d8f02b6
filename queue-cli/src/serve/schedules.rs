//! `/api/schedules` and `/api/workers`: the periodic jobs this server
//! enqueues (the config's `[[schedules]]`), each with its next occurrence
//! and its last one's job; and the worker processes alive now.

use axum::extract::State;
use axum::Json;
use chrono::{DateTime, Utc};
use queue_core::{JobFilter, ListParams};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::api::{Api, ErrorBody};
use super::error::ApiError;

/// One schedule.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ScheduleView {
    /// Its name (part of each occurrence's unique key).
    pub name: String,
    /// The kind of the jobs it enqueues.
    pub kind: String,
    /// When it occurs: the cron expression, or `every ..`.
    pub when: String,
    /// Its next occurrence; null if it has none.
    pub next_at: Option<DateTime<Utc>>,
    /// Its latest occurrence by now, and that occurrence's job.
    pub last: Option<LastRun>,
}

/// A schedule's latest occurrence.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct LastRun {
    /// When it fell.
    pub at: DateTime<Utc>,
    /// The key of its job; null if none was enqueued (no scheduler ran
    /// then, or it was skipped as missed).
    pub job_id: Option<String>,
    /// That job's state; null without a job.
    pub state: Option<String>,
}

/// The schedules this server enqueues, with their next and last runs.
#[utoipa::path(
    get, path = "/api/schedules", tag = "queue",
    responses(
        (status = 200, description = "The schedules, in the config's order", body = Vec<ScheduleView>),
        (status = 401, description = "No valid token", body = ErrorBody),
        (status = 503, description = "The database is unavailable", body = ErrorBody),
    ),
    security((), ("bearer" = []))
)]
pub async fn schedules(State(api): State<Api>) -> Result<Json<Vec<ScheduleView>>, ApiError> {
    let now = Utc::now();
    let mut views = Vec::with_capacity(api.schedules.len());
    for schedule in api.schedules.iter() {
        let last = match schedule.latest_by(now) {
            None => None,
            Some(at) => {
                // Each occurrence's job carries the occurrence's unique key.
                let filter = JobFilter::default().unique_key(schedule.occurrence_key(at));
                let page = api.admin.list(&ListParams::first(filter, 1)).await?;
                let job = page.jobs.into_iter().next();
                Some(LastRun {
                    at,
                    state: job.as_ref().map(|j| {
                        j.state
                            .map_or_else(|| j.stored_state.clone(), |s| s.as_str().to_owned())
                    }),
                    job_id: job.map(|j| j.id),
                })
            }
        };
        views.push(ScheduleView {
            name: schedule.name().to_owned(),
            kind: schedule.kind().to_owned(),
            when: schedule.when().to_owned(),
            next_at: schedule.next_after(now),
            last,
        });
    }
    Ok(Json(views))
}

/// A live worker process: the core's [`WorkerInfo`], as it is.
pub use queue_core::WorkerInfo as WorkerView;

/// The worker processes that beat within the stalled age (as the
/// resetter judges a silent job): a worker silent for longer is taken for
/// dead and left out.
#[utoipa::path(
    get, path = "/api/workers", tag = "queue",
    responses(
        (status = 200, description = "The live workers, by name", body = Vec<WorkerView>),
        (status = 400, description = "The workers table does not exist", body = ErrorBody),
        (status = 401, description = "No valid token", body = ErrorBody),
        (status = 503, description = "The database is unavailable", body = ErrorBody),
    ),
    security((), ("bearer" = []))
)]
pub async fn workers(State(api): State<Api>) -> Result<Json<Vec<WorkerView>>, ApiError> {
    let max_age = chrono::TimeDelta::from_std(api.stalled_max_age)
        .unwrap_or_else(|_| chrono::TimeDelta::seconds(60));
    let live = api.admin.workers(Utc::now() - max_age).await?;
    Ok(Json(live))
}
