//! Statements prepared by name in SQL (`PREPARE` / `EXECUTE`), for the job
//! transaction's two round trips.
//!
//! sqlx sends each bound statement in a round trip of its own and cannot
//! pipeline, so a job's transaction cost four: `BEGIN`, the lock, the
//! completion, `COMMIT`. A simple-protocol query can carry several
//! statements, but it cannot bind values, and a statement in it is planned
//! on every call. `EXECUTE` of a statement prepared once per connection
//! gets both: `BEGIN; EXECUTE lock(..)` and `EXECUTE complete(..); COMMIT`,
//! each one round trip on a cached plan. The arguments are literals: the
//! job's key, its claim token and a timestamp, each escaped by [`literal`].

use super::{literal, Param, Statement};

/// The message (inside a failed integer cast, SQLSTATE 22P02) with which a
/// held-job statement reports that the job's row is no longer this claim's.
/// Plain SQL cannot raise an error of its own, and a simple-protocol query
/// must fail to stop the `COMMIT` that follows the completion.
pub(crate) const NOT_HELD: &str = "queue: the job is no longer held by this claim";

/// A statement with a name of its own, prepared in SQL on each connection
/// that runs it.
#[derive(Debug, Clone)]
pub(crate) struct Prepared {
    /// `queue_<purpose>_<hash of the text>`: stores with the same statement
    /// share it; any change to the text gets a new name.
    pub name: String,
    statement: Statement,
}

impl Prepared {
    /// Names `statement`; the parameters' types are inferred when prepared.
    pub(crate) fn new(purpose: &str, statement: Statement) -> Prepared {
        Prepared {
            name: format!("queue_{purpose}_{:016x}", fnv1a(&statement.text)),
            statement,
        }
    }

    /// `PREPARE name AS ...`.
    pub(crate) fn prepare(&self) -> String {
        format!("PREPARE {} AS {}", self.name, self.statement.text)
    }

    /// `EXECUTE name(..)` with each parameter's value from `value`, already
    /// a literal; `None` if a parameter has no value (a bug in this crate).
    pub(crate) fn execute(&self, mut value: impl FnMut(Param) -> Option<String>) -> Option<String> {
        let args = self
            .statement
            .params
            .iter()
            .map(|p| value(*p))
            .collect::<Option<Vec<_>>>()?;
        Some(format!("EXECUTE {}({})", self.name, args.join(", ")))
    }

    /// The statement's text (tests).
    #[cfg(test)]
    pub(crate) fn text(&self) -> &str {
        &self.statement.text
    }
}

/// A `DO` block that prepares each of `statements` the connection does not
/// hold yet. Sent ahead of a statement's first `EXECUTE` on a connection
/// the store has not seen prepare them, so that it never fails for want of
/// them: executing first and preparing on the error (26000) would leave an
/// `ERROR` in the server's log for every new connection. A prepared
/// statement belongs to the session, and survives the transaction it was
/// made in.
pub(crate) fn prepare_missing(statements: &[&Prepared]) -> String {
    let body: String = statements
        .iter()
        .map(|p| {
            format!(
                "IF NOT EXISTS (SELECT FROM pg_catalog.pg_prepared_statements WHERE name = {}) \
                 THEN EXECUTE {}; END IF; ",
                literal(&p.name),
                literal(&p.prepare())
            )
        })
        .collect();
    format!("DO {}", literal(&format!("BEGIN {body}END")))
}

/// `SELECT 1` when exactly one row was locked or updated (`rows`, a
/// subquery), the [`NOT_HELD`] error otherwise.
pub(crate) fn exactly_one(rows: &str) -> String {
    format!(
        "SELECT CASE count(*) WHEN 1 THEN 1 ELSE CAST({} || count(*) AS int4) END FROM {rows}",
        literal(&format!("{NOT_HELD}; rows: "))
    )
}

/// FNV-1a: a hash that is the same in every build, for statement names.
fn fnv1a(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325, |hash, byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn statement(text: &str, params: Vec<Param>) -> Statement {
        Statement {
            text: text.into(),
            params,
        }
    }

    #[test]
    fn names_follow_the_text() {
        let a = Prepared::new("lock", statement("SELECT $1", vec![Param::Id]));
        let same = Prepared::new("lock", statement("SELECT $1", vec![Param::Id]));
        let other = Prepared::new("lock", statement("SELECT $1 + 1", vec![Param::Id]));
        assert_eq!(a.name, same.name);
        assert_ne!(a.name, other.name);
        assert!(a.name.starts_with("queue_lock_"), "{}", a.name);
        assert_eq!(a.prepare(), format!("PREPARE {} AS SELECT $1", a.name));
    }

    #[test]
    fn arguments_are_escaped_literals_in_parameter_order() {
        let p = Prepared::new(
            "complete",
            statement("SELECT $1, $2", vec![Param::Token, Param::Id]),
        );
        let text = p
            .execute(|param| {
                Some(literal(match param {
                    Param::Id => "it's a \\ key",
                    _ => "7",
                }))
            })
            .unwrap();
        assert_eq!(
            text,
            format!("EXECUTE {}(E'7', E'it''s a \\\\ key')", p.name)
        );
        assert_eq!(p.execute(|_| None), None);
    }
}
