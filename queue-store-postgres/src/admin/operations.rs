//! Bulk operations, in the operations table beside the job table
//! ([`crate::sql::operations`]).

use queue_core::{
    AbortOutcome, NewOperation, Operation, OperationAction, OperationParams, OperationState,
    OperationStep, StoreError, TakeOperation, MAX_OPERATION_PAGE,
};
use sqlx::postgres::PgRow;
use sqlx::Row;

use super::{beside_error, PgAdmin};
use crate::error::store_error;
use crate::ident::QualifiedName;
use crate::record::PgKey;
use crate::sql::{catalog, operations};

/// The jobs an ended operation must have changed for the job table to be
/// analyzed ([`PgAdmin::analyze`]).
const ANALYZE_AFTER: u64 = 1000;

/// What an operation's errors call the table.
const WHAT: &str = "bulk operations";

/// The longest age the statements take (a thousand years): a longer one
/// reaches before any time the database keeps, and means "never".
const LONGEST_AGE: std::time::Duration = std::time::Duration::from_secs(1000 * 365 * 24 * 3600);

impl<K: PgKey> PgAdmin<K> {
    fn operations_table(&self) -> QualifiedName {
        operations::operations_table(&self.inner.options.table)
    }

    fn key_type(&self) -> &str {
        self.inner.sql.key_type()
    }

    /// Runs `sql` with `bind` on a pooled connection; the rows back as
    /// operations.
    async fn operation_rows<'q>(
        &self,
        sql: String,
        context: &str,
        bind: impl FnOnce(
            sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments>,
        )
            -> sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments>,
    ) -> Result<Vec<Operation<K>>, StoreError> {
        let table = self.operations_table();
        let mut conn = self.connection(context).await?;
        let rows = bind(sqlx::query(sqlx::AssertSqlSafe(sql)))
            .fetch_all(&mut *conn)
            .await
            .map_err(|e| beside_error(&table, WHAT, context, e))?;
        rows.iter().map(|row| operation(row, context)).collect()
    }

    pub(super) async fn create_op(&self, new: &NewOperation) -> Result<Operation<K>, StoreError> {
        new.check()?;
        let context = "recording a bulk operation";
        let action = serde_json::to_value(&new.action).map_err(|e| encode_error(context, e))?;
        let filter = serde_json::to_value(&new.filter).map_err(|e| encode_error(context, e))?;
        let total = i64::try_from(new.total).unwrap_or(i64::MAX);
        let sql = operations::create(&self.operations_table(), self.key_type());
        let mut rows = self
            .operation_rows(sql, context, |q| {
                q.bind(action)
                    .bind(filter)
                    .bind(new.by.clone())
                    .bind(total)
                    .bind(i32::try_from(new.batch).unwrap_or(i32::MAX))
            })
            .await?;
        rows.pop()
            .ok_or_else(|| StoreError::Config(format!("{context}: the insert returned no row")))
    }

    pub(super) async fn read_op(&self, id: i64) -> Result<Option<Operation<K>>, StoreError> {
        let sql = operations::get(&self.operations_table(), self.key_type());
        Ok(self
            .operation_rows(sql, "reading a bulk operation", |q| q.bind(id))
            .await?
            .pop())
    }

    pub(super) async fn read_ops(
        &self,
        params: &OperationParams,
    ) -> Result<Vec<Operation<K>>, StoreError> {
        let sql = operations::list(&self.operations_table(), self.key_type());
        let states: Option<Vec<String>> = params
            .states
            .as_ref()
            .map(|states| states.iter().map(|s| s.as_str().to_owned()).collect());
        let limit = i64::try_from(params.limit.min(MAX_OPERATION_PAGE)).unwrap_or(0);
        self.operation_rows(sql, "reading bulk operations", |q| {
            q.bind(params.before).bind(states).bind(limit)
        })
        .await
    }

    pub(super) async fn take_op(
        &self,
        take: &TakeOperation,
    ) -> Result<Option<Operation<K>>, StoreError> {
        let sql = operations::take(&self.operations_table(), self.key_type());
        Ok(self
            .operation_rows(sql, "taking a bulk operation to run", |q| {
                q.bind(take.runner.clone())
                    .bind(take.id)
                    .bind(take.silent_for.min(LONGEST_AGE).as_secs_f64())
            })
            .await?
            .pop())
    }

    pub(super) async fn step_op(
        &self,
        step: &OperationStep<K>,
    ) -> Result<Option<Operation<K>>, StoreError> {
        let sql = operations::step(&self.operations_table(), self.key_type());
        let done = i64::try_from(step.done).unwrap_or(i64::MAX);
        let end = step.end.map(|s| s.as_str().to_owned());
        let recorded = self
            .operation_rows(sql, "recording a bulk operation's batch", |q| {
                q.bind(step.id)
                    .bind(step.runner.clone())
                    .bind(done)
                    .bind(step.cursor.clone())
                    .bind(end)
                    .bind(step.message.clone())
            })
            .await?
            .pop();
        if let (Some(_), Some(op)) = (step.end, &recorded) {
            if op.done >= ANALYZE_AFTER && self.inner.options.exact_counts_below > 0 {
                self.analyze().await;
            }
        }
        Ok(recorded)
    }

    /// Has the job table analyzed: a bulk operation that just ended moved
    /// many jobs between states, and a big table's figures split its
    /// finished jobs by the shares of the last ANALYZE (autovacuum's comes
    /// within minutes). Samples the columns the figures and the claims'
    /// plans read ([`crate::statistics::analyzed_columns`]: 260 ms on
    /// 3,000,000 rows, against 410 for every column), never waits for its
    /// lock ([`catalog::analyze_skipping_locked`]), and leaves the table
    /// alone on any error: it only freshens estimates. A role that does not
    /// own the table gets a warning from Postgres, not an error.
    async fn analyze(&self) {
        // A partitioned table's live partitions: its finished jobs' are
        // autovacuum's, and its figures read the partitions' statistics.
        if self.inner.analyzed.is_empty() {
            return;
        }
        let columns = crate::statistics::analyzed_columns(&self.inner.options, &self.inner.absent);
        let tables: Vec<String> = (self.inner.analyzed.iter())
            .map(|t| catalog::analyze_target(t, &columns))
            .collect();
        let analyze = catalog::analyze_skipping_locked(&tables);
        if let Err(error) = sqlx::query(sqlx::AssertSqlSafe(analyze))
            .execute(&self.inner.pool)
            .await
        {
            tracing::debug!(tables = %tables.join(", "), %error, "analyzing the table after a bulk operation failed; the figures are freshened at the next ANALYZE");
        }
    }

    pub(super) async fn prune_ops(
        &self,
        older_than: std::time::Duration,
    ) -> Result<u64, StoreError> {
        if older_than > LONGEST_AGE {
            return Ok(0);
        }
        let table = self.operations_table();
        let context = "removing old bulk operations";
        let mut conn = self.connection(context).await?;
        let done = sqlx::query(sqlx::AssertSqlSafe(operations::prune(&table)))
            .bind(older_than.as_secs_f64())
            .execute(&mut *conn)
            .await
            .map_err(|e| beside_error(&table, WHAT, context, e))?;
        Ok(done.rows_affected())
    }

    pub(super) async fn abort_op(
        &self,
        id: i64,
        by: &str,
    ) -> Result<Option<AbortOutcome<K>>, StoreError> {
        let sql = operations::abort(&self.operations_table(), self.key_type());
        let message = format!("aborted by {by}");
        let aborted = self
            .operation_rows(sql, "aborting a bulk operation", |q| {
                q.bind(id).bind(message)
            })
            .await?
            .pop();
        match aborted {
            Some(op) => Ok(Some(AbortOutcome::Aborted(op))),
            // Ended before, or no such operation.
            None => Ok(self.read_op(id).await?.map(AbortOutcome::Ended)),
        }
    }
}

/// An operation from its row.
fn operation<K: PgKey>(row: &PgRow, context: &str) -> Result<Operation<K>, StoreError> {
    let get = |e| store_error(context, e);
    let id: i64 = row.try_get("id").map_err(get)?;
    let unknown = |what: &str, e: &dyn std::fmt::Display| {
        StoreError::Config(format!(
            "{context}: operation {id} has {what} this version cannot read ({e}); was it written by a newer one?"
        ))
    };
    let action: OperationAction = serde_json::from_value(row.try_get("action").map_err(get)?)
        .map_err(|e| unknown("an action", &e))?;
    let filter = serde_json::from_value(row.try_get("filter").map_err(get)?)
        .map_err(|e| unknown("a filter", &e))?;
    let state: String = row.try_get("state").map_err(get)?;
    let state = OperationState::parse(&state).ok_or_else(|| unknown("a state", &state))?;
    let count = |name: &str| -> Result<u64, StoreError> {
        let n: i64 = row.try_get(name).map_err(get)?;
        Ok(u64::try_from(n).unwrap_or(0))
    };
    let batch: i32 = row.try_get("batch").map_err(get)?;
    let new = NewOperation::new(
        action,
        filter,
        row.try_get::<String, _>("by").map_err(get)?,
        count("total")?,
    )
    .batch(u32::try_from(batch).unwrap_or(1));
    let mut op = Operation::new(id, new, row.try_get("created_at").map_err(get)?);
    op.state = state;
    op.done = count("done")?;
    op.runner = row.try_get("runner").map_err(get)?;
    op.cursor = row.try_get("cursor").map_err(get)?;
    op.message = row.try_get("message").map_err(get)?;
    op.started_at = row.try_get("started_at").map_err(get)?;
    op.updated_at = row.try_get("updated_at").map_err(get)?;
    op.finished_at = row.try_get("finished_at").map_err(get)?;
    Ok(op)
}

fn encode_error(context: &str, error: serde_json::Error) -> StoreError {
    StoreError::Refused(format!("{context}: it cannot be written as JSON ({error})"))
}
