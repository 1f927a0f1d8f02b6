//! Requests a browser sends on another site's behalf are refused.
//!
//! Bearer tokens already keep other sites out when tokens are configured:
//! a browser never adds an `Authorization` header by itself. Two gaps
//! remain, and this layer closes them for every route:
//!
//! - Writes: a write from a page of another origin (a form posted to
//!   `/api/jobs/7/retry`, say) is refused whenever the browser says where
//!   it comes from: `Sec-Fetch-Site` other than `same-origin` or `none`, or
//!   an `Origin` whose host is not the one asked. Programs such as curl send
//!   neither header and pass.
//! - With no token configured the server listens on loopback only, but a
//!   page on another site could still reach it through a name that
//!   resolves to 127.0.0.1 (DNS rebinding). Then every request must be for
//!   a loopback host name.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::api::ApiError;
use super::auth::Tokens;

/// Refuses cross-site writes, and requests for a foreign host name when
/// no token is configured.
pub async fn guard(State(tokens): State<Arc<Tokens>>, request: Request, next: Next) -> Response {
    let headers = request.headers();
    let host = headers
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .map(str::to_ascii_lowercase);
    if !tokens.any() {
        if let Some(host) = &host {
            if !is_loopback(host) {
                return ApiError::new(
                    StatusCode::FORBIDDEN,
                    "forbidden",
                    format!(
                        "host {host:?} is not a loopback name; a server without tokens answers only 127.0.0.1, [::1] and localhost (configure a token to serve other names)"
                    ),
                )
                .into_response();
            }
        }
    }
    let safe = matches!(
        *request.method(),
        Method::GET | Method::HEAD | Method::OPTIONS
    );
    if !safe && from_another_site(headers, host.as_deref()) {
        return ApiError::new(
            StatusCode::FORBIDDEN,
            "cross_site",
            "a write from a page of another site is refused",
        )
        .into_response();
    }
    next.run(request).await
}

/// Whether the browser says the request comes from another origin.
fn from_another_site(headers: &HeaderMap, host: Option<&str>) -> bool {
    let text = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    if let Some(site) = text("sec-fetch-site") {
        return !matches!(site, "same-origin" | "none");
    }
    match text("origin") {
        None => false,
        Some(origin) => {
            let authority = origin
                .split_once("://")
                .map(|(_, rest)| rest.to_ascii_lowercase());
            authority.as_deref() != host || host.is_none()
        }
    }
}

/// `localhost`, `127.x.y.z` or `[::1]`, with or without a port.
fn is_loopback(host: &str) -> bool {
    let name = match host.strip_prefix('[') {
        Some(rest) => rest.split(']').next().unwrap_or(rest),
        None => host.rsplit_once(':').map_or(host, |(name, _)| name),
    };
    name == "localhost"
        || name
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.insert(*name, HeaderValue::from_static(value));
        }
        map
    }

    #[test]
    fn loopback_names_with_and_without_ports() {
        for host in [
            "localhost",
            "localhost:8080",
            "127.0.0.1:80",
            "127.1.2.3",
            "[::1]:8080",
            "[::1]",
        ] {
            assert!(is_loopback(host), "{host}");
        }
        for host in [
            "evil.example",
            "evil.example:8080",
            "10.0.0.1:80",
            "localhost.evil.example",
            "[::2]:1",
        ] {
            assert!(!is_loopback(host), "{host}");
        }
    }

    #[test]
    fn the_browser_says_where_a_write_comes_from() {
        let host = Some("127.0.0.1:8080");
        assert!(
            !from_another_site(&headers(&[]), host),
            "curl sends neither header"
        );
        assert!(!from_another_site(
            &headers(&[("sec-fetch-site", "same-origin")]),
            host
        ));
        assert!(!from_another_site(
            &headers(&[("sec-fetch-site", "none")]),
            host
        ));
        assert!(from_another_site(
            &headers(&[("sec-fetch-site", "cross-site")]),
            host
        ));
        assert!(from_another_site(
            &headers(&[("sec-fetch-site", "same-site")]),
            host
        ));
        assert!(!from_another_site(
            &headers(&[("origin", "http://127.0.0.1:8080")]),
            host
        ));
        assert!(from_another_site(
            &headers(&[("origin", "http://127.0.0.1:9999")]),
            host
        ));
        assert!(from_another_site(&headers(&[("origin", "null")]), host));
        assert!(from_another_site(
            &headers(&[("origin", "https://evil.example")]),
            host
        ));
    }
}
