//! The HTTP API's handlers and the JSON they take and give, described for
//! the OpenAPI document by their types (`utoipa`). Every handler is a thin
//! call into the admin contract.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::rejection::{JsonRejection, QueryRejection};
use axum::extract::{FromRequest, FromRequestParts, Path, Request, State};
use axum::http::request::Parts;
use axum::http::StatusCode;
use axum::Json;
use chrono::{DateTime, Utc};
use queue_core::{
    ActionReport, JobFilter, JobState, JobView, ListOrder, ListParams, NewJob, RetryParams,
    SkipReason, StatsParams, StoreError, Targets, UniqueScope,
};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::erased::TextAdmin;
pub use super::error::{ApiError, ErrorBody, ErrorDetail};
use super::timeline::DepthHistory;
use crate::args::states_named_in;

/// What the handlers share.
#[derive(Clone)]
pub struct Api {
    /// The queue.
    pub admin: Arc<TextAdmin>,
    /// The type of its keys, which the OpenAPI document describes.
    pub key: queue_store_postgres::PgKeyType,
    /// Processing jobs silent for longer are counted stalled.
    pub stalled_max_age: Duration,
    /// The depth samples the timeline draws.
    pub depth: Arc<DepthHistory>,
    /// The background tasks `/healthz` watches.
    pub health: Arc<super::health::Health>,
    /// The figures of the last read, and when it was: one read at a time.
    stats: Arc<tokio::sync::Mutex<Option<(std::time::Instant, queue_core::QueueStats)>>>,
    /// The same for the figures counted exactly (`/api/stats?exact=true`).
    exact_stats: Arc<tokio::sync::Mutex<Option<(std::time::Instant, queue_core::QueueStats)>>>,
    /// How many times the figures were read from the store.
    stats_reads: Arc<std::sync::atomic::AtomicU64>,
    /// The schedules this server runs (the config's `[[schedules]]`).
    pub schedules: Arc<Vec<queue_worker::Schedule>>,
    /// Wakes this server's operation runner when an operation is started.
    pub operations: Arc<tokio::sync::Notify>,
    /// Appends the API's writes to the audit log.
    pub audit: super::audit::AuditWriter,
}

/// How long the queue's figures serve every caller (`/api/stats`, every
/// dashboard tab, `/metrics`, the depth sampler) before they are read
/// again: however many ask, the store sees one read a second at most.
pub const STATS_FRESH: Duration = Duration::from_secs(1);

impl Api {
    /// The API over `admin`, whose keys are of type `key`. Starts the
    /// audit log's writer, which `health` watches: call it within a Tokio
    /// runtime.
    pub fn new(
        admin: Arc<TextAdmin>,
        key: queue_store_postgres::PgKeyType,
        stalled_max_age: Duration,
    ) -> Self {
        let (audit, writing) = super::audit::AuditWriter::spawn(admin.clone());
        let health = Arc::new(super::health::Health::default());
        health.watch("audit writer", writing.abort_handle());
        Api {
            audit,
            admin,
            key,
            stalled_max_age,
            depth: Arc::default(),
            health,
            stats: Arc::default(),
            exact_stats: Arc::default(),
            stats_reads: Arc::default(),
            schedules: Arc::default(),
            operations: Arc::default(),
        }
    }

    /// How many times this server has read the queue's figures from the
    /// store.
    pub fn stats_reads(&self) -> u64 {
        self.stats_reads.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Drops the figures read last: the next caller reads them again (after
    /// a pause or a resume, which they show).
    pub async fn forget_stats(&self) {
        *self.stats.lock().await = None;
        *self.exact_stats.lock().await = None;
    }

    /// The queue's figures, at most [`STATS_FRESH`] old (estimated on a big
    /// table, unless `exact`). One read at a time (single flight): a caller
    /// that comes while a read runs waits for it and takes its figures. A
    /// fresh read is recorded in the depth history.
    pub async fn stats_now(&self, exact: bool) -> Result<queue_core::QueueStats, StoreError> {
        let slot = if exact {
            &self.exact_stats
        } else {
            &self.stats
        };
        let mut last = slot.lock().await;
        if let Some((at, stats)) = last.as_ref() {
            if at.elapsed() < STATS_FRESH {
                return Ok(stats.clone());
            }
        }
        let now = Utc::now();
        let max_age = chrono::TimeDelta::from_std(self.stalled_max_age)
            .unwrap_or_else(|_| chrono::TimeDelta::seconds(60));
        let mut params = StatsParams::new(now, now - max_age);
        if exact {
            params = params.exact();
        }
        let stats = self.admin.stats(params).await?;
        self.stats_reads
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.depth.record(&stats);
        *last = Some((std::time::Instant::now(), stats.clone()));
        Ok(stats)
    }
}

/// A JSON body whose rejections are [`ApiError`]s.
pub struct ApiJson<T>(pub T);

impl<S, T> FromRequest<S> for ApiJson<T>
where
    S: Send + Sync,
    T: serde::de::DeserializeOwned,
{
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &S) -> Result<Self, ApiError> {
        match Json::<serde_json::Value>::from_request(request, state).await {
            Ok(Json(value)) => from_object(value, "the body").map(ApiJson),
            Err(rejection) => Err(json_rejection(rejection)),
        }
    }
}

/// A request body (`bytes`) as `T`: JSON, and an object ([`from_object`]);
/// `what` names it in the errors.
pub(crate) fn object_body<T: serde::de::DeserializeOwned>(
    bytes: &[u8],
    what: &str,
) -> Result<T, ApiError> {
    let value = serde_json::from_slice(bytes)
        .map_err(|e| ApiError::bad_request(format!("the body is not {what}: {e}")))?;
    from_object(value, &format!("the body ({what})"))
}

/// `value` as `T`, a request body the API documents as an object: serde
/// would also read a struct from an array of its fields in order
/// (`[null, null]`), which no schema of ours admits.
pub(crate) fn from_object<T: serde::de::DeserializeOwned>(
    value: serde_json::Value,
    what: &str,
) -> Result<T, ApiError> {
    if !value.is_object() {
        return Err(ApiError::bad_request(format!(
            "{what} must be a JSON object, not {}",
            match value {
                serde_json::Value::Null => "null",
                serde_json::Value::Bool(_) => "a boolean",
                serde_json::Value::Number(_) => "a number",
                serde_json::Value::String(_) => "a string",
                serde_json::Value::Array(_) => "an array",
                serde_json::Value::Object(_) => "an object",
            }
        )));
    }
    serde_json::from_value(value)
        .map_err(|e| ApiError::bad_request(format!("Failed to deserialize {what}: {e}")))
}

fn json_rejection(rejection: JsonRejection) -> ApiError {
    let message = rejection.body_text();
    match rejection.status() {
        StatusCode::PAYLOAD_TOO_LARGE => {
            ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large", message)
        }
        StatusCode::UNSUPPORTED_MEDIA_TYPE => ApiError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
            message,
        ),
        _ => ApiError::bad_request(message),
    }
}

/// A query string whose rejections are [`ApiError`]s. A parameter the
/// endpoint does not declare is refused, so a misspelt filter cannot widen
/// a bulk operation to every job.
pub struct ApiQuery<T>(pub T);

impl<S, T> FromRequestParts<S> for ApiQuery<T>
where
    S: Send + Sync,
    T: serde::de::DeserializeOwned + IntoParams,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, ApiError> {
        refuse_undeclared(parts, &[&parameter_names::<T>()])?;
        parse_query(parts).map(ApiQuery)
    }
}

/// A list's query: which jobs, and which page of them.
pub struct ListQuery(pub FilterQuery, pub PageQuery);

impl<S: Send + Sync> FromRequestParts<S> for ListQuery {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, ApiError> {
        let filter = parameter_names::<FilterQuery>();
        let page = parameter_names::<PageQuery>();
        refuse_undeclared(parts, &[&filter, &page])?;
        Ok(ListQuery(parse_query(parts)?, parse_query(parts)?))
    }
}

/// The query parameters `T` declares in the OpenAPI document.
fn parameter_names<T: IntoParams>() -> Vec<String> {
    T::into_params(|| Some(utoipa::openapi::path::ParameterIn::Query))
        .into_iter()
        .map(|parameter| parameter.name)
        .collect()
}

/// Refuses a query parameter none of `declared` names.
fn refuse_undeclared(parts: &Parts, declared: &[&[String]]) -> Result<(), ApiError> {
    let query = parts.uri.query().unwrap_or_default();
    for (name, _) in form_urlencoded::parse(query.as_bytes()) {
        if !declared
            .iter()
            .any(|names| names.iter().any(|n| *n == name))
        {
            let known: Vec<&str> = declared
                .iter()
                .flat_map(|names| names.iter().map(String::as_str))
                .collect();
            return Err(ApiError::bad_request(format!(
                "unknown query parameter {name:?}; this endpoint takes: {}",
                if known.is_empty() {
                    "none".to_string()
                } else {
                    known.join(", ")
                }
            )));
        }
    }
    Ok(())
}

/// `T` from the request's query string.
fn parse_query<T: serde::de::DeserializeOwned>(parts: &Parts) -> Result<T, ApiError> {
    axum::extract::Query::<T>::try_from_uri(&parts.uri)
        .map(|q| q.0)
        .map_err(|rejection: QueryRejection| ApiError::bad_request(rejection.body_text()))
}

/// A job: its key, kind, payload, state and every standard column the
/// table has (`null` where it has none). On the wire it is the core's
/// [`JobView`] with a text key, field for field; only its schema's name is
/// `Job` (utoipa would name the generic type `JobView_String`).
#[derive(Debug, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Job(pub JobView<String>);

impl From<JobView<String>> for Job {
    fn from(job: JobView<String>) -> Self {
        Job(job)
    }
}

impl utoipa::PartialSchema for Job {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        <JobView<String> as utoipa::PartialSchema>::schema()
    }
}

impl ToSchema for Job {
    fn name() -> std::borrow::Cow<'static, str> {
        "Job".into()
    }

    fn schemas(
        schemas: &mut Vec<(
            String,
            utoipa::openapi::RefOr<utoipa::openapi::schema::Schema>,
        )>,
    ) {
        <JobView<String> as ToSchema>::schemas(schemas);
    }
}

/// A page of jobs.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct JobList {
    pub jobs: Vec<Job>,
    /// Pass as `after` for the next page; `null` on the last.
    pub next: Option<String>,
    /// Set when the search stopped before the page was full (a failure
    /// text filter that no trigram index serves, on a big table): this
    /// many jobs were read, up to and including `next`, and the page holds
    /// the matches among them. The page after `next` searches on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub searched: Option<u64>,
}

/// Which jobs: a list's filter, and a bulk operation's.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct FilterQuery {
    /// States, comma-separated: standard names or the table's own values.
    pub state: Option<String>,
    /// Kinds, comma-separated.
    pub kind: Option<String>,
    /// Text the failure message contains (any case).
    pub failure_contains: Option<String>,
    /// JSON the payload contains (jsonb's `@>`), such as `{"customer":42}`.
    pub payload: Option<String>,
    /// The unique key a job holds.
    pub unique_key: Option<String>,
    /// The worker that last claimed a job.
    pub worker: Option<String>,
    /// Running jobs whose attempt started more than this many seconds ago
    /// (the state is then `processing`).
    #[param(minimum = 0, maximum = 2147483647)]
    pub running_longer_than: Option<u32>,
    /// Enqueued at or after (RFC 3339).
    pub queued_after: Option<DateTime<Utc>>,
    /// Enqueued before.
    pub queued_before: Option<DateTime<Utc>>,
    /// Finished at or after.
    pub finished_after: Option<DateTime<Utc>>,
    /// Finished before.
    pub finished_before: Option<DateTime<Utc>>,
}

/// Which page of a list, in which order.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct PageQuery {
    /// `newest` (default) or `oldest` first.
    pub order: Option<Order>,
    /// Jobs per page, 1 to 1000 (default 50).
    #[param(minimum = 1, maximum = 1000)]
    pub limit: Option<u32>,
    /// The `next` of the previous page.
    pub after: Option<String>,
}

/// The order of a list.
#[derive(Debug, Clone, Copy, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Order {
    Newest,
    Oldest,
}

/// Why jobs are failed by hand.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct FailRequest {
    /// The failure message the job ends with.
    #[schema(min_length = 1, max_length = 10000)]
    pub reason: String,
}

/// A job to add.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct EnqueueRequest {
    /// The kind.
    pub kind: String,
    /// The arguments (default `{}`).
    #[serde(default = "empty_object")]
    pub payload: serde_json::Value,
    /// Not before this time.
    pub run_at: Option<DateTime<Utc>>,
    /// Higher runs first (default 0).
    #[serde(default, deserialize_with = "integral")]
    #[schema(minimum = -2147483648, maximum = 2147483647)]
    pub priority: i32,
    /// A unique key: while a job holding it is in scope, nothing is added
    /// and that job is returned (200, `inserted` false), so a client may
    /// retry a request safely.
    pub unique_key: Option<String>,
    /// How long the key holds: `active` (default: while the job waits or
    /// runs) or `forever` (as long as the job exists).
    pub unique_scope: Option<Scope>,
    /// At most this many attempts in all, whatever the workers' retry
    /// policy allows.
    #[schema(minimum = 1, maximum = 2147483647)]
    pub max_attempts: Option<u32>,
    /// Not started after this time: the job then ends failed, unrun.
    pub expires_at: Option<DateTime<Utc>>,
    /// Never started twice: not retried, failed rather than run again
    /// after a crash.
    #[serde(default)]
    pub at_most_once: bool,
}

/// How long a unique key holds.
#[derive(Debug, Clone, Copy, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Scope {
    Active,
    Forever,
}

/// An `i32` written as any JSON number with no fraction (`3` or `3.0`, as
/// JSON Schema's integer allows).
fn integral<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<i32, D::Error> {
    let number = serde_json::Number::deserialize(deserializer)?;
    let value = match (number.as_i64(), number.as_f64()) {
        (Some(n), _) => Some(n),
        (None, Some(f)) if f.fract() == 0.0 && f.abs() < 1e18 => Some(f as i64),
        _ => None,
    };
    value.and_then(|n| i32::try_from(n).ok()).ok_or_else(|| {
        serde::de::Error::custom(format!(
            "{number} is not a whole number from -2147483648 to 2147483647"
        ))
    })
}

fn empty_object() -> serde_json::Value {
    serde_json::json!({})
}

/// The key of an added job, or of the job holding its unique key.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct Enqueued {
    pub id: String,
    /// False when the unique key was taken: `id` is then the holder's.
    pub inserted: bool,
}

/// What a write did.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ActionResult {
    /// Jobs whose state changed (or that were deleted).
    pub changed: u64,
    /// Running jobs asked to stop (cancel).
    pub stop_requested: u64,
}

/// Retry options.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct RetryQuery {
    /// Also set the failure and reset counts back to zero.
    pub reset_attempts: Option<bool>,
}

/// Jobs of one state and kind: the core's count, as it is.
pub use queue_core::StateCount;

/// How the figures are read.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct StatsQuery {
    /// Count every job, however big the table (one such read at a time;
    /// it may take seconds on millions of rows).
    pub exact: Option<bool>,
}

/// The queue at a glance.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct Stats {
    /// Per state (lifecycle order) and kind.
    pub counts: Vec<StateCount>,
    /// Since when the longest-waiting claimable job has been claimable.
    pub oldest_claimable_since: Option<DateTime<Utc>>,
    /// How long, in seconds.
    pub oldest_claimable_age_seconds: Option<f64>,
    /// Processing jobs silent for longer than the stalled age; null when
    /// the table keeps no heartbeat or start time to tell.
    pub stalled: Option<u64>,
    /// The paused kinds, by kind.
    pub paused: Vec<super::pauses::Pause>,
    pub now: DateTime<Utc>,
}

impl From<queue_core::QueueStats> for Stats {
    fn from(stats: queue_core::QueueStats) -> Self {
        Stats {
            oldest_claimable_age_seconds: stats
                .oldest_claimable_age()
                .map(|age| age.num_milliseconds() as f64 / 1000.0),
            counts: stats.counts,
            oldest_claimable_since: stats.oldest_claimable_since,
            stalled: stats.stalled,
            paused: stats.paused,
            now: stats.now,
        }
    }
}

impl Api {
    /// The jobs `query` chooses.
    pub(crate) fn filter(&self, query: &FilterQuery) -> Result<JobFilter, ApiError> {
        let split = |text: &Option<String>| {
            text.as_deref().map(|t| {
                t.split(',')
                    .map(str::trim)
                    .filter(|s| !s.is_empty())
                    .map(str::to_owned)
                    .collect::<Vec<_>>()
            })
        };
        let states = match split(&query.state) {
            None => None,
            Some(names) if names.is_empty() => {
                return Err(ApiError::bad_request("state: give at least one state"))
            }
            Some(names) => {
                let mut states: Vec<JobState> = Vec::new();
                for name in names {
                    let named = states_named_in(|s| self.admin.stored_state(s), &name)
                        .map_err(|e| ApiError::bad_request(e.to_string()))?;
                    states.extend(
                        named
                            .into_iter()
                            .filter(|s| !states.contains(s))
                            .collect::<Vec<_>>(),
                    );
                }
                Some(states)
            }
        };
        let mut filter = JobFilter::default();
        filter.states = states;
        filter.kinds = split(&query.kind);
        filter.queued_from = query.queued_after;
        filter.queued_before = query.queued_before;
        filter.finished_from = query.finished_after;
        filter.finished_before = query.finished_before;
        filter.failure_contains = query.failure_contains.clone();
        filter.payload_contains = match &query.payload {
            Some(text) => Some(serde_json::from_str(text).map_err(|e| {
                ApiError::bad_request(format!("payload: {text:?} is not JSON: {e}"))
            })?),
            None => None,
        };
        filter.unique_key = query.unique_key.clone();
        filter.worker = query.worker.clone();
        if let Some(seconds) = query.running_longer_than {
            if seconds > i32::MAX as u32 {
                return Err(ApiError::bad_request(
                    "running_longer_than must be between 0 and 2147483647 seconds",
                ));
            }
            if query.state.is_some() {
                return Err(ApiError::bad_request(
                    "running_longer_than picks running jobs: leave out state",
                ));
            }
            filter = filter
                .running_since_before(Utc::now() - chrono::TimeDelta::seconds(i64::from(seconds)));
        }
        Ok(filter)
    }
}

/// One job's write: 404 if there is no such job, 409 if the write left it
/// alone, with the reason (its state, a row held for a moment, a unique
/// key another job holds).
fn one(report: ActionReport<String>, action: &str) -> Result<Json<ActionResult>, ApiError> {
    if let Some(skipped) = report.skipped.first() {
        return Err(match skipped.reason {
            SkipReason::Missing => ApiError::not_found(format!("there is no job {}", skipped.id)),
            _ => ApiError::new(StatusCode::CONFLICT, "conflict", skipped.explain(action)),
        });
    }
    Ok(Json(ActionResult {
        changed: report.changed,
        stop_requested: report.stop_requested,
    }))
}

/// One job.
#[utoipa::path(
    get, path = "/api/jobs/{id}", tag = "jobs",
    params(("id" = String, Path, description = "The job's key")),
    responses(
        (status = 200, description = "The job", body = Job),
        (status = 401, description = "No valid token", body = ErrorBody),
        (status = 404, description = "No such job", body = ErrorBody),
        (status = 503, description = "The database is unavailable", body = ErrorBody),
    ),
    security((), ("bearer" = []))
)]
pub async fn get_job(
    State(api): State<Api>,
    Path(id): Path<String>,
) -> Result<Json<Job>, ApiError> {
    match api.admin.get(&id).await? {
        Some(job) => Ok(Json(job.into())),
        None => Err(ApiError::not_found(format!("there is no job {id}"))),
    }
}

/// A page of jobs matching the filter, by key.
#[utoipa::path(
    get, path = "/api/jobs", tag = "jobs",
    params(FilterQuery, PageQuery),
    responses(
        (status = 200, description = "A page", body = JobList),
        (status = 400, description = "A bad filter value", body = ErrorBody),
        (status = 401, description = "No valid token", body = ErrorBody),
        (status = 503, description = "The database is unavailable", body = ErrorBody),
    ),
    security((), ("bearer" = []))
)]
pub async fn list_jobs(
    State(api): State<Api>,
    ListQuery(filter, page): ListQuery,
) -> Result<Json<JobList>, ApiError> {
    let limit = page.limit.unwrap_or(50);
    if !(1..=1000).contains(&limit) {
        return Err(ApiError::bad_request("limit must be between 1 and 1000"));
    }
    let params = ListParams::first(api.filter(&filter)?, limit as usize)
        .order(match page.order {
            Some(Order::Oldest) => ListOrder::OldestFirst,
            _ => ListOrder::NewestFirst,
        })
        .after(page.after.clone());
    let page = api.admin.list(&params).await?;
    Ok(Json(JobList {
        jobs: page.jobs.into_iter().map(Job::from).collect(),
        next: page.next,
        searched: page.searched,
    }))
}

/// Adds a job.
#[utoipa::path(
    post, path = "/api/jobs", tag = "jobs",
    request_body = EnqueueRequest,
    responses(
        (status = 201, description = "Added", body = Enqueued),
        (status = 200, description = "Not added: a job holding the unique key is returned", body = Enqueued),
        (status = 400, description = "Bad input", body = ErrorBody),
        (status = 401, description = "No valid token", body = ErrorBody),
        (status = 403, description = "A read-only token", body = ErrorBody),
        (status = 413, description = "The body is too large", body = ErrorBody),
        (status = 415, description = "The body is not JSON", body = ErrorBody),
        (status = 503, description = "The database is unavailable", body = ErrorBody),
    ),
    security((), ("bearer" = []))
)]
pub async fn enqueue(
    State(api): State<Api>,
    ApiJson(request): ApiJson<EnqueueRequest>,
) -> Result<(StatusCode, Json<Enqueued>), ApiError> {
    let mut job = NewJob::new(request.kind, request.payload).priority(request.priority);
    if let Some(at) = request.run_at {
        job = job.process_after(at);
    }
    match (request.unique_key, request.unique_scope) {
        (Some(key), scope) => {
            let scope = match scope {
                Some(Scope::Forever) => UniqueScope::Forever,
                _ => UniqueScope::Active,
            };
            job = job.unique(key, scope);
        }
        (None, Some(_)) => return Err(ApiError::bad_request("unique_scope needs a unique_key")),
        (None, None) => {}
    }
    match request.max_attempts {
        Some(0) => return Err(ApiError::bad_request("max_attempts must be at least 1")),
        Some(n) if n > i32::MAX as u32 => {
            return Err(ApiError::bad_request(
                "max_attempts must be at most 2147483647",
            ))
        }
        Some(n) => job = job.max_attempts(n),
        None => {}
    }
    if let Some(at) = request.expires_at {
        job = job.expires_at(at);
    }
    if request.at_most_once {
        job = job.at_most_once();
    }
    let done = api
        .admin
        .enqueue(std::slice::from_ref(&job))
        .await?
        .pop()
        .ok_or_else(|| {
            ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal",
                "the store returned no key",
            )
        })?;
    let status = if done.inserted {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((
        status,
        Json(Enqueued {
            id: done.id,
            inserted: done.inserted,
        }),
    ))
}

/// Makes a failed, errored or canceled job queued and claimable now.
#[utoipa::path(
    post, path = "/api/jobs/{id}/retry", tag = "jobs",
    params(("id" = String, Path, description = "The job's key"), RetryQuery),
    responses(
        (status = 200, description = "Retried", body = ActionResult),
        (status = 400, description = "A bad option", body = ErrorBody),
        (status = 401, description = "No valid token", body = ErrorBody),
        (status = 403, description = "A read-only token", body = ErrorBody),
        (status = 404, description = "No such job", body = ErrorBody),
        (status = 409, description = "The job is in a state a retry leaves alone", body = ErrorBody),
        (status = 503, description = "The database is unavailable", body = ErrorBody),
    ),
    security((), ("bearer" = []))
)]
pub async fn retry_job(
    State(api): State<Api>,
    Path(id): Path<String>,
    ApiQuery(query): ApiQuery<RetryQuery>,
) -> Result<Json<ActionResult>, ApiError> {
    let params = RetryParams {
        reset_attempts: query.reset_attempts.unwrap_or(false),
    };
    let report = api.admin.retry(&Targets::id(id), params).await?;
    one(report, "retried")
}

/// Cancels a job: a waiting one ends canceled, a running one is asked to
/// stop.
#[utoipa::path(
    post, path = "/api/jobs/{id}/cancel", tag = "jobs",
    params(("id" = String, Path, description = "The job's key")),
    responses(
        (status = 200, description = "Canceled, or asked to stop", body = ActionResult),
        (status = 401, description = "No valid token", body = ErrorBody),
        (status = 403, description = "A read-only token", body = ErrorBody),
        (status = 404, description = "No such job", body = ErrorBody),
        (status = 409, description = "The job has finished", body = ErrorBody),
        (status = 503, description = "The database is unavailable", body = ErrorBody),
    ),
    security((), ("bearer" = []))
)]
pub async fn cancel_job(
    State(api): State<Api>,
    Path(id): Path<String>,
) -> Result<Json<ActionResult>, ApiError> {
    let report = api.admin.cancel(&Targets::id(id)).await?;
    one(report, "canceled")
}

/// Fails a job now with a reason, a running one included: its attempt is
/// fenced out (its late completion changes nothing) and its worker stops it
/// at the next heartbeat.
#[utoipa::path(
    post, path = "/api/jobs/{id}/fail", tag = "jobs",
    params(("id" = String, Path, description = "The job's key")),
    request_body = FailRequest,
    responses(
        (status = 200, description = "Failed", body = ActionResult),
        (status = 400, description = "Bad input", body = ErrorBody),
        (status = 401, description = "No valid token", body = ErrorBody),
        (status = 403, description = "A read-only token", body = ErrorBody),
        (status = 404, description = "No such job", body = ErrorBody),
        (status = 409, description = "The job has finished, or another write holds it", body = ErrorBody),
        (status = 413, description = "The body is too large", body = ErrorBody),
        (status = 415, description = "The body is not JSON", body = ErrorBody),
        (status = 503, description = "The database is unavailable", body = ErrorBody),
    ),
    security((), ("bearer" = []))
)]
pub async fn fail_job(
    State(api): State<Api>,
    Path(id): Path<String>,
    ApiJson(request): ApiJson<FailRequest>,
) -> Result<Json<ActionResult>, ApiError> {
    let reason = request.reason;
    if reason.trim().is_empty() {
        return Err(ApiError::bad_request(
            "reason must say why the job is failed",
        ));
    }
    if reason.chars().count() > 10_000 {
        return Err(ApiError::bad_request(
            "reason must be at most 10000 characters",
        ));
    }
    if reason.contains('\0') {
        return Err(ApiError::bad_request(
            "reason holds a NUL character, which Postgres cannot store",
        ));
    }
    let report = api.admin.force_fail(&Targets::id(id), &reason).await?;
    one(report, "failed")
}

/// Deletes a job.
#[utoipa::path(
    delete, path = "/api/jobs/{id}", tag = "jobs",
    params(("id" = String, Path, description = "The job's key")),
    responses(
        (status = 200, description = "Deleted", body = ActionResult),
        (status = 401, description = "No valid token", body = ErrorBody),
        (status = 403, description = "A read-only token", body = ErrorBody),
        (status = 404, description = "No such job", body = ErrorBody),
        (status = 409, description = "The job's attempt holds it in a transaction", body = ErrorBody),
        (status = 503, description = "The database is unavailable", body = ErrorBody),
    ),
    security((), ("bearer" = []))
)]
pub async fn delete_job(
    State(api): State<Api>,
    Path(id): Path<String>,
) -> Result<Json<ActionResult>, ApiError> {
    let report = api.admin.delete(&Targets::id(id)).await?;
    one(report, "deleted")
}

/// Counts per state and kind, the oldest waiting job, the stalled jobs.
#[utoipa::path(
    get, path = "/api/stats", tag = "queue",
    params(StatsQuery),
    responses(
        (status = 200, description = "The queue at a glance", body = Stats),
        (status = 400, description = "A bad query parameter", body = ErrorBody),
        (status = 401, description = "No valid token", body = ErrorBody),
        (status = 503, description = "The database is unavailable", body = ErrorBody),
    ),
    security((), ("bearer" = []))
)]
pub async fn stats(
    State(api): State<Api>,
    ApiQuery(query): ApiQuery<StatsQuery>,
) -> Result<Json<Stats>, ApiError> {
    let stats = api.stats_now(query.exact.unwrap_or(false)).await?;
    Ok(Json(stats.into()))
}
