//! Bearer tokens: read-only ones for GET, admin ones for everything. With
//! no token configured every request passes (the server then listens on a
//! loopback address only).
//!
//! A token is checked when it is configured: one that no client could
//! present (empty, blank, with spaces around it or characters a header
//! cannot carry) or one short enough to guess is refused at start-up,
//! naming where it came from, instead of silently counting as configured.

use std::sync::Arc;

use anyhow::{bail, Result};
use axum::extract::{Request, State};
use axum::http::{header, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::api::ApiError;

/// The shortest token accepted unless [`ShortTokens::AllowForTests`].
pub const MIN_TOKEN_LEN: usize = 16;

/// Whether tokens under [`MIN_TOKEN_LEN`] characters are accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ShortTokens {
    /// Refused at start-up (the default).
    #[default]
    Refuse,
    /// Accepted: for tests only (`queue serve --allow-short-tokens`).
    AllowForTests,
}

/// What a token may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Access {
    /// Reads only (GET and HEAD).
    Read,
    /// Reads and writes.
    Admin,
}

/// A token as configured, and where: the error refusing it names `from`.
#[derive(Debug, Clone)]
pub struct ConfiguredToken {
    /// What it may do.
    pub access: Access,
    /// Where it was configured, such as `serve.admin_tokens[0]`.
    pub from: String,
    /// The token.
    pub token: String,
}

/// The configured tokens, each one a client can present, with where it
/// was configured.
#[derive(Debug, Clone, Default)]
pub struct Tokens {
    admin: Vec<(String, String)>,
    read: Vec<(String, String)>,
}

/// Who made a request, as writes record it (a pause's `by`): where the
/// token it presented was configured (`serve.admin_tokens[0]`), or `api`
/// on a server without tokens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Actor(pub String);

impl Tokens {
    /// Admin and read-only tokens, checked as [`Tokens::configured`] does
    /// (short ones refused); each is named by its place in its list.
    pub fn new(admin: &[&str], read: &[&str]) -> Result<Tokens> {
        let entries = |access: Access, list: &[&str], name: &str| {
            list.iter()
                .enumerate()
                .map(|(i, token)| ConfiguredToken {
                    access,
                    from: format!("{name} token {}", i + 1),
                    token: (*token).to_owned(),
                })
                .collect::<Vec<_>>()
        };
        let mut all = entries(Access::Admin, admin, "admin");
        all.extend(entries(Access::Read, read, "read"));
        Tokens::configured(all, ShortTokens::Refuse)
    }

    /// The tokens `entries` configure; refused, naming the first bad one
    /// and why, if any is empty, blank, has spaces around it, holds a
    /// character other than visible ASCII (an Authorization header could
    /// never carry it), or is shorter than [`MIN_TOKEN_LEN`] (unless
    /// `short` allows that, for tests).
    pub fn configured(
        entries: impl IntoIterator<Item = ConfiguredToken>,
        short: ShortTokens,
    ) -> Result<Tokens> {
        let mut tokens = Tokens::default();
        for entry in entries {
            check(&entry, short)?;
            let held = (entry.token, entry.from);
            match entry.access {
                Access::Admin => tokens.admin.push(held),
                Access::Read => tokens.read.push(held),
            }
        }
        Ok(tokens)
    }

    /// Whether any token is configured.
    pub fn any(&self) -> bool {
        !self.admin.is_empty() || !self.read.is_empty()
    }

    #[cfg(test)]
    fn access(&self, presented: &str) -> Option<Access> {
        self.holder(presented).map(|(access, _)| access)
    }

    /// What the token `presented` may do, and where it was configured.
    fn holder<'a>(&'a self, presented: &str) -> Option<(Access, &'a str)> {
        // Every token is compared in full, whatever matched before, so the
        // time taken says nothing about which bytes were right.
        let first = |list: &'a [(String, String)]| {
            list.iter().fold(None, |hit: Option<&'a str>, (t, from)| {
                let this = same(t, presented);
                hit.or(this.then_some(from.as_str()))
            })
        };
        match (first(&self.admin), first(&self.read)) {
            (Some(from), _) => Some((Access::Admin, from)),
            (None, Some(from)) => Some((Access::Read, from)),
            _ => None,
        }
    }
}

/// Refuses a token no client could present, or one too short.
fn check(entry: &ConfiguredToken, short: ShortTokens) -> Result<()> {
    let (from, token) = (&entry.from, &entry.token);
    if token.is_empty() {
        bail!(
            "{from} is empty; no client can present an empty token: remove it or give a real one"
        );
    }
    if token.trim().is_empty() {
        bail!("{from} is only whitespace; no client can present it: remove it or give a real one");
    }
    if token.trim() != token {
        bail!("{from} has whitespace around it, which an Authorization header cannot carry: remove the whitespace");
    }
    if let Some(c) = token.chars().find(|c| !c.is_ascii_graphic()) {
        bail!(
            "{from} holds {c:?}; an Authorization header carries visible ASCII only (letters, digits, punctuation)"
        );
    }
    let length = token.chars().count();
    if length < MIN_TOKEN_LEN && short == ShortTokens::Refuse {
        bail!(
            "{from} is {length} characters long; a token needs at least {MIN_TOKEN_LEN} (such as the output of `openssl rand -hex 16`), or run with --allow-short-tokens in tests"
        );
    }
    Ok(())
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

/// The token of an `Authorization: Bearer <token>` value (the scheme in
/// any case); `None` for another scheme or a blank token, which no
/// configured token can equal.
fn bearer(value: &str) -> Option<&str> {
    let (scheme, token) = value.trim().split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

/// Lets a request through if its token may do what it asks: reads (GET,
/// HEAD) need a read or admin token, everything else an admin token.
pub async fn authorize(
    State(tokens): State<Arc<Tokens>>,
    mut request: Request,
    next: Next,
) -> Response {
    if !tokens.any() {
        request.extensions_mut().insert(Actor("api".to_owned()));
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
        .and_then(bearer);
    match presented.and_then(|t| tokens.holder(t)) {
        None => ApiError::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "this server needs a bearer token: Authorization: Bearer <token>",
        )
        .into_response(),
        Some((access, _)) if access < needed => ApiError::new(
            StatusCode::FORBIDDEN,
            "forbidden",
            "this token may only read; writes need an admin token",
        )
        .into_response(),
        Some((_, from)) => {
            request.extensions_mut().insert(Actor(from.to_owned()));
            next.run(request).await
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_grant_what_they_are_for() {
        let tokens = Tokens::new(&["admin-secret-0123"], &["read-secret-01234"]).expect("valid");
        assert_eq!(tokens.access("admin-secret-0123"), Some(Access::Admin));
        assert_eq!(tokens.access("read-secret-01234"), Some(Access::Read));
        assert_eq!(tokens.access("admin-secret-012"), None);
        assert_eq!(tokens.access("admin-secret-01234"), None);
        assert_eq!(tokens.access(""), None);
        assert!(!Tokens::default().any());
    }

    #[test]
    fn tokens_no_client_could_present_or_that_are_short_are_refused() {
        let refused = |token: &str| Tokens::new(&[token], &[]).unwrap_err().to_string();
        assert!(
            refused("").contains("admin token 1 is empty"),
            "{}",
            refused("")
        );
        assert!(refused("   \t").contains("only whitespace"));
        assert!(refused(" 0123456789abcdef").contains("whitespace around it"));
        assert!(refused("0123456789abcdef\n").contains("whitespace around it"));
        assert!(refused("0123456789 abcdef").contains("holds ' '"));
        assert!(refused("0123456789abcdéf").contains("visible ASCII"));
        assert!(refused("s3cret").contains("is 6 characters long; a token needs at least 16"));
        let read = Tokens::new(&["0123456789abcdef"], &[""])
            .unwrap_err()
            .to_string();
        assert!(read.contains("read token 1 is empty"), "{read}");
        // Short tokens pass when a flag says they are for tests; blank
        // ones never do.
        let short = |token: &str| {
            Tokens::configured(
                [ConfiguredToken {
                    access: Access::Admin,
                    from: "serve.admin_tokens[0]".into(),
                    token: token.into(),
                }],
                ShortTokens::AllowForTests,
            )
        };
        assert!(short("s3cret").is_ok());
        let empty = short("").unwrap_err().to_string();
        assert!(empty.contains("serve.admin_tokens[0] is empty"), "{empty}");
        assert!(short(" ").is_err());
    }

    #[test]
    fn a_bearer_token_is_read_in_any_case_and_never_blank() {
        // Every header variant of an empty token is sent to the server in
        // tests/dashboard.rs; here, what the reading itself gives.
        assert_eq!(bearer("Bearer abc"), Some("abc"));
        assert_eq!(bearer("bearer  abc "), Some("abc"));
        assert_eq!(bearer("Bearer  "), None);
        assert_eq!(bearer("Basic abc"), None);
    }
}
