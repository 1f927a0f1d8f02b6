//! `/healthz`: `ok` while the server and its background work run; 503,
//! naming what stopped, once a background task (the scheduler of the
//! config's schedules, the depth sampler) has died.

use std::sync::Mutex;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use tokio::task::AbortHandle;

use super::api::Api;

/// The background tasks whose death `/healthz` reports.
#[derive(Debug, Default)]
pub struct Health {
    tasks: Mutex<Vec<(&'static str, AbortHandle)>>,
}

impl Health {
    /// Watches `task`, named `name` (`scheduler`, `depth sampler`).
    pub fn watch(&self, name: &'static str, task: AbortHandle) {
        self.tasks
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .push((name, task));
    }

    /// The names of the watched tasks that have stopped.
    pub fn stopped(&self) -> Vec<&'static str> {
        self.tasks
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .iter()
            .filter(|(_, task)| task.is_finished())
            .map(|(name, _)| *name)
            .collect()
    }
}

/// `GET /healthz`.
pub async fn healthz(State(api): State<Api>) -> Response {
    let stopped = api.health.stopped();
    if stopped.is_empty() {
        return "ok".into_response();
    }
    (
        StatusCode::SERVICE_UNAVAILABLE,
        format!(
            "unhealthy: the {} stopped; the server's log says why",
            stopped.join(" and the ")
        ),
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_stopped_task_is_named() {
        let health = Health::default();
        let running = tokio::spawn(std::future::pending::<()>());
        let stopped = tokio::spawn(async {});
        health.watch("depth sampler", running.abort_handle());
        health.watch("scheduler", stopped.abort_handle());
        let _ = stopped.await;
        assert_eq!(health.stopped(), ["scheduler"]);
        running.abort();
    }
}
