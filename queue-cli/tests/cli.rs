//! Every `queue` command, run as the real binary against a real Postgres:
//! on the default table, and on a foreign table a config file maps (renamed
//! columns, an int4 key, an enum state type with its own labels), plus the
//! ways a command fails.

mod support;

use support::{fails, json, ok, Setup};

#[tokio::test]
async fn an_operator_session_on_the_default_table() {
    let Some(t) = Setup::new("an_operator_session_on_the_default_table").await else {
        return;
    };
    let config = t.config("");
    let q = |args: &[&str]| t.queue(&config, args);

    assert!(ok(&mut q(&["migrate", "--status"])).contains("pending"));
    assert!(ok(&mut q(&["migrate", "--dry-run"])).contains("CREATE TABLE IF NOT EXISTS"));
    assert!(ok(&mut q(&["migrate"])).contains("applied version 1"));
    assert!(ok(&mut q(&["migrate"])).contains("is up to date"));
    let status = json(&mut q(&["migrate", "--status", "--json"]));
    assert!(status[0]["applied_at"].is_string(), "{status}");

    let email = ok(&mut q(&["enqueue", "email", r#"{"to":"ops@example.com"}"#]));
    let email = email.trim().to_owned();
    let resized = ok(q(&["enqueue", "resize", "-", "--priority", "5"])
        .write_stdin("{\"w\": 1}\n{\"w\": 2}\n\n{\"w\": 3}\n"));
    assert_eq!(
        resized.lines().count(),
        3,
        "one key per NDJSON line: {resized}"
    );
    let later = json(&mut q(&["enqueue", "report", "--run-at", "1h", "--json"]));
    // Keys are text in JSON, whatever the key column's type (as in the API).
    let report_id = later["ids"][0].as_str().expect("the new key").to_owned();
    assert_eq!(later["inserted"][0], true);
    let unique = ok(&mut q(&[
        "enqueue",
        "invoice",
        "{}",
        "--unique-key",
        "invoice:7",
    ]));
    let again = ok(&mut q(&[
        "enqueue",
        "invoice",
        "{}",
        "--unique-key",
        "invoice:7",
    ]));
    assert_eq!(
        again.trim(),
        format!("{} (already there: it holds the unique key)", unique.trim()),
        "a second job with the key is not added"
    );
    let err = fails(q(&["enqueue", "invoice", "-", "--unique-key", "k"]).write_stdin("{}\n"));
    assert!(err.contains("cannot apply to every line"), "{err}");
    ok(&mut q(&["delete", unique.trim()]));
    let err = fails(&mut q(&["enqueue", "email", "{nope"]));
    assert!(err.contains("the payload is not valid JSON"), "{err}");
    let err = fails(q(&["enqueue", "email", "-"]).write_stdin("{}\nnot json\n"));
    assert!(
        err.contains("line 2 of standard input is not JSON"),
        "{err}"
    );

    let stats = ok(&mut q(&["stats"]));
    assert!(stats.contains("queued  resize      3"), "{stats}");
    assert!(stats.contains("5 jobs;"), "{stats}");
    let stats = json(&mut q(&["stats", "--json"]));
    let queued_email = stats["counts"]
        .as_array()
        .expect("counts")
        .iter()
        .find(|c| c["kind"] == "email" && c["state"] == "queued")
        .expect("the queued email count");
    assert_eq!(queued_email["count"], 1, "{stats}");

    // Pages of two, newest first.
    let page = ok(&mut q(&["list", "--limit", "2"]));
    assert_eq!(
        page.lines().filter(|l| l.contains("ago")).count(),
        2,
        "{page}"
    );
    assert!(page.contains("more: queue list --after"), "{page}");
    let page = json(&mut q(&["list", "--limit", "2", "--json"]));
    let next = page["next"].as_str().expect("the next key").to_owned();
    let rest = json(&mut q(&["list", "--after", &next, "--json"]));
    assert_eq!(rest["jobs"].as_array().map(Vec::len), Some(3));
    assert_eq!(rest["next"], serde_json::Value::Null);

    // A bad day: two resizes failed, the email's worker died long ago.
    let jobs = format!("{}.\"queue_jobs\"", t.s);
    t.sql(&format!(
        "UPDATE {jobs} SET state = 'failed', failure_message = 'convert: connection refused by imagemagick', \
         num_failures = 6, finished_at = now() - interval '40 days' WHERE kind = 'resize' AND payload->>'w' IN ('1', '2');
         UPDATE {jobs} SET state = 'processing', started_at = now() - interval '10 minutes', \
         last_heartbeat_at = now() - interval '5 minutes', worker_hostname = 'w1' WHERE id = {email}"
    ))
    .await;
    let failed = ok(&mut q(&[
        "list",
        "--state",
        "failed",
        "--failure-contains",
        "REFUSED",
    ]));
    assert_eq!(
        failed.lines().filter(|l| l.contains("failed")).count(),
        2,
        "{failed}"
    );
    let shown = ok(&mut q(&["show", &email]));
    assert!(shown.contains("state:            processing"), "{shown}");
    assert!(shown.contains("\"to\": \"ops@example.com\""), "{shown}");
    let shown = json(&mut q(&["show", &email, "--json"]));
    assert_eq!(shown["worker_hostname"], "w1");
    let err = fails(&mut q(&["show", "999999"]));
    assert_eq!(err, "queue: there is no job 999999");

    let err = fails(&mut q(&["retry", &email]));
    assert_eq!(
        err,
        format!("queue: job {email} was not retried: it is processing")
    );
    let err = fails(&mut q(&["retry", "--state", "failed"]));
    assert!(
        err.contains("Retry 2 jobs (state failed)") && err.contains("pass --yes"),
        "{err}"
    );
    assert_eq!(
        ok(&mut q(&["retry", "--state", "failed", "--yes"])),
        "retried 2 jobs\n"
    );
    let err = fails(&mut q(&["retry", "1", "--kind", "x"]));
    assert!(err.contains("not both"), "{err}");

    assert_eq!(
        ok(&mut q(&["reset-stalled", "--stalled-max-age", "1m"])),
        format!("1 job queued again, 0 failed (reset limit reached, or at most once)\n  reset  {email}\n")
    );
    assert_eq!(
        ok(&mut q(&["cancel", &report_id.to_string()])),
        "canceled 1 job; asked 0 running jobs to stop\n"
    );
    assert_eq!(
        ok(&mut q(&["delete", "--kind", "email", "--yes"])),
        "deleted 1 job\n"
    );
    let err = fails(&mut q(&["list", "--state", "lost"]));
    assert!(
        err.contains("unknown state \"lost\"") && err.contains("queued, processing"),
        "{err}"
    );

    t.sql(&format!(
        "UPDATE {jobs} SET state = 'completed', finished_at = now() - interval '40 days' WHERE kind = 'resize'"
    ))
    .await;
    let purged = json(&mut q(&[
        "purge",
        "--older-than",
        "30d",
        "--batch",
        "2",
        "--yes",
        "--json",
    ]));
    // One tracked operation over the three finished states: a batch of
    // two, then the last one.
    assert_eq!(
        (&purged["purged"], &purged["batches"]),
        (&serde_json::json!(3), &serde_json::json!(2)),
        "{purged}"
    );
    assert!(
        purged["operation"].as_i64().is_some_and(|id| id > 0),
        "{purged}"
    );
    let stats = json(&mut q(&["stats", "--json"]));
    let left: Vec<(String, String)> = stats["counts"]
        .as_array()
        .expect("counts")
        .iter()
        .map(|c| {
            (
                c["stored_state"].as_str().unwrap_or_default().to_owned(),
                c["kind"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect();
    assert_eq!(left, [("canceled".to_owned(), "report".to_owned())]);
}

#[tokio::test]
async fn an_operator_session_on_a_mapped_foreign_table() {
    let Some(t) = Setup::new("an_operator_session_on_a_mapped_foreign_table").await else {
        return;
    };
    let s = &t.s;
    t.sql(&format!(
        "CREATE SCHEMA {s};
         CREATE TYPE {s}.task_status AS ENUM ('new', 'working', 'done', 'broken', 'dropped');
         CREATE TABLE {s}.tasks (
           task_no serial PRIMARY KEY,
           job_type text NOT NULL,
           status {s}.task_status NOT NULL DEFAULT 'new',
           error text, enqueued timestamptz NOT NULL DEFAULT now(), began timestamptz,
           ended timestamptz, run_after timestamptz, tries integer NOT NULL DEFAULT 0,
           alive_at timestamptz, host text, stop boolean NOT NULL DEFAULT false,
           args jsonb NOT NULL DEFAULT '{{}}')"
    ))
    .await;
    let config = t.config(
        r#"table = "tasks"
mode = "lease"

[columns]
id = "task_no"
kind = "job_type"
payload = "args"
state = "status"
failure_message = "error"
queued_at = "enqueued"
started_at = "began"
finished_at = "ended"
process_after = "run_after"
num_failures = "tries"
last_heartbeat_at = "alive_at"
worker_hostname = "host"
cancel = "stop"
num_resets = false
execution_logs = false
claim_token = false
priority = false

[states]
queued = "new"
processing = "working"
completed = "done"
errored = "new"
failed = "broken"
canceled = "dropped"
"#,
    );
    let q = |args: &[&str]| t.queue(&config, args);
    let status = |id: String| {
        let pool = t.pool.clone();
        let s = s.clone();
        async move {
            sqlx::query_scalar::<_, String>(sqlx::AssertSqlSafe(format!(
                "SELECT status::text FROM {s}.tasks WHERE task_no = $1"
            )))
            .bind(id.trim().parse::<i32>().expect("an int4 key"))
            .fetch_one(&pool)
            .await
            .expect("the task")
        }
    };

    // The table is the user's: migrate creates only the tables beside it,
    // where pauses (the config maps a kind column), the audit log, the
    // worker registry and bulk operations are kept.
    let migrated = ok(&mut q(&["migrate"]));
    assert!(
        migrated.contains("tasks_kinds\": applied version 1")
            && migrated.contains("tasks_kinds\": applied version 2")
            && migrated.contains("tasks_kinds\": applied version 3")
            && migrated.contains("tasks_audit\": applied version 1")
            && migrated.contains("tasks_workers\": applied version 1")
            && migrated.contains("tasks_operations\": applied version 1")
            && migrated.lines().count() == 6,
        "{migrated}"
    );
    let err = fails(&mut q(&["migrate", "--table", "other"]));
    assert!(err.contains("a table of your own"), "{err}");

    let a = ok(&mut q(&["enqueue", "resize", r#"{"w": 10}"#]));
    let b = ok(&mut q(&["enqueue", "resize", r#"{"w": 20}"#]));
    let c = ok(&mut q(&["enqueue", "email", r#"{"to": "x"}"#]));
    assert_eq!(
        status(a.clone()).await,
        "new",
        "enqueue writes the table's queued label"
    );
    let shown = ok(&mut q(&["show", a.trim()]));
    assert!(shown.contains("state:            new (queued)"), "{shown}");
    assert!(shown.contains("\"w\": 10"), "{shown}");

    t.sql(&format!(
        "UPDATE {s}.tasks SET status = 'broken', error = 'upstream 503', tries = 3, ended = now() - interval '2 hours' WHERE task_no = {}",
        b.trim()
    ))
    .await;
    let stats = ok(&mut q(&["stats"]));
    assert!(stats.contains("new (queued)     email       1"), "{stats}");
    assert!(stats.contains("broken (failed)  resize      1"), "{stats}");
    let listed = json(&mut q(&["list", "--state", "broken", "--json"]));
    assert_eq!(listed["jobs"][0]["stored_state"], "broken");
    assert_eq!(listed["jobs"][0]["state"], "failed");
    assert_eq!(
        json(&mut q(&["list", "--state", "failed", "--json"]))["jobs"],
        listed["jobs"],
        "the standard name and the table's label select the same jobs"
    );

    assert_eq!(ok(&mut q(&["retry", b.trim()])), "retried 1 job\n");
    assert_eq!(status(b.clone()).await, "new");
    assert_eq!(
        ok(&mut q(&["cancel", c.trim()])),
        "canceled 1 job; asked 0 running jobs to stop\n"
    );
    assert_eq!(
        status(c.clone()).await,
        "dropped",
        "cancel writes the table's canceled label"
    );

    // A worker died holding the task: the table has no reset counter, so
    // the reset always queues it again, writing the table's label.
    t.sql(&format!(
        "UPDATE {s}.tasks SET status = 'working', began = now() - interval '10 minutes', \
         alive_at = now() - interval '5 minutes', host = 'gone' WHERE task_no = {}",
        a.trim()
    ))
    .await;
    assert!(ok(&mut q(&["stats"])).contains("1 stalled"));
    assert_eq!(
        ok(&mut q(&["reset-stalled", "--stalled-max-age", "1m"])),
        format!(
            "1 job queued again, 0 failed (reset limit reached, or at most once)\n  reset  {}\n",
            a.trim()
        )
    );
    assert_eq!(status(a.clone()).await, "new");

    t.sql(&format!(
        "UPDATE {s}.tasks SET status = 'done', ended = now() - interval '2 hours' WHERE task_no = {}",
        a.trim()
    ))
    .await;
    assert_eq!(
        ok(&mut q(&[
            "purge",
            "--older-than",
            "1h",
            "--state",
            "done",
            "--yes"
        ])),
        "purged 1 job in 1 batches\n"
    );
    assert_eq!(
        ok(&mut q(&["delete", "--state", "dropped", "--yes"])),
        "deleted 1 job\n"
    );
    let stats = json(&mut q(&["stats", "--json"]));
    assert_eq!(stats["counts"].as_array().map(Vec::len), Some(1), "{stats}");
}

/// A scheduler's table with nothing but a key, a state and its own two
/// timestamps is read and repaired as it is: no column is added. Only what needs a missing column refuses, naming it.
#[tokio::test]
async fn a_table_with_only_a_key_and_a_state_is_read_and_repaired() {
    let Some(t) = Setup::new("a_table_with_only_a_key_and_a_state_is_read_and_repaired").await
    else {
        return;
    };
    let s = &t.s;
    t.sql(&format!(
        "CREATE SCHEMA {s};
         CREATE TYPE {s}.status AS ENUM ('pending', 'running', 'done', 'dead');
         CREATE TABLE {s}.jobs (id bigint PRIMARY KEY, status {s}.status NOT NULL,
           created_at timestamptz NOT NULL DEFAULT now(), updated_at timestamptz);
         INSERT INTO {s}.jobs (id, status) VALUES (1, 'pending'), (2, 'running'), (3, 'dead'),
           (4, 'done'), (5, 'dead')"
    ))
    .await;
    let config = t.config(
        r#"table = "jobs"
key_type = "bigint"

# Nothing else: the columns the table lacks are absent.
[columns]
state = "status"
queued_at = "created_at"

[states]
queued = "pending"
processing = "running"
completed = "done"
errored = "pending"
failed = "dead"
canceled = "dead"
"#,
    );
    let q = |args: &[&str]| t.queue(&config, args);
    // No bookkeeping table named, no kind column: migrate creates the
    // audit, workers and operations tables beside it, and there is no kind
    // to pause.
    let migrated = ok(&mut q(&["migrate"]));
    assert!(
        migrated.contains("jobs_audit\": applied version 1")
            && migrated.contains("jobs_workers\": applied version 1")
            && migrated.contains("jobs_operations\": applied version 1")
            && migrated.lines().count() == 3,
        "{migrated}"
    );
    let paused = fails(&mut q(&["pause", "email"]));
    assert!(paused.contains("has no kind column"), "{paused}");

    let stats = ok(&mut q(&["stats"]));
    assert!(stats.contains("5 jobs;"), "{stats}");
    assert!(
        stats.contains("stalled jobs unknown (the table keeps no heartbeat or start time)"),
        "a table without heartbeats does not claim 0 stalled: {stats}"
    );
    let stats = json(&mut q(&["stats", "--json"]));
    assert_eq!(stats["stalled"], serde_json::Value::Null, "{stats}");
    let dead = json(&mut q(&["list", "--state", "dead", "--json"]));
    let keys: Vec<&str> = dead["jobs"]
        .as_array()
        .expect("jobs")
        .iter()
        .filter_map(|j| j["id"].as_str())
        .collect();
    assert_eq!(keys, ["5", "3"], "{dead}");
    assert!(ok(&mut q(&["show", "2"])).contains("running (processing)"));

    assert_eq!(ok(&mut q(&["retry", "3", "--yes"])), "retried 1 job\n");
    assert_eq!(ok(&mut q(&["delete", "5", "--yes"])), "deleted 1 job\n");
    assert_eq!(
        ok(&mut q(&["cancel", "1", "--yes"])),
        "canceled 1 job; asked 0 running jobs to stop\n"
    );
    let states: Vec<(i64, String)> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT id, status::text FROM {s}.jobs ORDER BY id"
    )))
    .fetch_all(&t.pool)
    .await
    .expect("the rows");
    let expected = [(1, "dead"), (2, "running"), (3, "pending"), (4, "done")]
        .map(|(id, status)| (id, status.to_owned()));
    assert_eq!(states, expected);

    // What needs a column the table lacks refuses and names it.
    let err = fails(&mut q(&["purge", "--older-than", "1h", "--yes"]));
    assert!(err.contains("has no finished_at column"), "{err}");
    let err = fails(&mut q(&["reset-stalled"]));
    assert!(
        err.contains("has neither last_heartbeat_at nor started_at"),
        "{err}"
    );
}

/// Job data that carries terminal escape sequences (in a kind, a payload, a
/// failure, a log entry) reaches the operator as visible escapes, never as
/// bytes their terminal would act on.
#[tokio::test]
async fn job_data_never_reaches_the_terminal_raw() {
    let Some(t) = Setup::new("job_data_never_reaches_the_terminal_raw").await else {
        return;
    };
    let config = t.config("");
    let q = |args: &[&str]| t.queue(&config, args);
    ok(&mut q(&["migrate"]));
    // ESC ] 0 ; ... BEL sets the window title; CSI (U+009B) starts a C1
    // sequence; U+202E reverses the rest of the line.
    let kind = "\u{1b}[31mred\u{1b}[0m";
    let payload = r#"{"note": "\u001b]0;pwned\u0007 \u009b2J \u202egnp.exe"}"#;
    let id = ok(&mut q(&["enqueue", kind, payload])).trim().to_owned();
    t.sql(&format!(
        "UPDATE {}.queue_jobs SET state = 'failed', finished_at = now(), \
         failure_message = E'boom \\x1b[2J\\x07', \
         execution_logs = ARRAY[json_build_object('at', 'now', 'key', 'k', 'message', E'log \\x1b[1m')] \
         WHERE id = {id}",
        queue_store_postgres::Ident::new(&t.schema).expect("a name").quoted()
    ))
    .await;
    let raw = |text: &str| {
        text.chars()
            .find(|c| (c.is_control() && *c != '\n') || *c == '\u{202e}')
    };
    for args in [
        &["show", id.as_str()][..],
        &["list"],
        &["list", "--state", "failed"],
        &["stats"],
    ] {
        let out = ok(&mut q(args));
        assert_eq!(
            raw(&out),
            None,
            "queue {args:?} printed a raw control: {out:?}"
        );
        assert!(
            out.contains("\\u{1b}"),
            "queue {args:?} shows the escape: {out}"
        );
    }
    let shown = ok(&mut q(&["show", id.as_str()]));
    assert!(shown.contains("\\u{202e}gnp.exe"), "{shown}");
    assert!(shown.contains("boom \\u{1b}[2J\\u{7}"), "{shown}");
    assert!(shown.contains("log \\u{1b}[1m"), "{shown}");
}

/// A retry by filter goes on past a batch that came back short because two
/// of its jobs share a unique key: every job that can be retried is.
#[tokio::test]
async fn a_bulk_retry_goes_past_jobs_sharing_a_key() {
    let Some(t) = Setup::new("a_bulk_retry_goes_past_jobs_sharing_a_key").await else {
        return;
    };
    let config = t.config("");
    let q = |args: &[&str]| t.queue(&config, args);
    ok(&mut q(&["migrate"]));
    for _ in 0..2 {
        let id = ok(&mut q(&["enqueue", "k", "{}", "--unique-key", "n"]));
        t.sql(&format!(
            "UPDATE {}.queue_jobs SET state = 'failed', finished_at = now() WHERE id = {}",
            queue_store_postgres::Ident::new(&t.schema)
                .expect("a name")
                .quoted(),
            id.trim()
        ))
        .await;
    }
    for _ in 0..3 {
        ok(&mut q(&["enqueue", "k", "{}"]));
    }
    t.sql(&format!(
        "UPDATE {}.queue_jobs SET state = 'failed', finished_at = now() WHERE unique_key IS NULL",
        queue_store_postgres::Ident::new(&t.schema)
            .expect("a name")
            .quoted()
    ))
    .await;
    let done = ok(&mut q(&[
        "--yes", "retry", "--state", "failed", "--batch", "2",
    ]));
    assert_eq!(
        done.trim(),
        "retried 4 jobs",
        "one of the two keyed jobs, and the three others"
    );
    let left = json(&mut q(&["list", "--state", "failed", "--json"]));
    assert_eq!(left["jobs"].as_array().map(Vec::len), Some(1), "{left}");
}

/// An NDJSON enqueue prints each batch's keys as it commits; a database
/// error part-way says how many jobs were enqueued and from which line to
/// resume, and a line that is not JSON does too.
#[tokio::test]
async fn an_ndjson_enqueue_says_where_to_resume() {
    let Some(t) = Setup::new("an_ndjson_enqueue_says_where_to_resume").await else {
        return;
    };
    let config = t.config("");
    let q = |args: &[&str]| t.queue(&config, args);
    ok(&mut q(&["migrate"]));
    t.sql(&format!(
        "ALTER TABLE {}.queue_jobs ADD CONSTRAINT no_bad CHECK (payload->>'bad' IS NULL)",
        t.s
    ))
    .await;
    let input: String = (1..=2500)
        .map(|n| {
            if n == 1500 {
                "{\"bad\": 1}\n".to_owned()
            } else {
                format!("{{\"n\": {n}}}\n")
            }
        })
        .collect();
    let output = q(&["enqueue", "k", "-"])
        .write_stdin(input)
        .output()
        .expect("it runs");
    assert!(!output.status.success());
    let keys = String::from_utf8_lossy(&output.stdout);
    assert_eq!(
        keys.lines().count(),
        1000,
        "the first batch's keys, printed"
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("enqueueing the jobs of lines 1001-2000 failed")
            && stderr.contains("1000 jobs enqueued before it")
            && stderr.contains("resume from line 1001: tail -n +1001"),
        "{stderr}"
    );
    let counted = json(&mut q(&["stats", "--json"]));
    assert_eq!(counted["counts"][0]["count"], 1000, "{counted}");

    let err = fails(q(&["enqueue", "k", "-"]).write_stdin("{\"a\": 1}\n\nnot json\n"));
    assert!(
        err.contains("line 3 of standard input is not JSON")
            && err.contains("0 jobs enqueued before it")
            && err.contains("resume from line 1"),
        "{err}"
    );

    // With --json, one object per job as its batch commits, with its line.
    let lines = ok(q(&["--json", "enqueue", "k", "-"]).write_stdin("{\"a\": 1}\n\n{\"a\": 2}\n"));
    let objects: Vec<serde_json::Value> = lines
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON object per line"))
        .collect();
    assert_eq!(
        objects
            .iter()
            .map(|o| o["line"].clone())
            .collect::<Vec<_>>(),
        [serde_json::json!(1), serde_json::json!(3)]
    );
    assert!(objects
        .iter()
        .all(|o| o["inserted"] == true && o["id"].is_string()));
}

/// The job you mean, found by what its payload contains or the key it
/// holds, from the CLI and over HTTP.
#[tokio::test]
async fn jobs_are_found_by_payload_and_unique_key() {
    let Some(t) = Setup::new("jobs_are_found_by_payload_and_unique_key").await else {
        return;
    };
    let config = t.config("");
    let q = |args: &[&str]| t.queue(&config, args);
    ok(&mut q(&["migrate"]));
    let wanted = ok(&mut q(&[
        "enqueue",
        "bill",
        r#"{"customer": 42, "plan": "pro"}"#,
    ]));
    ok(&mut q(&[
        "enqueue",
        "bill",
        r#"{"customer": 7, "plan": "pro"}"#,
    ]));
    let keyed = ok(&mut q(&[
        "enqueue",
        "bill",
        "{}",
        "--unique-key",
        "invoice:9",
    ]));
    let ids = |args: &[&str]| {
        let page = json(&mut q(args));
        page["jobs"]
            .as_array()
            .expect("jobs")
            .iter()
            .map(|j| j["id"].as_str().expect("a key").to_owned())
            .collect::<Vec<_>>()
    };
    assert_eq!(
        ids(&["list", "--payload", r#"{"customer": 42}"#, "--json"]),
        [wanted.trim()]
    );
    assert_eq!(
        ids(&["list", "--payload", r#"{"plan": "pro"}"#, "--json"]).len(),
        2
    );
    assert_eq!(
        ids(&["list", "--unique-key", "invoice:9", "--json"]),
        [keyed.trim()]
    );
    assert!(ids(&["list", "--worker", "nobody", "--json"]).is_empty());
    // A job whose attempt started two hours ago is running longer than an
    // hour; none is running longer than three.
    t.sql(&format!(
        "UPDATE {}.queue_jobs SET state = 'processing', started_at = now() - interval '2 hours', \
         worker_hostname = 'box-1' WHERE id = {}",
        t.s,
        wanted.trim()
    ))
    .await;
    assert_eq!(
        ids(&["list", "--running-longer-than", "1h", "--json"]),
        [wanted.trim()]
    );
    assert!(ids(&["list", "--running-longer-than", "3h", "--json"]).is_empty());
    assert_eq!(
        ids(&["list", "--worker", "box-1", "--json"]),
        [wanted.trim()]
    );
    let output = q(&["list", "--running-longer-than", "1h", "--state", "failed"])
        .output()
        .expect("it runs");
    assert!(
        !output.status.success(),
        "running jobs and another state conflict"
    );
    let output = q(&["list", "--payload", "{customer"])
        .output()
        .expect("it runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        !output.status.success() && stderr.contains("is not JSON"),
        "{stderr}"
    );
}

#[tokio::test]
async fn failures_are_one_clear_line() {
    let Some(t) = Setup::new("failures_are_one_clear_line").await else {
        return;
    };
    let config = t.config("");
    let err = fails(
        t.queue(&config, &["stats"])
            .env("DATABASE_URL", "postgres://nobody@127.0.0.1:1/nowhere"),
    );
    assert!(
        err.starts_with("queue: cannot connect to the database at 127.0.0.1:1/nowhere: ")
            && err.contains("refused"),
        "{err}"
    );
    let err = fails(&mut t.queue(&config, &["stats"]));
    assert!(
        err.contains("does not exist") && err.contains("queue migrate"),
        "a missing default table says how to create it: {err}"
    );
    let bad = t.dir.path().join("bad.toml");
    std::fs::write(&bad, "table = \"jobs\"\n[columns]\nstatus = \"state\"\n").expect("file");
    let err = fails(&mut t.queue(&bad, &["stats"]));
    assert!(
        err.starts_with(&format!(
            "queue: {}:3:1: unknown field `status`",
            bad.display()
        )),
        "{err}"
    );
    let err = fails(t.queue(&config, &["stats"]).env_remove("DATABASE_URL"));
    assert!(err.contains("no database"), "{err}");

    // Ages beyond what a time can hold are refused, not a panic.
    ok(&mut t.queue(&config, &["migrate"]));
    for args in [
        &["list", "--queued-after", "300000y"][..],
        &["purge", "--older-than", "300000y", "--yes"],
        &["stats", "--stalled-max-age", "300000y"],
        &["reset-stalled", "--stalled-max-age", "300000y"],
        &["enqueue", "k", "--run-at", "300000y"],
    ] {
        let output = t.queue(&config, args).output().expect("it runs");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            !output.status.success() && !stderr.contains("panicked"),
            "{args:?}: {stderr}"
        );
        assert!(stderr.contains("out of range"), "{args:?}: {stderr}");
    }
    let far = t.config("[resetter]\nstalled_max_age = \"300000y\"\n");
    let err = fails(&mut t.queue(&far, &["stats"]));
    assert!(
        err.contains("the stalled age") && err.contains("out of range"),
        "{err}"
    );

    // A purge takes finished jobs only: a state that is not one is refused
    // before anything is counted or asked.
    let config = t.config("");
    let err = fails(&mut t.queue(
        &config,
        &["purge", "--older-than", "1h", "--state", "errored"],
    ));
    assert!(
        err.contains("--state errored: only finished jobs can be purged"),
        "{err}"
    );
}

#[tokio::test]
async fn sslmode_require_connects_over_tls() {
    let Some(t) = Setup::new("sslmode_require_connects_over_tls").await else {
        return;
    };
    let ssl: String = sqlx::query_scalar("SHOW ssl")
        .fetch_one(&t.pool)
        .await
        .expect("SHOW ssl");
    if ssl != "on" {
        assert!(
            std::env::var("QUEUE_TEST_REQUIRE_TLS").as_deref() != Ok("1"),
            "the test server serves no TLS, though cargo xtask test-pg gave its cluster a certificate"
        );
        eprintln!(
            "sslmode_require_connects_over_tls: skipped: the server at DATABASE_URL serves no TLS"
        );
        return;
    }
    let separator = if t.url.contains('?') { '&' } else { '?' };
    let url = format!("{}{separator}sslmode=require", t.url);
    // The library: a pool on the same URL talks TLS.
    let pool = sqlx::PgPool::connect(&url).await.expect("a TLS connection");
    let encrypted: bool =
        sqlx::query_scalar("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
            .fetch_one(&pool)
            .await
            .expect("pg_stat_ssl");
    assert!(encrypted, "sslmode=require gives an encrypted connection");
    // The binary: sqlx refuses sslmode=require without TLS, so success
    // means the command ran over TLS.
    let config = t.config("");
    let q = |args: &[&str]| {
        let mut command = t.queue(&config, args);
        command.env("DATABASE_URL", &url);
        command
    };
    assert!(ok(&mut q(&["migrate"])).contains("applied version 1"));
    assert!(ok(&mut q(&["stats"])).contains("0 jobs;"));
}

/// `queue fail` ends a stuck running job and a waiting one with the
/// operator's reason, by key or by filter; a finished job is left alone
/// and named; a blank reason is refused.
#[tokio::test]
async fn stuck_jobs_are_failed_by_hand_with_a_reason() {
    let Some(t) = Setup::new("stuck_jobs_are_failed_by_hand_with_a_reason").await else {
        return;
    };
    let config = t.config("");
    let q = |args: &[&str]| t.queue(&config, args);
    ok(&mut q(&["migrate"]));
    let ids: Vec<String> = (0..4)
        .map(|n| {
            ok(&mut q(&["enqueue", "sync", &format!("{{\"n\": {n}}}")]))
                .trim()
                .to_owned()
        })
        .collect();
    let s = &t.s;
    t.sql(&format!(
        "UPDATE {s}.queue_jobs SET state = 'processing', started_at = now() - interval '3 hours', \
         last_heartbeat_at = now(), claim_token = 7 WHERE id = {};
         UPDATE {s}.queue_jobs SET state = 'completed', finished_at = now() WHERE id = {}",
        ids[0], ids[1]
    ))
    .await;
    assert_eq!(
        ok(&mut q(&[
            "fail",
            &ids[0],
            "--reason",
            "stuck on a dead socket"
        ])),
        "failed 1 job\n"
    );
    let shown = ok(&mut q(&["show", &ids[0]]));
    assert!(
        shown.contains("state:            failed") && shown.contains("stuck on a dead socket"),
        "{shown}"
    );
    let token: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT claim_token FROM {s}.queue_jobs WHERE id = {}",
        ids[0]
    )))
    .fetch_one(&t.pool)
    .await
    .expect("the token");
    assert_ne!(
        token, 7,
        "the running attempt's token no longer holds the job"
    );
    let err = fails(&mut q(&["fail", &ids[1], "--reason", "late"]));
    assert!(err.contains("was not failed: it is completed"), "{err}");
    let err = fails(&mut q(&["fail", &ids[2], "--reason", "  "]));
    assert!(err.contains("--reason must say why"), "{err}");
    assert_eq!(
        ok(&mut q(&[
            "fail",
            "--kind",
            "sync",
            "--state",
            "queued",
            "--reason",
            "bad deploy",
            "--yes"
        ])),
        "failed 2 jobs\n"
    );
    let failed = json(&mut q(&["list", "--state", "failed", "--json"]));
    assert_eq!(failed["jobs"].as_array().map(Vec::len), Some(3), "{failed}");
}

#[tokio::test]
async fn a_kind_is_paused_and_resumed_by_a_named_operator() {
    let Some(t) = Setup::new("a_kind_is_paused_and_resumed_by_a_named_operator").await else {
        return;
    };
    let config = t.config("");
    let q = |args: &[&str]| t.queue(&config, args);
    let migrated = ok(&mut q(&["migrate"]));
    assert!(
        migrated.contains("queue_jobs_kinds\": applied version 1"),
        "{migrated}"
    );
    ok(&mut q(&["enqueue", "email", "{}"]));
    assert_eq!(ok(&mut q(&["paused"])), "no kind is paused\n");

    let paused = ok(&mut q(&["pause", "email", "--actor", "alice"]));
    assert!(
        paused.starts_with("paused email: workers claim none"),
        "{paused}"
    );
    let again = ok(&mut q(&["pause", "email", "--actor", "bob"]));
    assert!(
        again.starts_with("email was already paused: paused") && again.contains("by alice"),
        "the first pause stands: {again}"
    );
    let listed = ok(&mut q(&["paused"]));
    assert!(
        listed.contains("KIND") && listed.contains("email") && listed.contains("alice"),
        "{listed}"
    );
    let stats = ok(&mut q(&["stats"]));
    assert!(
        stats.contains("email is paused: paused") && stats.contains("by alice"),
        "{stats}"
    );
    let as_json = json(&mut q(&["stats", "--json"]));
    assert_eq!(as_json["paused"][0]["kind"], "email", "{as_json}");
    assert_eq!(as_json["paused"][0]["by"], "alice", "{as_json}");

    let resumed = ok(&mut q(&["resume", "email"]));
    assert!(
        resumed.starts_with("resumed email (paused") && resumed.contains("by alice"),
        "{resumed}"
    );
    assert_eq!(
        ok(&mut q(&["resume", "email"])),
        "email was not paused; nothing changed\n"
    );
    let empty = fails(&mut q(&["pause", ""]));
    assert!(
        empty.contains("the kind to pause or resume is empty"),
        "{empty}"
    );
    let nobody = fails(&mut q(&["pause", "email", "--actor", " "]));
    assert!(nobody.contains("--actor is empty"), "{nobody}");

    // Every write above is in the audit log, newest first, with who made
    // it and how it ended; reads are not.
    let log = json(&mut q(&["audit", "--json", "--limit", "10"]));
    let entries = log.as_array().expect("a list");
    let seen: Vec<(String, String, bool)> = entries
        .iter()
        .map(|e| {
            (
                e["action"].as_str().unwrap_or("").to_owned(),
                e["target"]["kind"].as_str().unwrap_or("").to_owned(),
                e["ok"].as_bool().unwrap_or(true),
            )
        })
        .collect();
    let expected: Vec<(String, String, bool)> = [
        ("pause", "", false),
        ("resume", "email", true),
        ("resume", "email", true),
        ("pause", "email", true),
        ("pause", "email", true),
        ("enqueue", "email", true),
    ]
    .iter()
    .map(|(a, k, ok)| (a.to_string(), k.to_string(), *ok))
    .collect();
    assert_eq!(seen, expected, "{log}");
    assert_eq!(entries[3]["actor"], "bob", "{log}");
    assert_eq!(entries[4]["actor"], "alice", "{log}");
    assert!(
        entries[4]["outcome"]
            .as_str()
            .is_some_and(|o| o.starts_with("paused email")),
        "the command's own report: {log}"
    );
    assert!(
        entries[0]["outcome"]
            .as_str()
            .is_some_and(|o| o.contains("empty")),
        "the refusal: {log}"
    );
    let mine = ok(&mut q(&["audit", "--by", "alice"]));
    assert!(
        mine.contains("alice") && mine.contains("pause") && !mine.contains("bob"),
        "{mine}"
    );
}

#[tokio::test]
async fn a_kinds_limits_are_set_listed_and_cleared_by_a_named_operator() {
    let Some(t) = Setup::new("a_kinds_limits_are_set_listed_and_cleared_by_a_named_operator").await
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
    assert_eq!(ok(&mut q(&["limits"])), "no kind has limits\n");
    assert_eq!(
        ok(&mut q(&[
            "limit",
            "api",
            "--concurrency",
            "4",
            "--rate",
            "50",
            "--burst",
            "5"
        ])),
        "limited api to 4 at once, 50 a second (bursts of 5), in every worker process from within a second\n"
    );
    let listed = ok(&mut q(&["limits"]));
    assert!(
        listed.contains("api") && listed.contains("4 at once") && listed.contains("alice"),
        "{listed}"
    );
    let as_json = json(&mut q(&["limits", "--json"]));
    assert_eq!(as_json[0]["limits"]["max_running"], 4, "{as_json}");
    for (args, says) in [
        (&["limit", "api"][..], "give --concurrency"),
        (
            &["limit", "api", "--concurrency", "0"],
            "pause the kind instead",
        ),
        (&["limit", "api", "--rate=-1"], "a positive number"),
    ] {
        let err = fails(&mut q(args));
        assert!(err.contains(says), "{args:?}: {err}");
    }
    // Refused by the argument parser, with its usage.
    for (args, says) in [
        (&["limit", "api", "--burst", "3"][..], "--rate"),
        (
            &["limit", "api", "--clear", "--concurrency", "2"],
            "cannot be used with",
        ),
    ] {
        let output = q(args).output().expect("it runs");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            !output.status.success() && stderr.contains(says),
            "{args:?}: {stderr}"
        );
    }
    assert_eq!(
        ok(&mut q(&["limit", "api", "--clear"])),
        "api has no limits now\n"
    );
    assert_eq!(ok(&mut q(&["limits"])), "no kind has limits\n");
    let audit = json(&mut q(&["audit", "--json"]));
    let limits: Vec<&serde_json::Value> = audit
        .as_array()
        .expect("entries")
        .iter()
        .filter(|e| e["action"] == "limit")
        .collect();
    assert!(
        limits.len() >= 2 && limits.iter().all(|e| e["actor"] == "alice"),
        "{audit}"
    );
}

/// `migrate --in-place-claims` converts the plain default table (versions
/// 13 to 16) and the table takes and counts jobs after; a bad
/// `--lock-wait` is refused by name.
#[tokio::test]
async fn migrate_converts_the_default_table_to_claims_in_place() {
    let Some(t) = Setup::new("migrate_converts_the_default_table_to_claims_in_place").await else {
        return;
    };
    let config = t.config("");
    let q = |args: &[&str]| t.queue(&config, args);
    assert!(ok(&mut q(&["migrate"])).contains("applied version 1"));
    ok(&mut q(&["enqueue", "email", "{}"]));
    let refused = q(&["migrate", "--in-place-claims", "--lock-wait", "soon"])
        .output()
        .expect("the queue binary runs");
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "a bad --lock-wait is refused");
    assert!(
        err.contains("--lock-wait") && err.contains("not a duration"),
        "{err}"
    );
    let converted = ok(&mut q(&[
        "migrate",
        "--in-place-claims",
        "--lock-wait",
        "200ms",
        "--give-up-after",
        "1m",
    ]));
    for version in [13, 14, 15, 16] {
        assert!(
            converted.contains(&format!("applied version {version} (in-place claims")),
            "{converted}"
        );
    }
    assert!(ok(&mut q(&["migrate"])).contains("is up to date"));
    ok(&mut q(&["enqueue", "email", "{}"]));
    let stats = json(&mut q(&["stats", "--json"]));
    assert!(stats.to_string().contains("email"), "{stats}");
}

#[tokio::test]
async fn migrate_creates_the_default_table_partitioned_by_finish_time() {
    let Some(t) = Setup::new("migrate_creates_the_default_table_partitioned_by_finish_time").await
    else {
        return;
    };
    let config = t.config("");
    let q = |args: &[&str]| t.queue(&config, args);
    let err = fails(&mut q(&["migrate", "--partition-hours", "0"]));
    assert!(err.contains("1 to 744 hours"), "{err}");
    assert!(ok(&mut q(&["migrate", "--partition-hours", "24"])).contains("applied version 1"));
    let jobs = format!("{}.\"queue_jobs\"", t.s);
    let kind: String =
        sqlx::query_scalar("SELECT relkind::text FROM pg_class WHERE oid = to_regclass($1)")
            .bind(&jobs)
            .fetch_one(&t.pool)
            .await
            .expect("the table's kind");
    assert_eq!(kind, "p", "the table is partitioned");
    assert!(ok(&mut q(&["migrate"])).contains("is up to date"));
    ok(&mut q(&["enqueue", "email", "{}"]));
    t.sql(&format!(
        "INSERT INTO {jobs} (kind, state, finished_at) VALUES ('old', 'completed', now() - interval '40 days')"
    ))
    .await;
    let purged = json(&mut q(&["purge", "--older-than", "30d", "--yes", "--json"]));
    assert_eq!(purged["purged"], 1, "{purged}");
    let stats = json(&mut q(&["stats", "--json"]));
    assert!(stats.to_string().contains("email"), "{stats}");
}
