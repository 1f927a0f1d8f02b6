//! The HTTP API of `queue serve`, against Postgres: every endpoint on the
//! default table and on a mapped foreign table, bad input of every kind,
//! the tokens, filter values that look like SQL, the database going away
//! and coming back, and the binary itself.

mod support;

use std::net::SocketAddr;
use std::time::Duration;

use axum::body::Body;
use axum::http::{header, Method, Request, StatusCode};
use axum::Router;
use queue_cli::serve::{router, Api, Erased, Tokens};
use queue_store_postgres::{JobTable, PgAdmin, PgKeyType};
use serde_json::{json, Value};
use sqlx::postgres::PgPoolOptions;
use support::Setup;
use tower::ServiceExt;

/// A request's status, `WWW-Authenticate` header and body (JSON when it
/// parses, else a string).
async fn call(
    app: &Router,
    method: Method,
    uri: &str,
    token: Option<&str>,
    body: Option<(&str, &str)>,
) -> (StatusCode, Value) {
    let mut request = Request::builder().method(method).uri(uri);
    if let Some(token) = token {
        request = request.header(header::AUTHORIZATION, format!("Bearer {token}"));
    }
    let request = match body {
        Some((content_type, text)) => request
            .header(header::CONTENT_TYPE, content_type)
            .body(Body::from(text.to_owned())),
        None => request.body(Body::empty()),
    }
    .expect("a request");
    let response = app.clone().oneshot(request).await.expect("a response");
    let status = response.status();
    let bytes = axum::body::to_bytes(response.into_body(), 10 << 20)
        .await
        .expect("the body");
    let text = String::from_utf8_lossy(&bytes).into_owned();
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

async fn get(app: &Router, uri: &str) -> (StatusCode, Value) {
    call(app, Method::GET, uri, None, None).await
}

async fn post(app: &Router, uri: &str, body: &str) -> (StatusCode, Value) {
    call(
        app,
        Method::POST,
        uri,
        None,
        Some(("application/json", body)),
    )
    .await
}

fn app_over<A>(admin: A, key: PgKeyType, tokens: Tokens) -> Router
where
    A: queue_core::Admin,
    A::Id: queue_cli::CliKey,
{
    let api = Api::new(Erased::shared(admin), key, Duration::from_secs(60));
    router(api, tokens, 4096)
}

async fn default_table(t: &Setup) -> Router {
    let jobs = JobTable::new(&t.schema, "queue_jobs").expect("valid names");
    jobs.migrate(&t.pool).await.expect("migration");
    let admin = PgAdmin::<i64>::new(t.pool.clone(), jobs.store_options())
        .await
        .expect("an admin");
    app_over(admin, PgKeyType::Int8, Tokens::default())
}

#[tokio::test]
async fn the_api_on_the_default_table() {
    let Some(t) = Setup::new("the_api_on_the_default_table").await else {
        return;
    };
    let app = default_table(&t).await;

    let (status, body) = post(
        &app,
        "/api/jobs",
        r#"{"kind": "email", "payload": {"to": "a@b.c"}, "priority": 3}"#,
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let id = body["id"].as_str().expect("the key, as text").to_owned();
    let (status, job) = get(&app, &format!("/api/jobs/{id}")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        (
            &job["kind"],
            &job["payload"],
            &job["state"],
            &job["stored_state"],
            &job["priority"]
        ),
        (
            &json!("email"),
            &json!({"to": "a@b.c"}),
            &json!("queued"),
            &json!("queued"),
            &json!(3)
        )
    );
    for n in 0..3 {
        let (status, _) = post(
            &app,
            "/api/jobs",
            &format!(r#"{{"kind": "resize", "payload": {{"n": {n}}}}}"#),
        )
        .await;
        assert_eq!(status, StatusCode::CREATED);
    }

    // Pages, filters and their mistakes.
    let (status, page) = get(&app, "/api/jobs?state=queued&kind=resize&limit=2").await;
    assert_eq!(status, StatusCode::OK, "{page}");
    assert_eq!(page["jobs"].as_array().map(Vec::len), Some(2));
    let next = page["next"].as_str().expect("a next page").to_owned();
    let (_, rest) = get(&app, &format!("/api/jobs?kind=resize&limit=2&after={next}")).await;
    assert_eq!(rest["jobs"].as_array().map(Vec::len), Some(1));
    assert_eq!(rest["next"], Value::Null);
    for (uri, says) in [
        ("/api/jobs?limit=0", "limit must be between 1 and 1000"),
        ("/api/jobs?state=lost", "unknown state \"lost\""),
        ("/api/jobs?after=abc", "is not a key of this table"),
        (
            "/api/jobs?payload=%7Bnope",
            "payload: \"{nope\" is not JSON",
        ),
        (
            "/api/jobs?running_longer_than=2147483648",
            "between 0 and 2147483647",
        ),
        (
            "/api/jobs?running_longer_than=60&state=failed",
            "leave out state",
        ),
        ("/api/jobs?queued_after=yesterday", "queued_after"),
        ("/api/jobs?order=sideways", "order"),
        ("/api/jobs?state=", "at least one state"),
        ("/api/jobs?stat=failed", "unknown query parameter \"stat\""),
    ] {
        let (status, body) = get(&app, uri).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{uri}: {body}");
        assert_eq!(body["error"]["code"], "bad_request", "{uri}");
        assert!(
            body["error"]["message"]
                .as_str()
                .unwrap_or_default()
                .contains(says),
            "{uri}: {body}"
        );
    }
    let (status, by_payload) = get(&app, "/api/jobs?payload=%7B%22to%22%3A%22a%40b.c%22%7D").await;
    assert_eq!(status, StatusCode::OK, "{by_payload}");
    assert_eq!(
        by_payload["jobs"].as_array().map(Vec::len),
        Some(1),
        "the job whose payload contains {{\"to\": \"a@b.c\"}}: {by_payload}"
    );
    let hostile = "x'%29%3B%20DROP%20TABLE%20queue_jobs%3B%20--";
    let (status, none) = get(
        &app,
        &format!("/api/jobs?kind={hostile}&failure_contains={hostile}"),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        none["jobs"],
        json!([]),
        "values that look like SQL are values"
    );
    assert_eq!(
        get(&app, "/api/jobs").await.1["jobs"]
            .as_array()
            .map(Vec::len),
        Some(4),
        "and the table is intact"
    );

    // Bodies: not JSON, not the schema, not JSON at all, too large.
    let (status, body) = post(&app, "/api/jobs", "{nope").await;
    assert_eq!(
        (status, &body["error"]["code"]),
        (StatusCode::BAD_REQUEST, &json!("bad_request"))
    );
    let (status, body) = post(&app, "/api/jobs", r#"{"kind": "x", "priority": 2.5}"#).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert!(body["error"]["message"]
        .as_str()
        .unwrap_or_default()
        .contains("not a whole number"));
    let (status, whole) = post(&app, "/api/jobs", r#"{"kind": "x", "priority": 7.0}"#).await;
    assert_eq!(
        status,
        StatusCode::CREATED,
        "7.0 is a JSON Schema integer: {whole}"
    );
    let whole = whole["id"].as_str().expect("a key").to_owned();
    assert_eq!(
        get(&app, &format!("/api/jobs/{whole}")).await.1["priority"],
        7
    );
    call(
        &app,
        Method::DELETE,
        &format!("/api/jobs/{whole}"),
        None,
        None,
    )
    .await;
    // jsonb keeps numbers exactly and prints f64::MAX as 309 digits, which
    // the payload must read back as it went in.
    let (status, big) = post(
        &app,
        "/api/jobs",
        r#"{"kind": "x", "payload": [1.7976931348623157e308, 5e-324]}"#,
    )
    .await;
    assert_eq!(status, StatusCode::CREATED);
    let big = big["id"].as_str().expect("a key").to_owned();
    let (status, read) = get(&app, &format!("/api/jobs/{big}")).await;
    assert_eq!(status, StatusCode::OK, "{read}");
    assert_eq!(read["payload"], json!([f64::MAX, 5e-324]));
    call(
        &app,
        Method::DELETE,
        &format!("/api/jobs/{big}"),
        None,
        None,
    )
    .await;
    let (status, _) = post(&app, "/api/jobs", r#"{"kind": "x", "colour": "red"}"#).await;
    assert_eq!(
        status,
        StatusCode::BAD_REQUEST,
        "unknown fields are refused"
    );
    let (status, body) = call(
        &app,
        Method::POST,
        "/api/jobs",
        None,
        Some(("text/plain", "{}")),
    )
    .await;
    assert_eq!(
        (status, &body["error"]["code"]),
        (
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            &json!("unsupported_media_type")
        )
    );
    let big = format!(r#"{{"kind": "x", "payload": "{}"}}"#, "a".repeat(8192));
    let (status, body) = post(&app, "/api/jobs", &big).await;
    assert_eq!(
        (status, &body["error"]["code"]),
        (StatusCode::PAYLOAD_TOO_LARGE, &json!("payload_too_large"))
    );

    // Writes, guarded.
    let (status, body) = post(&app, &format!("/api/jobs/{id}/retry"), "").await;
    assert_eq!(
        (status, &body["error"]["code"]),
        (StatusCode::CONFLICT, &json!("conflict")),
        "{body}"
    );
    assert!(body["error"]["message"]
        .as_str()
        .unwrap_or_default()
        .contains("it is queued"));
    let (status, _) = post(&app, "/api/jobs/999999/retry", "").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, _) = post(&app, "/api/jobs/not-a-key/cancel", "").await;
    assert_eq!(
        status,
        StatusCode::NOT_FOUND,
        "a text no key can be is no job"
    );
    t.sql(&format!(
        "UPDATE {}.\"queue_jobs\" SET state = 'failed', failure_message = 'boom' WHERE id = {id}",
        t.s
    ))
    .await;
    let (status, done) = post(
        &app,
        &format!("/api/jobs/{id}/retry?reset_attempts=true"),
        "",
    )
    .await;
    assert_eq!((status, &done["changed"]), (StatusCode::OK, &json!(1)));
    let (status, done) = post(&app, &format!("/api/jobs/{id}/cancel"), "").await;
    assert_eq!((status, &done["changed"]), (StatusCode::OK, &json!(1)));
    let (status, body) = post(&app, &format!("/api/jobs/{id}/cancel"), "").await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    let (status, done) = call(&app, Method::DELETE, &format!("/api/jobs/{id}"), None, None).await;
    assert_eq!((status, &done["changed"]), (StatusCode::OK, &json!(1)));
    let (status, _) = call(&app, Method::DELETE, &format!("/api/jobs/{id}"), None, None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);

    let (status, stats) = get(&app, "/api/stats").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        stats["counts"],
        json!([{"state": "queued", "stored_state": "queued", "kind": "resize", "count": 3, "estimated": false}])
    );
    assert!(stats["oldest_claimable_age_seconds"].is_number());
    let (status, exact) = get(&app, "/api/stats?exact=true").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        exact["counts"], stats["counts"],
        "a small table is counted either way"
    );
    let (status, metrics) = get(&app, "/metrics").await;
    assert_eq!(status, StatusCode::OK);
    let metrics = metrics.as_str().expect("text").to_owned();
    assert!(
        metrics.contains("queue_jobs{state=\"queued\",kind=\"resize\"} 3"),
        "{metrics}"
    );
    assert!(metrics.contains("queue_stalled_jobs 0"), "{metrics}");
    let (status, doc) = get(&app, "/openapi.json").await;
    assert_eq!(status, StatusCode::OK);
    let retry = &doc["paths"]["/api/jobs/{id}/retry"]["post"];
    assert_eq!(
        retry["parameters"][0]["schema"]["pattern"], "^-?[0-9]{1,18}$",
        "the document says what a key of this table looks like: {retry}"
    );
    let state = doc["paths"]["/api/jobs"]["get"]["parameters"]
        .as_array()
        .and_then(|ps| ps.iter().find(|p| p["name"] == "state"))
        .expect("the state parameter");
    assert!(
        state["schema"]["pattern"]
            .as_str()
            .is_some_and(|p| p.contains("queued|processing")),
        "and which states it knows: {state}"
    );
    assert_eq!(get(&app, "/nowhere").await.0, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn tokens_decide_who_reads_and_who_writes() {
    let Some(t) = Setup::new("tokens_decide_who_reads_and_who_writes").await else {
        return;
    };
    let jobs = JobTable::new(&t.schema, "queue_jobs").expect("valid names");
    jobs.migrate(&t.pool).await.expect("migration");
    let admin = PgAdmin::<i64>::new(t.pool.clone(), jobs.store_options())
        .await
        .expect("an admin");
    let app = app_over(
        admin,
        PgKeyType::Int8,
        Tokens::new(&["admin-secret-0123"], &["read-secret-01234"]).expect("valid tokens"),
    );
    let job = Some(("application/json", r#"{"kind": "k"}"#));
    let (status, body) = call(&app, Method::GET, "/api/jobs", None, None).await;
    assert_eq!(
        (status, &body["error"]["code"]),
        (StatusCode::UNAUTHORIZED, &json!("unauthorized"))
    );
    assert_eq!(
        call(&app, Method::GET, "/api/jobs", Some("wrong"), None)
            .await
            .0,
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(
        call(&app, Method::GET, "/metrics", None, None).await.0,
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(
        call(
            &app,
            Method::GET,
            "/api/jobs",
            Some("read-secret-01234"),
            None
        )
        .await
        .0,
        StatusCode::OK
    );
    let (status, body) = call(
        &app,
        Method::POST,
        "/api/jobs",
        Some("read-secret-01234"),
        job,
    )
    .await;
    assert_eq!(
        (status, &body["error"]["code"]),
        (StatusCode::FORBIDDEN, &json!("forbidden"))
    );
    assert_eq!(
        call(
            &app,
            Method::POST,
            "/api/jobs",
            Some("admin-secret-0123"),
            job
        )
        .await
        .0,
        StatusCode::CREATED
    );
    assert_eq!(
        call(
            &app,
            Method::GET,
            "/api/stats",
            Some("admin-secret-0123"),
            None
        )
        .await
        .0,
        StatusCode::OK
    );
    assert_eq!(
        call(&app, Method::GET, "/openapi.json", None, None).await.0,
        StatusCode::OK
    );
    assert_eq!(
        call(&app, Method::GET, "/healthz", None, None).await.0,
        StatusCode::OK
    );
}

#[tokio::test]
async fn the_api_on_a_mapped_foreign_table() {
    let Some(t) = Setup::new("the_api_on_a_mapped_foreign_table").await else {
        return;
    };
    let s = &t.s;
    t.sql(&format!(
        "CREATE SCHEMA {s};
         CREATE TYPE {s}.task_status AS ENUM ('new', 'working', 'done', 'broken', 'dropped');
         CREATE TABLE {s}.tasks (task_no serial PRIMARY KEY, job_type text NOT NULL,
           status {s}.task_status NOT NULL DEFAULT 'new', error text,
           enqueued timestamptz NOT NULL DEFAULT now(), began timestamptz, ended timestamptz,
           args jsonb NOT NULL DEFAULT '{{}}')"
    ))
    .await;
    let config = queue_store_postgres::PgConfig::parse(
        "tasks.toml",
        &format!(
            "schema = {schema:?}\ntable = \"tasks\"\n[columns]\nid = \"task_no\"\nkind = \"job_type\"\npayload = \"args\"\nstate = \"status\"\n\
             failure_message = \"error\"\nqueued_at = \"enqueued\"\nfinished_at = \"ended\"\n\
             started_at = \"began\"\nprocess_after = false\nnum_resets = false\nnum_failures = false\n\
             last_heartbeat_at = false\nexecution_logs = false\nworker_hostname = false\ncancel = false\n\
             claim_token = false\npriority = false\n\
             [states]\nqueued = \"new\"\nprocessing = \"working\"\ncompleted = \"done\"\nerrored = \"new\"\nfailed = \"broken\"\ncanceled = \"dropped\"\n",
            schema = t.schema
        ),
    )
    .expect("the config");
    let options = config.store_options().expect("valid options");
    let admin = PgAdmin::<i32>::new(t.pool.clone(), options)
        .await
        .expect("an admin");
    let app = app_over(admin, PgKeyType::Int4, Tokens::default());
    let (status, body) = post(
        &app,
        "/api/jobs",
        r#"{"kind": "resize", "payload": {"w": 10}}"#,
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let id = body["id"].as_str().expect("a key").to_owned();
    let status_of = |id: String| {
        let (pool, s) = (t.pool.clone(), s.clone());
        async move {
            sqlx::query_scalar::<_, String>(sqlx::AssertSqlSafe(format!(
                "SELECT status::text FROM {s}.tasks WHERE task_no = $1"
            )))
            .bind(id.parse::<i32>().expect("an int4 key"))
            .fetch_one(&pool)
            .await
            .expect("the task")
        }
    };
    assert_eq!(status_of(id.clone()).await, "new");
    let (_, page) = get(&app, "/api/jobs?state=new").await;
    assert_eq!(page["jobs"][0]["stored_state"], "new");
    assert_eq!(page["jobs"][0]["state"], "queued");
    let (status, _) = post(&app, &format!("/api/jobs/{id}/cancel"), "").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(status_of(id.clone()).await, "dropped");
    let (_, stats) = get(&app, "/api/stats").await;
    assert_eq!(stats["counts"][0]["stored_state"], "dropped");
}

/// The HTTP reads and a retry on a table with only a key and a state:
/// the config maps nothing else, and nothing is added to the table.
#[tokio::test]
async fn the_api_on_a_table_with_only_a_key_and_a_state() {
    let Some(t) = Setup::new("the_api_on_a_table_with_only_a_key_and_a_state").await else {
        return;
    };
    let s = &t.s;
    t.sql(&format!(
        "CREATE SCHEMA {s};
         CREATE TABLE {s}.jobs (id text PRIMARY KEY, status text NOT NULL);
         INSERT INTO {s}.jobs VALUES ('a', 'waiting'), ('b', 'broken'), ('c', 'busy')"
    ))
    .await;
    let config = queue_store_postgres::PgConfig::parse(
        "jobs.toml",
        &format!(
            "schema = {schema:?}\ntable = \"jobs\"\nkey_type = \"text\"\n[columns]\nstate = \"status\"\n\
             [states]\nqueued = \"waiting\"\nprocessing = \"busy\"\ncompleted = \"ok\"\nerrored = \"waiting\"\nfailed = \"broken\"\ncanceled = \"broken\"\n",
            schema = t.schema
        ),
    )
    .expect("the config");
    let admin = PgAdmin::<String>::new(t.pool.clone(), config.store_options().expect("options"))
        .await
        .expect("an admin on a key and a state");
    let app = app_over(admin, PgKeyType::Text, Tokens::default());
    let (status, stats) = get(&app, "/api/stats").await;
    assert_eq!(status, StatusCode::OK, "{stats}");
    assert_eq!(stats["stalled"], Value::Null, "unknown, not 0: {stats}");
    assert_eq!(stats["oldest_claimable_since"], Value::Null, "{stats}");
    let (status, page) = get(&app, "/api/jobs?state=broken").await;
    assert_eq!(status, StatusCode::OK, "{page}");
    assert_eq!(page["jobs"][0]["id"], "b", "{page}");
    let (status, job) = get(&app, "/api/jobs/c").await;
    assert_eq!(status, StatusCode::OK, "{job}");
    assert_eq!(job["state"], "processing", "{job}");
    let (status, _) = get(&app, "/api/timeline").await;
    assert_ne!(
        status,
        StatusCode::INTERNAL_SERVER_ERROR,
        "no finish column is no crash"
    );
    let (status, body) = post(&app, "/api/jobs/b/retry", "").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let stored: String = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT status FROM {s}.jobs WHERE id = 'b'"
    )))
    .fetch_one(&t.pool)
    .await
    .expect("the job");
    assert_eq!(stored, "waiting");
    let (status, body) = get(&app, "/metrics").await;
    assert_eq!(status, StatusCode::OK, "{body}");
}

/// `POST /api/jobs/{id}/fail` fails a waiting job with the reason; a blank
/// or missing reason is a 400, a finished job a 409, an unknown key a 404.
#[tokio::test]
async fn the_api_fails_a_job_with_a_reason() {
    let Some(t) = Setup::new("the_api_fails_a_job_with_a_reason").await else {
        return;
    };
    let app = default_table(&t).await;
    let (_, body) = post(&app, "/api/jobs", r#"{"kind": "sync"}"#).await;
    let id = body["id"].as_str().expect("a key").to_owned();
    let uri = format!("/api/jobs/{id}/fail");
    let (status, body) = post(&app, &uri, r#"{"reason": ""}"#).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    let (status, body) = post(&app, &uri, r#"{}"#).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    // The fields of a struct in an array, which serde alone would read.
    let (status, body) = post(&app, &uri, r#"["bad deploy"]"#).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("must be a JSON object, not an array")),
        "{body}"
    );
    let (status, body) = post(&app, &uri, r#"{"reason": "bad deploy"}"#).await;
    assert_eq!(
        (status, body["changed"].as_u64()),
        (StatusCode::OK, Some(1)),
        "{body}"
    );
    let (_, job) = get(&app, &format!("/api/jobs/{id}")).await;
    assert_eq!(
        (job["state"].as_str(), job["failure_message"].as_str()),
        (Some("failed"), Some("bad deploy")),
        "{job}"
    );
    let (status, body) = post(&app, &uri, r#"{"reason": "again"}"#).await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    let (status, body) = post(&app, "/api/jobs/999999/fail", r#"{"reason": "x"}"#).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
}

/// A TCP proxy to Postgres that can go down and come back on the same port.
struct Proxy {
    addr: SocketAddr,
    target: SocketAddr,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl Proxy {
    async fn start(target: SocketAddr) -> Proxy {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a port");
        let addr = listener.local_addr().expect("its address");
        let mut proxy = Proxy {
            addr,
            target,
            task: None,
        };
        proxy.serve(listener);
        proxy
    }

    fn serve(&mut self, listener: tokio::net::TcpListener) {
        let target = self.target;
        self.task = Some(tokio::spawn(async move {
            let mut connections = tokio::task::JoinSet::new();
            while let Ok((mut client, _)) = listener.accept().await {
                connections.spawn(async move {
                    if let Ok(mut server) = tokio::net::TcpStream::connect(target).await {
                        let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                    }
                });
            }
        }));
    }

    /// Closes the port and every connection through it.
    fn down(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }

    async fn up(&mut self) {
        let listener = tokio::net::TcpListener::bind(self.addr)
            .await
            .expect("the same port again");
        self.serve(listener);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_database_going_away_is_a_503_and_then_recovers() {
    let Some(t) = Setup::new("the_database_going_away_is_a_503_and_then_recovers").await else {
        return;
    };
    let jobs = JobTable::new(&t.schema, "queue_jobs").expect("valid names");
    jobs.migrate(&t.pool).await.expect("migration");
    let url: sqlx::postgres::PgConnectOptions = t.url.parse().expect("the test URL");
    let target: SocketAddr = format!(
        "{}:{}",
        url.get_host().replace("localhost", "127.0.0.1"),
        url.get_port()
    )
    .parse()
    .expect("a TCP address for the test database");
    let mut proxy = Proxy::start(target).await;
    let pool = PgPoolOptions::new()
        .max_connections(4)
        .acquire_timeout(Duration::from_secs(2))
        .test_before_acquire(false)
        .connect_with(url.clone().host("127.0.0.1").port(proxy.addr.port()))
        .await
        .expect("a pool through the proxy");
    let admin = PgAdmin::<i64>::new(pool, jobs.store_options())
        .await
        .expect("an admin");
    let app = app_over(admin, PgKeyType::Int8, Tokens::default());
    assert_eq!(get(&app, "/api/stats").await.0, StatusCode::OK);

    proxy.down();
    // The figures read a moment ago serve for a second; after that every
    // request reads the database.
    tokio::time::sleep(queue_cli::serve::api::STATS_FRESH).await;
    let mut answers = Vec::new();
    for _ in 0..3 {
        let (status, body) = get(&app, "/api/stats").await;
        answers.push((status, body["error"]["code"].clone()));
    }
    assert!(
        answers.iter().all(
            |(s, code)| *s == StatusCode::SERVICE_UNAVAILABLE && code == "database_unavailable"
        ),
        "every request while the database is away: {answers:?}"
    );

    proxy.up().await;
    let started = std::time::Instant::now();
    loop {
        let (status, _) = get(&app, "/api/stats").await;
        if status == StatusCode::OK {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "never recovered: {status}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    println!(
        "recovered {:?} after the database came back",
        started.elapsed()
    );
}

/// A failure's body carries a stable code, the server's own words and the
/// request's id (also in `x-request-id`), never Postgres' text: a value
/// the table refuses is a 400 naming the rule, a table gone from under
/// the server a 500.
#[tokio::test]
async fn error_bodies_carry_a_code_and_a_request_id_not_the_databases_text() {
    let Some(t) = Setup::new("error_bodies_carry_a_code_and_a_request_id").await else {
        return;
    };
    let app = default_table(&t).await;
    t.sql(&format!(
        "ALTER TABLE {}.queue_jobs ADD CONSTRAINT no_bad_kind CHECK (kind <> 'bad')",
        queue_store_postgres::Ident::new(&t.schema)
            .expect("a name")
            .quoted()
    ))
    .await;
    let send = |request: Request<Body>| {
        let app = app.clone();
        async move {
            let response = app.oneshot(request).await.expect("a response");
            let status = response.status();
            let id = response
                .headers()
                .get("x-request-id")
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned);
            let bytes = axum::body::to_bytes(response.into_body(), 1 << 20)
                .await
                .expect("the body");
            let text = String::from_utf8_lossy(&bytes).into_owned();
            (status, id, text)
        }
    };
    let enqueue = |kind: &str| {
        Request::builder()
            .method(Method::POST)
            .uri("/api/jobs")
            .header(header::CONTENT_TYPE, "application/json")
            .body(Body::from(format!(r#"{{"kind": "{kind}"}}"#)))
            .expect("a request")
    };
    let (status, id, text) = send(enqueue("bad")).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{text}");
    let body: Value = serde_json::from_str(&text).expect("JSON");
    assert_eq!(body["error"]["code"], "bad_request");
    let message = body["error"]["message"].as_str().expect("a message");
    assert!(
        message.contains("\"no_bad_kind\""),
        "names the rule: {message}"
    );
    assert!(message.contains("SQLSTATE 23514"), "{message}");
    assert!(
        !text.contains("violates") && !text.contains("queue_jobs"),
        "Postgres' sentence stays in the log: {text}"
    );
    assert_eq!(body["error"]["request_id"].as_str(), id.as_deref());

    t.sql(&format!(
        "DROP TABLE {}.queue_jobs CASCADE",
        queue_store_postgres::Ident::new(&t.schema)
            .expect("a name")
            .quoted()
    ))
    .await;
    let (status, id, text) = send(enqueue("good")).await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR, "{text}");
    let body: Value = serde_json::from_str(&text).expect("JSON");
    assert_eq!(body["error"]["code"], "misconfigured");
    assert!(
        !text.contains("does not exist") && !text.contains("queue_jobs"),
        "{text}"
    );
    let id = id.expect("every response has a request id");
    assert_eq!(body["error"]["request_id"], json!(id));
    assert!(text.contains(&format!("under request {id}")), "{text}");
    let (_, id_ok, _) = send(
        Request::builder()
            .uri("/healthz")
            .body(Body::empty())
            .expect("a request"),
    )
    .await;
    assert!(id_ok.is_some_and(|i| i != id), "each request its own id");
}

/// `queue serve` on a free loopback port with `config`, and the first line
/// it prints (where it listens).
async fn serve_binary(t: &Setup, config: &std::path::Path) -> (tokio::process::Child, String) {
    let binary = assert_cmd::cargo::cargo_bin("queue");
    let mut child = tokio::process::Command::new(binary)
        .env("DATABASE_URL", &t.url)
        .arg("--config")
        .arg(config)
        .args(["serve", "--listen", "127.0.0.1:0"])
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("queue serve starts");
    let stdout = child.stdout.take().expect("its output");
    let mut lines = tokio::io::AsyncBufReadExt::lines(tokio::io::BufReader::new(stdout));
    let first = tokio::time::timeout(Duration::from_secs(20), lines.next_line())
        .await
        .expect("it says where it listens")
        .expect("a line")
        .expect("not the end");
    // Keep reading, so the server never blocks on a full pipe.
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    (child, first)
}

#[tokio::test]
async fn the_binary_serves_and_refuses_to_serve_openly() {
    let Some(t) = Setup::new("the_binary_serves_and_refuses_to_serve_openly").await else {
        return;
    };
    let config = t.config("");
    assert!(support::ok(&mut t.queue(&config, &["migrate"])).contains("applied"));
    let err = support::fails(
        t.queue(&config, &["serve", "--listen", "0.0.0.0:0"])
            .env_remove("QUEUE_ADMIN_TOKENS")
            .env_remove("QUEUE_READ_TOKENS"),
    );
    assert!(
        err.contains("refusing to serve on 0.0.0.0:0 without a token"),
        "{err}"
    );
    // A token no client could present, or one short enough to guess, is
    // refused at start-up: it would otherwise lift the loopback-only rule.
    for (tokens, refusal) in [
        (r#"[""]"#, "serve.admin_tokens[0] in the config is empty"),
        (
            r#"["  "]"#,
            "serve.admin_tokens[0] in the config is only whitespace",
        ),
        (
            r#"["s3cret"]"#,
            "is 6 characters long; a token needs at least 16",
        ),
    ] {
        let bad = t.config(&format!("[serve]\nadmin_tokens = {tokens}\n"));
        let err = support::fails(
            t.queue(&bad, &["serve", "--listen", "0.0.0.0:0"])
                .env_remove("QUEUE_ADMIN_TOKENS")
                .env_remove("QUEUE_READ_TOKENS")
                .timeout(Duration::from_secs(20)),
        );
        assert!(err.contains(refusal), "{tokens}: {err}");
    }
    let err = support::fails(
        t.queue(&config, &["serve", "--listen", "0.0.0.0:0"])
            .env("QUEUE_ADMIN_TOKENS", "0123456789abcdef,")
            .timeout(Duration::from_secs(20)),
    );
    assert!(err.contains("QUEUE_ADMIN_TOKENS entry 2 is empty"), "{err}");
    let config = t.config("");

    // Serve on a free loopback port, ask over HTTP, stop with SIGTERM.
    let (mut child, first) = serve_binary(&t, &config).await;
    let addr = first
        .strip_prefix("listening on http://")
        .unwrap_or_else(|| panic!("{first}"))
        .to_owned();
    let mut stream = tokio::net::TcpStream::connect(&addr)
        .await
        .expect("a connection");
    tokio::io::AsyncWriteExt::write_all(
        &mut stream,
        format!("GET /api/stats HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .await
    .expect("a request");
    let mut answer = String::new();
    tokio::io::AsyncReadExt::read_to_string(&mut stream, &mut answer)
        .await
        .expect("an answer");
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.contains("\"counts\":[]"), "{answer}");
    let pid = child.id().expect("its pid");
    let killed = std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .expect("kill");
    assert!(killed.success());
    let exit = tokio::time::timeout(Duration::from_secs(10), child.wait())
        .await
        .expect("it stops on SIGTERM")
        .expect("its status");
    assert!(exit.success(), "a graceful stop exits 0: {exit}");
}

#[tokio::test]
async fn an_enqueue_with_a_unique_key_can_be_retried_safely() {
    let Some(t) = Setup::new("an_enqueue_with_a_unique_key_can_be_retried_safely").await else {
        return;
    };
    let app = default_table(&t).await;
    let request = r#"{"kind": "invoice", "payload": {"order": 7}, "unique_key": "invoice:7"}"#;
    let (status, first) = post(&app, "/api/jobs", request).await;
    assert_eq!(status, StatusCode::CREATED, "{first}");
    assert_eq!(first["inserted"], true);
    let (status, again) = post(&app, "/api/jobs", request).await;
    assert_eq!(
        (status, &again["id"], &again["inserted"]),
        (StatusCode::OK, &first["id"], &json!(false)),
        "the retried request gets the same job, and adds none: {again}"
    );
    let (_, page) = get(&app, "/api/jobs?kind=invoice").await;
    assert_eq!(page["jobs"].as_array().map(Vec::len), Some(1));
    let (status, forever) = post(
        &app,
        "/api/jobs",
        r#"{"kind": "invoice", "unique_key": "invoice:8", "unique_scope": "forever"}"#,
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{forever}");
    let (status, body) = post(
        &app,
        "/api/jobs",
        r#"{"kind": "invoice", "unique_scope": "forever"}"#,
    )
    .await;
    assert_eq!(
        (status, &body["error"]["code"]),
        (StatusCode::BAD_REQUEST, &json!("bad_request")),
        "a scope without a key: {body}"
    );
}

#[tokio::test]
async fn an_enqueue_carries_the_jobs_own_options() {
    let Some(t) = Setup::new("an_enqueue_carries_the_jobs_own_options").await else {
        return;
    };
    let app = default_table(&t).await;
    let (status, body) = post(
        &app,
        "/api/jobs",
        r#"{"kind": "charge", "max_attempts": 2, "expires_at": "2099-01-01T00:00:00Z", "at_most_once": true}"#,
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let id: i64 = body["id"]
        .as_str()
        .and_then(|s| s.parse().ok())
        .expect("a key");
    let row: (Option<i32>, Option<chrono::DateTime<chrono::Utc>>, bool) =
        sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT max_attempts, expires_at, at_most_once FROM {}.queue_jobs WHERE id = $1",
            t.s
        )))
        .bind(id)
        .fetch_one(&t.pool)
        .await
        .expect("the row");
    assert_eq!(
        (row.0, row.1.map(|at| at.to_rfc3339()), row.2),
        (Some(2), Some("2099-01-01T00:00:00+00:00".to_owned()), true)
    );
    let (status, body) = post(
        &app,
        "/api/jobs",
        r#"{"kind": "charge", "max_attempts": 0}"#,
    )
    .await;
    assert_eq!(
        (status, &body["error"]["code"]),
        (StatusCode::BAD_REQUEST, &json!("bad_request")),
        "{body}"
    );
}

#[tokio::test]
async fn queue_serve_enqueues_the_configs_schedules() {
    let Some(t) = Setup::new("queue_serve_enqueues_the_configs_schedules").await else {
        return;
    };
    let config = t.config(
        "[[schedules]]\nname = \"ticks\"\nevery = \"1s\"\nkind = \"tick\"\npayload = { from = \"config\" }\n",
    );
    assert!(support::ok(&mut t.queue(&config, &["migrate"])).contains("applied"));
    let (mut child, _listening) = serve_binary(&t, &config).await;
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    let stopped = std::process::Command::new("kill")
        .args(["-TERM", &child.id().expect("its pid").to_string()])
        .status()
        .expect("kill");
    assert!(stopped.success());
    child.wait().await.expect("it stops");
    let jobs: Vec<(String, serde_json::Value)> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT unique_key, payload FROM {}.queue_jobs WHERE kind = 'tick' ORDER BY id",
        t.s
    )))
    .fetch_all(&t.pool)
    .await
    .expect("the jobs");
    assert!(jobs.len() >= 2, "one job a second: {jobs:?}");
    assert!(
        jobs.iter()
            .all(|(key, payload)| key.starts_with("schedule:ticks:")
                && *payload == serde_json::json!({"from": "config"})),
        "{jobs:?}"
    );
}

/// A schedule the table cannot hold (no unique_forever column to keep an
/// occurrence's key for as long as its job exists) is refused when `queue
/// serve` starts, naming the schedule, instead of stopping the scheduler
/// at its first occurrence while `/healthz` says ok.
#[tokio::test]
async fn queue_serve_refuses_a_schedule_the_table_cannot_hold() {
    let Some(t) = Setup::new("queue_serve_refuses_a_schedule_the_table_cannot_hold").await else {
        return;
    };
    // The default table's shape, less its unique_forever column.
    let default = t.config("");
    support::ok(&mut t.queue(&default, &["migrate"]));
    t.sql(&format!(
        "CREATE TABLE {s}.tasks (LIKE {s}.queue_jobs INCLUDING DEFAULTS); \
         ALTER TABLE {s}.tasks DROP COLUMN unique_forever; \
         CREATE UNIQUE INDEX ON {s}.tasks (unique_key) WHERE state IN ('queued', 'processing', 'errored')",
        s = t.s
    ))
    .await;
    let config = t.config(
        "table = \"tasks\"\n[columns]\nunique_forever = false\n\
         [[schedules]]\nname = \"nightly\"\ncron = \"0 3 * * *\"\nkind = \"report\"\n",
    );
    let err = support::fails(
        t.queue(&config, &["serve", "--listen", "127.0.0.1:0"])
            .timeout(Duration::from_secs(20)),
    );
    assert!(
        err.contains("schedule \"nightly\" cannot enqueue its jobs here")
            && err.contains("no unique_forever column"),
        "{err}"
    );
}

/// `PUT /api/kinds/{kind}/limits` sets a kind's limits and clears them
/// with an empty body; `GET /api/limits` lists them; limits no store could
/// hold are a 400.
#[tokio::test]
async fn the_api_sets_lists_and_clears_a_kinds_limits() {
    let Some(t) = Setup::new("the_api_sets_lists_and_clears_a_kinds_limits").await else {
        return;
    };
    let app = default_table(&t).await;
    let (status, set) = call(
        &app,
        Method::PUT,
        "/api/kinds/api/limits",
        None,
        Some((
            "application/json",
            r#"{"max_running": 4, "per_second": 50, "burst": 5}"#,
        )),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{set}");
    assert_eq!(
        set["limits"]["description"],
        "4 at once, 50 a second (bursts of 5)"
    );
    assert_eq!(set["limits"]["set_by"], "api");
    let (status, listed) = get(&app, "/api/limits").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(listed.as_array().map(Vec::len), Some(1), "{listed}");
    assert_eq!(listed[0]["max_running"], 4);
    for bad in [
        r#"{"max_running": 0}"#,
        r#"{"burst": 3}"#,
        r#"{"per_second": -2}"#,
        r#"{"bogus": 1}"#,
        // Serde would read the fields from an array; the schema says object.
        "[null, null, null]",
    ] {
        let (status, body) = call(
            &app,
            Method::PUT,
            "/api/kinds/api/limits",
            None,
            Some(("application/json", bad)),
        )
        .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{bad}: {body}");
    }
    let (status, cleared) = call(&app, Method::PUT, "/api/kinds/api/limits", None, None).await;
    assert_eq!((status, &cleared["limits"]), (StatusCode::OK, &Value::Null));
    let (_, listed) = get(&app, "/api/limits").await;
    assert_eq!(listed, json!([]));
}
