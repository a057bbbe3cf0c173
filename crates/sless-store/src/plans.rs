//! The listing queries use their indexes on both backends: each is explained
//! (SQLite's `EXPLAIN QUERY PLAN`, PostgreSQL's `EXPLAIN` with scans and sorts
//! priced out, since on tiny test tables they are cheapest) and its plan must
//! name the index and never scan the whole table.

use crate::db::Backend;
use crate::testing;

/// (query, index it must use); `$1`.. are bound to `'x'` or 0 as the query needs.
const LISTINGS: &[(&str, &str, &[Param])] = &[
    (
        "SELECT name FROM functions WHERE namespace = $1 ORDER BY name",
        "functions",
        &[Param::Text],
    ),
    (
        "SELECT id FROM invocations WHERE namespace = $1 ORDER BY started_at DESC, id DESC LIMIT 50",
        "invocations",
        &[Param::Text],
    ),
    (
        "SELECT id FROM invocations WHERE namespace = $1 AND started_at >= $2 \
         ORDER BY started_at DESC, id DESC LIMIT 50",
        "invocations",
        &[Param::Text, Param::Int],
    ),
    (
        "SELECT id FROM async_calls WHERE namespace = $1 ORDER BY queued_at DESC, seq DESC LIMIT 50",
        "async_calls_by_time",
        &[Param::Text],
    ),
    (
        "SELECT seq FROM async_calls WHERE namespace = $1 AND function = $2 AND phase = 'Queued' \
         ORDER BY seq LIMIT 50",
        "async_calls_pending",
        &[Param::Text, Param::Text],
    ),
    (
        "SELECT id FROM dead_letters WHERE namespace = $1 ORDER BY failed_at DESC, id DESC LIMIT 50",
        "dead_letters_by_time",
        &[Param::Text],
    ),
    (
        "SELECT id FROM dead_letters WHERE namespace = $1 AND trigger = $2 \
         ORDER BY failed_at DESC LIMIT 50",
        "dead_letters_by_trigger",
        &[Param::Text, Param::Text],
    ),
    (
        "SELECT id FROM telemetry WHERE namespace = $1 AND device = $2 \
         ORDER BY received_at DESC, id DESC LIMIT 50",
        "telemetry_by_device",
        &[Param::Text, Param::Text],
    ),
    (
        "SELECT id FROM telemetry WHERE namespace = $1 ORDER BY received_at DESC, id DESC LIMIT 50",
        "telemetry_by_namespace",
        &[Param::Text],
    ),
    (
        "SELECT id FROM audit WHERE namespace = $1 ORDER BY at_us DESC, id DESC LIMIT 50",
        "audit_by_namespace",
        &[Param::Text],
    ),
    (
        "SELECT id FROM audit ORDER BY at_us DESC, id DESC LIMIT 50",
        "audit_by_time",
        &[],
    ),
    (
        "SELECT name FROM triggers WHERE namespace = $1 AND function = $2",
        "triggers_by_function",
        &[Param::Text, Param::Text],
    ),
];

#[derive(Debug, Clone, Copy)]
enum Param {
    Text,
    Int,
}

#[tokio::test]
async fn listings_use_their_indexes() {
    let store = testing::store().await;
    let mut conn = store.pool().acquire().await.unwrap();
    if store.backend() == Backend::Postgres {
        // Empty tables have no statistics: price out the plans that only win on
        // tiny tables, so the plan shows whether an index serves filter and order.
        for setting in [
            "SET enable_seqscan = off",
            "SET enable_bitmapscan = off",
            "SET enable_sort = off",
        ] {
            sqlx::query(setting).execute(&mut *conn).await.unwrap();
        }
    }
    for (sql, index, params) in LISTINGS {
        let explain = match store.backend() {
            Backend::Sqlite => format!("EXPLAIN QUERY PLAN {sql}"),
            Backend::Postgres => format!("EXPLAIN {sql}"),
        };
        let mut q = sqlx::query(sqlx::AssertSqlSafe(explain));
        for p in *params {
            q = match p {
                Param::Text => q.bind("x"),
                Param::Int => q.bind(0i64),
            };
        }
        let rows = q.fetch_all(&mut *conn).await.unwrap();
        let plan: Vec<String> = rows
            .iter()
            .map(|r| {
                use sqlx::Row;
                // SQLite: (id, parent, notused, detail); PostgreSQL: one text column.
                let column = r.len() - 1;
                r.try_get::<String, _>(column).unwrap_or_default()
            })
            .collect();
        let plan = plan.join("\n");
        // A primary key's index is named after its table on PostgreSQL
        // (`functions_pkey`) and is SQLite's table itself (`invocations` is
        // WITHOUT ROWID) or `sqlite_autoindex_functions_1`.
        let uses_index = match store.backend() {
            Backend::Sqlite => {
                plan.contains(&format!("USING INDEX {index}"))
                    || plan.contains(&format!("USING COVERING INDEX {index}"))
                    || plan.contains("USING PRIMARY KEY")
                    || plan.contains(&format!("sqlite_autoindex_{index}"))
            }
            Backend::Postgres => {
                plan.contains(&format!("using {index} on"))
                    || plan.contains(&format!("using {index}_pkey on"))
                    || plan.contains(&format!("on {index}")) && plan.contains("Index")
            }
        };
        let full_scan = match store.backend() {
            Backend::Sqlite => plan.lines().any(|l| {
                l.starts_with("SCAN ") && !l.contains("USING") || l.contains("USE TEMP B-TREE")
            }),
            Backend::Postgres => plan.contains("Seq Scan") || plan.contains("Sort"),
        };
        assert!(
            uses_index && !full_scan,
            "{} plan of {sql:?} does not use index {index} alone:\n{plan}",
            store.backend().name()
        );
    }
}
