//! Bearer tokens, each with a role: `read` for GET, `operate` for the
//! everyday repairs (enqueue, retry, cancel, pause, resume), `admin` for
//! everything (delete, force-fail); and a name, which the audit log
//! records as who acted. With no token configured every request passes
//! (the server then listens on a loopback address only).
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

/// What a token may do: each role may do what the ones before it may.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Access {
    /// Reads only (GET and HEAD).
    Read,
    /// Reads, and the everyday repairs: enqueue, retry, cancel, pause and
    /// resume.
    Operate,
    /// Everything: also delete, force-fail, and whatever else destroys.
    Admin,
}

impl Access {
    /// The role's name in the config and in messages.
    pub fn name(self) -> &'static str {
        match self {
            Access::Read => "read",
            Access::Operate => "operate",
            Access::Admin => "admin",
        }
    }
}

impl From<queue_store_postgres::TokenRole> for Access {
    fn from(role: queue_store_postgres::TokenRole) -> Self {
        match role {
            queue_store_postgres::TokenRole::Read => Access::Read,
            queue_store_postgres::TokenRole::Operate => Access::Operate,
            queue_store_postgres::TokenRole::Admin => Access::Admin,
        }
    }
}

/// A token as configured, and where: the error refusing it names `from`.
#[derive(Debug, Clone)]
pub struct ConfiguredToken {
    /// What it may do.
    pub access: Access,
    /// Where it was configured, such as `serve.admin_tokens[0]`.
    pub from: String,
    /// Its name, which the audit log records as who acted; without one,
    /// `from`.
    pub name: Option<String>,
    /// The token.
    pub token: String,
}

/// The configured tokens, each one a client can present, with what it may
/// do and the name its requests act under.
#[derive(Debug, Clone, Default)]
pub struct Tokens {
    held: Vec<Held>,
}

#[derive(Debug, Clone)]
struct Held {
    token: String,
    access: Access,
    actor: String,
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
                    name: None,
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
            if let Some(name) = &entry.name {
                if name.trim().is_empty() || name.chars().any(char::is_control) {
                    bail!(
                        "{} has a name that says nothing or holds control characters: {name:?}",
                        entry.from
                    );
                }
                if let Some(same) = tokens.held.iter().find(|h| &h.actor == name) {
                    bail!("{} is named {name:?}, as another token is: the audit log could not tell them apart (the other: {:?})", entry.from, same.actor);
                }
            }
            tokens.held.push(Held {
                actor: entry.name.unwrap_or(entry.from),
                token: entry.token,
                access: entry.access,
            });
        }
        Ok(tokens)
    }

    /// Whether any token is configured.
    pub fn any(&self) -> bool {
        !self.held.is_empty()
    }

    #[cfg(test)]
    fn access(&self, presented: &str) -> Option<Access> {
        self.holder(presented).map(|(access, _)| access)
    }

    /// What the token `presented` may do, and the name its requests act
    /// under (of the most powerful entry, if it is configured twice).
    fn holder(&self, presented: &str) -> Option<(Access, &str)> {
        // Every token is compared in full, whatever matched before, so the
        // time taken says nothing about which bytes were right.
        self.held
            .iter()
            .fold(None, |best: Option<&Held>, held| {
                let this = same(&held.token, presented);
                match best {
                    Some(b) if !this || b.access >= held.access => Some(b),
                    _ if this => Some(held),
                    _ => None,
                }
            })
            .map(|h| (h.access, h.actor.as_str()))
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

/// The role a request needs: reads (GET, HEAD) any token; the everyday
/// repairs (enqueue, retry, cancel, pause, resume) an operate token; every
/// other write (delete, force-fail, and any route not named here) an admin
/// token.
pub fn needed(method: &Method, route: &str) -> Access {
    if matches!(*method, Method::GET | Method::HEAD) {
        return Access::Read;
    }
    match (method.as_str(), route) {
        ("POST", "/api/jobs")
        | ("POST", "/api/jobs/{id}/retry")
        | ("POST", "/api/jobs/{id}/cancel")
        | ("POST", "/api/kinds/{kind}/pause")
        | ("POST", "/api/kinds/{kind}/resume")
        | ("PUT", "/api/kinds/{kind}/limits")
        | ("POST", "/api/operations/retry")
        | ("POST", "/api/operations/cancel")
        | ("POST", "/api/operations/{id}/abort") => Access::Operate,
        _ => Access::Admin,
    }
}

/// Lets a request through if its token may do what it asks ([`needed`]),
/// marking it with the token's name ([`Actor`]).
pub async fn authorize(
    State(tokens): State<Arc<Tokens>>,
    mut request: Request,
    next: Next,
) -> Response {
    if !tokens.any() {
        request.extensions_mut().insert(Actor("api".to_owned()));
        return next.run(request).await;
    }
    let route = request
        .extensions()
        .get::<axum::extract::MatchedPath>()
        .map(|m| m.as_str().to_owned())
        .unwrap_or_default();
    let needed = needed(request.method(), &route);
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
        Some((access, actor)) if access < needed => ApiError::new(
            StatusCode::FORBIDDEN,
            "forbidden",
            format!(
                "this token ({actor}) has the {} role; this needs an {} token",
                access.name(),
                needed.name()
            ),
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
    fn each_route_needs_its_role_and_a_named_token_acts_under_its_name() {
        for (method, route, role) in [
            (Method::GET, "/api/jobs", Access::Read),
            (Method::GET, "/api/audit", Access::Read),
            (Method::POST, "/api/jobs", Access::Operate),
            (Method::POST, "/api/jobs/{id}/retry", Access::Operate),
            (Method::POST, "/api/jobs/{id}/cancel", Access::Operate),
            (Method::POST, "/api/kinds/{kind}/pause", Access::Operate),
            (Method::POST, "/api/kinds/{kind}/resume", Access::Operate),
            (Method::POST, "/api/jobs/{id}/fail", Access::Admin),
            (Method::DELETE, "/api/jobs/{id}", Access::Admin),
            (Method::PUT, "/api/anything/new", Access::Admin),
        ] {
            assert_eq!(needed(&method, route), role, "{method} {route}");
        }
        let entry = |access, name: Option<&str>, token: &str| ConfiguredToken {
            access,
            from: "serve.tokens[0]".into(),
            name: name.map(str::to_owned),
            token: token.into(),
        };
        let tokens = Tokens::configured(
            [
                entry(Access::Operate, Some("ci"), "operate-secret-0123"),
                entry(Access::Read, None, "read-secret-01234"),
            ],
            ShortTokens::Refuse,
        )
        .expect("valid");
        assert_eq!(
            tokens.holder("operate-secret-0123"),
            Some((Access::Operate, "ci"))
        );
        assert_eq!(
            tokens.holder("read-secret-01234"),
            Some((Access::Read, "serve.tokens[0]"))
        );
        let twice = Tokens::configured(
            [
                entry(Access::Operate, Some("ci"), "operate-secret-0123"),
                entry(Access::Admin, Some("ci"), "admin-secret-012345"),
            ],
            ShortTokens::Refuse,
        )
        .expect_err("two tokens named ci")
        .to_string();
        assert!(twice.contains("could not tell them apart"), "{twice}");
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
                    name: None,
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
