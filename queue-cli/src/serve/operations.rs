//! `/api/operations`: bulk operations by filter as tracked background
//! work. A start records the operation and returns at once; this server's
//! runner ([`spawn_runner`]) carries it out in batches, as it does those
//! started by `queue ... --detach` and those whose runner died, and hands
//! its own back when the server stops.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::{Extension, Json};
use chrono::{DateTime, Utc};
use queue_core::{
    purge_params, run_operation, AbortOutcome, CancellationToken, JobFilter, NewOperation,
    Operation, OperationAction, OperationParams, OperationState, RunOptions, StopAs, StoreError,
    TakeOperation, BACKGROUND_PACE, BACKGROUND_YIELD, MAX_OPERATION_BATCH, MAX_OPERATION_PAGE,
};
use serde::{Deserialize, Serialize};
use tokio::sync::Notify;
use utoipa::{IntoParams, ToSchema};

use super::api::{Api, ApiQuery, ErrorBody, FilterQuery};
use super::auth::Actor;
use super::erased::TextAdmin;
use super::error::ApiError;

/// How often the runner looks for operations nobody runs, when nothing
/// wakes it sooner.
const LOOK_EVERY: Duration = Duration::from_secs(1);

/// How long ended operations are kept before the runner removes them.
pub const KEEP_OPERATIONS: Duration = Duration::from_secs(30 * 24 * 3600);

/// How often the runner removes ended operations older than
/// [`KEEP_OPERATIONS`].
const PRUNE_OPERATIONS_EVERY: Duration = Duration::from_secs(3600);

/// A bulk operation.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct OperationView {
    /// Its id.
    pub id: i64,
    /// `retry`, `cancel`, `fail`, `delete` or `purge`.
    pub action: String,
    /// A retry's: whether each job gets its whole retry budget again.
    pub reset_attempts: Option<bool>,
    /// A force-fail's reason.
    pub reason: Option<String>,
    /// Which jobs, as the store's filter (standard state names).
    #[schema(value_type = Object)]
    pub filter: serde_json::Value,
    /// Who started it: a token's name, or an operator's.
    pub by: String,
    /// `pending`, `running`, `done`, `aborted`, `interrupted` or `failed`.
    pub state: String,
    /// Jobs it changes at most: those that matched when it started.
    pub total: u64,
    /// Jobs changed so far.
    pub done: u64,
    /// `done` as a share of `total`, from 0 to 1.
    pub progress: f64,
    /// Jobs per batch.
    pub batch: u32,
    /// The process carrying it out, or that last did.
    pub runner: Option<String>,
    /// Why it failed, was aborted or interrupted.
    pub message: Option<String>,
    pub created_at: DateTime<Utc>,
    pub started_at: Option<DateTime<Utc>>,
    /// Its last batch.
    pub updated_at: DateTime<Utc>,
    pub finished_at: Option<DateTime<Utc>>,
}

impl From<Operation<String>> for OperationView {
    fn from(op: Operation<String>) -> Self {
        let progress = op.progress();
        let (reset_attempts, reason) = match &op.action {
            OperationAction::Retry { reset_attempts } => (Some(*reset_attempts), None),
            OperationAction::Fail { reason } => (None, Some(reason.clone())),
            _ => (None, None),
        };
        OperationView {
            id: op.id,
            action: op.action.name().to_owned(),
            reset_attempts,
            reason,
            filter: serde_json::to_value(&op.filter).unwrap_or_default(),
            by: op.by,
            state: op.state.to_string(),
            total: op.total,
            done: op.done,
            progress,
            batch: op.batch,
            runner: op.runner,
            message: op.message,
            created_at: op.created_at,
            started_at: op.started_at,
            updated_at: op.updated_at,
            finished_at: op.finished_at,
        }
    }
}

/// What starting an operation answers (only the OpenAPI document reads
/// this type: the handlers answer with [`OperationView`] or [`ApiError`]).
#[derive(utoipa::IntoResponses)]
#[allow(dead_code)]
pub enum Started {
    /// Recorded; this server carries it out.
    #[response(status = 202)]
    Recorded(OperationView),
    /// A bad filter or option (a purge's state that has not finished, a
    /// fail without a reason), or no operations table.
    #[response(status = 400)]
    BadRequest(ErrorBody),
    /// No valid token.
    #[response(status = 401)]
    Unauthorized(ErrorBody),
    /// A token without the role: operate for a retry or a cancel, admin
    /// for the rest.
    #[response(status = 403)]
    Forbidden(ErrorBody),
    /// The database is unavailable.
    #[response(status = 503)]
    Unavailable(ErrorBody),
}

/// A bulk operation's options (all optional; the body may be left out).
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct OperationOptions {
    /// Jobs per batch, 1 to 10000 (default 1000; 5000 for a purge).
    #[schema(minimum = 1, maximum = 10000)]
    pub batch: Option<u32>,
}

/// A bulk retry's options (all optional; the body may be left out).
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RetryOptions {
    /// Jobs per batch, 1 to 10000 (default 1000).
    #[schema(minimum = 1, maximum = 10000)]
    pub batch: Option<u32>,
    /// Also set the failure and reset counts back to zero.
    pub reset_attempts: Option<bool>,
}

/// A bulk force-fail's options.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct FailOptions {
    /// Jobs per batch, 1 to 10000 (default 1000).
    #[schema(minimum = 1, maximum = 10000)]
    pub batch: Option<u32>,
    /// The failure message the jobs end with.
    #[schema(min_length = 1, max_length = 10000)]
    pub reason: String,
}

/// Which finished jobs a purge removes.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct PurgeQuery {
    /// Final states, comma-separated: completed, failed, canceled (or the
    /// table's own values for them).
    pub state: String,
    /// Jobs that finished before this time (RFC 3339).
    pub finished_before: DateTime<Utc>,
}

/// The options in a request's body; `T`'s default if there is no body. A
/// body that is there must be JSON, so whitespace alone is refused.
fn options<T: Default + serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    if body.is_empty() {
        return Ok(T::default());
    }
    required(body)
}

/// The options in a request's body, which must hold them.
fn required<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    super::api::object_body(body, "the operation's options")
}

/// Starts `action` on the jobs `filter` matches, `batch` at a time.
async fn start(
    api: &Api,
    actor: &Actor,
    filter: JobFilter,
    batch: Option<u32>,
    action: OperationAction,
) -> Result<(StatusCode, Json<OperationView>), ApiError> {
    let batch = batch.unwrap_or(action.default_batch());
    if batch == 0 || batch > MAX_OPERATION_BATCH {
        return Err(ApiError::bad_request(format!(
            "batch must be between 1 and {MAX_OPERATION_BATCH}"
        )));
    }
    if action == OperationAction::Purge {
        // Before narrowing, which would drop a state that has not finished
        // instead of refusing it.
        purge_params(&filter, 1)?;
    }
    let filter = action.narrow(filter, &api.admin.retryable_states());
    let mut new = NewOperation::new(action, filter, actor.0.clone(), 0).batch(batch);
    // Refused before anything is counted.
    new.check()?;
    new.total = api.admin.count(&new.filter).await?;
    let op = api.admin.create_operation(&new).await?;
    api.operations.notify_one();
    Ok((StatusCode::ACCEPTED, Json(op.into())))
}

/// Retries every failed, errored and canceled job the filter matches, as a
/// tracked operation that this server carries out.
#[utoipa::path(
    post, path = "/api/operations/retry", tag = "operations",
    params(FilterQuery),
    request_body(content = Option<RetryOptions>, description = "Options"),
    responses(Started),
    security((), ("bearer" = []))
)]
pub async fn start_retry(
    State(api): State<Api>,
    Extension(actor): Extension<Actor>,
    ApiQuery(query): ApiQuery<FilterQuery>,
    body: Bytes,
) -> Result<(StatusCode, Json<OperationView>), ApiError> {
    let options: RetryOptions = options(&body)?;
    let action = OperationAction::Retry {
        reset_attempts: options.reset_attempts.unwrap_or(false),
    };
    start(&api, &actor, api.filter(&query)?, options.batch, action).await
}

/// Cancels every waiting job the filter matches and asks running ones to
/// stop, as a tracked operation that this server carries out.
#[utoipa::path(
    post, path = "/api/operations/cancel", tag = "operations",
    params(FilterQuery),
    request_body(content = Option<OperationOptions>, description = "Options"),
    responses(Started),
    security((), ("bearer" = []))
)]
pub async fn start_cancel(
    State(api): State<Api>,
    Extension(actor): Extension<Actor>,
    ApiQuery(query): ApiQuery<FilterQuery>,
    body: Bytes,
) -> Result<(StatusCode, Json<OperationView>), ApiError> {
    start_plain(&api, &actor, &query, &body, OperationAction::Cancel).await
}

/// Fails every unfinished job the filter matches with a reason, fencing
/// running attempts out, as a tracked operation that this server carries
/// out.
#[utoipa::path(
    post, path = "/api/operations/fail", tag = "operations",
    params(FilterQuery),
    request_body(content = FailOptions, description = "The reason, and options"),
    responses(Started),
    security((), ("bearer" = []))
)]
pub async fn start_fail(
    State(api): State<Api>,
    Extension(actor): Extension<Actor>,
    ApiQuery(query): ApiQuery<FilterQuery>,
    body: Bytes,
) -> Result<(StatusCode, Json<OperationView>), ApiError> {
    let options: FailOptions = required(&body)?;
    let action = OperationAction::Fail {
        reason: options.reason,
    };
    start(&api, &actor, api.filter(&query)?, options.batch, action).await
}

/// Deletes every job the filter matches, as a tracked operation that this
/// server carries out.
#[utoipa::path(
    post, path = "/api/operations/delete", tag = "operations",
    params(FilterQuery),
    request_body(content = Option<OperationOptions>, description = "Options"),
    responses(Started),
    security((), ("bearer" = []))
)]
pub async fn start_delete(
    State(api): State<Api>,
    Extension(actor): Extension<Actor>,
    ApiQuery(query): ApiQuery<FilterQuery>,
    body: Bytes,
) -> Result<(StatusCode, Json<OperationView>), ApiError> {
    start_plain(&api, &actor, &query, &body, OperationAction::Delete).await
}

/// Starts `action`, whose body holds only the batch, on the jobs `query`
/// matches.
async fn start_plain(
    api: &Api,
    actor: &Actor,
    query: &FilterQuery,
    body: &[u8],
    action: OperationAction,
) -> Result<(StatusCode, Json<OperationView>), ApiError> {
    let options: OperationOptions = options(body)?;
    start(api, actor, api.filter(query)?, options.batch, action).await
}

/// Purges finished jobs (moves them to the archive where the table has
/// one), as a tracked operation that this server carries out.
#[utoipa::path(
    post, path = "/api/operations/purge", tag = "operations",
    params(PurgeQuery),
    request_body(content = Option<OperationOptions>, description = "Options"),
    responses(Started),
    security((), ("bearer" = []))
)]
pub async fn start_purge(
    State(api): State<Api>,
    Extension(actor): Extension<Actor>,
    ApiQuery(query): ApiQuery<PurgeQuery>,
    body: Bytes,
) -> Result<(StatusCode, Json<OperationView>), ApiError> {
    let options: OperationOptions = options(&body)?;
    let filter = api.filter(&FilterQuery {
        state: Some(query.state),
        finished_before: Some(query.finished_before),
        ..FilterQuery::default()
    })?;
    start(&api, &actor, filter, options.batch, OperationAction::Purge).await
}

/// Which operations to list.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct OperationsQuery {
    /// Operations per page, 1 to 200 (default 20), newest first.
    #[param(minimum = 1, maximum = 200)]
    pub limit: Option<u32>,
    /// Operations before this id (the last id of the previous page).
    pub before: Option<i64>,
    /// Only those that have not ended (pending, running, interrupted).
    pub open: Option<bool>,
}

/// The operation id in a path; refused if it is none.
fn operation_id(text: &str) -> Result<i64, ApiError> {
    text.parse()
        .map_err(|_| ApiError::bad_request(format!("{text:?} is not an operation id")))
}

/// Operations, newest first.
#[utoipa::path(
    get, path = "/api/operations", tag = "operations",
    params(OperationsQuery),
    responses(
        (status = 200, description = "Operations, newest first", body = Vec<OperationView>),
        (status = 400, description = "Bad input, or no operations table", body = ErrorBody),
        (status = 401, description = "No valid token", body = ErrorBody),
        (status = 503, description = "The database is unavailable", body = ErrorBody),
    ),
    security((), ("bearer" = []))
)]
pub async fn list(
    State(api): State<Api>,
    ApiQuery(query): ApiQuery<OperationsQuery>,
) -> Result<Json<Vec<OperationView>>, ApiError> {
    let limit = query.limit.unwrap_or(20);
    if limit == 0 || limit as usize > MAX_OPERATION_PAGE {
        return Err(ApiError::bad_request(format!(
            "limit must be between 1 and {MAX_OPERATION_PAGE}"
        )));
    }
    let mut params = OperationParams::newest(limit as usize).before(query.before);
    if query.open == Some(true) {
        params = params.states([
            OperationState::Pending,
            OperationState::Running,
            OperationState::Interrupted,
        ]);
    }
    let ops = api.admin.operations(&params).await?;
    Ok(Json(ops.into_iter().map(OperationView::from).collect()))
}

/// One operation: poll it for its progress.
#[utoipa::path(
    get, path = "/api/operations/{id}", tag = "operations",
    params(("id" = i64, Path, description = "The operation's id")),
    responses(
        (status = 200, description = "The operation", body = OperationView),
        (status = 400, description = "Not an operation id, or no operations table", body = ErrorBody),
        (status = 401, description = "No valid token", body = ErrorBody),
        (status = 404, description = "No such operation", body = ErrorBody),
        (status = 503, description = "The database is unavailable", body = ErrorBody),
    ),
    security((), ("bearer" = []))
)]
pub async fn get(
    State(api): State<Api>,
    Path(id): Path<String>,
) -> Result<Json<OperationView>, ApiError> {
    let id = operation_id(&id)?;
    match api.admin.operation(id).await? {
        Some(op) => Ok(Json(op.into())),
        None => Err(ApiError::not_found(format!("there is no operation {id}"))),
    }
}

/// Aborts an operation: its runner stops after the batch under way; the
/// jobs already changed stay changed. 409 if it had already ended.
#[utoipa::path(
    post, path = "/api/operations/{id}/abort", tag = "operations",
    params(("id" = i64, Path, description = "The operation's id")),
    responses(
        (status = 200, description = "Aborted", body = OperationView),
        (status = 400, description = "Bad input, or no operations table", body = ErrorBody),
        (status = 401, description = "No valid token", body = ErrorBody),
        (status = 403, description = "A read-only token", body = ErrorBody),
        (status = 404, description = "No such operation", body = ErrorBody),
        (status = 409, description = "It had already ended", body = ErrorBody),
        (status = 503, description = "The database is unavailable", body = ErrorBody),
    ),
    security((), ("bearer" = []))
)]
pub async fn abort(
    State(api): State<Api>,
    Extension(actor): Extension<Actor>,
    Path(id): Path<String>,
) -> Result<Json<OperationView>, ApiError> {
    let id = operation_id(&id)?;
    match api.admin.abort_operation(id, &actor.0).await? {
        None => Err(ApiError::not_found(format!("there is no operation {id}"))),
        Some(AbortOutcome::Aborted(op)) => Ok(Json(op.into())),
        Some(outcome) => Err(ApiError::new(
            StatusCode::CONFLICT,
            "conflict",
            format!(
                "operation {id} had already ended: it is {}",
                outcome.operation().state
            ),
        )),
    }
}

/// Runs, until `stop`, the operations nobody runs: recorded by this
/// server's API or by `queue ... --detach`, handed back by a server that
/// stopped, or left by a runner that died (silent for
/// [`queue_core::OPERATION_SILENT_AFTER`]). One at a time; `wake` starts a
/// look at once. On `stop` the operation under way is handed back after
/// its batch, for the next runner.
pub fn spawn_runner(
    admin: Arc<TextAdmin>,
    wake: Arc<Notify>,
    stop: CancellationToken,
) -> tokio::task::JoinHandle<()> {
    let runner = format!("queue-serve:{}", queue_worker::default_worker_name());
    tokio::spawn(async move {
        let mut missing_table_said = false;
        let mut pruned_at: Option<std::time::Instant> = None;
        while !stop.is_cancelled() {
            if pruned_at.is_none_or(|at| at.elapsed() >= PRUNE_OPERATIONS_EVERY) {
                pruned_at = Some(std::time::Instant::now());
                match admin.prune_operations(KEEP_OPERATIONS).await {
                    Ok(0) => {}
                    Ok(n) => tracing::info!(
                        removed = n,
                        "removed bulk operations ended over 30 days ago"
                    ),
                    Err(error) => tracing::debug!(%error, "removing old bulk operations failed"),
                }
            }
            match admin
                .take_operation(&TakeOperation::next(runner.clone()))
                .await
            {
                Ok(Some(op)) => {
                    let id = op.id;
                    tracing::info!(
                        operation = id,
                        action = op.action.name(),
                        "running a bulk operation"
                    );
                    let options = RunOptions::new(BACKGROUND_PACE, StopAs::HandedBack)
                        .yielding(BACKGROUND_YIELD);
                    match run_operation(&*admin, op, &runner, &stop, options, |_| {}).await {
                        Ok(op) => tracing::info!(
                            operation = id,
                            state = %op.state,
                            done = op.done,
                            "bulk operation ended"
                        ),
                        Err(error) => {
                            tracing::warn!(operation = id, %error, "a bulk operation's batch could not be recorded")
                        }
                    }
                    continue;
                }
                Ok(None) => {}
                Err(StoreError::Refused(why)) => {
                    if !missing_table_said {
                        tracing::warn!("bulk operations cannot run here: {why}");
                        missing_table_said = true;
                    }
                }
                Err(error) => tracing::debug!(%error, "looking for bulk operations failed"),
            }
            tokio::select! {
                _ = stop.cancelled() => {}
                _ = wake.notified() => {}
                _ = tokio::time::sleep(LOOK_EVERY) => {}
            }
        }
    })
}
