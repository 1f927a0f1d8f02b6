//! SQL identifiers: validated once, always written quoted.

use std::fmt;

use crate::error::OptionsError;

/// A Postgres identifier (a schema, table, view, column or type name).
///
/// Validated when built (non-empty, at most 63 bytes, no NUL) and always
/// written quoted with embedded quotes doubled, so any name, including one
/// with spaces, upper case, quotes or SQL keywords, refers to exactly that
/// object and never becomes SQL.
///
/// ```
/// use queue_store_postgres::Ident;
/// let name = Ident::new("Jobs \"2024\"").unwrap();
/// assert_eq!(name.quoted(), "\"Jobs \"\"2024\"\"\"");
/// assert!(Ident::new("").is_err());
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Ident(String);

impl Ident {
    /// Validates `name`.
    pub fn new(name: impl Into<String>) -> Result<Ident, OptionsError> {
        let name = name.into();
        if name.is_empty() {
            return Err(OptionsError::InvalidIdent {
                name,
                problem: "it is empty",
            });
        }
        if name.len() > 63 {
            return Err(OptionsError::InvalidIdent {
                name,
                problem: "it is longer than Postgres' 63-byte limit",
            });
        }
        if name.contains('\0') {
            return Err(OptionsError::InvalidIdent {
                name,
                problem: "it contains a NUL character",
            });
        }
        Ok(Ident(name))
    }

    /// The name as given.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The name quoted for SQL.
    pub fn quoted(&self) -> String {
        format!("\"{}\"", self.0.replace('"', "\"\""))
    }
}

impl fmt::Display for Ident {
    /// Writes the quoted form, so messages show exactly what SQL uses.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.quoted())
    }
}

/// A schema-qualified name: two identifiers, never a dotted string.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct QualifiedName {
    /// The schema.
    pub schema: Ident,
    /// The object in it.
    pub name: Ident,
}

impl QualifiedName {
    /// `schema.name`.
    pub fn new(schema: Ident, name: Ident) -> Self {
        QualifiedName { schema, name }
    }

    /// The quoted, qualified form.
    pub fn quoted(&self) -> String {
        format!("{}.{}", self.schema.quoted(), self.name.quoted())
    }
}

impl fmt::Display for QualifiedName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.quoted())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn awkward_names_are_quoted_and_hostile_ones_stay_names() {
        for (name, quoted) in [
            ("jobs", "\"jobs\""),
            ("Jobs", "\"Jobs\""),
            ("select", "\"select\""),
            ("my jobs", "\"my jobs\""),
            ("a\"b", "\"a\"\"b\""),
            ("x\"; DROP TABLE jobs; --", "\"x\"\"; DROP TABLE jobs; --\""),
        ] {
            assert_eq!(Ident::new(name).unwrap().quoted(), quoted);
        }
    }

    #[test]
    fn invalid_names_are_rejected_with_the_reason() {
        let long = "x".repeat(64);
        let err = Ident::new(long).unwrap_err().to_string();
        assert!(err.contains("63-byte"), "{err}");
        assert!(Ident::new("a\0b").unwrap_err().to_string().contains("NUL"));
        assert!(Ident::new("x".repeat(63)).is_ok());
    }
}
