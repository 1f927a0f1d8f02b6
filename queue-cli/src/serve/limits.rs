//! `/api/limits` and `/api/kinds/{kind}/limits`: a kind's limits, held by
//! every worker process together.

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::{Extension, Json};
use chrono::{DateTime, Utc};
use queue_core::{KindLimit, KindLimits};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::api::{Api, ErrorBody};
use super::auth::Actor;
use super::error::ApiError;

/// A kind's limits.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Limits {
    /// At most this many of its jobs run at once, in every process.
    pub max_running: Option<u32>,
    /// At most this many of its jobs start per second, on average.
    pub per_second: Option<f64>,
    /// How many may start at once after a quiet spell (null: one second's
    /// worth).
    pub burst: Option<u32>,
}

/// A kind's limits as the store keeps them.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct KindLimitView {
    /// The kind.
    pub kind: String,
    #[serde(flatten)]
    pub limits: Limits,
    /// The limits in words.
    pub description: String,
    /// When they were set, by the database's clock.
    pub set_at: DateTime<Utc>,
    /// Who set them.
    pub set_by: String,
}

impl From<KindLimit> for KindLimitView {
    fn from(limit: KindLimit) -> Self {
        KindLimitView {
            description: limit.limits.describe(),
            kind: limit.kind,
            limits: Limits {
                max_running: limit.limits.max_running,
                per_second: limit.limits.per_second,
                burst: limit.limits.burst,
            },
            set_at: limit.set_at,
            set_by: limit.set_by,
        }
    }
}

/// What setting a kind's limits did.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct LimitsSet {
    /// The kind.
    pub kind: String,
    /// The limits in force; null once cleared.
    pub limits: Option<KindLimitView>,
}

/// The body of a limits change: every field null or left out clears them.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct LimitsRequest {
    /// At most this many run at once (1 to 1000000).
    #[schema(minimum = 1, maximum = 1000000)]
    pub max_running: Option<u32>,
    /// At most this many start per second (0.001 to 1000000).
    #[schema(minimum = 0.001, maximum = 1000000)]
    pub per_second: Option<f64>,
    /// A burst, with a rate (1 to 1000000).
    #[schema(minimum = 1, maximum = 1000000)]
    pub burst: Option<u32>,
}

/// The kinds with limits, by kind.
#[utoipa::path(
    get, path = "/api/limits", tag = "kinds",
    responses(
        (status = 200, description = "The kinds with limits", body = Vec<KindLimitView>),
        (status = 400, description = "The table keeps no kinds, or its kinds table predates limits", body = ErrorBody),
        (status = 401, description = "No valid token", body = ErrorBody),
        (status = 503, description = "The database is unavailable", body = ErrorBody),
    ),
    security((), ("bearer" = []))
)]
pub async fn limits(State(api): State<Api>) -> Result<Json<Vec<KindLimitView>>, ApiError> {
    let limits = api.admin.limits().await?;
    Ok(Json(limits.into_iter().map(KindLimitView::from).collect()))
}

/// Sets a kind's limits, for every worker process from within a second:
/// how many of its jobs run at once, how many start per second (and in a
/// burst). An empty body, or every field null, clears them.
#[utoipa::path(
    put, path = "/api/kinds/{kind}/limits", tag = "kinds",
    params(("kind" = String, Path, description = "The kind")),
    request_body(content = Option<LimitsRequest>, description = "The limits"),
    responses(
        (status = 200, description = "The limits in force", body = LimitsSet),
        (status = 400, description = "Limits no store could hold, or the table keeps no kinds", body = ErrorBody),
        (status = 401, description = "No valid token", body = ErrorBody),
        (status = 403, description = "A read-only token", body = ErrorBody),
        (status = 503, description = "The database is unavailable", body = ErrorBody),
    ),
    security((), ("bearer" = []))
)]
pub async fn set_limits(
    State(api): State<Api>,
    Extension(actor): Extension<Actor>,
    Path(kind): Path<String>,
    body: Bytes,
) -> Result<Json<LimitsSet>, ApiError> {
    let request: LimitsRequest = if body.is_empty() {
        LimitsRequest::default()
    } else {
        super::api::object_body(&body, "limits")?
    };
    let mut limits = KindLimits::default();
    if let Some(n) = request.max_running {
        limits = limits.max_running(n);
    }
    match (request.per_second, request.burst) {
        (Some(rate), burst) => limits = limits.per_second(rate, burst),
        (None, Some(_)) => {
            return Err(ApiError::bad_request(
                "a burst belongs to a rate limit: give per_second too",
            ))
        }
        (None, None) => {}
    }
    let set = api.admin.set_limits(&kind, &limits, &actor.0).await?;
    api.forget_stats().await;
    Ok(Json(LimitsSet {
        kind,
        limits: set.map(KindLimitView::from),
    }))
}
