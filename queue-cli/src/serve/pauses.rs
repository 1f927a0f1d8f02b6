//! `/api/pauses` and `/api/kinds/{kind}/pause|resume`: pausing a kind for
//! every worker, and resuming it.

use axum::extract::{Path, State};
use axum::{Extension, Json};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::api::{Api, ErrorBody};
use super::auth::Actor;
use super::error::ApiError;

/// A paused kind: the core's [`PausedKind`], as it is.
pub use queue_core::PausedKind as Pause;

/// What a resume did.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct Resumed {
    /// The kind.
    pub kind: String,
    /// The pause it ended; null if the kind was not paused.
    pub ended: Option<Pause>,
}

/// The paused kinds, by kind.
#[utoipa::path(
    get, path = "/api/pauses", tag = "kinds",
    responses(
        (status = 200, description = "The paused kinds", body = Vec<Pause>),
        (status = 401, description = "No valid token", body = ErrorBody),
        (status = 503, description = "The database is unavailable", body = ErrorBody),
    ),
    security((), ("bearer" = []))
)]
pub async fn paused(State(api): State<Api>) -> Result<Json<Vec<Pause>>, ApiError> {
    let pauses = api.admin.paused().await?;
    Ok(Json(pauses))
}

/// Pauses a kind: from within a second no worker claims its jobs; running
/// ones finish, waiting ones keep their place. A kind already paused keeps
/// its first pause, which is returned.
#[utoipa::path(
    post, path = "/api/kinds/{kind}/pause", tag = "kinds",
    params(("kind" = String, Path, description = "The kind")),
    responses(
        (status = 200, description = "The pause in force", body = Pause),
        (status = 400, description = "Bad input, or the table keeps no kinds", body = ErrorBody),
        (status = 401, description = "No valid token", body = ErrorBody),
        (status = 403, description = "A read-only token", body = ErrorBody),
        (status = 503, description = "The database is unavailable", body = ErrorBody),
    ),
    security((), ("bearer" = []))
)]
pub async fn pause(
    State(api): State<Api>,
    Extension(actor): Extension<Actor>,
    Path(kind): Path<String>,
) -> Result<Json<Pause>, ApiError> {
    let pause = api.admin.pause(&kind, &actor.0).await?;
    api.forget_stats().await;
    Ok(Json(pause))
}

/// Resumes a kind: workers claim its jobs again, and waiting ones are
/// woken.
#[utoipa::path(
    post, path = "/api/kinds/{kind}/resume", tag = "kinds",
    params(("kind" = String, Path, description = "The kind")),
    responses(
        (status = 200, description = "Resumed, or it was not paused", body = Resumed),
        (status = 400, description = "Bad input, or the table keeps no kinds", body = ErrorBody),
        (status = 401, description = "No valid token", body = ErrorBody),
        (status = 403, description = "A read-only token", body = ErrorBody),
        (status = 503, description = "The database is unavailable", body = ErrorBody),
    ),
    security((), ("bearer" = []))
)]
pub async fn resume(
    State(api): State<Api>,
    Path(kind): Path<String>,
) -> Result<Json<Resumed>, ApiError> {
    let ended = api.admin.resume(&kind).await?;
    api.forget_stats().await;
    Ok(Json(Resumed { kind, ended }))
}
