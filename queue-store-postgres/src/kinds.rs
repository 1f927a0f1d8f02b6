//! The kinds table the store keeps beside a job table (`<table>_kinds`):
//! which kinds are paused, for every process that claims from the table
//! ([`Admin::pause`](queue_core::Admin::pause)). Creating and upgrading
//! it, versioned like the default table; and the paused kinds as claims
//! read them, kept until the store's listener hears of a change (the
//! table's trigger notifies each, from its version 3).
//!
//! [`JobTable::migrate`](crate::JobTable::migrate) creates it with the
//! default table. For a table of your own, [`migrate`] creates it (the
//! `queue migrate` command does, with your config file); until it exists,
//! pausing is refused, naming it, and claims read no pauses.
//!
//! ```no_run
//! # async fn run(pool: sqlx::PgPool) -> Result<(), Box<dyn std::error::Error>> {
//! use queue_store_postgres::{kinds, PgStoreOptions};
//!
//! let options = PgStoreOptions::new("jobs")?;
//! for applied in kinds::migrate(&pool, &options).await? {
//!     println!("{}: applied version {}", applied.table, applied.version);
//! }
//! # Ok(()) }
//! ```

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use queue_core::StoreError;
use sqlx::{PgConnection, PgPool, Row};

use crate::error::store_error;
use crate::migrate::Migration;
use crate::options::{Column, PgStoreOptions};
use crate::sql::{default_table, kinds};
use crate::QualifiedName;

/// SQLSTATE undefined_column: a kinds table before the version with
/// limits.
const UNDEFINED_COLUMN: &str = "42703";

/// How long claims go on the paused and limited kinds they read last
/// before a read aside replaces them (claims meanwhile go on the old ones).
pub(crate) const PAUSES_REFRESH: Duration = Duration::from_millis(500);

/// The promise: no claim goes on rules older than this, so a pause or a
/// limit holds for every worker within it. A claim that finds none younger
/// (a worker idle for longer, that no notification woke) reads them itself
/// first.
///
/// A reading's age counts from when its read began, or, while the store's
/// listener hears the kinds table's changes, from the last notification
/// it heard: notifications reach a listener in commit order, so a change
/// committed before that notification was heard first, and forgot the
/// reading.
pub(crate) const PAUSES_HOLD: Duration = Duration::from_secs(1);

/// How long claims go on a reading the listener keeps current before a
/// read aside replaces it all the same: what no trigger tells (the kinds
/// table dropped, its trigger disabled) holds within this.
pub(crate) const WATCHED_REFRESH: Duration = Duration::from_secs(10);

/// Creates or upgrades the kinds table beside the table `options` describe;
/// returns the versions applied now. A table already at the newest version
/// is only read. Refused ([`StoreError::Config`]) for a table without the
/// kind column the options map: it has no kinds to pause.
pub async fn migrate(
    pool: &PgPool,
    options: &PgStoreOptions,
) -> Result<Vec<Migration>, StoreError> {
    let kinds = named(pool, options).await?;
    crate::migrate::apply(
        pool,
        &kinds,
        kinds::migrations(&kinds),
        crate::migrate::LockWait::default(),
    )
    .await
}

/// Every version of the kinds table's schema, applied or pending.
pub async fn migrations(
    pool: &PgPool,
    options: &PgStoreOptions,
) -> Result<Vec<Migration>, StoreError> {
    let kinds = named(pool, options).await?;
    crate::migrate::status(pool, &kinds, kinds::migrations(&kinds)).await
}

/// Whether the table `options` describe has the kind column they map, so
/// that a kinds table belongs beside it.
pub async fn has_kinds(pool: &PgPool, options: &PgStoreOptions) -> Result<bool, StoreError> {
    let Some(column) = options.column_name(Column::Kind) else {
        return Ok(false);
    };
    sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = to_regclass($1) \
         AND attname = $2 AND attnum > 0 AND NOT attisdropped)",
    )
    .bind(options.table.quoted())
    .bind(column.as_str())
    .fetch_one(pool)
    .await
    .map_err(|e| {
        store_error(
            &format!("looking for the kind column of {}", options.table),
            e,
        )
    })
}

/// The kinds table of the table `options` describe, or why it has none.
async fn named(pool: &PgPool, options: &PgStoreOptions) -> Result<QualifiedName, StoreError> {
    if !has_kinds(pool, options).await? {
        return Err(StoreError::Config(format!(
            "table {} has no kind column{}, so it has no kinds to pause and no kinds table to create",
            options.table,
            options
                .column_name(Column::Kind)
                .map(|c| format!(" {}", c.quoted()))
                .unwrap_or_default()
        )));
    }
    Ok(kinds::kinds_table(&options.table))
}

/// What claims heed, per kind: which kinds are paused, and which have
/// limits (claimed apart, each under its row's lock).
#[derive(Debug, Default)]
pub(crate) struct KindRules {
    pub(crate) paused: Vec<String>,
    pub(crate) limited: Vec<String>,
    /// The kinds the claim of everything else passes over: paused or
    /// limited (derived once per reading, not per claim).
    pub(crate) set_apart: Vec<String>,
}

/// The pauses and limits as claims see them: read from the kinds table
/// aside once they are [`PAUSES_REFRESH`] old, or on the claim's own
/// connection once they are [`PAUSES_HOLD`] old.
pub(crate) struct ClaimRules {
    table: QualifiedName,
    /// Pauses and limits.
    read: String,
    /// Pauses alone, for a kinds table not yet at the version with limits.
    read_paused: String,
    last: Mutex<Option<Reading>>,
    /// A read aside is on its way.
    refreshing: AtomicBool,
    /// How many times [`ClaimRules::forget`] was called: a read begun
    /// before a pause by this process must not replace the reading after
    /// it.
    forgotten: AtomicU64,
    /// The store's listener hears every change of the kinds table: it
    /// listens on the channel of its trigger, on a connection unbroken
    /// since.
    watched: AtomicBool,
    /// When the listener last heard a notification, in nanoseconds after
    /// `since` (0: none).
    heard: AtomicU64,
    since: Instant,
}

/// The rules as a claim finds them.
pub(crate) enum Cached {
    /// Younger than [`PAUSES_REFRESH`].
    Fresh(Arc<KindRules>),
    /// Older, but younger than [`PAUSES_HOLD`]: a claim may go on them,
    /// and has them read aside.
    Aging(Arc<KindRules>),
    /// None, or too old to go on: the claim reads them first.
    Expired,
}

/// A read aside in progress; dropping it (the read ended, or its task was
/// dropped) lets the next begin.
pub(crate) struct Refreshing<'a>(&'a AtomicBool);

impl Drop for Refreshing<'_> {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

/// One reading of the kinds table.
#[derive(Clone)]
struct Reading {
    /// When the read began: its rules hold as of then.
    at: Instant,
    /// Whether the kinds table existed: once it does, the next reading
    /// reads it without asking again.
    exists: bool,
    /// Whether it has the limits' columns, as last found; asked again a
    /// minute after it had not (`queue migrate` may add them meanwhile).
    limits: bool,
    limits_seen: Instant,
    /// The listener heard every change of the kinds table since before
    /// the read began.
    watched: bool,
    rules: Arc<KindRules>,
}

impl ClaimRules {
    /// The rules of the kinds table beside `table`.
    pub(crate) fn new(table: &QualifiedName) -> Self {
        let kinds = kinds::kinds_table(table);
        ClaimRules {
            read: kinds::rules(&kinds),
            read_paused: kinds::paused_kinds(&kinds),
            table: kinds,
            last: Mutex::new(None),
            refreshing: AtomicBool::new(false),
            forgotten: AtomicU64::new(0),
            watched: AtomicBool::new(false),
            heard: AtomicU64::new(0),
            since: Instant::now(),
        }
    }

    /// The kinds table whose rules these are.
    pub(crate) fn table(&self) -> &QualifiedName {
        &self.table
    }

    /// The last reading's rules, by their age (see [`PAUSES_HOLD`]).
    pub(crate) fn cached(&self) -> Cached {
        let last = self.last.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(reading) = &*last else {
            return Cached::Expired;
        };
        let mut current_at = reading.at;
        if reading.watched {
            let heard = self.heard.load(Ordering::SeqCst);
            if heard > 0 {
                current_at = current_at.max(self.since + Duration::from_nanos(heard));
            }
        }
        match current_at.elapsed() {
            age if age < PAUSES_REFRESH && reading.at.elapsed() < WATCHED_REFRESH => {
                Cached::Fresh(reading.rules.clone())
            }
            age if age < PAUSES_HOLD => Cached::Aging(reading.rules.clone()),
            _ => Cached::Expired,
        }
    }

    /// The listener now hears every change of the kinds table (`true`), or
    /// may have missed one (`false`: the readings so far are forgotten).
    pub(crate) fn watching(&self, watched: bool) {
        self.watched.store(watched, Ordering::SeqCst);
        if !watched {
            self.forget();
        }
    }

    /// The listener heard a notification: every change of the kinds table
    /// committed before it was sent was heard first (see [`PAUSES_HOLD`]).
    pub(crate) fn heard(&self) {
        let nanos = u64::try_from(self.since.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.heard.store(nanos.max(1), Ordering::SeqCst);
    }

    /// Claims the read aside: `false` while another is on its way. The
    /// read holds [`ClaimRules::refreshing`]'s guard until it ends.
    pub(crate) fn begin_refresh(&self) -> bool {
        self.refreshing
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    /// The guard of a read aside begun by [`ClaimRules::begin_refresh`]:
    /// dropped when the read ends (or its task is dropped).
    pub(crate) fn refreshing(&self) -> Refreshing<'_> {
        Refreshing(&self.refreshing)
    }

    /// Reads the rules in force now on `conn`, and keeps them for the
    /// claims after; none while the kinds table does not exist.
    pub(crate) async fn read(&self, conn: &mut PgConnection) -> Result<Arc<KindRules>, StoreError> {
        let began = Instant::now();
        // In this order: the listener stops watching before it forgets, so
        // a read that sees the count after it sees it unwatched too.
        let forgotten = self.forgotten.load(Ordering::SeqCst);
        let watched = self.watched.load(Ordering::SeqCst);
        let last = self
            .last
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        let context = || format!("reading the paused and limited kinds from {}", self.table);
        let mut exists = last.as_ref().is_some_and(|r| r.exists);
        let mut limits = last
            .as_ref()
            .is_none_or(|r| r.limits || r.limits_seen.elapsed() > Duration::from_secs(60));
        let mut limits_seen = last.as_ref().map_or_else(Instant::now, |r| r.limits_seen);
        if !exists {
            exists = sqlx::query_scalar(default_table::RELATION_EXISTS)
                .bind(self.table.quoted())
                .fetch_one(&mut *conn)
                .await
                .map_err(|e| store_error(&context(), e))?;
        }
        let mut rules = KindRules::default();
        if exists {
            let read = if limits {
                &self.read
            } else {
                &self.read_paused
            };
            match sqlx::query(sqlx::AssertSqlSafe(read.as_str()))
                .fetch_all(&mut *conn)
                .await
            {
                Ok(rows) => {
                    for row in rows {
                        let get = |e| store_error(&context(), e);
                        let kind: String = row.try_get("kind").map_err(get)?;
                        let (paused, limited) = if limits {
                            (
                                row.try_get("paused").map_err(get)?,
                                row.try_get("limited").map_err(get)?,
                            )
                        } else {
                            (true, false)
                        };
                        if paused {
                            rules.paused.push(kind.clone());
                        }
                        if limited {
                            rules.limited.push(kind);
                        }
                    }
                }
                // Dropped since it was seen: no rules, and ask again next
                // time.
                Err(sqlx::Error::Database(e))
                    if e.code().as_deref() == Some(crate::admin::UNDEFINED_TABLE) =>
                {
                    exists = false;
                }
                // Not yet at the version with limits (queue migrate adds
                // them): pauses alone.
                Err(sqlx::Error::Database(e))
                    if limits && e.code().as_deref() == Some(UNDEFINED_COLUMN) =>
                {
                    limits = false;
                    limits_seen = Instant::now();
                    let paused: Vec<String> =
                        sqlx::query_scalar(sqlx::AssertSqlSafe(self.read_paused.as_str()))
                            .fetch_all(&mut *conn)
                            .await
                            .map_err(|e| store_error(&context(), e))?;
                    rules.paused = paused;
                }
                Err(e) => return Err(store_error(&context(), e)),
            }
        }
        rules.set_apart = rules.paused.clone();
        rules.set_apart.extend(
            rules
                .limited
                .iter()
                .filter(|k| !rules.paused.contains(k))
                .cloned(),
        );
        let reading = Reading {
            at: began,
            exists,
            limits,
            limits_seen,
            watched,
            rules: Arc::new(rules),
        };
        let rules = reading.rules.clone();
        self.keep(reading, forgotten);
        Ok(rules)
    }

    /// Keeps `reading` for the claims after, unless a newer one is kept
    /// already or the rules were forgotten since it began (`forgotten`,
    /// the count then): an older read would undo what the newer saw.
    fn keep(&self, reading: Reading, forgotten: u64) {
        let mut last = self.last.lock().unwrap_or_else(PoisonError::into_inner);
        let newer = last.as_ref().is_some_and(|kept| kept.at > reading.at);
        if !newer && self.forgotten.load(Ordering::SeqCst) == forgotten {
            *last = Some(reading);
        }
    }

    /// The channel the kinds table's trigger notifies its changes on; none
    /// before the kinds table's version 3 (or with the trigger disabled).
    pub(crate) async fn changes_channel<'c, E>(&self, on: E) -> Result<Option<String>, sqlx::Error>
    where
        E: sqlx::Executor<'c, Database = sqlx::Postgres>,
    {
        sqlx::query_scalar(kinds::CHANGES_CHANNEL)
            .bind(self.table.quoted())
            .bind(kinds::changes_trigger_name(&self.table))
            .fetch_optional(on)
            .await
    }

    /// Forgets the last reading: the next claim reads the table again (a
    /// pause or resume by this process holds for its own claims at once;
    /// one by another process, when the listener hears of it).
    pub(crate) fn forget(&self) {
        let mut last = self.last.lock().unwrap_or_else(PoisonError::into_inner);
        self.forgotten.fetch_add(1, Ordering::SeqCst);
        *last = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ident::Ident;

    fn rules() -> ClaimRules {
        ClaimRules::new(&QualifiedName::new(
            Ident::new("public").expect("valid"),
            Ident::new("jobs").expect("valid"),
        ))
    }

    /// A reading begun `ago`, pausing `paused`.
    fn reading(ago: Duration, paused: &str) -> Reading {
        Reading {
            at: Instant::now()
                .checked_sub(ago)
                .expect("the machine has been up longer"),
            exists: true,
            limits: true,
            limits_seen: Instant::now(),
            watched: false,
            rules: Arc::new(KindRules {
                paused: vec![paused.to_owned()],
                ..KindRules::default()
            }),
        }
    }

    fn paused(cached: Cached) -> Option<(&'static str, Vec<String>)> {
        match cached {
            Cached::Fresh(rules) => Some(("fresh", rules.paused.clone())),
            Cached::Aging(rules) => Some(("aging", rules.paused.clone())),
            Cached::Expired => None,
        }
    }

    #[test]
    fn claims_go_on_rules_younger_than_the_promise_and_read_older_ones_first() {
        let r = rules();
        assert!(paused(r.cached()).is_none(), "nothing read yet");
        r.keep(reading(Duration::from_millis(100), "mail"), 0);
        assert_eq!(paused(r.cached()), Some(("fresh", vec!["mail".into()])));
        r.keep(reading(Duration::from_millis(700), "mail"), 0);
        assert_eq!(
            paused(r.cached()),
            Some(("fresh", vec!["mail".into()])),
            "an older reading does not replace a newer one"
        );
        *r.last.lock().expect("unpoisoned") = Some(reading(Duration::from_millis(700), "sms"));
        assert_eq!(
            paused(r.cached()),
            Some(("aging", vec!["sms".into()])),
            "past the refresh, claims go on it while it is read aside"
        );
        *r.last.lock().expect("unpoisoned") = Some(reading(PAUSES_HOLD, "sms"));
        assert!(
            paused(r.cached()).is_none(),
            "past the promise, a claim reads the rules first"
        );
    }

    #[test]
    fn a_read_begun_before_this_process_paused_a_kind_does_not_undo_the_pause() {
        let r = rules();
        // A read aside begins, then this process pauses a kind (forgets),
        // and a claim reads the rules with the pause.
        let before = r.forgotten.load(Ordering::SeqCst);
        r.forget();
        let after = r.forgotten.load(Ordering::SeqCst);
        r.keep(reading(Duration::from_millis(1), "mail"), after);
        // The read aside ends: its rules, older and without the pause,
        // are not kept.
        r.keep(reading(Duration::ZERO, "none"), before);
        assert_eq!(paused(r.cached()), Some(("fresh", vec!["mail".into()])));
    }

    /// `reading`, taken while the listener heard every change.
    fn watched_reading(ago: Duration, paused: &str) -> Reading {
        Reading {
            watched: true,
            ..reading(ago, paused)
        }
    }

    #[test]
    fn a_notification_heard_after_a_watched_reading_keeps_it_current() {
        let r = rules();
        r.watching(true);
        r.keep(watched_reading(PAUSES_HOLD * 3, "mail"), 0);
        assert!(
            paused(r.cached()).is_none(),
            "nothing heard since: as old as its read"
        );
        r.heard();
        assert_eq!(
            paused(r.cached()),
            Some(("fresh", vec!["mail".into()])),
            "a notification just heard: every change committed before it was heard first"
        );
        *r.last.lock().expect("unpoisoned") = Some(watched_reading(WATCHED_REFRESH, "mail"));
        assert_eq!(
            paused(r.cached()),
            Some(("aging", vec!["mail".into()])),
            "kept current, but read again aside after a while all the same"
        );
    }

    #[test]
    fn a_notification_does_not_keep_a_reading_taken_unwatched_current() {
        let r = rules();
        r.keep(reading(PAUSES_HOLD * 3, "mail"), 0);
        r.heard();
        assert!(paused(r.cached()).is_none());
    }

    #[test]
    fn a_listener_that_stops_watching_forgets_the_reading() {
        let r = rules();
        r.watching(true);
        let forgotten = r.forgotten.load(Ordering::SeqCst);
        r.keep(watched_reading(Duration::from_millis(1), "mail"), forgotten);
        r.heard();
        r.watching(false);
        assert!(
            paused(r.cached()).is_none(),
            "a change may have gone unheard"
        );
        // A read begun before the listener stopped is not kept either.
        r.keep(watched_reading(Duration::ZERO, "mail"), forgotten);
        assert!(paused(r.cached()).is_none());
    }

    #[test]
    fn one_read_aside_at_a_time() {
        let r = rules();
        assert!(r.begin_refresh());
        let guard = r.refreshing();
        assert!(!r.begin_refresh(), "a read is on its way");
        drop(guard);
        assert!(r.begin_refresh(), "the read ended");
    }
}
