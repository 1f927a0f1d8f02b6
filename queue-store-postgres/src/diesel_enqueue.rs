//! Enqueue inside a diesel transaction (features `diesel` and
//! `diesel-async`): the same statements, values and rule for unique keys
//! as [`JobTable::enqueue_unique`] (see [`crate::enqueue`]), on
//! the application's own diesel connection, so that a job exists only if
//! the application's transaction commits, and wakes idle workers (the
//! default table's NOTIFY trigger) only then.

use diesel::pg::Pg;
use diesel::query_builder::{BoxedSqlQuery, SqlQuery};
use diesel::sql_types::{Array, BigInt, Bool, Jsonb, Nullable, Text, Timestamptz};
use queue_core::{Enqueued, NewJob, StoreError};

use crate::bind::Value;
use crate::enqueue::{any_unique, job_value, no_unique_column, plain_statement};
use crate::job_table::JobTable;
use crate::sql::{Param, Statement};
use crate::unique::{Answer, Rounds};

/// One row of the plain enqueue's answer: a job added.
#[derive(diesel::QueryableByName)]
struct Added {
    #[diesel(sql_type = BigInt)]
    id: i64,
}

impl Added {
    fn enqueued(self) -> Enqueued<i64> {
        Enqueued {
            id: self.id,
            inserted: true,
        }
    }
}

/// One row of the unique enqueue's answer: a job added, or the holder of
/// a key that was taken.
#[derive(diesel::QueryableByName)]
struct Keyed {
    #[diesel(sql_type = BigInt)]
    id: i64,
    #[diesel(sql_type = Nullable<Text>)]
    unique_key: Option<String>,
    #[diesel(sql_type = Bool)]
    inserted: bool,
}

impl Keyed {
    fn answer(self) -> Answer<i64> {
        Answer {
            id: self.id,
            key: self.unique_key,
            inserted: self.inserted,
        }
    }
}

type Query = BoxedSqlQuery<'static, Pg, SqlQuery>;

/// The body of both diesel entry points, which differ only in whether a
/// query's `load` is awaited (`diesel_async`) or not (`diesel`): the
/// plain statement, or the unique one in [`Rounds`].
#[cfg(any(feature = "diesel", feature = "diesel-async"))]
macro_rules! enqueue_on {
    ($table:ident, $conn:ident, $jobs:ident $(, $($await:tt)+)?) => {{
        if $jobs.is_empty() {
            return Ok(Vec::new());
        }
        if !any_unique($jobs) {
            let statement = plain_statement($table.enqueue_statements(), $jobs);
            let query = $table.diesel_query(statement, $jobs)?;
            let rows: Vec<Added> = query.load($conn) $($($await)+)? .map_err(store_error)?;
            return Ok(rows.into_iter().map(Added::enqueued).collect());
        }
        let statement = $table.unique_statement()?;
        let mut rounds = Rounds::new($jobs);
        while let Some(batch) = rounds.next_batch() {
            let query = $table.diesel_query(statement, &batch)?;
            let rows: Vec<Keyed> = query.load($conn) $($($await)+)? .map_err(store_error)?;
            rounds.record(&batch, rows.into_iter().map(Keyed::answer).collect());
        }
        rounds.finish()
    }};
}

/// `value` bound to `query`, as sqlx binds it (the statement casts each
/// array to its column's type).
fn bind(query: Query, value: Value<i64>) -> Result<Query, StoreError> {
    Ok(match value {
        Value::Texts(v) => query.bind::<Array<Nullable<Text>>, _>(v),
        Value::Jsons(v) => query.bind::<Array<Jsonb>, _>(v),
        Value::Ints(v) => query.bind::<Array<BigInt>, _>(v),
        Value::OptInts(v) => query.bind::<Array<Nullable<BigInt>>, _>(v),
        Value::Times(v) => query.bind::<Array<Nullable<Timestamptz>>, _>(v),
        Value::Bools(v) => query.bind::<Array<Bool>, _>(v),
        Value::Text(v) => query.bind::<Text, _>(v),
        Value::Json(v) => query.bind::<Jsonb, _>(v),
        Value::Int(v) => query.bind::<BigInt, _>(v),
        Value::OptTime(v) => query.bind::<Nullable<Timestamptz>, _>(v),
        _ => {
            return Err(StoreError::Backend {
                context: "internal error: an enqueue parameter diesel cannot bind".into(),
                source: "statement and binder disagree".into(),
            })
        }
    })
}

/// A diesel error as the store reports errors.
fn store_error(error: diesel::result::Error) -> StoreError {
    use diesel::result::{DatabaseErrorKind, Error};
    let context = "enqueueing jobs through diesel".to_owned();
    match &error {
        Error::DatabaseError(DatabaseErrorKind::SerializationFailure, _) => StoreError::Conflict {
            context,
            source: Box::new(error),
        },
        Error::DatabaseError(DatabaseErrorKind::ClosedConnection, _) => StoreError::Unavailable {
            context,
            source: Box::new(error),
        },
        _ => StoreError::Backend {
            context,
            source: Box::new(error),
        },
    }
}

impl JobTable {
    /// `statement` with `jobs` bound: the same statement, and values, as
    /// the sqlx enqueue's.
    fn diesel_query(&self, statement: &Statement, jobs: &[NewJob]) -> Result<Query, StoreError> {
        let mut query = diesel::sql_query(statement.text.to_string()).into_boxed();
        for param in &statement.params {
            let value = match param {
                Param::Channel => Some(Value::Text(crate::options::default_channel(
                    &self.name().name,
                ))),
                other => job_value(jobs, *other),
            };
            let value = value.ok_or_else(|| StoreError::Backend {
                context: format!("internal error: no value for enqueue parameter {param:?}"),
                source: "statement and binder disagree".into(),
            })?;
            query = bind(query, value)?;
        }
        Ok(query)
    }

    /// The unique enqueue's statement; refused without one.
    fn unique_statement(&self) -> Result<&Statement, StoreError> {
        self.enqueue_statements()
            .unique
            .as_ref()
            .ok_or_else(|| no_unique_column(&self.name().to_string()))
    }

    /// Enqueues `jobs` on a diesel connection, inside whatever transaction
    /// it has open; says for each whether it was added (see
    /// [`JobTable::enqueue_unique`], whose statements and rule for unique
    /// keys it shares).
    ///
    /// ```no_run
    /// # fn run(conn: &mut diesel::PgConnection) -> Result<(), Box<dyn std::error::Error>> {
    /// use diesel::Connection;
    /// use queue_core::NewJob;
    /// use queue_store_postgres::JobTable;
    ///
    /// let jobs = JobTable::default();
    /// conn.transaction::<_, Box<dyn std::error::Error>, _>(|conn| {
    ///     // ... the application's own writes on `conn` ...
    ///     jobs.enqueue_diesel(conn, &[NewJob::new("welcome_email", serde_json::json!({"user": 42}))])?;
    ///     Ok(())
    /// })?;
    /// # Ok(()) }
    /// ```
    #[cfg(feature = "diesel")]
    pub fn enqueue_diesel(
        &self,
        conn: &mut diesel::PgConnection,
        jobs: &[NewJob],
    ) -> Result<Vec<Enqueued<i64>>, StoreError> {
        use diesel::RunQueryDsl;
        enqueue_on!(self, conn, jobs)
    }

    /// [`JobTable::enqueue_diesel`] on a `diesel_async` connection.
    #[cfg(feature = "diesel-async")]
    pub async fn enqueue_diesel_async(
        &self,
        conn: &mut diesel_async::AsyncPgConnection,
        jobs: &[NewJob],
    ) -> Result<Vec<Enqueued<i64>>, StoreError> {
        use diesel_async::RunQueryDsl;
        enqueue_on!(self, conn, jobs, .await)
    }
}
