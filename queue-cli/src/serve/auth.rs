//! Bearer tokens: read-only ones for GET, admin ones for everything. With
//! no token configured every request passes (the server then listens on a
//! loopback address only).

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::api::ApiError;

/// The configured tokens.
#[derive(Debug, Clone, Default)]
pub struct Tokens {
    /// May read and write.
    pub admin: Vec<String>,
    /// May only read.
    pub read: Vec<String>,
}

/// What a token may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Access {
    Read,
    Admin,
}

impl Tokens {
    /// Whether any token is configured.
    pub fn any(&self) -> bool {
        !self.admin.is_empty() || !self.read.is_empty()
    }

    fn access(&self, presented: &str) -> Option<Access> {
        // Every token is compared in full, whatever matched before, so the
        // time taken says nothing about which bytes were right.
        let admin = self
            .admin
            .iter()
            .fold(false, |hit, t| hit | same(t, presented));
        let read = self
            .read
            .iter()
            .fold(false, |hit, t| hit | same(t, presented));
        match (admin, read) {
            (true, _) => Some(Access::Admin),
            (false, true) => Some(Access::Read),
            _ => None,
        }
    }
}

/// Compares in time independent of where the strings differ.
fn same(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    let mut diff = (a.len() ^ b.len()) as u8 | u8::from(a.len() != b.len());
    for i in 0..a.len().max(b.len()) {
        diff |= a.get(i).copied().unwrap_or(0) ^ b.get(i).copied().unwrap_or(0);
    }
    diff == 0
}

/// Lets a request through if its token may do what it asks: reads (GET,
/// HEAD) need a read or admin token, everything else an admin token.
pub async fn authorize(
    State(tokens): State<Arc<Tokens>>,
    request: Request,
    next: Next,
) -> Response {
    if !tokens.any() {
        return next.run(request).await;
    }
    let needed = if matches!(*request.method(), Method::GET | Method::HEAD) {
        Access::Read
    } else {
        Access::Admin
    };
    let presented = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim);
    match presented.and_then(|t| tokens.access(t)) {
        None => ApiError::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "this server needs a bearer token: Authorization: Bearer <token>",
        )
        .into_response(),
        Some(access) if access < needed => ApiError::new(
            StatusCode::FORBIDDEN,
            "forbidden",
            "this token may only read; writes need an admin token",
        )
        .into_response(),
        Some(_) => next.run(request).await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_grant_what_they_are_for() {
        let tokens = Tokens {
            admin: vec!["a-secret".into()],
            read: vec!["r-secret".into()],
        };
        assert_eq!(tokens.access("a-secret"), Some(Access::Admin));
        assert_eq!(tokens.access("r-secret"), Some(Access::Read));
        assert_eq!(tokens.access("a-secre"), None);
        assert_eq!(tokens.access("a-secret2"), None);
        assert_eq!(tokens.access(""), None);
        assert!(!Tokens::default().any());
    }
}
