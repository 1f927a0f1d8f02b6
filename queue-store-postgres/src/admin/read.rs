//! Reading jobs: one by key, a page, a count, and the finish timeline.

use queue_core::{
    FinishedBucket, JobFilter, JobPage, JobView, ListOrder, ListParams, StoreError, TimelineParams,
};
use sqlx::postgres::PgRow;
use sqlx::Row;

use super::PgAdmin;
use crate::bind::{query, Value};
use crate::error::store_error;
use crate::record::PgKey;
use crate::sql::Param;

/// How many jobs of the list a page reads at most when no index serves its
/// filter (a failure text without a trigram index): a bounded read on any
/// table, tens of milliseconds. The page says how far it searched
/// ([`JobPage::searched`]).
const SEARCH_LIMIT: i64 = 50_000;

/// One operator read's connection: a read-only transaction whose
/// statements the server stops after the admin read timeout.
pub(super) type Read = sqlx::Transaction<'static, sqlx::Postgres>;

impl<K: PgKey> PgAdmin<K> {
    /// Opens a read for `context`: `BEGIN READ ONLY` and the timeout in one
    /// round trip.
    pub(super) async fn begin_read(&self, context: &str) -> Result<Read, StoreError> {
        let begin = match self.inner.options.admin_read_timeout {
            Some(limit) => format!(
                "BEGIN READ ONLY; SET LOCAL statement_timeout = {}",
                limit.as_millis().max(1)
            ),
            None => "BEGIN READ ONLY".to_owned(),
        };
        self.inner
            .pool
            .begin_with(sqlx::AssertSqlSafe(begin))
            .await
            .map_err(|e| store_error(context, e))
    }

    /// Ends a read (nothing to keep: it wrote nothing).
    pub(super) async fn end_read(&self, read: Read, context: &str) -> Result<(), StoreError> {
        read.commit().await.map_err(|e| store_error(context, e))
    }

    /// A read's error: one the timeout stopped is [`StoreError::TimedOut`].
    pub(super) fn read_error(&self, context: &str, error: sqlx::Error) -> StoreError {
        let cancelled = error
            .as_database_error()
            .and_then(|db| db.code())
            .is_some_and(|code| code == "57014");
        match (cancelled, self.inner.options.admin_read_timeout) {
            (true, Some(after)) => StoreError::TimedOut {
                context: context.to_owned(),
                after,
            },
            _ => store_error(context, error),
        }
    }

    pub(super) fn view(&self, row: &PgRow) -> Result<JobView<K>, StoreError> {
        let get = |e| store_error("reading a job", e);
        let stored_state: String = row.try_get("state").map_err(get)?;
        let logs: Option<serde_json::Value> = row.try_get("execution_logs").map_err(get)?;
        let execution_logs = match logs {
            None | Some(serde_json::Value::Null) => Vec::new(),
            Some(serde_json::Value::Array(entries)) => entries,
            Some(other) => vec![other],
        };
        let state = self.state_of(&stored_state);
        let mut view = JobView::new(row.try_get("id").map_err(get)?, stored_state, state);
        view.kind = row.try_get("kind").map_err(get)?;
        view.payload = row.try_get("payload").map_err(get)?;
        view.priority = row.try_get("priority").map_err(get)?;
        view.failure_message = row.try_get("failure_message").map_err(get)?;
        view.queued_at = row.try_get("queued_at").map_err(get)?;
        view.started_at = row.try_get("started_at").map_err(get)?;
        view.finished_at = row.try_get("finished_at").map_err(get)?;
        view.process_after = row.try_get("process_after").map_err(get)?;
        view.num_resets = row.try_get("num_resets").map_err(get)?;
        view.num_failures = row.try_get("num_failures").map_err(get)?;
        view.last_heartbeat_at = row.try_get("last_heartbeat_at").map_err(get)?;
        view.execution_logs = execution_logs;
        view.worker_hostname = row.try_get("worker_hostname").map_err(get)?;
        view.cancel = row.try_get("cancel").map_err(get)?;
        view.unique_key = row.try_get("unique_key").map_err(get)?;
        view.max_attempts = row.try_get("max_attempts").map_err(get)?;
        view.attempts_left = row.try_get("attempts_left").map_err(get)?;
        view.expires_at = row.try_get("expires_at").map_err(get)?;
        view.at_most_once = row.try_get("at_most_once").map_err(get)?;
        Ok(view)
    }

    /// The value of a filter's input.
    pub(super) fn filter_value(&self, filter: &JobFilter, p: Param) -> Option<Value<K>> {
        let texts = |v: &[String]| Value::Texts(v.iter().cloned().map(Some).collect());
        match p {
            Param::FilterStates => filter.states.as_ref().map(|states| {
                Value::Texts(
                    states
                        .iter()
                        .flat_map(|s| self.inner.options.stored_values(*s))
                        .map(|v| Some(v.to_owned()))
                        .collect(),
                )
            }),
            Param::FilterKinds => filter.kinds.as_deref().map(texts),
            // Times of the callers' clock, on the database's.
            Param::QueuedFrom => filter.queued_from.map(|at| Value::Time(self.to_db(at))),
            Param::QueuedBefore => filter.queued_before.map(|at| Value::Time(self.to_db(at))),
            Param::FinishedFrom => filter.finished_from.map(|at| Value::Time(self.to_db(at))),
            Param::FinishedBefore => filter.finished_before.map(|at| Value::Time(self.to_db(at))),
            Param::FailureText => filter.failure_contains.clone().map(Value::Text),
            Param::FilterPayload => filter.payload_contains.clone().map(Value::Json),
            Param::FilterUniqueKey => filter.unique_key.clone().map(Value::Text),
            Param::FilterWorker => filter.worker.clone().map(Value::Text),
            Param::StartedBefore => filter.started_before.map(|at| Value::Time(self.to_db(at))),
            _ => None,
        }
    }

    pub(super) async fn fetch_job(&self, id: &K) -> Result<Option<JobView<K>>, StoreError> {
        let context = "reading a job";
        let mut read = self.begin_read(context).await?;
        let row = query(&self.inner.sql.get, |p| match p {
            Param::Id => Some(Value::Key(id.clone())),
            _ => None,
        })?
        .fetch_optional(&mut *read)
        .await
        .map_err(|e| self.read_error(context, e))?;
        self.end_read(read, context).await?;
        row.map(|row| self.view(&row)).transpose()
    }

    pub(super) async fn fetch_page(
        &self,
        params: &ListParams<K>,
    ) -> Result<JobPage<K>, StoreError> {
        let newest_first = params.order == ListOrder::NewestFirst;
        let statement =
            self.inner
                .sql
                .list(&params.filter, newest_first, params.after.is_some())?;
        let fetch = i64::try_from(params.limit)
            .unwrap_or(i64::MAX)
            .saturating_add(1);
        let context = "listing jobs";
        let mut read = self.begin_read(context).await?;
        let searched = self.inner.sql.list_searches_a_stretch(&params.filter);
        let rows = query(&statement, |p| match p {
            Param::Limit => Some(Value::Int(fetch)),
            Param::SearchLimit => Some(Value::Int(SEARCH_LIMIT)),
            Param::After => params.after.clone().map(Value::Key),
            other => self.filter_value(&params.filter, other),
        })?
        .fetch_all(&mut *read)
        .await
        .map_err(|e| self.read_error(context, e))?;
        if let (true, Some(after)) = (
            rows.is_empty() && self.inner.sql.list_by_queued_time().is_some(),
            &params.after,
        ) {
            // By queued time, a page starts where its anchor stands: one
            // that is gone would read as the end of the list.
            let gone = !query(&self.inner.sql.anchor_exists(), |p| match p {
                Param::After => Some(Value::Key(after.clone())),
                _ => None,
            })?
            .fetch_one(&mut *read)
            .await
            .map_err(|e| self.read_error(context, e))?
            .try_get::<bool, _>(0)
            .map_err(|e| store_error(context, e))?;
            if gone {
                return Err(StoreError::Refused(
                    "the job this page starts after is gone (deleted or purged since the page before): start again from the first page"
                        .into(),
                ));
            }
        }
        self.end_read(read, context).await?;
        if searched {
            return self.searched_page(&rows, params.limit);
        }
        let mut jobs = rows
            .iter()
            .map(|row| self.view(row))
            .collect::<Result<Vec<_>, _>>()?;
        let next = if jobs.len() > params.limit {
            jobs.truncate(params.limit);
            jobs.last().map(|job| job.id.clone())
        } else {
            None
        };
        Ok(JobPage::new(jobs, next))
    }

    /// The page of a search of a stretch of the list (`sql::admin`'s
    /// `list`): its matches, and where the stretch ended if the page did
    /// not fill before it.
    fn searched_page(&self, rows: &[PgRow], limit: usize) -> Result<JobPage<K>, StoreError> {
        let context = "listing jobs";
        let mut jobs = Vec::new();
        let mut last = None;
        for row in rows {
            let matched: bool = row
                .try_get("__queue_match")
                .map_err(|e| store_error(context, e))?;
            let place: i64 = row
                .try_get("__queue_n")
                .map_err(|e| store_error(context, e))?;
            let job = self.view(row)?;
            last = Some((job.id.clone(), place));
            if matched {
                jobs.push(job);
            }
        }
        if jobs.len() > limit {
            jobs.truncate(limit);
            let next = jobs.last().map(|job| job.id.clone());
            return Ok(JobPage::new(jobs, next));
        }
        // The stretch's last job came: the search stopped there.
        match last {
            Some((id, place)) if place == SEARCH_LIMIT => {
                Ok(JobPage::new(jobs, Some(id)).searched(Some(SEARCH_LIMIT as u64)))
            }
            _ => Ok(JobPage::new(jobs, None)),
        }
    }

    pub(super) async fn count_matching(&self, filter: &JobFilter) -> Result<u64, StoreError> {
        let statement = self.inner.sql.count(filter)?;
        let context = "counting jobs";
        let mut read = self.begin_read(context).await?;
        let count: i64 = query(&statement, |p| self.filter_value(filter, p))?
            .fetch_one(&mut *read)
            .await
            .map_err(|e| self.read_error(context, e))?
            .try_get(0)
            .map_err(|e| store_error(context, e))?;
        self.end_read(read, context).await?;
        Ok(u64::try_from(count).unwrap_or(0))
    }

    /// How many jobs match `filter`, read on `conn` (a limited kind's
    /// claim counts its running jobs inside its own transaction).
    pub(crate) async fn count_on(
        &self,
        conn: &mut sqlx::PgConnection,
        filter: &JobFilter,
    ) -> Result<u64, StoreError> {
        let statement = self.inner.sql.count(filter)?;
        let context = "counting a limited kind's running jobs";
        let count: i64 = query(&statement, |p| self.filter_value(filter, p))?
            .fetch_one(&mut *conn)
            .await
            .map_err(|e| store_error(context, e))?
            .try_get(0)
            .map_err(|e| store_error(context, e))?;
        Ok(u64::try_from(count).unwrap_or(0))
    }

    pub(super) async fn fetch_timeline(
        &self,
        params: &TimelineParams,
    ) -> Result<Option<Vec<FinishedBucket>>, StoreError> {
        let Some(statement) = &self.inner.sql.timeline else {
            return Ok(None);
        };
        let seconds = params.bucket.num_seconds();
        if seconds < 1 {
            return Err(StoreError::Refused(format!(
                "a timeline's interval must be at least a second, not {} ms",
                params.bucket.num_milliseconds()
            )));
        }
        // Finish times are written on the database's clock: the window is
        // translated onto it, as every other admin read's times are.
        self.inner.offset.refresh(&self.inner.pool).await?;
        let context = "counting finished jobs";
        let mut read = self.begin_read(context).await?;
        let rows = query::<K>(statement, |p| match p {
            Param::FinishedFrom => Some(Value::Time(self.to_db(params.since))),
            Param::FinishedBefore => Some(Value::Time(self.to_db(params.until()))),
            Param::BucketSeconds => Some(Value::Int(seconds)),
            _ => None,
        })?
        .fetch_all(&mut *read)
        .await
        .map_err(|e| self.read_error(context, e))?;
        self.end_read(read, context).await?;
        let mut buckets = params.empty();
        for row in &rows {
            let read = |e| store_error("counting finished jobs", e);
            let bucket: i64 = row.try_get("bucket").map_err(read)?;
            let stored: String = row.try_get("state").map_err(read)?;
            let count: i64 = row.try_get("count").map_err(read)?;
            let kind: Option<String> = row.try_get("kind").map_err(read)?;
            let slot = usize::try_from(bucket)
                .ok()
                .and_then(|i| buckets.get_mut(i));
            if let (Some(slot), Some(state)) = (slot, self.state_of(&stored)) {
                slot.add_of_kind(kind.as_deref(), state, u64::try_from(count).unwrap_or(0));
            }
        }
        Ok(Some(buckets))
    }
}
