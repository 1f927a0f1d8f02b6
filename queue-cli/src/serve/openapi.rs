//! The OpenAPI document, generated from the handlers and their types.

use queue_store_postgres::PgKeyType;
use utoipa::openapi::schema::{ObjectBuilder, SchemaFormat, Type};
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::openapi::{RefOr, Schema};
use utoipa::{Modify, OpenApi};

use super::{api, audit, limits, operations, pauses, schedules, timeline};

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
        api::fail_job,
        api::delete_job,
        api::stats,
        pauses::paused,
        pauses::pause,
        pauses::resume,
        limits::limits,
        limits::set_limits,
        audit::audit,
        operations::start_retry,
        operations::start_cancel,
        operations::start_fail,
        operations::start_delete,
        operations::start_purge,
        operations::list,
        operations::get,
        operations::abort,
        schedules::schedules,
        schedules::workers,
        timeline::timeline
    ),
    components(schemas(
        api::Job,
        api::JobList,
        api::EnqueueRequest,
        api::FailRequest,
        api::Enqueued,
        api::ActionResult,
        api::Stats,
        api::StateCount,
        api::Order,
        api::Scope,
        api::ErrorBody,
        api::ErrorDetail,
        pauses::Pause,
        pauses::Resumed,
        limits::Limits,
        limits::KindLimitView,
        limits::LimitsSet,
        limits::LimitsRequest,
        audit::AuditEntry,
        audit::AuditPage,
        operations::OperationView,
        operations::OperationOptions,
        operations::RetryOptions,
        operations::FailOptions,
        schedules::ScheduleView,
        schedules::LastRun,
        schedules::WorkerView,
        timeline::Timeline,
        timeline::TimelinePoint
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

/// The form of the table's keys, as a string schema: the key parameters
/// (`{id}`, `after`) take only what the key column holds.
fn key_schema(key: PgKeyType) -> Option<RefOr<Schema>> {
    let (pattern, format) = match key {
        // Digits that fit the column, so a generated key parses.
        PgKeyType::Int4 => ("^-?[0-9]{1,9}$", None),
        PgKeyType::Int8 => ("^-?[0-9]{1,18}$", None),
        PgKeyType::Uuid => (
            "^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$",
            Some(SchemaFormat::Custom("uuid".into())),
        ),
        PgKeyType::Text => return None,
    };
    Some(
        ObjectBuilder::new()
            .schema_type(Type::String)
            .pattern(Some(pattern))
            .format(format)
            .into(),
    )
}

/// A comma-separated list of `names`, as a string schema.
fn list_schema(names: &[String]) -> RefOr<Schema> {
    let escaped: Vec<String> = names
        .iter()
        .map(|name| {
            name.chars()
                .flat_map(|c| {
                    let special = "\\^$.|?*+()[]{}".contains(c);
                    special.then_some('\\').into_iter().chain([c])
                })
                .collect()
        })
        .collect();
    let one = format!("({})", escaped.join("|"));
    ObjectBuilder::new()
        .schema_type(Type::String)
        .pattern(Some(format!("^{one}(,{one})*$")))
        .into()
}

/// The document, for a table whose keys are `key`s and whose states are
/// named `states` (standard names and stored values), as JSON.
pub fn document(key: PgKeyType, states: &[String]) -> String {
    let mut doc = ApiDoc::openapi();
    let key = key_schema(key);
    let states = list_schema(states);
    for item in doc.paths.paths.values_mut() {
        let operations = [&mut item.get, &mut item.post, &mut item.delete];
        for operation in operations.into_iter().flatten() {
            for parameter in operation.parameters.iter_mut().flatten() {
                match parameter.name.as_str() {
                    "id" | "after" if key.is_some() => parameter.schema = key.clone(),
                    "state" => parameter.schema = Some(states.clone()),
                    _ => {}
                }
            }
        }
    }
    doc.to_pretty_json().unwrap_or_else(|e| {
        format!("{{\"error\": \"the OpenAPI document did not serialize: {e}\"}}")
    })
}
