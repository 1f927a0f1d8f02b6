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
use crate::sql::{ListRead, Param};

/// How many jobs of the list a page reads at most when no index serves its
/// filter (a failure text without a trigram index): a bounded read on any
/// table, tens of milliseconds. The page says how far it searched
/// ([`JobPage::searched`]).
const SEARCH_LIMIT: i64 = 50_000;

/// The widest window of keys a page of a queued-time range reads
/// ([`ListRead::Windows`]); a wider one it looks into first. About eight
/// of the default table's block ranges: tens of milliseconds when every
/// job in it matches.
const READ_WINDOW: i64 = 40_000;

/// The rows a page asks for: one more than its limit, telling whether a
/// page follows.
fn fetched(limit: usize) -> i64 {
    i64::try_from(limit).unwrap_or(i64::MAX).saturating_add(1)
}

/// A page of `jobs` read in list order, one more than `limit` if a page
/// follows: the page, and where the next starts.
fn walked_page<K: Clone>(mut jobs: Vec<JobView<K>>, limit: usize) -> JobPage<K> {
    let next = if jobs.len() > limit {
        jobs.truncate(limit);
        jobs.last().map(|job| job.id.clone())
    } else {
        None
    };
    JobPage::new(jobs, next)
}

/// One operator read's connection: a read-only transaction whose
/// statements the server stops after the admin read timeout.
pub(super) type Read = sqlx::Transaction<'static, sqlx::Postgres>;

impl<K: PgKey> PgAdmin<K> {
    /// Opens a read for `context`: `BEGIN READ ONLY`, the timeout and the
    /// plans in one round trip. Each statement is planned for its values
    /// (`plan_cache_mode = force_custom_plan`): after five runs Postgres
    /// may keep a generic plan, one that cannot tell a rare kind or a
    /// narrow range from a common one and walks the whole table for it
    /// (2.2 s instead of 50 ms for a rare kind's page on ten million
    /// rows). An operator's read is planned in well under a millisecond.
    pub(super) async fn begin_read(&self, context: &str) -> Result<Read, StoreError> {
        let begin = match self.inner.options.admin_read_timeout {
            Some(limit) => format!(
                "BEGIN READ ONLY; SET LOCAL plan_cache_mode = force_custom_plan; SET LOCAL statement_timeout = {}",
                limit.as_millis().max(1)
            ),
            None => "BEGIN READ ONLY; SET LOCAL plan_cache_mode = force_custom_plan".to_owned(),
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
        let sql = &self.inner.sql;
        let plan = sql.list_read(&params.filter);
        let context = "listing jobs";
        let mut read = self.begin_read(context).await?;
        if plan == ListRead::Windows {
            let page = self.windowed_page(&mut read, params, newest_first).await?;
            self.end_read(read, context).await?;
            return Ok(page);
        }
        let statement = sql.list(&params.filter, newest_first, params.after.is_some(), plan)?;
        let rows = query(&statement, |p| match p {
            Param::Limit => Some(Value::Int(fetched(params.limit))),
            Param::SearchLimit => Some(Value::Int(SEARCH_LIMIT)),
            Param::After => params.after.clone().map(Value::Key),
            other => self.filter_value(&params.filter, other),
        })?
        .fetch_all(&mut *read)
        .await
        .map_err(|e| self.read_error(context, e))?;
        if let (true, Some(after)) = (
            rows.is_empty() && sql.list_by_queued_time().is_some(),
            &params.after,
        ) {
            // By queued time, a page starts where its anchor stands: one
            // that is gone would read as the end of the list.
            let gone = !query(&sql.anchor_exists(), |p| match p {
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
        if plan == ListRead::Stretch {
            return self.searched_page(&rows, params.limit);
        }
        let jobs = rows
            .iter()
            .map(|row| self.view(row))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(walked_page(jobs, params.limit))
    }

    /// A page read in windows of keys ([`ListRead::Windows`]), from where
    /// the page starts away from it, until the page is full or the keys
    /// end. A window of at most [`READ_WINDOW`] keys is read; a wider one
    /// is first looked into (does a match lie in it?): an empty one is
    /// stepped over and the next is eight times as wide; one with a match
    /// is halved, its nearer half first. So a page finds a range far down
    /// the list in a few cheap looks, then reads only the windows at its
    /// near end. Keys are integers here (the plan is only chosen for
    /// them). The reads go through bitmaps (the block range index of
    /// queued times and keys).
    async fn windowed_page(
        &self,
        read: &mut Read,
        params: &ListParams<K>,
        newest_first: bool,
    ) -> Result<JobPage<K>, StoreError> {
        let context = "listing jobs";
        let sql = &self.inner.sql;
        let bounds = query(&sql.key_bounds(), |_| None::<Value<K>>)?
            .fetch_one(&mut **read)
            .await
            .map_err(|e| self.read_error(context, e))?;
        let lowest: Option<i64> = bounds.try_get(0).map_err(|e| store_error(context, e))?;
        let highest: Option<i64> = bounds.try_get(1).map_err(|e| store_error(context, e))?;
        let (Some(lowest), Some(highest)) = (lowest, highest) else {
            return Ok(JobPage::new(Vec::new(), None));
        };
        let after =
            match &params.after {
                Some(key) => Some(key.to_string().parse::<i64>().map_err(|_| {
                    StoreError::Refused(format!("after: {key} is not an integer key"))
                })?),
                None => None,
            };
        // Bitmaps only: a walk of the key would be planned for a window
        // (the planner does not know that keys follow queued times), and a
        // probe would be planned as a scan from the table's start hoping
        // to meet a match soon.
        sqlx::raw_sql("SET LOCAL enable_indexscan = off; SET LOCAL enable_seqscan = off")
            .execute(&mut **read)
            .await
            .map_err(|e| self.read_error(context, e))?;
        // Exclusive, as a page's start.
        let mut start = match (after, newest_first) {
            (Some(after), _) => after,
            (None, true) => highest.saturating_add(1),
            (None, false) => lowest.saturating_sub(1),
        };
        let statement = sql.list(&params.filter, newest_first, true, ListRead::Windows)?;
        let probe = sql.window_probe(&params.filter, newest_first)?;
        let mut width = READ_WINDOW;
        let mut jobs = Vec::new();
        loop {
            // Inclusive.
            let end = if newest_first {
                start.saturating_sub(width)
            } else {
                start.saturating_add(width)
            };
            let last = if newest_first {
                end <= lowest
            } else {
                end >= highest
            };
            let bind = |p: Param| match p {
                Param::After => Some(Value::Int(start)),
                Param::WindowEnd => Some(Value::Int(end)),
                Param::Limit => Some(Value::Int(fetched(params.limit) - jobs.len() as i64)),
                other => self.filter_value(&params.filter, other),
            };
            if width > READ_WINDOW {
                let found: bool = query(&probe, bind)?
                    .fetch_one(&mut **read)
                    .await
                    .map_err(|e| self.read_error(context, e))?
                    .try_get(0)
                    .map_err(|e| store_error(context, e))?;
                if found {
                    width /= 2;
                    continue;
                }
            } else {
                let rows = query(&statement, bind)?
                    .fetch_all(&mut **read)
                    .await
                    .map_err(|e| self.read_error(context, e))?;
                for row in &rows {
                    jobs.push(self.view(row)?);
                }
                if jobs.len() as i64 >= fetched(params.limit) {
                    break;
                }
            }
            if last {
                break;
            }
            start = end;
            width = width.saturating_mul(8);
        }
        sqlx::raw_sql("SET LOCAL enable_indexscan = on; SET LOCAL enable_seqscan = on")
            .execute(&mut **read)
            .await
            .map_err(|e| self.read_error(context, e))?;
        Ok(walked_page(jobs, params.limit))
    }

    /// The page of a stretch of the list searched (`sql::admin`'s `list`
    /// with `ListRead::Stretch`): its matches, and where the stretch ended
    /// if the page did not fill before it.
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
            return Ok(walked_page(jobs, limit));
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
