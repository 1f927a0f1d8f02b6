//! [`PgKeyType`]: which of the supported key types a table's key column
//! has, for tools that pick the key type at run time (the `queue` CLI).

use queue_core::StoreError;
use sqlx::PgPool;

use crate::error::store_error;
use crate::options::{Column, PgStoreOptions};

/// A key column type the store supports, named as in a config file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "config", derive(serde::Deserialize))]
#[cfg_attr(feature = "config", serde(rename_all = "lowercase"))]
pub enum PgKeyType {
    /// `integer`, decoded as `i32`.
    #[cfg_attr(feature = "config", serde(alias = "integer"))]
    Int4,
    /// `bigint` (the default table's), decoded as `i64`.
    #[cfg_attr(feature = "config", serde(alias = "bigint"))]
    Int8,
    /// `uuid`, decoded as `uuid::Uuid`.
    Uuid,
    /// `text` or `varchar`, decoded as `String`.
    #[cfg_attr(feature = "config", serde(alias = "varchar"))]
    Text,
}

const KEY_COLUMN_TYPE: &str = "SELECT format_type(a.atttypid, a.atttypmod) \
     FROM pg_catalog.pg_attribute a \
     WHERE a.attrelid = to_regclass($1) AND a.attname = $2 AND a.attnum > 0 AND NOT a.attisdropped";

impl PgKeyType {
    /// The key type of a column of this `format_type`, if supported.
    pub fn of_column_type(type_name: &str) -> Option<PgKeyType> {
        match type_name {
            "integer" => Some(PgKeyType::Int4),
            "bigint" => Some(PgKeyType::Int8),
            "uuid" => Some(PgKeyType::Uuid),
            t if t == "text" || t.starts_with("character varying") => Some(PgKeyType::Text),
            _ => None,
        }
    }

    /// Reads the key column's type from the catalog.
    pub async fn detect(pool: &PgPool, options: &PgStoreOptions) -> Result<PgKeyType, StoreError> {
        let table = options.table_name();
        let column = options
            .column_name(Column::Id)
            .map(|c| c.as_str().to_owned())
            .unwrap_or_else(|| "id".into());
        let found: Option<String> = sqlx::query_scalar(KEY_COLUMN_TYPE)
            .bind(table.quoted())
            .bind(&column)
            .fetch_optional(pool)
            .await
            .map_err(|e| store_error("reading the key column's type", e))?;
        let Some(type_name) = found else {
            return Err(StoreError::Config(format!(
                "table {table} does not exist or has no key column \"{column}\"; create it (the default table: `queue migrate`) or map the key column"
            )));
        };
        PgKeyType::of_column_type(&type_name).ok_or_else(|| {
            StoreError::Config(format!(
                "key column \"{column}\" of {table} has type {type_name}; supported key types are integer, bigint, uuid and text"
            ))
        })
    }
}
