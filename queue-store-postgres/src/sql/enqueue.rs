//! The enqueue's statements: one builder for every way jobs come in (the
//! admin contract on any table, [`JobTable`](crate::JobTable) on the
//! default table, on sqlx and on diesel), so that all of them insert the
//! same way and keep unique keys by the same rule (see
//! [`crate::unique`]).

use queue_core::JobState;

use super::admin::notified;
use super::{literal, Builder, Names, Param, Statement, TableShape};
use crate::ident::QualifiedName;
use crate::options::{Column, PgStoreOptions};

/// A table's enqueue statements.
#[derive(Debug, Clone)]
pub(crate) struct EnqueueStatements {
    /// Inserts jobs that set nothing but their kind, payload, priority
    /// and due time ([`EnqueueTable::plain`]): fewer arrays to send and
    /// unpack than [`EnqueueStatements::plain`].
    pub bare: Statement,
    /// [`EnqueueStatements::bare`] of one job ([`Param::Kind`],
    /// [`Param::Payload`], [`Param::Priority`], [`Param::ProcessAfter`]).
    pub one: Statement,
    /// Inserts jobs without unique keys ([`EnqueueTable::plain`]).
    pub plain: Statement,
    /// Inserts jobs some of which have unique keys
    /// ([`EnqueueTable::unique`]); `None` without a unique key column.
    pub unique: Option<Statement>,
}

impl EnqueueStatements {
    /// The statements of the table `options` name, as the catalog found
    /// it (`shape`), with its columns' quoted names.
    pub(super) fn new(options: &PgStoreOptions, shape: &TableShape, names: &Names) -> Self {
        // The default table's trigger notifies the default channel on every
        // insert; any other table, or channel, needs the enqueue to.
        let notify = !(shape.notify_trigger
            && options.notify_channel() == crate::options::default_channel(&options.table.name));
        let table = EnqueueTable {
            table: options.table.quoted(),
            names,
            shape,
            states: &options.states,
            notify,
        };
        EnqueueStatements {
            bare: table.plain(Input::Bare),
            one: table.plain(Input::One),
            plain: table.plain(Input::Options),
            unique: table.unique(),
        }
    }

    /// The statements of the default table at `table` at its newest
    /// version, known without reading the catalog: what
    /// [`JobTable`](crate::JobTable) enqueues with.
    pub(crate) fn default_table(table: &QualifiedName, in_place_claims: bool) -> Self {
        let options = crate::JobTable::options_for(table);
        let shape = TableShape {
            in_place_claims,
            ..TableShape::default_table()
        };
        // Every standard column but the attempts-left countdown: the
        // default table counts failures up against `max_attempts`.
        let names = Names::new(&options, &[Column::AttemptsLeft], None);
        EnqueueStatements::new(&options, &shape, &names)
    }
}

/// What an enqueue statement takes of each job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Input {
    /// Kind, payload, priority and due time: the columns' defaults for the
    /// rest.
    Bare,
    /// The same of one job, bound one by one rather than as arrays: a
    /// single enqueue is planned and run as a plain `INSERT` of one row.
    One,
    /// Those, and the job's limits and expiry, where the table keeps them.
    Options,
    /// Those, and the unique key and its scope.
    Unique,
}

/// What the enqueue statements are built from.
struct EnqueueTable<'a> {
    /// The table, schema-qualified and quoted.
    table: String,
    names: &'a Names,
    shape: &'a TableShape,
    states: &'a crate::options::StateValues,
    /// Whether the statement notifies [`Param::Channel`] itself.
    notify: bool,
}

impl EnqueueTable<'_> {
    /// `CAST('value' AS state type)` of a state.
    fn state_value(&self, state: JobState) -> String {
        format!(
            "CAST({} AS {})",
            literal(self.states.get(state)),
            self.shape.state_type
        )
    }

    /// `state IN (..)` of the given states.
    fn state_in(&self, states: &[JobState]) -> String {
        let values: Vec<String> = states.iter().map(|s| self.state_value(*s)).collect();
        format!(
            "{} IN ({})",
            self.names.must(Column::State),
            values.join(", ")
        )
    }

    /// Inserts jobs from arrays ([`Param::Kinds`], [`Param::Payloads`],
    /// [`Param::Priorities`], [`Param::ProcessAfters`], and with
    /// [`Input::Options`] each job's limits and expiry) into the columns
    /// the table has, queued; returns their keys in order. With `notify`
    /// (a table without the default table's trigger on the store's
    /// channel) it also notifies [`Param::Channel`]: an initplan, run once
    /// per statement, so one round trip does both.
    fn plain(&self, input: Input) -> Statement {
        let mut b = Builder::default();
        let (source, columns, values) = self.enqueue_input(&mut b, input);
        let notified = if self.notify {
            notified(&mut b)
        } else {
            String::new()
        };
        b.push(&format!(
            "INSERT INTO {table} ({}) SELECT {} FROM {source} RETURNING {}{notified}",
            columns.join(", "),
            values.join(", "),
            self.names.must(Column::Id),
            table = self.table,
        ));
        b.build()
    }

    /// Inserts jobs from the arrays of [`EnqueueTable::plain`] with
    /// options and [`Param::UniqueKeys`] (and [`Param::UniqueForevers`]
    /// when the table keeps the scope), skipping each whose key the
    /// table's unique index says is held. Returns the inserted jobs (`id`,
    /// `unique_key`, `inserted` true, in order) and then, for each key
    /// that was held, the job holding it (`inserted` false): see
    /// [`crate::unique`].
    ///
    /// The holders are looked up one key at a time through the unique
    /// index, and only for the keys the insert skipped: none at all in
    /// the common case of new keys. (A scan for the keys all at once, `=
    /// ANY` of the array, compares each row with every key under a
    /// generic plan: 50 times slower at 5,000 keys.)
    fn unique(&self) -> Option<Statement> {
        let names = &self.names;
        let key = names.at(Column::UniqueKey)?;
        let (table, a, id) = (&self.table, &names.alias, names.must(Column::Id));
        let mut b = Builder::default();
        let (source, columns, values) = self.enqueue_input(&mut b, Input::Unique);
        let notified = if self.notify {
            notified(&mut b)
        } else {
            String::new()
        };
        let active = self.state_in(&[JobState::Queued, JobState::Processing, JobState::Errored]);
        // Without a scope column the table's own index decides which rows
        // hold a key: prefer a waiting or running one, then the newest.
        let holds = match names.at(Column::UniqueForever) {
            Some(forever) => {
                // A table whose claims are in place keeps keys unique by
                // the times (its unique index's predicate, spelled the
                // same so that the planner reads that index).
                let by_times = self
                    .shape
                    .unfinished_times(names)
                    .map(|times| format!(" AND ({forever} OR {times})"))
                    .unwrap_or_default();
                format!(" AND ({forever} OR {active}){by_times}")
            }
            None => String::new(),
        };
        b.push(&format!(
            "WITH \"__queue_input\" AS (SELECT * FROM {source}), \
             \"__queue_inserted\" AS (INSERT INTO {table} AS {a} ({columns}) SELECT {values} FROM \"__queue_input\" AS u \
             ON CONFLICT DO NOTHING RETURNING {id} AS \"id\", CAST({key} AS text) AS \"unique_key\") \
             SELECT \"id\", \"unique_key\", true AS \"inserted\"{notified} FROM \"__queue_inserted\" \
             UNION ALL \
             SELECT h.\"id\", h.\"unique_key\", false{none} \
             FROM (SELECT DISTINCT k.\"unique_key\" FROM \"__queue_input\" AS k WHERE k.\"unique_key\" IS NOT NULL \
             AND NOT EXISTS (SELECT 1 FROM \"__queue_inserted\" AS i WHERE i.\"unique_key\" = k.\"unique_key\")) AS k \
             CROSS JOIN LATERAL (SELECT {id} AS \"id\", CAST({key} AS text) AS \"unique_key\" \
             FROM {table} AS {a} WHERE {key} = k.\"unique_key\"{holds} \
             ORDER BY ({active}) DESC, {id} DESC LIMIT 1) AS h",
            columns = columns.join(", "),
            values = values.join(", "),
            none = if self.notify { ", NULL::int4" } else { "" },
        ));
        Some(b.build())
    }

    /// Where the enqueue reads its jobs from (`u`: `unnest(..)` of the
    /// arrays, or one row), and the columns with the values that fill
    /// them, for `input`.
    fn enqueue_input(&self, b: &mut Builder, input: Input) -> (String, Vec<String>, Vec<String>) {
        let names = &self.names;
        let mut arrays = vec![
            (Param::Kinds, "text[]", "kind"),
            (Param::Payloads, "jsonb[]", "payload"),
            (Param::Priorities, "int8[]", "priority"),
            (Param::ProcessAfters, "timestamptz[]", "process_after"),
        ];
        let mut filled = vec![
            (Column::Kind, "kind"),
            (Column::Payload, "payload"),
            (Column::Priority, "priority"),
            (Column::ProcessAfter, "process_after"),
        ];
        // A job's own limit goes to the countdown column when the table
        // keeps one instead (the catalog refuses a table with both).
        let limit_column = if names.get(Column::AttemptsLeft).is_some() {
            Column::AttemptsLeft
        } else {
            Column::MaxAttempts
        };
        for (param, ty, field, column) in [
            (Param::MaxAttemptses, "int8[]", "max_attempts", limit_column),
            (
                Param::ExpiresAts,
                "timestamptz[]",
                "expires_at",
                Column::ExpiresAt,
            ),
            (
                Param::AtMostOnces,
                "bool[]",
                "at_most_once",
                Column::AtMostOnce,
            ),
        ] {
            if matches!(input, Input::Options | Input::Unique) && names.get(column).is_some() {
                arrays.push((param, ty, field));
                filled.push((column, field));
            }
        }
        if input == Input::Unique {
            arrays.push((Param::UniqueKeys, "text[]", "unique_key"));
            filled.push((Column::UniqueKey, "unique_key"));
            if names.get(Column::UniqueForever).is_some() {
                arrays.push((Param::UniqueForevers, "bool[]", "unique_forever"));
                filled.push((Column::UniqueForever, "unique_forever"));
            }
        }
        // One job's fields are one row of scalars; many jobs' are arrays,
        // unnested into rows.
        let source = if input == Input::One {
            let fields: Vec<String> = arrays
                .iter()
                .map(|(param, ty, field)| {
                    let scalar = ty.trim_end_matches("[]");
                    format!("CAST({} AS {scalar}) AS {field}", b.p(one_of(*param)))
                })
                .collect();
            format!("(SELECT {}) AS u", fields.join(", "))
        } else {
            let unnest: Vec<String> = arrays
                .iter()
                .map(|(param, ty, _)| format!("CAST({} AS {ty})", b.p(*param)))
                .collect();
            let fields: Vec<&str> = arrays.iter().map(|(_, _, f)| *f).collect();
            format!("unnest({}) AS u({})", unnest.join(", "), fields.join(", "))
        };
        let mut columns = Vec::new();
        let mut values = Vec::new();
        for (c, field) in filled {
            if let Some(n) = names.get(c) {
                columns.push(n.to_owned());
                values.push(match (c, self.shape.payload_type.as_deref()) {
                    (Column::Payload, Some(ty)) => format!("CAST(u.{field} AS {ty})"),
                    // Without a limit of its own, the column's default.
                    (Column::AttemptsLeft, _) => match &self.shape.attempts_left_default {
                        Some(default) => format!("COALESCE(u.{field}, {default})"),
                        None => format!("u.{field}"),
                    },
                    _ => format!("u.{field}"),
                });
            }
        }
        columns.push(names.get(Column::State).unwrap_or("\"state\"").to_owned());
        values.push(self.state_value(JobState::Queued));
        (source, columns, values)
    }
}

/// The parameter of one job's field, for the array of many jobs' `param`.
fn one_of(param: Param) -> Param {
    match param {
        Param::Kinds => Param::Kind,
        Param::Payloads => Param::Payload,
        Param::Priorities => Param::Priority,
        Param::ProcessAfters => Param::ProcessAfter,
        // Only the bare fields come one by one.
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ident::Ident;

    /// Each statement takes the arrays its jobs need and no more: the
    /// bare insert only the four every job sets, the others each job's
    /// limits and expiry too, the unique one its key and scope.
    #[test]
    fn each_statement_binds_what_its_jobs_set() {
        let table = QualifiedName::new(Ident::new("public").unwrap(), Ident::new("jobs").unwrap());
        let statements = EnqueueStatements::default_table(&table, false);
        let four = [
            Param::Kinds,
            Param::Payloads,
            Param::Priorities,
            Param::ProcessAfters,
        ];
        let options = [Param::MaxAttemptses, Param::ExpiresAts, Param::AtMostOnces];
        assert_eq!(statements.bare.params, four);
        assert_eq!(
            statements.one.params,
            [
                Param::Kind,
                Param::Payload,
                Param::Priority,
                Param::ProcessAfter
            ]
        );
        assert!(!statements.one.text.contains("unnest"));
        assert_eq!(statements.plain.params, [&four[..], &options[..]].concat());
        let unique = statements
            .unique
            .expect("the default table keeps unique keys");
        assert_eq!(
            unique.params,
            [
                &four[..],
                &options[..],
                &[Param::UniqueKeys, Param::UniqueForevers][..]
            ]
            .concat()
        );
        assert!(
            !unique.text.contains("= ANY("),
            "holders are looked up key by key: {}",
            unique.text
        );
    }
}
