//! The docs say what the code does: the outcome names of the lifecycle
//! guide, what terminal states mean, the API's answer to an enqueue as the
//! README and docs/cli.md show it, the API's error codes, and every flag
//! of every command. Each check reads the files a user reads.

use std::path::PathBuf;
use std::time::Duration;

use axum::body::Body;
use axum::http::{header, Method, Request};
use clap::CommandFactory;
use queue_cli::serve::{router, Api, Erased, Tokens};
use queue_core::Outcome;
use queue_store_memory::MemoryStore;
use queue_store_postgres::PgKeyType;
use tower::ServiceExt;

fn read(path: &str) -> String {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    std::fs::read_to_string(root.join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// Every outcome the lifecycle guide's table names is an outcome's label,
/// and every label is named there.
#[test]
fn the_lifecycle_guide_names_the_outcomes_as_the_code_does() {
    let message = || "m".to_owned();
    let labels: Vec<&str> = [
        Outcome::Completed,
        Outcome::Retried {
            retry_at: chrono::Utc::now(),
            message: message(),
        },
        Outcome::Failed { message: message() },
        Outcome::Poisoned { message: message() },
        Outcome::Canceled { message: message() },
        Outcome::Released,
        Outcome::Interrupted { message: message() },
        Outcome::Lost,
    ]
    .iter()
    .map(Outcome::label)
    .collect();
    let guide = read("docs/job-lifecycle.md");
    let table = guide
        .split("## How an attempt ends")
        .nth(1)
        .and_then(|rest| rest.split("\n\n").find(|block| block.contains("| outcome")))
        .expect("the outcome table");
    let mut named = Vec::new();
    for row in table.lines().skip(2) {
        let outcome = row.split('|').nth(2).unwrap_or_default().trim();
        if let Some(label) = outcome.strip_prefix('`').and_then(|o| o.split('`').next()) {
            named.push(label.to_owned());
        }
    }
    for name in &named {
        assert!(
            labels.contains(&name.as_str()),
            "docs/job-lifecycle.md names the outcome `{name}`; the outcomes are {labels:?}"
        );
    }
    for label in labels {
        if label != "failed" {
            // failed: the row of retries exhausted names it in its text.
            assert!(
                named.iter().any(|n| n == label),
                "docs/job-lifecycle.md's table lacks `{label}`"
            );
        }
    }
}

/// An operator's retry leaves a terminal state: no doc says they are
/// never left.
#[test]
fn no_doc_says_terminal_states_are_never_left() {
    for path in ["docs/job-lifecycle.md", "docs/architecture.md"] {
        let text = read(path).replace('\n', " ");
        assert!(
            !text.contains("never left"),
            "{path} says terminal states are never left, but a retry leaves them"
        );
    }
}

/// The answer to `POST /api/jobs`, as the README and docs/cli.md show it,
/// has the keys the API answers with.
#[tokio::test]
async fn the_documented_enqueue_answer_is_the_apis() {
    let api = Api::new(
        Erased::shared(MemoryStore::new()),
        PgKeyType::Int8,
        Duration::from_secs(60),
    );
    let app = router(api, Tokens::default(), 4096);
    let request = Request::builder()
        .method(Method::POST)
        .uri("/api/jobs")
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(r#"{"kind": "email"}"#))
        .expect("a request");
    let response = app.oneshot(request).await.expect("a response");
    let bytes = axum::body::to_bytes(response.into_body(), 1 << 20)
        .await
        .expect("the body");
    let answer: serde_json::Value = serde_json::from_slice(&bytes).expect("JSON");
    let keys = |v: &serde_json::Value| {
        let mut keys: Vec<String> = v
            .as_object()
            .map(|o| o.keys().cloned().collect())
            .unwrap_or_default();
        keys.sort();
        keys
    };
    for path in ["README.md", "docs/cli.md"] {
        let text = read(path);
        let shown: Vec<serde_json::Value> = text
            .lines()
            .filter(|l| l.contains("# {\"id\""))
            .filter_map(|l| l.split("# ").last())
            .map(|json| serde_json::from_str(json.trim()).expect("the shown answer is JSON"))
            .collect();
        assert!(!shown.is_empty(), "{path} shows an enqueue's answer");
        for example in shown {
            assert_eq!(
                keys(&example),
                keys(&answer),
                "{path}: {example} vs {answer}"
            );
        }
    }
}

/// Every error code the server answers with is listed in docs/cli.md.
#[test]
fn every_error_code_is_documented() {
    let docs = read("docs/cli.md");
    let mut codes = Vec::new();
    for file in [
        "api.rs",
        "auth.rs",
        "cross_site.rs",
        "error.rs",
        "metrics.rs",
        "mod.rs",
        "timeline.rs",
    ] {
        let source = read(&format!("queue-cli/src/serve/{file}"));
        // A code follows its status: `StatusCode::X,` then `"code"`.
        for part in source.split("StatusCode::").skip(1) {
            let after = part.split_once(',').map(|(_, rest)| rest.trim_start());
            if let Some(code) = after
                .and_then(|rest| rest.strip_prefix('"'))
                .and_then(|rest| rest.split('"').next())
            {
                if !code.is_empty() && code.chars().all(|c| c.is_ascii_lowercase() || c == '_') {
                    codes.push(code.to_owned());
                }
            }
        }
    }
    codes.sort();
    codes.dedup();
    assert!(codes.len() >= 10, "the codes were found: {codes:?}");
    for code in codes {
        assert!(
            docs.contains(&format!("`{code}`")),
            "docs/cli.md does not list the error code `{code}`"
        );
    }
}

/// Every flag of every `queue` command appears in docs/cli.md.
#[test]
fn every_flag_is_documented() {
    let docs = read("docs/cli.md");
    let cli = queue_cli::Cli::command();
    let mut missing = Vec::new();
    let mut check = |command: &str, arg: &clap::Arg| {
        if let Some(long) = arg.get_long() {
            if long != "help" && long != "version" && !docs.contains(&format!("--{long}")) {
                missing.push(format!("{command} --{long}"));
            }
        }
    };
    for arg in cli.get_arguments() {
        check("queue", arg);
    }
    for sub in cli.get_subcommands() {
        for arg in sub.get_arguments() {
            check(sub.get_name(), arg);
        }
    }
    assert!(
        missing.is_empty(),
        "docs/cli.md does not mention {missing:?}"
    );
}

/// Every config file the guides show parses, and describes valid options:
/// a user copying one starts from a working file.
#[test]
fn the_guides_config_files_parse() {
    for path in ["docs/cli.md", "docs/existing-tables.md"] {
        let text = read(path);
        let blocks: Vec<&str> = text
            .split("```toml\n")
            .skip(1)
            .filter_map(|rest| rest.split("\n```").next())
            .collect();
        assert!(!blocks.is_empty(), "{path} shows a config file");
        for (n, block) in blocks.iter().enumerate() {
            let origin = format!("{path}, toml block {}", n + 1);
            let config = queue_store_postgres::PgConfig::parse(&origin, block)
                .unwrap_or_else(|e| panic!("{e}"));
            config
                .store_options()
                .unwrap_or_else(|e| panic!("{origin}: {e}"));
        }
    }
}
