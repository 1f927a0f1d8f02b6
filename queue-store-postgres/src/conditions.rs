//! Extra dequeue conditions: SQL fragments with bound values, returned by a
//! PreDequeue hook.

use chrono::{DateTime, Utc};

/// A value bound to a [`PgCondition`] placeholder.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum PgArg {
    /// `bigint`.
    Int(i64),
    /// `double precision`.
    Float(f64),
    /// `boolean`.
    Bool(bool),
    /// `text`.
    Text(String),
    /// `uuid`.
    Uuid(uuid::Uuid),
    /// `jsonb`.
    Json(serde_json::Value),
    /// `timestamptz`.
    Timestamp(DateTime<Utc>),
    /// `text[]`.
    TextArray(Vec<String>),
    /// `bigint[]`.
    IntArray(Vec<i64>),
}

macro_rules! arg_from {
    ($($t:ty => $variant:ident $(via $conv:expr)?),* $(,)?) => {
        $(impl From<$t> for PgArg {
            fn from(value: $t) -> Self {
                PgArg::$variant($($conv)?(value))
            }
        })*
    };
}

arg_from! {
    i64 => Int,
    i32 => Int via i64::from,
    u32 => Int via i64::from,
    f64 => Float,
    bool => Bool,
    String => Text,
    &str => Text via str::to_owned,
    uuid::Uuid => Uuid,
    serde_json::Value => Json,
    DateTime<Utc> => Timestamp,
    Vec<String> => TextArray,
    Vec<i64> => IntArray,
}

/// One condition on the claimed rows: an SQL boolean expression over the
/// table alias, with `{}` where each bound value goes. The SQL is written by
/// the developer; values are never interpolated. As in Rust's format
/// strings, `{{` and `}}` stand for literal braces (`'{{}}'::jsonb` is the
/// empty JSON object); any other brace is kept as written.
///
/// ```
/// use queue_store_postgres::PgCondition;
/// // Only jobs of the listed kinds whose estimated cost fits the headroom.
/// let fits = PgCondition::new("jobs.cost <= {} AND jobs.kind = ANY({})")
///     .bind(8i64)
///     .bind(vec!["resize".to_owned(), "encode".to_owned()]);
/// assert_eq!(fits.args().len(), 2);
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct PgCondition {
    sql: String,
    args: Vec<PgArg>,
}

/// The conditions a PreDequeue hook returns for the Postgres store; all must
/// hold.
pub type PgConditions = Vec<PgCondition>;

impl PgCondition {
    /// A condition with `{}` placeholders, bound in order with
    /// [`PgCondition::bind`].
    pub fn new(sql: impl Into<String>) -> Self {
        PgCondition {
            sql: sql.into(),
            args: Vec::new(),
        }
    }

    /// Binds the next placeholder.
    pub fn bind(mut self, value: impl Into<PgArg>) -> Self {
        self.args.push(value.into());
        self
    }

    /// The bound values, in order.
    pub fn args(&self) -> &[PgArg] {
        &self.args
    }

    /// How many `{}` placeholders the SQL has (escaped braces not
    /// counted).
    pub fn placeholders(&self) -> usize {
        self.pieces().len() - 1
    }

    /// The SQL with each `{}` replaced by `$next`, `$next + 1`, ... and
    /// each escaped brace by the brace.
    pub(crate) fn numbered(&self, next: &mut usize) -> String {
        let mut pieces = self.pieces().into_iter();
        let mut out = pieces.next().unwrap_or_default();
        for piece in pieces {
            out.push('$');
            out.push_str(&next.to_string());
            *next += 1;
            out.push_str(&piece);
        }
        out
    }

    /// The SQL between placeholders, escapes resolved.
    fn pieces(&self) -> Vec<String> {
        let mut pieces = vec![String::new()];
        let mut chars = self.sql.chars().peekable();
        while let Some(c) = chars.next() {
            let piece = pieces.last_mut().expect("never empty");
            match (c, chars.peek()) {
                ('{', Some('{')) | ('}', Some('}')) => {
                    chars.next();
                    piece.push(c);
                }
                ('{', Some('}')) => {
                    chars.next();
                    pieces.push(String::new());
                }
                _ => piece.push(c),
            }
        }
        pieces
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placeholders_are_numbered_from_the_given_start() {
        let c = PgCondition::new("a = {} OR b = {}").bind(1i64).bind("x");
        let mut next = 4;
        assert_eq!(c.numbered(&mut next), "a = $4 OR b = $5");
        assert_eq!(next, 6);
        assert_eq!(c.placeholders(), 2);
    }

    #[test]
    fn doubled_braces_are_literal_braces() {
        let c = PgCondition::new("jobs.meta <> '{{}}'::jsonb AND jobs.kind = {}").bind("x");
        assert_eq!(c.placeholders(), 1);
        let mut next = 1;
        assert_eq!(
            c.numbered(&mut next),
            "jobs.meta <> '{}'::jsonb AND jobs.kind = $1"
        );
        let json = PgCondition::new(r#"jobs.meta @> '{"tier": 1}'::jsonb"#);
        assert_eq!(json.placeholders(), 0, "a lone brace is kept as written");
        assert_eq!(
            json.numbered(&mut next),
            r#"jobs.meta @> '{"tier": 1}'::jsonb"#
        );
        let escaped = PgCondition::new("'{{{}}}'").bind(1i64);
        assert_eq!(escaped.placeholders(), 1);
        assert_eq!(escaped.numbered(&mut 1), "'{$1}'");
    }
}
