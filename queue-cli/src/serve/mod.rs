//! `queue serve`: an HTTP API over the admin contract, its OpenAPI
//! document at `/openapi.json`, Prometheus metrics at `/metrics`, and a
//! dashboard at `/`.

pub mod api;
mod audit;
mod auth;
mod cross_site;
mod dashboard;
mod erased;
mod error;
mod health;
mod limits;
mod metrics;
mod openapi;
mod operations;
mod pauses;
mod schedules;
mod timeline;

use std::io::Write;
use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::{bail, Context as _, Result};
use axum::extract::DefaultBodyLimit;
use axum::http::{header, StatusCode};
use axum::middleware::{from_fn, from_fn_with_state};
use axum::response::IntoResponse;
use axum::routing::{get, post, put};
use axum::Router;
use queue_core::CancellationToken;
use queue_store_postgres::{PgKeyType, PgStoreOptions};
use sqlx::PgPool;

pub use self::api::Api;
pub use self::auth::{Access, ConfiguredToken, ShortTokens, Tokens, MIN_TOKEN_LEN};
pub use self::erased::{open as open_admin, Erased, TextAdmin};
pub use self::health::Health;
pub use self::openapi::document as openapi_document;
use crate::Context;

/// The largest request body by default: 1 MiB.
const MAX_BODY: usize = 1 << 20;

/// `queue serve`.
#[derive(Debug, Clone, clap::Args)]
pub struct ServeArgs {
    /// Where to listen (default: the config's serve.listen, else
    /// 127.0.0.1:8080). Any address but loopback needs a token
    /// (QUEUE_ADMIN_TOKENS, or serve.admin_tokens in the config).
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<SocketAddr>,
    /// The largest request body accepted, in bytes (default 1 MiB).
    #[arg(long, value_name = "BYTES")]
    pub max_body_bytes: Option<usize>,
    /// Accept tokens shorter than 16 characters: for tests only.
    #[arg(long)]
    pub allow_short_tokens: bool,
}

/// The whole application: the dashboard at `/`, the API under `/api`,
/// `/metrics`, `/openapi.json` and `/healthz`.
pub fn router(api: Api, tokens: Tokens, max_body: usize) -> Router {
    let tokens = Arc::new(tokens);
    let mut states: Vec<String> = Vec::new();
    for state in queue_core::JobState::ALL {
        for name in [state.as_str().to_owned(), api.admin.stored_state(state)] {
            if !states.contains(&name) {
                states.push(name);
            }
        }
    }
    let document = openapi::document(api.key, &states);
    let metrics = metrics::MetricsState {
        api: api.clone(),
        handle: metrics::handle(),
        gauges: Default::default(),
    };
    let protected = Router::new()
        .route("/api/jobs", get(api::list_jobs).post(api::enqueue))
        .route("/api/jobs/{id}", get(api::get_job).delete(api::delete_job))
        .route("/api/jobs/{id}/retry", post(api::retry_job))
        .route("/api/jobs/{id}/cancel", post(api::cancel_job))
        .route("/api/jobs/{id}/fail", post(api::fail_job))
        .route("/api/stats", get(api::stats))
        .route("/api/pauses", get(pauses::paused))
        .route("/api/kinds/{kind}/pause", post(pauses::pause))
        .route("/api/kinds/{kind}/resume", post(pauses::resume))
        .route("/api/limits", get(limits::limits))
        .route("/api/kinds/{kind}/limits", put(limits::set_limits))
        .route("/api/audit", get(audit::audit))
        .route("/api/operations", get(operations::list))
        .route("/api/operations/retry", post(operations::start_retry))
        .route("/api/operations/cancel", post(operations::start_cancel))
        .route("/api/operations/fail", post(operations::start_fail))
        .route("/api/operations/delete", post(operations::start_delete))
        .route("/api/operations/purge", post(operations::start_purge))
        .route("/api/operations/{id}", get(operations::get))
        .route("/api/operations/{id}/abort", post(operations::abort))
        .route("/api/schedules", get(schedules::schedules))
        .route("/api/workers", get(schedules::workers))
        .route("/api/timeline", get(timeline::timeline))
        .with_state(api.clone())
        .merge(
            Router::new()
                .route("/metrics", get(metrics::metrics))
                .with_state(metrics),
        )
        // Outermost last: the token is checked before a write is recorded.
        .route_layer(from_fn_with_state(api.clone(), audit::record))
        .route_layer(from_fn_with_state(tokens.clone(), auth::authorize));
    Router::new()
        .merge(dashboard::routes())
        .route(
            "/openapi.json",
            get(|| async move { ([(header::CONTENT_TYPE, "application/json")], document) }),
        )
        .merge(
            Router::new()
                .route("/healthz", get(health::healthz))
                .with_state(api),
        )
        .merge(protected)
        .fallback(|| async {
            api::ApiError::new(StatusCode::NOT_FOUND, "not_found", "no such endpoint")
                .into_response()
        })
        .layer(DefaultBodyLimit::max(max_body))
        .layer(from_fn_with_state(tokens, cross_site::guard))
        // Outermost: every response, refusals included, has its id.
        .layer(from_fn(error::with_request_id))
}

/// The tokens from the environment and the config file, each checked
/// ([`Tokens::configured`]); the error names the one refused and where it
/// came from.
fn tokens(context: &Context, short: ShortTokens) -> Result<Tokens> {
    let mut entries = Vec::new();
    for (access, variable) in [
        (Access::Admin, "QUEUE_ADMIN_TOKENS"),
        (Access::Operate, "QUEUE_OPERATE_TOKENS"),
        (Access::Read, "QUEUE_READ_TOKENS"),
    ] {
        // Unset or empty: none. Otherwise every comma-separated entry
        // must be a token (spaces around one are trimmed).
        let value = std::env::var(variable).unwrap_or_default();
        if value.trim().is_empty() {
            continue;
        }
        for (i, token) in value.split(',').enumerate() {
            entries.push(ConfiguredToken {
                access,
                from: format!("{variable} entry {}", i + 1),
                name: None,
                token: token.trim().to_owned(),
            });
        }
    }
    let serve = &context.config.serve;
    for (access, list, name) in [
        (Access::Admin, &serve.admin_tokens, "admin_tokens"),
        (Access::Operate, &serve.operate_tokens, "operate_tokens"),
        (Access::Read, &serve.read_tokens, "read_tokens"),
    ] {
        for (i, token) in list.iter().enumerate() {
            entries.push(ConfiguredToken {
                access,
                from: format!("serve.{name}[{i}] in the config"),
                name: None,
                token: token.clone(),
            });
        }
    }
    for (i, named) in serve.tokens.iter().enumerate() {
        entries.push(ConfiguredToken {
            access: named.role.into(),
            from: format!("serve.tokens[{i}] ({:?}) in the config", named.name),
            name: Some(named.name.clone()),
            token: named.token.clone(),
        });
    }
    Tokens::configured(entries, short)
}

/// Serves until SIGINT or SIGTERM; the first line on `out` says where.
pub(crate) async fn run(
    context: &Context,
    pool: PgPool,
    options: PgStoreOptions,
    key: PgKeyType,
    args: &ServeArgs,
    out: &mut impl Write,
) -> Result<()> {
    // Before anything starts (the operation runner takes work at once):
    // from here on SIGTERM stops the server gracefully instead of killing
    // it mid-batch.
    let stop_signal = Stopped::listen();
    let serve = &context.config.serve;
    let listen = match (args.listen, &serve.listen) {
        (Some(addr), _) => addr,
        (None, Some(text)) => text.parse().with_context(|| {
            format!("serve.listen: {text:?} is not an address such as 127.0.0.1:8080")
        })?,
        (None, None) => SocketAddr::from(([127, 0, 0, 1], 8080)),
    };
    let short = if args.allow_short_tokens {
        ShortTokens::AllowForTests
    } else {
        ShortTokens::Refuse
    };
    let tokens = tokens(context, short)?;
    if !listen.ip().is_loopback() && !tokens.any() {
        bail!(
            "refusing to serve on {listen} without a token: set QUEUE_ADMIN_TOKENS (and QUEUE_READ_TOKENS) or serve.admin_tokens in the config, or listen on 127.0.0.1"
        );
    }
    let schedules = crate::schedules::from_config(&context.config.schedules)?;
    let stop_scheduling = CancellationToken::new();
    let stop = stop_scheduling.clone();
    let admin = open_admin(pool, options, key).await?;
    let listed = Arc::new(schedules.clone());
    let scheduling = crate::schedules::spawn(admin.clone(), schedules, stop)?;
    let mut api = Api::new(
        admin,
        key,
        crate::commands::read::stalled_max_age(context, None)?,
    );
    api.schedules = listed;
    let sampler = tokio::spawn(sample_depth(api.clone()));
    api.health.watch("depth sampler", sampler.abort_handle());
    let stop_running = CancellationToken::new();
    let running = operations::spawn_runner(
        api.admin.clone(),
        api.operations.clone(),
        stop_running.clone(),
    );
    api.health.watch("operation runner", running.abort_handle());
    if let Some(scheduling) = &scheduling {
        api.health.watch("scheduler", scheduling.abort_handle());
    }
    let max_body = args
        .max_body_bytes
        .or(serve.max_body_bytes)
        .unwrap_or(MAX_BODY);
    let app = router(api, tokens, max_body);
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .with_context(|| format!("cannot listen on {listen}"))?;
    let local = listener.local_addr()?;
    writeln!(out, "listening on http://{local}")?;
    out.flush()?;
    axum::serve(listener, app)
        .with_graceful_shutdown(stop_signal.wait())
        .await
        .context("serving")?;
    sampler.abort();
    // The operation under way is handed back after its batch, for the
    // next server to carry on. A database that does not answer must not
    // hold the shutdown up: after 10 s the runner is left, and the next
    // runner takes its operation over once it has been silent for
    // OPERATION_SILENT_AFTER (a batch done but not yet counted is then
    // done again, over jobs it no longer matches).
    stop_running.cancel();
    let _ = tokio::time::timeout(std::time::Duration::from_secs(10), running).await;
    stop_scheduling.cancel();
    if let Some(scheduling) = scheduling {
        let _ = scheduling.await;
    }
    Ok(())
}

/// Counts the jobs every [`timeline::SAMPLE_EVERY`], for the timeline's
/// depth line. A failure (the database away) leaves a gap, nothing more.
async fn sample_depth(api: Api) {
    let mut every = tokio::time::interval(timeline::SAMPLE_EVERY);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        every.tick().await;
        if let Err(error) = api.stats_now(false).await {
            tracing::debug!(%error, "sampling the queue's depth failed");
        }
    }
}

/// SIGINT and SIGTERM, listened for from the moment it is made: a signal
/// that comes before [`Stopped::wait`] is first polled is not lost, and
/// does not kill the process (the default action) either.
struct Stopped {
    #[cfg(unix)]
    signals: Option<(tokio::signal::unix::Signal, tokio::signal::unix::Signal)>,
}

impl Stopped {
    fn listen() -> Self {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{signal, SignalKind};
            let signals = signal(SignalKind::interrupt())
                .and_then(|interrupt| Ok((interrupt, signal(SignalKind::terminate())?)));
            Stopped {
                signals: signals.ok(),
            }
        }
        #[cfg(not(unix))]
        Stopped {}
    }

    /// Resolves on SIGINT or SIGTERM.
    async fn wait(self) {
        #[cfg(unix)]
        match self.signals {
            Some((mut interrupt, mut term)) => {
                tokio::select! {
                    _ = interrupt.recv() => {}
                    _ = term.recv() => {}
                }
            }
            // Signals could not be listened for: Ctrl-C still stops it.
            None => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
        #[cfg(not(unix))]
        {
            let _ = tokio::signal::ctrl_c().await;
        }
        tracing::info!("stopping: finishing the requests under way");
    }
}
