//! Errors as the API reports them: a status, a stable code, a short
//! message of the server's own words, and the request's id. What the
//! database said stays in the server's log, under that id: a client never
//! reads Postgres' text.

use axum::extract::Request;
use axum::http::{header, HeaderName, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Json;
use queue_core::StoreError;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// The header each response carries its request's id in.
pub const REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

tokio::task_local! {
    /// The id of the request being served on this task.
    static CURRENT_REQUEST: String;
}

/// Gives each request an id: errors name it in their body, the log lines
/// about them carry it, and every response has it in `x-request-id`.
pub async fn with_request_id(request: Request, next: Next) -> Response {
    let id = uuid::Uuid::new_v4().simple().to_string();
    let mut response = CURRENT_REQUEST.scope(id.clone(), next.run(request)).await;
    if let Ok(value) = HeaderValue::from_str(&id) {
        response.headers_mut().insert(REQUEST_ID, value);
    }
    response
}

/// The id of the request this task serves, if any.
fn request_id() -> Option<String> {
    CURRENT_REQUEST.try_with(String::clone).ok()
}

/// An error as the API reports it: a status, a stable code and a message.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    code: &'static str,
    message: String,
}

/// The body of every error response.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ErrorBody {
    /// What went wrong.
    pub error: ErrorDetail,
}

/// An error's code and message.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ErrorDetail {
    /// Stable, for programs: `bad_request`, `unauthorized`, `forbidden`,
    /// `cross_site`, `not_found`, `conflict`, `transient_conflict`,
    /// `payload_too_large`, `unsupported_media_type`, `misconfigured`,
    /// `database_unavailable`, `read_timeout`, `internal`.
    pub code: String,
    /// For people.
    pub message: String,
    /// The request's id (also in the `x-request-id` header): the server's
    /// log has the detail of a server-side error under it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_id: Option<String>,
}

impl ApiError {
    /// An error with this status, code and message.
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            code,
            message: message.into(),
        }
    }

    /// 400.
    pub fn bad_request(message: impl Into<String>) -> Self {
        ApiError::new(StatusCode::BAD_REQUEST, "bad_request", message)
    }

    /// 404.
    pub fn not_found(message: impl Into<String>) -> Self {
        ApiError::new(StatusCode::NOT_FOUND, "not_found", message)
    }

    /// A failure on the server's side: logged with the request's id and
    /// `detail`; the client reads only `code` and a message naming the id.
    fn logged(status: StatusCode, code: &'static str, summary: &str, detail: &str) -> Self {
        let id = request_id().unwrap_or_else(|| "-".into());
        if status.is_server_error() {
            tracing::error!(request_id = %id, code, detail, "{summary}");
        } else {
            tracing::warn!(request_id = %id, code, detail, "{summary}");
        }
        ApiError::new(
            status,
            code,
            format!("{summary}; the server's log has the detail under request {id}"),
        )
    }

    /// The status.
    pub fn status(&self) -> StatusCode {
        self.status
    }

    /// The stable code.
    pub fn code(&self) -> &'static str {
        self.code
    }

    /// The message.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = ErrorBody {
            error: ErrorDetail {
                code: self.code.to_owned(),
                message: self.message,
                request_id: request_id(),
            },
        };
        let mut response = (self.status, Json(body)).into_response();
        if self.status == StatusCode::UNAUTHORIZED {
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        let retry_after = match self.code {
            "database_unavailable" => Some("5"),
            "transient_conflict" => Some("1"),
            _ => None,
        };
        if let Some(seconds) = retry_after {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static(seconds));
        }
        response
    }
}

impl From<StoreError> for ApiError {
    /// Each store error as the status it means: a request the store
    /// refuses is the client's (400, in the store's own words); a
    /// transient conflict may be sent again (409, with `Retry-After`); an
    /// unreachable database is 503; a store set up wrong for its table,
    /// and anything else, is the server's (500). Only the store's own
    /// words reach the client, never the database's.
    fn from(error: StoreError) -> Self {
        let detail = error.chain();
        match &error {
            StoreError::Refused(message) => ApiError::bad_request(message.clone()),
            StoreError::TimedOut { context, after } => ApiError::logged(
                StatusCode::SERVICE_UNAVAILABLE,
                "read_timeout",
                &format!(
                    "{context} took longer than {after:?}, the server's limit for one read, and was stopped; narrow the request"
                ),
                &detail,
            ),
            StoreError::Unavailable { .. } => ApiError::logged(
                StatusCode::SERVICE_UNAVAILABLE,
                "database_unavailable",
                "the database is unavailable; try again shortly",
                &detail,
            ),
            StoreError::Conflict { .. } => ApiError::logged(
                StatusCode::CONFLICT,
                "transient_conflict",
                "the database refused the change for now (a deadlock or a serialization conflict); send the request again",
                &detail,
            ),
            StoreError::Config(_) => ApiError::logged(
                StatusCode::INTERNAL_SERVER_ERROR,
                "misconfigured",
                "the server's job store does not match its table",
                &detail,
            ),
            StoreError::Backend { source, .. } => {
                // A value the table refuses (a constraint, an enum label, a
                // length) is the request's fault: say which rule, by its
                // SQLSTATE class and the constraint's name, not Postgres'
                // sentence (which quotes the table and the row).
                let database = source
                    .downcast_ref::<sqlx::Error>()
                    .and_then(|e| e.as_database_error());
                match database.and_then(|db| Some((db.code()?.into_owned(), db.constraint()))) {
                    Some((code, constraint)) if code.starts_with("22") || code.starts_with("23") => {
                        let what = refused_value(&code);
                        let rule = constraint
                            .map(|c| format!(" (constraint {c:?})"))
                            .unwrap_or_default();
                        ApiError::logged(
                            StatusCode::BAD_REQUEST,
                            "bad_request",
                            &format!("the table refused the values: {what}{rule}, SQLSTATE {code}"),
                            &detail,
                        )
                    }
                    _ => ApiError::logged(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        "internal",
                        "the job store failed",
                        &detail,
                    ),
                }
            }
            _ => ApiError::logged(
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal",
                "the job store failed",
                &detail,
            ),
        }
    }
}

/// What a SQLSTATE of class 22 (data exception) or 23 (integrity
/// constraint violation) says of a value, in a few words.
fn refused_value(code: &str) -> &'static str {
    match code {
        "23502" => "a value the table requires is missing",
        "23503" => "a value refers to a row that does not exist",
        "23505" => "a value must be unique and is taken",
        "23514" => "a value fails a check of the table",
        "22001" => "a value is too long for its column",
        "22003" => "a number is out of its column's range",
        "22P02" => "a value is not of its column's type",
        "22007" | "22008" => "a time is out of range or malformed",
        c if c.starts_with("23") => "a constraint of the table refused them",
        _ => "a value does not fit its column",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mapped(error: StoreError) -> (StatusCode, &'static str, String) {
        let e = ApiError::from(error);
        (e.status, e.code, e.message)
    }

    fn boxed(text: &str) -> queue_core::BoxError {
        text.to_owned().into()
    }

    #[test]
    fn each_store_error_maps_to_the_status_it_means_and_hides_the_detail() {
        let (status, code, message) = mapped(StoreError::Conflict {
            context: "retrying jobs".into(),
            source: boxed("deadlock detected: Process 42 waits for ShareLock"),
        });
        assert_eq!((status, code), (StatusCode::CONFLICT, "transient_conflict"));
        assert!(!message.contains("Process 42"), "{message}");
        let (status, code, message) = mapped(StoreError::Unavailable {
            context: "listing jobs".into(),
            source: boxed("connection refused to 10.1.2.3:5432"),
        });
        assert_eq!(
            (status, code),
            (StatusCode::SERVICE_UNAVAILABLE, "database_unavailable")
        );
        assert!(!message.contains("10.1.2.3"), "{message}");
        let (status, code, message) = mapped(StoreError::Config(
            "listing jobs: relation \"secret_schema.jobs\" does not exist".into(),
        ));
        assert_eq!(
            (status, code),
            (StatusCode::INTERNAL_SERVER_ERROR, "misconfigured")
        );
        assert!(!message.contains("secret_schema"), "{message}");
        let (status, code, message) = mapped(StoreError::Backend {
            context: "listing jobs".into(),
            source: boxed("could not read block 7 in file \"base/16384/2619\""),
        });
        assert_eq!(
            (status, code),
            (StatusCode::INTERNAL_SERVER_ERROR, "internal")
        );
        assert!(!message.contains("base/16384"), "{message}");
        assert!(message.contains("under request"), "{message}");
        let (status, code, message) = mapped(StoreError::Refused(
            "only finished jobs can be purged, not queued ones".into(),
        ));
        assert_eq!((status, code), (StatusCode::BAD_REQUEST, "bad_request"));
        assert!(message.contains("only finished jobs"), "{message}");
    }
}
