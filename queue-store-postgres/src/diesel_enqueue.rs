//! Enqueue inside a diesel transaction (features `diesel` and
//! `diesel-async`): the same statement as [`JobTable::enqueue_unique`], on
//! the application's own diesel connection, so that a job exists only if
//! the application's transaction commits, and wakes idle workers (the
//! default table's NOTIFY trigger) only then.

use diesel::pg::Pg;
use diesel::query_builder::BoxedSqlQuery;
use diesel::sql_types::{Array, BigInt, Bool, Integer, Jsonb, Nullable, Text, Timestamptz};
use queue_core::{Enqueued, NewJob, StoreError};

use crate::enqueue::{FunctionArgs, JobTable};
use crate::sql::default_table;

/// One row of the enqueue function's answer.
#[derive(diesel::QueryableByName)]
struct Row {
    #[diesel(sql_type = BigInt)]
    id: i64,
    #[diesel(sql_type = Bool)]
    inserted: bool,
}

impl Row {
    fn enqueued(self) -> Enqueued<i64> {
        Enqueued {
            id: self.id,
            inserted: self.inserted,
        }
    }
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
    /// The enqueue statement with `jobs` bound.
    fn diesel_query(
        &self,
        jobs: &[NewJob],
    ) -> BoxedSqlQuery<'static, Pg, diesel::query_builder::SqlQuery> {
        let text = default_table::insert_with_options(self.name());
        let args = FunctionArgs::new(jobs);
        diesel::sql_query(text)
            .into_boxed()
            .bind::<Array<Text>, _>(args.kinds)
            .bind::<Array<Jsonb>, _>(args.payloads)
            .bind::<Array<Integer>, _>(args.priorities)
            .bind::<Array<Nullable<Timestamptz>>, _>(args.afters)
            .bind::<Array<Nullable<Text>>, _>(args.keys)
            .bind::<Array<Bool>, _>(args.forever)
            .bind::<Array<Nullable<Integer>>, _>(args.max_attempts)
            .bind::<Array<Nullable<Timestamptz>>, _>(args.expires)
            .bind::<Array<Bool>, _>(args.at_most_once)
    }

    /// Enqueues `jobs` on a diesel connection, inside whatever transaction
    /// it has open; says for each whether it was added (see
    /// [`JobTable::enqueue_unique`]).
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
        if jobs.is_empty() {
            return Ok(Vec::new());
        }
        let rows: Vec<Row> = self.diesel_query(jobs).load(conn).map_err(store_error)?;
        Ok(rows.into_iter().map(Row::enqueued).collect())
    }

    /// [`JobTable::enqueue_diesel`] on a `diesel_async` connection.
    #[cfg(feature = "diesel-async")]
    pub async fn enqueue_diesel_async(
        &self,
        conn: &mut diesel_async::AsyncPgConnection,
        jobs: &[NewJob],
    ) -> Result<Vec<Enqueued<i64>>, StoreError> {
        use diesel_async::RunQueryDsl;
        if jobs.is_empty() {
            return Ok(Vec::new());
        }
        let rows: Vec<Row> = self
            .diesel_query(jobs)
            .load(conn)
            .await
            .map_err(store_error)?;
        Ok(rows.into_iter().map(Row::enqueued).collect())
    }
}
