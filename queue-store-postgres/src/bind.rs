//! Binding values to the store's statements.

use std::sync::Arc;

use chrono::{DateTime, Utc};
use queue_core::{JobState, Lease, StoreError};
use sqlx::postgres::PgArguments;
use sqlx::query::Query;
use sqlx::Postgres;

use crate::conditions::PgArg;
use crate::options::StateValues;
use crate::record::PgKey;
use crate::sql::{Param, Statement};

/// A value bound to a statement parameter.
pub(crate) enum Value<K> {
    Text(String),
    OptText(Option<String>),
    Time(DateTime<Utc>),
    OptTime(Option<DateTime<Utc>>),
    Int(i64),
    Int4(i32),
    Bool(bool),
    Key(K),
    Keys(Vec<K>),
    Ints(Vec<i64>),
    Texts(Vec<Option<String>>),
    Times(Vec<Option<DateTime<Utc>>>),
    Int4s(Vec<i32>),
    Json(serde_json::Value),
    Jsons(Vec<serde_json::Value>),
    Bools(Vec<bool>),
    OptInts(Vec<Option<i64>>),
}

impl<K: PgKey> Value<K> {
    pub(crate) fn bind<'q>(
        self,
        q: Query<'q, Postgres, PgArguments>,
    ) -> Query<'q, Postgres, PgArguments> {
        match self {
            Value::Text(v) => q.bind(v),
            Value::OptText(v) => q.bind(v),
            Value::Time(v) => q.bind(v),
            Value::OptTime(v) => q.bind(v),
            Value::Int(v) => q.bind(v),
            Value::Int4(v) => q.bind(v),
            Value::Bool(v) => q.bind(v),
            Value::Bools(v) => q.bind(v),
            Value::OptInts(v) => q.bind(v),
            Value::Key(v) => q.bind(v),
            Value::Keys(v) => q.bind(v),
            Value::Ints(v) => q.bind(v),
            Value::Texts(v) => q.bind(v),
            Value::Times(v) => q.bind(v),
            Value::Int4s(v) => q.bind(v),
            Value::Json(v) => q.bind(v),
            Value::Jsons(v) => q.bind(v),
        }
    }
}

pub(crate) fn bind_arg<'q>(
    q: Query<'q, Postgres, PgArguments>,
    arg: PgArg,
) -> Query<'q, Postgres, PgArguments> {
    match arg {
        PgArg::Int(v) => q.bind(v),
        PgArg::Float(v) => q.bind(v),
        PgArg::Bool(v) => q.bind(v),
        PgArg::Text(v) => q.bind(v),
        PgArg::Uuid(v) => q.bind(v),
        PgArg::Json(v) => q.bind(v),
        PgArg::Timestamp(v) => q.bind(v),
        PgArg::TextArray(v) => q.bind(v),
        PgArg::IntArray(v) => q.bind(v),
    }
}

/// Binds every parameter of `statement` from `value`; a parameter without a
/// value is a bug in this crate, reported rather than panicking.
pub(crate) fn query<'q, K: PgKey>(
    statement: &'q Statement,
    mut value: impl FnMut(Param) -> Option<Value<K>>,
) -> Result<Query<'q, Postgres, PgArguments>, StoreError> {
    let mut q = sqlx::query(sqlx::AssertSqlSafe(Arc::clone(&statement.text)));
    for param in &statement.params {
        let v = value(*param).ok_or_else(|| StoreError::Backend {
            context: format!("internal error: no value for statement parameter {param:?}"),
            source: "statement and binder disagree".into(),
        })?;
        q = v.bind(q);
    }
    Ok(q)
}

pub(crate) fn state<K>(states: &StateValues, s: JobState) -> Value<K> {
    Value::Text(states.get(s).to_owned())
}

/// The values a statement guarded by a lease binds: key, token and states.
pub(crate) fn lease_value<K: PgKey>(
    lease: &Lease<K>,
    states: &StateValues,
    p: Param,
) -> Option<Value<K>> {
    match p {
        Param::Id => Some(Value::Key(lease.id.clone())),
        Param::Token => Some(Value::Int(lease.token)),
        Param::State(s) => Some(state(states, s)),
        _ => None,
    }
}
