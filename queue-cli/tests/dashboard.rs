//! What `queue serve` adds for the dashboard, over the memory store (no
//! database needed): the page and its assets with a policy that lets no
//! other script run, the refusal of writes from other sites and of foreign
//! host names when no token is set, and the timeline the chart draws. The
//! page itself is driven in Chromium by `cargo xtask test-pg`.

use std::time::Duration;

use axum::body::Body;
use axum::http::{header, HeaderMap, Method, Request, StatusCode};
use axum::Router;
use chrono::Utc;
use queue_cli::serve::{router, Api, Erased, Tokens};
use queue_core::{Admin, ClaimParams, NewJob, Store, Transition};
use queue_store_memory::MemoryStore;
use queue_store_postgres::PgKeyType;
use serde_json::Value;
use tower::ServiceExt;

fn app(store: MemoryStore, tokens: Tokens) -> Router {
    let api = Api::new(
        Erased::shared(store),
        PgKeyType::Int8,
        Duration::from_secs(60),
    );
    router(api, tokens, 4096)
}

/// A request with these headers: its status, headers and body.
async fn send(
    app: &Router,
    method: Method,
    uri: &str,
    headers: &[(&str, &str)],
) -> (StatusCode, HeaderMap, String) {
    let mut request = Request::builder().method(method).uri(uri);
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let response = app
        .clone()
        .oneshot(request.body(Body::empty()).expect("a request"))
        .await
        .expect("a response");
    let (status, headers) = (response.status(), response.headers().clone());
    let bytes = axum::body::to_bytes(response.into_body(), 10 << 20)
        .await
        .expect("the body");
    (
        status,
        headers,
        String::from_utf8_lossy(&bytes).into_owned(),
    )
}

fn code(body: &str) -> String {
    serde_json::from_str::<Value>(body).expect("a JSON error")["error"]["code"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

#[tokio::test]
async fn the_page_and_its_assets_are_served_under_a_strict_policy() {
    let app = app(MemoryStore::new(), Tokens::default());
    for (path, content_type, contains) in [
        ("/", "text/html", "/assets/app.js"),
        ("/assets/app.js", "text/javascript", "textContent"),
        ("/assets/app.css", "text/css", ".card"),
    ] {
        let (status, headers, body) = send(&app, Method::GET, path, &[]).await;
        assert_eq!(status, StatusCode::OK, "{path}");
        let header = |name: header::HeaderName| {
            headers
                .get(name)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_owned()
        };
        assert!(
            header(header::CONTENT_TYPE).starts_with(content_type),
            "{path}"
        );
        let policy = header(header::CONTENT_SECURITY_POLICY);
        assert!(
            policy.contains("script-src 'self'") && !policy.contains("unsafe"),
            "{path}: only this server's scripts may run: {policy}"
        );
        assert!(
            policy.contains("frame-ancestors 'none'"),
            "{path}: no framing"
        );
        assert_eq!(header(header::X_CONTENT_TYPE_OPTIONS), "nosniff");
        assert!(body.contains(contains), "{path} is the file it names");
    }
    let (_, _, script) = send(&app, Method::GET, "/assets/app.js", &[]).await;
    assert!(
        !script.contains("innerHTML") && !script.contains("insertAdjacentHTML"),
        "the page writes job data as text only"
    );
}

#[tokio::test]
async fn writes_from_another_site_are_refused() {
    let store = MemoryStore::new();
    let id = Admin::enqueue(&store, &[NewJob::new("k", serde_json::json!({}))])
        .await
        .expect("enqueued")[0]
        .id;
    let app = app(store, Tokens::default());
    let cancel = format!("/api/jobs/{id}/cancel");
    for headers in [
        &[("origin", "https://evil.example")][..],
        &[("origin", "null")],
        &[("sec-fetch-site", "cross-site")],
        &[
            ("sec-fetch-site", "same-site"),
            ("origin", "http://127.0.0.1:8080"),
        ],
        &[
            ("host", "127.0.0.1:8080"),
            ("origin", "http://127.0.0.1:9999"),
        ],
    ] {
        let (status, _, body) = send(&app, Method::POST, &cancel, headers).await;
        assert_eq!(
            (status, code(&body)),
            (StatusCode::FORBIDDEN, "cross_site".to_owned()),
            "{headers:?}"
        );
    }
    let (status, _, body) = send(
        &app,
        Method::GET,
        &format!("/api/jobs/{id}"),
        &[("sec-fetch-site", "cross-site")],
    )
    .await;
    assert_eq!(status, StatusCode::OK, "reads are not refused: {body}");
    assert!(
        body.contains("\"queued\""),
        "the job was not canceled: {body}"
    );
    let (status, _, body) = send(
        &app,
        Method::POST,
        &cancel,
        &[
            ("host", "127.0.0.1:8080"),
            ("origin", "http://127.0.0.1:8080"),
            ("sec-fetch-site", "same-origin"),
        ],
    )
    .await;
    assert_eq!(status, StatusCode::OK, "the dashboard's own write: {body}");
    let (status, _, _) = send(&app, Method::POST, &cancel, &[]).await;
    assert_eq!(
        status,
        StatusCode::CONFLICT,
        "a program (no Origin) reaches the handler, which finds it canceled"
    );
}

#[tokio::test]
async fn without_tokens_only_loopback_host_names_are_answered() {
    let open = app(MemoryStore::new(), Tokens::default());
    for host in [
        "127.0.0.1:8080",
        "localhost:8080",
        "[::1]:8080",
        "localhost",
    ] {
        let (status, _, _) = send(&open, Method::GET, "/api/stats", &[("host", host)]).await;
        assert_eq!(status, StatusCode::OK, "{host}");
    }
    let (status, _, body) = send(
        &open,
        Method::GET,
        "/api/stats",
        &[("host", "rebound.evil.example:8080")],
    )
    .await;
    assert_eq!(
        (status, code(&body)),
        (StatusCode::FORBIDDEN, "forbidden".to_owned()),
        "a name that resolves to loopback from another site (DNS rebinding)"
    );
    let guarded = app(
        MemoryStore::new(),
        Tokens::new(&["secret-0123456789"], &[]).expect("a valid token"),
    );
    let (status, _, _) = send(
        &guarded,
        Method::GET,
        "/api/stats",
        &[
            ("host", "queue.internal.example"),
            ("authorization", "Bearer secret-0123456789"),
        ],
    )
    .await;
    assert_eq!(
        status,
        StatusCode::OK,
        "with tokens any host name is served"
    );
}

/// However many callers ask for the figures at once (dashboard tabs,
/// `/api/stats`, `/metrics`), the store sees one read: one at a time, each
/// serving every caller for a second.
#[tokio::test]
async fn concurrent_stats_requests_share_one_read() {
    let api = Api::new(
        Erased::shared(MemoryStore::new()),
        PgKeyType::Int8,
        Duration::from_secs(60),
    );
    let reads = api.clone();
    let app = router(api, Tokens::default(), 4096);
    let mut requests = Vec::new();
    for i in 0..20 {
        let app = app.clone();
        let uri = if i % 2 == 0 { "/api/stats" } else { "/metrics" };
        requests.push(tokio::spawn(async move {
            send(&app, Method::GET, uri, &[]).await.0
        }));
    }
    for request in requests {
        assert_eq!(request.await.expect("joined"), StatusCode::OK);
    }
    assert_eq!(reads.stats_reads(), 1, "twenty requests, one read");
    tokio::time::sleep(queue_cli::serve::api::STATS_FRESH).await;
    assert_eq!(
        send(&app, Method::GET, "/api/stats", &[]).await.0,
        StatusCode::OK
    );
    assert_eq!(
        reads.stats_reads(),
        2,
        "read again once a second has passed"
    );
}

/// `/healthz` says ok while the background tasks run, and 503 naming the
/// one that stopped (a scheduler that died, the depth sampler).
#[tokio::test]
async fn healthz_names_a_background_task_that_stopped() {
    let api = Api::new(
        Erased::shared(MemoryStore::new()),
        PgKeyType::Int8,
        Duration::from_secs(60),
    );
    let health = api.health.clone();
    let app = router(api, Tokens::default(), 4096);
    let sampler = tokio::spawn(std::future::pending::<()>());
    health.watch("depth sampler", sampler.abort_handle());
    let (status, _, body) = send(&app, Method::GET, "/healthz", &[]).await;
    assert_eq!((status, body.as_str()), (StatusCode::OK, "ok"));
    let scheduler = tokio::spawn(async {});
    health.watch("scheduler", scheduler.abort_handle());
    scheduler.await.expect("it ended");
    let (status, _, body) = send(&app, Method::GET, "/healthz", &[]).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(body.contains("the scheduler stopped"), "{body}");
    sampler.abort();
}

/// An empty token can be neither configured nor presented: every header a
/// client might send for one is refused.
#[tokio::test]
async fn no_header_variant_of_an_empty_token_gets_in() {
    assert!(
        Tokens::new(&[""], &[]).is_err(),
        "an empty token is refused"
    );
    let guarded = app(
        MemoryStore::new(),
        Tokens::new(&["secret-0123456789"], &[]).expect("a valid token"),
    );
    for value in [
        "Bearer",
        "Bearer ",
        "Bearer  ",
        "Bearer \t",
        "bearer ",
        " Bearer ",
        "",
    ] {
        let (status, _, _) = send(
            &guarded,
            Method::GET,
            "/api/stats",
            &[("authorization", value)],
        )
        .await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{value:?}");
    }
    let (status, _, _) = send(
        &guarded,
        Method::GET,
        "/api/stats",
        &[("authorization", "bearer secret-0123456789")],
    )
    .await;
    assert_eq!(status, StatusCode::OK, "the scheme's case does not matter");
}

#[tokio::test]
async fn the_timeline_counts_finished_jobs_per_minute_and_samples_the_depth() {
    let store = MemoryStore::new();
    let jobs: Vec<NewJob> = (0..5)
        .map(|n| NewJob::new("k", serde_json::json!(n)))
        .collect();
    Admin::enqueue(&store, &jobs).await.expect("enqueued");
    let now = Utc::now();
    let claimed = store
        .claim(ClaimParams {
            limit: 3,
            worker: "w",
            conditions: None,
            now,
        })
        .await
        .expect("claimed");
    let mut transitions = [
        Transition::Complete,
        Transition::Complete,
        Transition::Fail {
            message: "no".into(),
        },
    ]
    .into_iter();
    for job in claimed {
        let transition = transitions.next().expect("three");
        let written = store
            .finish(job.job_store, &job.lease, transition, now)
            .await
            .expect("finished");
        assert_eq!(written, queue_core::WriteResult::Applied);
    }
    let app = app(store, Tokens::default());
    let (status, _, body) = send(&app, Method::GET, "/api/timeline", &[]).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let timeline: Value = serde_json::from_str(&body).expect("JSON");
    let points = timeline["points"].as_array().expect("points");
    assert_eq!(points.len(), 60, "an hour of minutes");
    assert_eq!(timeline["finish_times_kept"], true);
    let last = &points[59];
    assert_eq!(
        (last["completed"].as_u64(), last["failed"].as_u64()),
        (Some(2), Some(1))
    );
    assert_eq!(
        last["completed_by_kind"],
        serde_json::json!({"k": 2}),
        "each kind's completions: its throughput"
    );
    assert_eq!(
        last["waiting"],
        Value::Null,
        "no depth sample yet: the server has not counted the jobs"
    );
    send(&app, Method::GET, "/api/stats", &[]).await;
    let (_, _, body) = send(&app, Method::GET, "/api/timeline?minutes=5", &[]).await;
    let timeline: Value = serde_json::from_str(&body).expect("JSON");
    let points = timeline["points"].as_array().expect("points");
    assert_eq!(points.len(), 5);
    assert_eq!(
        points[4]["waiting"].as_u64(),
        Some(2),
        "the stats call sampled two waiting jobs"
    );
    for bad in [
        "/api/timeline?minutes=0",
        "/api/timeline?minutes=1441",
        "/api/timeline?minutes=x",
    ] {
        let (status, _, body) = send(&app, Method::GET, bad, &[]).await;
        assert_eq!(
            (status, code(&body)),
            (StatusCode::BAD_REQUEST, "bad_request".to_owned()),
            "{bad}"
        );
    }
}

/// Each token's role decides what it may do, and every write that got past
/// the check is in the audit log under the token's name, with how it ended;
/// refused requests and reads are not.
#[tokio::test]
async fn roles_decide_the_writes_and_the_audit_log_names_the_token() {
    use queue_cli::serve::{Access, ConfiguredToken, ShortTokens};
    let store = MemoryStore::new();
    let id = store.enqueue(NewJob::new("mail", serde_json::json!(1)));
    let token = |access, name: &str, token: &str| ConfiguredToken {
        access,
        from: format!("serve.tokens ({name})"),
        name: Some(name.to_owned()),
        token: token.to_owned(),
    };
    let tokens = Tokens::configured(
        [
            token(Access::Read, "dashboard", "read-secret-01234"),
            token(Access::Operate, "on-call", "operate-secret-012"),
            token(Access::Admin, "lead", "admin-secret-01234"),
        ],
        ShortTokens::Refuse,
    )
    .expect("valid tokens");
    let app = app(store, tokens);
    let as_ = |t: &'static str| [("authorization", t)];
    let (read, operate, admin) = (
        "Bearer read-secret-01234",
        "Bearer operate-secret-012",
        "Bearer admin-secret-01234",
    );
    let job = format!("/api/jobs/{id}");
    for (method, uri, who, status) in [
        (
            Method::POST,
            "/api/kinds/mail/pause".to_owned(),
            read,
            StatusCode::FORBIDDEN,
        ),
        (
            Method::POST,
            "/api/kinds/mail/pause".to_owned(),
            operate,
            StatusCode::OK,
        ),
        (
            Method::POST,
            format!("{job}/cancel"),
            operate,
            StatusCode::OK,
        ),
        (Method::DELETE, job.clone(), operate, StatusCode::FORBIDDEN),
        (Method::DELETE, job.clone(), admin, StatusCode::OK),
        (
            Method::POST,
            format!("{job}/retry"),
            admin,
            StatusCode::NOT_FOUND,
        ),
    ] {
        let (got, _, body) = send(&app, method.clone(), &uri, &as_(who)).await;
        assert_eq!(got, status, "{method} {uri} with {who}: {body}");
        if got == StatusCode::FORBIDDEN {
            assert!(body.contains("needs an"), "{body}");
        }
    }
    let (status, _, body) = send(&app, Method::GET, "/api/audit?limit=10", &as_(read)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let log: Value = serde_json::from_str(&body).expect("JSON");
    let seen: Vec<(&str, &str, bool)> = log["entries"]
        .as_array()
        .expect("entries")
        .iter()
        .map(|e| {
            (
                e["actor"].as_str().unwrap_or(""),
                e["action"].as_str().unwrap_or(""),
                e["ok"].as_bool().unwrap_or(true),
            )
        })
        .collect();
    assert_eq!(
        seen,
        vec![
            ("lead", "retry", false),
            ("lead", "delete", true),
            ("on-call", "cancel", true),
            ("on-call", "pause", true),
        ],
        "newest first; the refused requests are not there: {body}"
    );
    assert_eq!(log["entries"][1]["target"]["ids"][0], id.to_string());
    assert_eq!(log["entries"][3]["target"]["kind"], "mail");
    assert!(
        log["entries"][0]["outcome"]
            .as_str()
            .is_some_and(|o| o.starts_with("404")),
        "{body}"
    );
    assert_eq!(log["next"], Value::Null, "one page");
}

/// Concurrent writes share the audit log's appends, and none is lost or
/// answered early: each request, once answered, finds its own entry, and
/// the log holds every one of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_writes_are_each_in_the_audit_log_when_answered() {
    const WRITES: usize = 40;
    let app = app(MemoryStore::new(), Tokens::default());
    let mut tasks = tokio::task::JoinSet::new();
    for n in 0..WRITES {
        let app = app.clone();
        tasks.spawn(async move {
            let kind = format!("kind-{n}");
            let (status, _, body) =
                send(&app, Method::POST, &format!("/api/kinds/{kind}/pause"), &[]).await;
            assert_eq!(status, StatusCode::OK, "{body}");
            let (_, _, body) = send(&app, Method::GET, "/api/audit?limit=1000", &[]).await;
            let log: Value = serde_json::from_str(&body).expect("JSON");
            assert!(
                log["entries"]
                    .as_array()
                    .expect("entries")
                    .iter()
                    .any(|e| e["target"]["kind"] == kind.as_str()),
                "the pause of {kind} was answered before its entry was written: {body}"
            );
            kind
        });
    }
    let mut kinds = Vec::new();
    while let Some(kind) = tasks.join_next().await {
        kinds.push(kind.expect("a write"));
    }
    let (_, _, body) = send(&app, Method::GET, "/api/audit?limit=1000", &[]).await;
    let log: Value = serde_json::from_str(&body).expect("JSON");
    let mut logged: Vec<String> = log["entries"]
        .as_array()
        .expect("entries")
        .iter()
        .map(|e| e["target"]["kind"].as_str().unwrap_or("").to_owned())
        .collect();
    logged.sort();
    kinds.sort();
    assert_eq!(logged, kinds, "one entry per write");
}

/// `/api/schedules` lists each schedule with its next occurrence and its
/// latest one's job, found by the occurrence's unique key.
#[tokio::test]
async fn schedules_show_their_next_run_and_their_last_runs_job() {
    use queue_core::UniqueScope;
    use queue_worker::Schedule;
    let store = MemoryStore::new();
    let hourly = Schedule::every(
        "hourly",
        Duration::from_secs(3600),
        NewJob::new("report", serde_json::json!({})),
    )
    .expect("a schedule");
    let now = Utc::now();
    let last = hourly.latest_by(now).expect("an occurrence");
    let job = NewJob::new("report", serde_json::json!({}))
        .unique(hourly.occurrence_key(last), UniqueScope::Forever);
    let id = Admin::enqueue(&store, &[job]).await.expect("enqueued")[0].id;
    let mut api = Api::new(
        Erased::shared(store),
        PgKeyType::Int8,
        Duration::from_secs(60),
    );
    api.schedules = std::sync::Arc::new(vec![hourly.clone()]);
    let app = router(api, Tokens::default(), 4096);
    let (status, _, body) = send(&app, Method::GET, "/api/schedules", &[]).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let listed: Value = serde_json::from_str(&body).expect("JSON");
    let s = &listed[0];
    assert_eq!(
        (s["name"].as_str(), s["kind"].as_str()),
        (Some("hourly"), Some("report"))
    );
    assert_eq!(s["when"], "every 3600s");
    assert_eq!(s["last"]["job_id"], id.to_string(), "{body}");
    assert_eq!(s["last"]["state"], "queued", "{body}");
    let next: chrono::DateTime<Utc> = serde_json::from_value(s["next_at"].clone()).expect("a time");
    assert_eq!(next, last + chrono::TimeDelta::hours(1), "{body}");
}
