//! The OpenAPI document, generated from the handlers and their types.

use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi};

use super::api;

/// The API's description.
#[derive(OpenApi)]
#[openapi(
    info(
        title = "queue",
        description = "Enqueue, look at and repair the jobs of a Postgres job queue."
    ),
    paths(
        api::list_jobs,
        api::enqueue,
        api::get_job,
        api::retry_job,
        api::cancel_job,
        api::delete_job,
        api::stats
    ),
    components(schemas(
        api::Job,
        api::JobList,
        api::EnqueueRequest,
        api::Enqueued,
        api::ActionResult,
        api::Stats,
        api::StateCount,
        api::Order,
        api::ErrorBody,
        api::ErrorDetail
    )),
    modifiers(&Bearer)
)]
pub struct ApiDoc;

struct Bearer;

impl Modify for Bearer {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
    }
}

/// The document as JSON.
pub fn document() -> String {
    ApiDoc::openapi().to_pretty_json().unwrap_or_else(|e| {
        format!("{{\"error\": \"the OpenAPI document did not serialize: {e}\"}}")
    })
}
