//! Every write through the HTTP API (and so the dashboard) in the audit
//! log: who (the token's name), what, on which job or kind, and how it
//! ended (the status and the response); and `GET /api/audit`, which reads
//! the log.

use std::collections::HashMap;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::{MatchedPath, Path, Request, State};
use axum::http::Method;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Json;
use queue_core::{AuditParams, NewAuditEntry};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use tokio::sync::{mpsc, oneshot};
use utoipa::{IntoParams, ToSchema};

use super::api::{Api, ApiQuery, ErrorBody};
use super::auth::Actor;
use super::erased::TextAdmin;
use super::error::ApiError;

/// How much of a response an entry keeps as its outcome.
const OUTCOME_BYTES: usize = 4000;

/// Records each write request that got past the token check, after it
/// ran. A log that cannot be written is logged as a warning; the write
/// stands, and its response is the handler's.
pub async fn record(State(api): State<Api>, request: Request, next: Next) -> Response {
    if matches!(
        *request.method(),
        Method::GET | Method::HEAD | Method::OPTIONS
    ) {
        return next.run(request).await;
    }
    let (mut parts, body) = request.into_parts();
    let actor = parts
        .extensions
        .get::<Actor>()
        .map_or_else(|| "api".to_owned(), |a| a.0.clone());
    let matched = parts
        .extensions
        .get::<MatchedPath>()
        .map(|m| m.as_str().to_owned())
        .unwrap_or_default();
    let params: HashMap<String, String> =
        axum::RequestPartsExt::extract::<Path<HashMap<String, String>>>(&mut parts)
            .await
            .map(|Path(p)| p)
            .unwrap_or_default();
    let (action, mut target) = describe(&parts.method, &matched, &params);
    if let Some(query) = parts.uri.query() {
        target["query"] = json!(query);
    }
    let response = next.run(Request::from_parts(parts, body)).await;
    let status = response.status();
    let (parts, body) = response.into_parts();
    let bytes = match axum::body::to_bytes(body, usize::MAX).await {
        Ok(bytes) => bytes,
        Err(error) => {
            tracing::warn!(
                "the response to a {action} could not be read for the audit log: {error}"
            );
            return ApiError::new(
                axum::http::StatusCode::INTERNAL_SERVER_ERROR,
                "internal",
                "the response could not be read",
            )
            .into_response();
        }
    };
    let kept = &bytes[..bytes.len().min(OUTCOME_BYTES)];
    let outcome = format!("{} {}", status.as_u16(), String::from_utf8_lossy(kept));
    let entry = NewAuditEntry::new(actor, action, target, status.is_success(), outcome);
    let action = entry.action.clone();
    if let Err(error) = api.audit.append(entry).await {
        tracing::warn!("a {action} is not in the audit log: {error}");
    }
    Response::from_parts(parts, Body::from(bytes))
}

/// The most entries one append writes.
const MAX_BATCH: usize = 500;

/// An entry on its way to the log, and who waits for it to be written.
type Pending = (NewAuditEntry, oneshot::Sender<Result<(), String>>);

/// Writes the server's audit entries, many requests' in one append: the
/// entries that arrive while one append is being written go together into
/// the next, so concurrent writes share one insert and one commit instead
/// of one each (a single-job enqueue is two commits with its entry). Each
/// request still waits until its own entry is written.
#[derive(Clone)]
pub struct AuditWriter {
    sender: mpsc::Sender<Pending>,
}

impl AuditWriter {
    /// Starts the task that appends to `admin`'s log; it ends when the
    /// last writer is dropped. Call it within a Tokio runtime.
    pub fn spawn(admin: Arc<TextAdmin>) -> (Self, tokio::task::JoinHandle<()>) {
        let (sender, receiver) = mpsc::channel(MAX_BATCH);
        let task = tokio::spawn(write(admin, receiver));
        (AuditWriter { sender }, task)
    }

    /// Appends `entry` and waits until it is written; the error says why
    /// it was not.
    pub async fn append(&self, entry: NewAuditEntry) -> Result<(), String> {
        let (done, written) = oneshot::channel();
        let stopped = || "the audit writer has stopped".to_owned();
        self.sender
            .send((entry, done))
            .await
            .map_err(|_| stopped())?;
        written.await.map_err(|_| stopped())?
    }
}

/// The writer's loop: waits for an entry, takes every other one already
/// waiting (up to [`MAX_BATCH`]), appends them in one write and answers
/// each.
async fn write(admin: Arc<TextAdmin>, mut receiver: mpsc::Receiver<Pending>) {
    let mut batch = Vec::with_capacity(MAX_BATCH);
    while receiver.recv_many(&mut batch, MAX_BATCH).await > 0 {
        let (entries, waiting): (Vec<_>, Vec<_>) = batch.drain(..).unzip();
        let result = admin
            .append_audit(&entries)
            .await
            .map_err(|error| error.to_string());
        for done in waiting {
            // A request that went away no longer waits; its entry stands.
            let _ = done.send(result.clone());
        }
    }
}

/// The action and target of a write to the route `matched` with path
/// parameters `params`.
fn describe(method: &Method, matched: &str, params: &HashMap<String, String>) -> (String, Value) {
    let id = || json!({ "ids": [params.get("id")] });
    let kind = || json!({ "kind": params.get("kind") });
    match (method.as_str(), matched) {
        ("POST", "/api/jobs") => ("enqueue".into(), json!({})),
        ("POST", "/api/jobs/{id}/retry") => ("retry".into(), id()),
        ("POST", "/api/jobs/{id}/cancel") => ("cancel".into(), id()),
        ("POST", "/api/jobs/{id}/fail") => ("fail".into(), id()),
        ("DELETE", "/api/jobs/{id}") => ("delete".into(), id()),
        ("POST", "/api/kinds/{kind}/pause") => ("pause".into(), kind()),
        ("POST", "/api/kinds/{kind}/resume") => ("resume".into(), kind()),
        ("PUT", "/api/kinds/{kind}/limits") => ("limit".into(), kind()),
        ("POST", "/api/operations/{id}/abort") => {
            ("abort-operation".into(), json!({ "id": params.get("id") }))
        }
        ("POST", route) if route.starts_with("/api/operations/") => {
            // The filter is the request's query, recorded beside.
            let action = route.trim_start_matches("/api/operations/");
            (action.into(), json!({ "operation": true }))
        }
        (method, route) => (format!("{method} {route}"), json!(params)),
    }
}

/// Which entries `GET /api/audit` returns.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct AuditQuery {
    /// At most this many, newest first (1-1000, default 50).
    #[param(minimum = 1, maximum = 1000)]
    pub limit: Option<usize>,
    /// Only entries before this id (the previous page's `next`).
    pub before: Option<i64>,
    /// Only this actor's.
    pub actor: Option<String>,
}

/// One write, as the audit log keeps it: the core's entry, as it is.
pub use queue_core::AuditEntry;

/// A page of the audit log.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct AuditPage {
    /// Newest first.
    pub entries: Vec<AuditEntry>,
    /// The `before` of the next page; null on the last.
    pub next: Option<i64>,
}

/// The audit log, newest first: every write through the CLI and the API.
#[utoipa::path(
    get, path = "/api/audit", tag = "audit",
    params(AuditQuery),
    responses(
        (status = 200, description = "A page of the log", body = AuditPage),
        (status = 400, description = "Bad input, or the log's table does not exist", body = ErrorBody),
        (status = 401, description = "No valid token", body = ErrorBody),
        (status = 503, description = "The database is unavailable", body = ErrorBody),
    ),
    security((), ("bearer" = []))
)]
pub async fn audit(
    State(api): State<Api>,
    ApiQuery(query): ApiQuery<AuditQuery>,
) -> Result<Json<AuditPage>, ApiError> {
    let limit = query.limit.unwrap_or(50);
    if limit == 0 || limit > queue_core::MAX_AUDIT_PAGE {
        return Err(ApiError::bad_request(format!(
            "limit must be between 1 and {}",
            queue_core::MAX_AUDIT_PAGE
        )));
    }
    let entries = api
        .admin
        .audit(
            &AuditParams::newest(limit)
                .before(query.before)
                .actor(query.actor),
        )
        .await?;
    let next = (entries.len() == limit)
        .then(|| entries.last().map(|e| e.id))
        .flatten();
    Ok(Json(AuditPage { entries, next }))
}
