//! The admin's part in a table partitioned by finish time
//! ([`crate::partitions`]): purges drop whole partitions, and the
//! partitions finishing jobs need next are made as time goes on.

use std::time::{Duration, Instant};

use queue_core::{PurgeParams, StoreError};

use super::PgAdmin;
use crate::options::Column;
use crate::partitions::{drop_finished, keep_ahead, Dropped};
use crate::record::PgKey;

/// How often the partitions ahead are made, at the most.
const MAKE_EVERY: Duration = Duration::from_secs(3600);

impl<K: PgKey> PgAdmin<K> {
    /// Drops the partitions of finished jobs that `params` purges whole,
    /// on a table partitioned by finish time without an archive (purged
    /// jobs that move to an archive are moved row by row).
    pub(super) async fn drop_old_partitions(
        &self,
        params: &PurgeParams,
    ) -> Result<Dropped, StoreError> {
        // Refuses what a purge refuses, before anything is dropped.
        if params.filter()?.is_none() || params.limit == 0 {
            return Ok(Dropped::default());
        }
        let inner = &self.inner;
        let finished = match inner.options.column_name(Column::FinishedAt) {
            Some(column) if inner.partitioned && inner.options.archive.is_none() => column,
            _ => return Ok(Dropped::default()),
        };
        if inner.absent.contains(&Column::FinishedAt) {
            return Ok(Dropped::default());
        }
        let states: Vec<String> = params
            .states
            .iter()
            .map(|s| inner.options.states.get(*s).to_owned())
            .collect();
        drop_finished(
            &inner.pool,
            &inner.options.table,
            finished.as_str(),
            &states,
            params.finished_from.map(|at| self.to_db(at)),
            self.to_db(params.finished_before),
        )
        .await
    }

    /// Makes the partitions finishing jobs need next, on a partitioned
    /// default table, at most once an hour ([`MAKE_EVERY`]); a failure is
    /// logged, and tried again at the next call.
    pub(crate) async fn keep_partitions_ahead(&self) {
        if !self.inner.partitioned {
            return;
        }
        {
            let mut made = self
                .inner
                .partitions_made
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if made.is_some_and(|at| at.elapsed() < MAKE_EVERY) {
                return;
            }
            *made = Some(Instant::now());
        }
        let now = self.to_db(self.inner.offset.callers_now());
        match keep_ahead(&self.inner.pool, &self.inner.options.table, None, now).await {
            Ok(0) => {}
            Ok(made) => {
                tracing::info!(made, table = %self.inner.options.table, "partitions for finished jobs made")
            }
            Err(error) => {
                *self
                    .inner
                    .partitions_made
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner) = None;
                tracing::warn!(error = %error.chain(), table = %self.inner.options.table, "making partitions for finished jobs failed; trying again at the next pass");
            }
        }
    }
}
