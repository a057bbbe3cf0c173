//! Logical backup and restore of the whole store, the same on every backend: every
//! table's rows as JSON objects (text as strings, integers as numbers, blobs as
//! base64), read in one snapshot, and written back into an empty store.
//!
//! [`SCHEMA`] lists every table and column; a test checks it against the
//! migrations, so a new column cannot be left out of backups unnoticed.

use base64::Engine as _;
use futures::TryStreamExt;
use serde_json::{Map, Value};
use sqlx::Row;
use sqlx::any::AnyRow;

use crate::db::Backend;
use crate::query::Builder;
use crate::{Result, SqlStore, StoreError};

/// How a column's values are stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Text,
    Int,
    Blob,
}

/// One table: its columns, and the order rows are exported in (its key).
#[derive(Debug)]
pub struct Table {
    pub name: &'static str,
    pub columns: &'static [(&'static str, Kind)],
    order: &'static str,
    /// An identity column whose sequence must follow the imported rows (PostgreSQL).
    identity: Option<&'static str>,
}

use Kind::{Blob, Int, Text};

/// Every table, parents before the tables whose foreign keys name them.
pub const SCHEMA: &[Table] = &[
    Table {
        name: "namespaces",
        columns: &[("name", Text), ("created_at", Text)],
        order: "name",
        identity: None,
    },
    Table {
        name: "namespace_quotas",
        columns: &[("namespace", Text), ("quota", Text)],
        order: "namespace",
        identity: None,
    },
    Table {
        name: "functions",
        columns: &[
            ("namespace", Text),
            ("name", Text),
            ("spec", Text),
            ("status", Text),
            ("revision", Int),
            ("code_sha256", Text),
            ("created_at", Text),
            ("updated_at", Text),
            ("generation", Int),
        ],
        order: "namespace, name",
        identity: None,
    },
    Table {
        name: "triggers",
        columns: &[
            ("namespace", Text),
            ("name", Text),
            ("function", Text),
            ("kind", Text),
            ("spec", Text),
            ("status", Text),
            ("created_at", Text),
            ("updated_at", Text),
            ("generation", Int),
        ],
        order: "namespace, name",
        identity: None,
    },
    Table {
        name: "jobs",
        columns: &[
            ("namespace", Text),
            ("name", Text),
            ("spec", Text),
            ("status", Text),
            ("code_sha256", Text),
            ("created_at", Text),
            ("updated_at", Text),
            ("generation", Int),
        ],
        order: "namespace, name",
        identity: None,
    },
    Table {
        name: "secrets",
        columns: &[
            ("namespace", Text),
            ("name", Text),
            ("sealed", Text),
            ("digest", Text),
            ("created_at", Text),
            ("updated_at", Text),
        ],
        order: "namespace, name",
        identity: None,
    },
    Table {
        name: "devices",
        columns: &[
            ("namespace", Text),
            ("name", Text),
            ("spec", Text),
            ("password_hash", Text),
            ("messages", Int),
            ("last_seen_at", Int),
            ("created_at", Text),
            ("updated_at", Text),
        ],
        order: "namespace, name",
        identity: None,
    },
    Table {
        name: "tokens",
        columns: &[
            ("hash", Text),
            ("namespace", Text),
            ("created_at", Text),
            ("last_used_at", Text),
        ],
        order: "hash",
        identity: None,
    },
    Table {
        name: "blob_sizes",
        columns: &[("sha256", Text), ("compressed", Int), ("unpacked", Int)],
        order: "sha256",
        identity: None,
    },
    Table {
        name: "async_calls",
        columns: &[
            ("seq", Int),
            ("id", Text),
            ("namespace", Text),
            ("function", Text),
            ("phase", Text),
            ("attempts", Int),
            ("event", Blob),
            ("request_id", Text),
            ("callback_url", Text),
            ("response_status", Int),
            ("response_headers", Text),
            ("response_body", Blob),
            ("error", Text),
            ("redrive_of", Text),
            ("queued_at", Int),
            ("started_at", Int),
            ("finished_at", Int),
        ],
        order: "seq",
        identity: Some("seq"),
    },
    Table {
        name: "dead_letters",
        columns: &[
            ("id", Text),
            ("namespace", Text),
            ("source", Text),
            ("trigger", Text),
            ("function", Text),
            ("payload", Blob),
            ("message", Text),
            ("attempts", Int),
            ("last_status", Int),
            ("error", Text),
            ("failed_at", Int),
        ],
        order: "id",
        identity: None,
    },
    Table {
        name: "telemetry",
        columns: &[
            ("id", Int),
            ("namespace", Text),
            ("device", Text),
            ("received_at", Int),
            ("payload", Text),
        ],
        order: "id",
        identity: Some("id"),
    },
    Table {
        name: "invocations",
        columns: &[
            ("namespace", Text),
            ("started_at", Int),
            ("id", Text),
            ("function", Text),
            ("revision", Int),
            ("source", Text),
            ("request_id", Text),
            ("duration_us", Int),
            ("status", Int),
            ("cold_start", Int),
            ("error", Text),
            ("attempt", Int),
            ("trigger", Text),
            ("call_id", Text),
        ],
        order: "namespace, started_at, id",
        identity: None,
    },
    Table {
        name: "audit",
        columns: &[
            ("id", Text),
            ("at_us", Int),
            ("actor", Text),
            ("namespace", Text),
            ("action", Text),
            ("object_kind", Text),
            ("object_name", Text),
            ("address", Text),
            ("status", Int),
        ],
        order: "id",
        identity: None,
    },
];

/// The table named `name`.
pub fn table(name: &str) -> Option<&'static Table> {
    SCHEMA.iter().find(|t| t.name == name)
}

/// Rows inserted per statement on import.
const IMPORT_BATCH: usize = 200;

fn select_sql(t: &Table) -> String {
    let columns: Vec<&str> = t.columns.iter().map(|(c, _)| *c).collect();
    format!(
        "SELECT {} FROM {} ORDER BY {}",
        columns.join(", "),
        t.name,
        t.order
    )
}

fn row_to_json(t: &Table, row: &AnyRow) -> Result<Map<String, Value>> {
    let mut out = Map::new();
    for (i, (column, kind)) in t.columns.iter().enumerate() {
        let value = match kind {
            Text => row.try_get::<Option<String>, _>(i)?.map(Value::String),
            Int => row.try_get::<Option<i64>, _>(i)?.map(Value::from),
            Blob => row
                .try_get::<Option<Vec<u8>>, _>(i)?
                .map(|b| Value::String(base64::engine::general_purpose::STANDARD.encode(b))),
        };
        out.insert((*column).to_string(), value.unwrap_or(Value::Null));
    }
    Ok(out)
}

/// A row of a backup that does not fit its table.
fn bad_row(t: &Table, column: &str, why: &str) -> StoreError {
    StoreError::Config(format!("backup: table {}, column {column}: {why}", t.name))
}

impl SqlStore {
    /// Reads every table in one consistent snapshot, handing each row to `row`
    /// (table by table, in [`SCHEMA`] order).
    pub async fn export(
        &self,
        row: &mut (dyn FnMut(&'static Table, Map<String, Value>) -> Result<()> + Send),
    ) -> Result<()> {
        let mut tx = self.pool().begin().await?;
        if self.backend() == Backend::Postgres {
            sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
                .execute(&mut *tx)
                .await?;
        }
        for t in SCHEMA {
            let sql = select_sql(t);
            let mut rows = sqlx::query(sqlx::AssertSqlSafe(sql)).fetch(&mut *tx);
            while let Some(r) = rows.try_next().await? {
                row(t, row_to_json(t, &r)?)?;
            }
        }
        tx.commit().await?;
        Ok(())
    }

    /// The first table that holds rows, if any: a restore goes only into an empty
    /// store (one that only holds the `default` namespace a server creates at start).
    pub async fn first_nonempty_table(&self) -> Result<Option<&'static str>> {
        for t in SCHEMA {
            let sql = if t.name == "namespaces" {
                "SELECT COUNT(*) FROM namespaces WHERE name <> 'default'".to_string()
            } else {
                format!("SELECT COUNT(*) FROM {}", t.name)
            };
            let n: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
                .fetch_one(self.pool())
                .await?;
            if n > 0 {
                return Ok(Some(t.name));
            }
        }
        Ok(None)
    }

    /// Starts writing a backup back into this (empty) store: all of it lands at
    /// [`Import::commit`], or none.
    pub async fn begin_import(&self) -> Result<Import> {
        if let Some(table) = self.first_nonempty_table().await? {
            return Err(StoreError::Config(format!(
                "the store is not empty (table {table} holds rows): restore into a new data directory or database"
            )));
        }
        let mut tx = self.begin_write().await?;
        // The `default` namespace a server creates at start comes back from the backup.
        sqlx::query("DELETE FROM namespaces WHERE name = 'default'")
            .execute(&mut *tx)
            .await?;
        Ok(Import {
            tx,
            backend: self.backend(),
            rows: 0,
        })
    }
}

/// A restore in progress (one transaction).
pub struct Import {
    tx: sqlx::Transaction<'static, sqlx::Any>,
    backend: Backend,
    rows: u64,
}

impl Import {
    /// Inserts `rows` into `table`; every column of the table must be present
    /// (`null` where empty).
    pub async fn rows(&mut self, table: &'static Table, rows: &[Map<String, Value>]) -> Result<()> {
        for chunk in rows.chunks(IMPORT_BATCH) {
            let columns: Vec<&str> = table.columns.iter().map(|(c, _)| *c).collect();
            let mut q = Builder::new(
                self.backend,
                &format!(
                    "INSERT INTO {} ({}) VALUES ",
                    table.name,
                    columns.join(", ")
                ),
            );
            for (i, row) in chunk.iter().enumerate() {
                q.push(if i == 0 { "(" } else { ", (" });
                for (j, (column, kind)) in table.columns.iter().enumerate() {
                    if j > 0 {
                        q.push(", ");
                    }
                    let value = row
                        .get(*column)
                        .ok_or_else(|| bad_row(table, column, "missing"))?;
                    match (kind, value) {
                        (Text, Value::Null) => q.push_bind(None::<String>),
                        (Int, Value::Null) => q.push_bind(None::<i64>),
                        (Blob, Value::Null) => q.push_bind(None::<Vec<u8>>),
                        (Text, Value::String(s)) => q.push_bind(s.clone()),
                        (Int, Value::Number(n)) => q.push_bind(
                            n.as_i64()
                                .ok_or_else(|| bad_row(table, column, "not a 64-bit integer"))?,
                        ),
                        (Blob, Value::String(s)) => q.push_bind(
                            base64::engine::general_purpose::STANDARD
                                .decode(s)
                                .map_err(|_| bad_row(table, column, "not base64"))?,
                        ),
                        _ => return Err(bad_row(table, column, "a value of the wrong type")),
                    };
                }
                q.push(")");
            }
            q.build()?.execute(&mut *self.tx).await?;
            self.rows += chunk.len() as u64;
        }
        Ok(())
    }

    /// Rows inserted so far.
    pub fn count(&self) -> u64 {
        self.rows
    }

    /// Makes the restore visible. On PostgreSQL the identity columns' sequences move
    /// past the restored ids (SQLite's AUTOINCREMENT follows inserted ids itself).
    pub async fn commit(mut self) -> Result<u64> {
        if self.backend == Backend::Postgres {
            for t in SCHEMA {
                if let Some(column) = t.identity {
                    let sql = format!(
                        "SELECT setval(pg_get_serial_sequence('{0}', '{1}'), \
                         COALESCE((SELECT MAX({1}) FROM {0}), 0) + 1, false)",
                        t.name, column
                    );
                    sqlx::query(sqlx::AssertSqlSafe(sql))
                        .execute(&mut *self.tx)
                        .await?;
                }
            }
        }
        self.tx.commit().await?;
        Ok(self.rows)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Store;

    /// Every column of every table the migrations create is in [`SCHEMA`].
    #[tokio::test]
    async fn the_schema_list_covers_every_column() {
        let store = crate::testing::store().await;
        let sql = match store.backend() {
            Backend::Sqlite => {
                "SELECT m.name || '.' || p.name FROM sqlite_schema m JOIN pragma_table_info(m.name) p \
                 WHERE m.type = 'table' AND m.name NOT LIKE 'sqlite_%' AND m.name NOT LIKE '_sqlx%'"
            }
            Backend::Postgres => {
                "SELECT CAST(table_name || '.' || column_name AS TEXT) FROM information_schema.columns \
                 WHERE table_schema = 'public' AND table_name NOT LIKE '_sqlx%'"
            }
        };
        let mut actual: Vec<String> = sqlx::query_scalar(sql)
            .fetch_all(store.pool())
            .await
            .unwrap();
        actual.sort();
        let mut listed: Vec<String> = SCHEMA
            .iter()
            .flat_map(|t| {
                t.columns
                    .iter()
                    .map(move |(c, _)| format!("{}.{c}", t.name))
            })
            .collect();
        listed.sort();
        assert_eq!(listed, actual);
    }

    #[tokio::test]
    async fn a_backup_restores_into_an_empty_store_only() {
        let a = crate::testing::store().await;
        a.ensure_namespace("default").await.unwrap();
        a.ensure_namespace("team").await.unwrap();
        a.create_token("h1", "team").await.unwrap();
        sqlx::query(
            "INSERT INTO dead_letters (id, namespace, source, function, payload, message, attempts, last_status, failed_at) \
             VALUES ('d1', 'team', 'queue', 'f', $1, 'boom', 3, 500, 7)",
        )
        .bind(vec![0u8, 1, 2, 255])
        .execute(a.pool())
        .await
        .unwrap();
        let mut dump: Vec<(&'static Table, Map<String, Value>)> = Vec::new();
        a.export(&mut |t, row| {
            dump.push((t, row));
            Ok(())
        })
        .await
        .unwrap();

        let b = crate::testing::store().await;
        b.ensure_namespace("default").await.unwrap();
        let mut import = b.begin_import().await.unwrap();
        for (t, row) in &dump {
            import.rows(t, std::slice::from_ref(row)).await.unwrap();
        }
        assert_eq!(import.commit().await.unwrap(), dump.len() as u64);
        let names: Vec<String> = b
            .list_namespaces()
            .await
            .unwrap()
            .into_iter()
            .map(|n| n.name)
            .collect();
        assert_eq!(names, ["default", "team"]);
        assert_eq!(
            b.token_namespace("h1").await.unwrap().as_deref(),
            Some("team")
        );
        let payload: Vec<u8> =
            sqlx::query_scalar("SELECT payload FROM dead_letters WHERE id = 'd1'")
                .fetch_one(b.pool())
                .await
                .unwrap();
        assert_eq!(payload, [0, 1, 2, 255]);

        // A second restore into the same store is refused, naming a table.
        let err = b.begin_import().await.err().expect("refused");
        assert!(err.to_string().contains("not empty"), "{err}");

        // A row of the wrong shape is an error naming the table and column.
        let c = crate::testing::store().await;
        let mut import = c.begin_import().await.unwrap();
        let mut row = Map::new();
        row.insert("name".into(), Value::from(5));
        row.insert("created_at".into(), Value::from("x"));
        let err = import
            .rows(&SCHEMA[0], &[row])
            .await
            .unwrap_err()
            .to_string();
        assert!(err.contains("namespaces") && err.contains("name"), "{err}");
    }
}
