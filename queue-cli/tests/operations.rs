//! Bulk operations as tracked background work, as operators meet them: the
//! CLI starting one detached, listing, aborting and resuming it; the API
//! starting, polling and aborting one under each role; and `queue serve`
//! carrying detached ones out, handing the one under way back when it is
//! stopped, and the next server carrying it on to the end.

mod support;

use std::time::Duration;

use axum::body::Body;
use axum::http::{header, Method, Request, StatusCode};
use queue_cli::serve::{router, Access, Api, ConfiguredToken, Erased, ShortTokens, Tokens};
use queue_store_postgres::{JobTable, PgAdmin, PgKeyType};
use serde_json::{json, Value};
use support::{fails, json, ok, Setup};
use tower::ServiceExt;

/// Adds `n` failed jobs of kind `kind` to the default table.
async fn failed_jobs(t: &Setup, kind: &str, n: u32) {
    t.sql(&format!(
        "INSERT INTO {s}.queue_jobs (kind, state, finished_at, failure_message) \
         SELECT '{kind}', 'failed', now(), 'boom' FROM generate_series(1, {n})",
        s = t.s
    ))
    .await;
}

async fn count(t: &Setup, state: &str) -> i64 {
    sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT count(*) FROM {}.queue_jobs WHERE state = '{state}'",
        t.s
    )))
    .fetch_one(&t.pool)
    .await
    .expect("a count")
}

#[tokio::test]
async fn the_cli_records_detached_operations_and_aborts_and_resumes_them() {
    let Some(t) =
        Setup::new("the_cli_records_detached_operations_and_aborts_and_resumes_them").await
    else {
        return;
    };
    let config = t.config("");
    let q = |args: &[&str]| {
        let mut command = t.queue(&config, args);
        command.env("QUEUE_ACTOR", "alice");
        command
    };
    ok(&mut q(&["migrate"]));
    failed_jobs(&t, "x", 30).await;

    let started = ok(&mut q(&["retry", "--state", "failed", "--detach", "--yes"]));
    assert!(
        started.starts_with(
            "recorded operation 1: retry 30 jobs; a running `queue serve` carries it out"
        ),
        "{started}"
    );
    let listed = json(&mut q(&["ops", "--json"]));
    assert_eq!(listed.as_array().map(Vec::len), Some(1), "{listed}");
    assert_eq!(
        (&listed[0]["state"], &listed[0]["total"], &listed[0]["by"]),
        (&json!("pending"), &json!(30), &json!("alice"))
    );
    assert_eq!(count(&t, "failed").await, 30, "nothing runs it yet");

    assert_eq!(
        ok(&mut q(&["ops", "abort", "1"])),
        "aborted operation 1 after 0 of 30 jobs; its runner stops after the batch under way\n"
    );
    let err = fails(&mut q(&["ops", "abort", "1"]));
    assert!(
        err.contains("operation 1 had already ended: it is aborted"),
        "{err}"
    );
    let err = fails(&mut q(&["ops", "resume", "1"]));
    assert!(
        err.contains("operation 1 cannot be resumed: it is aborted"),
        "{err}"
    );
    let err = fails(&mut q(&["ops", "show", "99"]));
    assert!(err.contains("there is no operation 99"), "{err}");

    // Detached, then carried out here, 7 at a time.
    let started = ok(&mut q(&[
        "delete", "--kind", "x", "--batch", "7", "--detach", "--yes",
    ]));
    assert!(
        started.starts_with("recorded operation 2: delete 30 jobs"),
        "{started}"
    );
    assert_eq!(
        ok(&mut q(&["ops", "resume", "2"])),
        "deleted 30 jobs (operation 2)\n"
    );
    let shown = json(&mut q(&["ops", "show", "2", "--json"]));
    assert_eq!(
        (&shown["state"], &shown["done"], &shown["batch"]),
        (&json!("done"), &json!(30), &json!(7)),
        "{shown}"
    );
    assert!(shown["runner"]
        .as_str()
        .is_some_and(|r| r.starts_with("queue-cli:")));
    assert_eq!(count(&t, "failed").await, 0);

    // In the foreground, it is an operation too.
    failed_jobs(&t, "y", 5).await;
    assert_eq!(
        ok(&mut q(&["retry", "--state", "failed", "--yes"])),
        "retried 5 jobs\n"
    );
    let open = json(&mut q(&["ops", "--open", "--json"]));
    assert_eq!(open, json!([]), "none left open");
    let table = ok(&mut q(&["ops"]));
    assert!(
        table
            .lines()
            .nth(1)
            .is_some_and(|l| l.contains("retry") && l.contains("done") && l.contains("5/5")),
        "{table}"
    );

    let by_key = fails(&mut q(&["retry", "1", "--detach"]));
    assert!(
        by_key.contains("--detach applies to a write by filter"),
        "{by_key}"
    );

    // The audit log has the abort, by whom.
    let audit = json(&mut q(&["audit", "--json"]));
    let aborts: Vec<&Value> = audit
        .as_array()
        .expect("entries")
        .iter()
        .filter(|e| e["action"] == "abort-operation")
        .collect();
    assert_eq!(aborts.len(), 2, "the abort and the refused second one");
    assert!(aborts
        .iter()
        .all(|e| e["actor"] == "alice" && e["target"]["id"] == 1));
}

/// A request's status and JSON body.
async fn call(
    app: &axum::Router,
    method: Method,
    uri: &str,
    token: &str,
    body: Option<&str>,
) -> (StatusCode, Value) {
    let request = Request::builder()
        .method(method)
        .uri(uri)
        .header(header::AUTHORIZATION, format!("Bearer {token}"))
        .header(header::CONTENT_TYPE, "application/json")
        .body(body.map_or_else(Body::empty, |b| Body::from(b.to_owned())))
        .expect("a request");
    let response = app.clone().oneshot(request).await.expect("a response");
    let status = response.status();
    let bytes = axum::body::to_bytes(response.into_body(), 1 << 20)
        .await
        .expect("the body");
    (
        status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    )
}

#[tokio::test]
async fn the_api_starts_polls_and_aborts_operations_by_role() {
    let Some(t) = Setup::new("the_api_starts_polls_and_aborts_operations_by_role").await else {
        return;
    };
    let jobs = JobTable::new(&t.schema, "queue_jobs").expect("valid names");
    jobs.migrate(&t.pool).await.expect("migration");
    failed_jobs(&t, "x", 12).await;
    failed_jobs(&t, "y", 3).await;
    let admin = PgAdmin::<i64>::new(t.pool.clone(), jobs.store_options())
        .await
        .expect("an admin");
    let token = |access, name: &str, token: &str| ConfiguredToken {
        access,
        from: format!("{name} in the test"),
        name: Some(name.to_owned()),
        token: token.to_owned(),
    };
    let tokens = Tokens::configured(
        [
            token(Access::Read, "viewer", "read-secret-0123456"),
            token(Access::Operate, "on-call", "operate-secret-01234"),
            token(Access::Admin, "lead", "admin-secret-0123456"),
        ],
        ShortTokens::Refuse,
    )
    .expect("valid tokens");
    let api = Api::new(
        Erased::shared(admin),
        PgKeyType::Int8,
        Duration::from_secs(60),
    );
    let app = router(api, tokens, 4096);
    let (read, operate, lead) = (
        "read-secret-0123456",
        "operate-secret-01234",
        "admin-secret-0123456",
    );

    let (status, _) = call(
        &app,
        Method::POST,
        "/api/operations/retry?kind=x",
        read,
        None,
    )
    .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "a read token starts nothing");
    let (status, _) = call(
        &app,
        Method::POST,
        "/api/operations/delete?kind=x",
        operate,
        None,
    )
    .await;
    assert_eq!(
        status,
        StatusCode::FORBIDDEN,
        "a delete needs the admin role"
    );

    let (status, op) = call(
        &app,
        Method::POST,
        "/api/operations/retry?kind=x",
        operate,
        Some(r#"{"batch": 5, "reset_attempts": true}"#),
    )
    .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{op}");
    assert_eq!(
        (
            &op["action"],
            &op["state"],
            &op["total"],
            &op["batch"],
            &op["by"],
            &op["reset_attempts"]
        ),
        (
            &json!("retry"),
            &json!("pending"),
            &json!(12),
            &json!(5),
            &json!("on-call"),
            &json!(true)
        ),
        "{op}"
    );
    let id = op["id"].as_i64().expect("an id");
    let (status, polled) = call(
        &app,
        Method::GET,
        &format!("/api/operations/{id}"),
        read,
        None,
    )
    .await;
    assert_eq!(
        (status, &polled["progress"]),
        (StatusCode::OK, &json!(0.0)),
        "{polled}"
    );
    let (status, listed) = call(&app, Method::GET, "/api/operations?open=true", read, None).await;
    assert_eq!(
        (status, listed.as_array().map(Vec::len)),
        (StatusCode::OK, Some(1))
    );

    let (status, aborted) = call(
        &app,
        Method::POST,
        &format!("/api/operations/{id}/abort"),
        operate,
        None,
    )
    .await;
    assert_eq!(
        (status, &aborted["state"]),
        (StatusCode::OK, &json!("aborted")),
        "{aborted}"
    );
    assert_eq!(aborted["message"], json!("aborted by on-call"));
    let (status, again) = call(
        &app,
        Method::POST,
        &format!("/api/operations/{id}/abort"),
        operate,
        None,
    )
    .await;
    assert_eq!(status, StatusCode::CONFLICT, "{again}");
    let (status, _) = call(&app, Method::GET, "/api/operations/999", read, None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, error) = call(&app, Method::GET, "/api/operations/%C2%84", read, None).await;
    assert_eq!(
        status,
        StatusCode::BAD_REQUEST,
        "a JSON error for a path that is no id: {error}"
    );
    assert!(error["error"]["message"]
        .as_str()
        .is_some_and(|m| m.contains("is not an operation id")));

    for (uri, body, says) in [
        (
            "/api/operations/fail?kind=x",
            None,
            "not the operation's options",
        ),
        (
            "/api/operations/fail?kind=x",
            Some(r#"{"reason": " "}"#),
            "must say why",
        ),
        ("/api/operations/purge?kind=x", None, "state"),
        (
            "/api/operations/purge?state=queued&finished_before=2026-01-01T00:00:00Z",
            None,
            "only finished jobs",
        ),
        (
            "/api/operations/retry",
            Some(r#"{"batch": 0}"#),
            "batch must be between",
        ),
        (
            "/api/operations/retry",
            Some(r#"{"bogus": 1}"#),
            "unknown field",
        ),
        (
            "/api/operations/retry",
            Some("[null]"),
            "must be a JSON object, not an array",
        ),
        ("/api/operations/retry?state=lost", None, "unknown state"),
        // A misspelt filter would otherwise widen the retry to every job.
        (
            "/api/operations/retry?knd=x",
            None,
            "unknown query parameter \"knd\"",
        ),
        (
            "/api/operations/delete?=0.0",
            None,
            "unknown query parameter",
        ),
        // A body that is there must be JSON; only no body means defaults.
        (
            "/api/operations/retry?kind=x",
            Some("\n"),
            "not the operation's options",
        ),
    ] {
        let (status, error) = call(&app, Method::POST, uri, lead, body).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{uri}: {error}");
        let message = error["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains(says), "{uri}: {error}");
    }
    assert_eq!(count(&t, "failed").await, 15, "nothing was changed");
}

/// `queue serve` on a free loopback port.
async fn serve(t: &Setup, config: &std::path::Path) -> tokio::process::Child {
    let child = tokio::process::Command::new(assert_cmd::cargo::cargo_bin("queue"))
        .env("DATABASE_URL", &t.url)
        .env_remove("RUST_LOG")
        .arg("--config")
        .arg(config)
        .args(["serve", "--listen", "127.0.0.1:0"])
        .stdout(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("queue serve starts");
    assert!(child.id().is_some());
    child
}

async fn operation(t: &Setup, id: i64) -> (String, i64) {
    sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT state, done FROM {}.queue_jobs_operations WHERE id = {id}",
        t.s
    )))
    .fetch_one(&t.pool)
    .await
    .expect("the operation")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_server_hands_its_operation_to_the_next() {
    let Some(t) = Setup::new("a_stopped_server_hands_its_operation_to_the_next").await else {
        return;
    };
    let config = t.config("");
    ok(&mut t.queue(&config, &["migrate"]));
    const JOBS: i64 = 3000;
    failed_jobs(&t, "x", JOBS as u32).await;
    let started = json(&mut t.queue(
        &config,
        &[
            "retry", "--state", "failed", "--batch", "10", "--detach", "--yes", "--json",
        ],
    ));
    let id = started["id"].as_i64().expect("an id");

    let mut first = serve(&t, &config).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let (state, done) = operation(&t, id).await;
        if done > 0 {
            assert_eq!(state, "running");
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the server never took the operation"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Stopped as a service manager stops it: the batch under way ends, and
    // the operation is handed back.
    let pid = first.id().expect("a pid").to_string();
    assert!(std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .expect("kill runs")
        .success());
    let exit = tokio::time::timeout(Duration::from_secs(20), first.wait())
        .await
        .expect("it stops")
        .expect("an exit");
    assert!(exit.success(), "{exit:?}");
    let (state, done) = operation(&t, id).await;
    assert_eq!(state, "pending", "handed back");
    assert!(done > 0 && done < JOBS, "part done: {done}");
    assert_eq!(
        count(&t, "queued").await,
        done,
        "the count is the jobs changed"
    );

    let _second = serve(&t, &config).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let (state, done) = operation(&t, id).await;
        if state == "done" {
            assert_eq!(done, JOBS);
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the next server never finished it: {state} {done}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(count(&t, "queued").await, JOBS, "every job retried once");
    assert_eq!(count(&t, "failed").await, 0);
}
