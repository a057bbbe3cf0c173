//! Dynamic SQL for both backends: a query built piece by piece with its bound
//! values, numbering the placeholders as the backend wants them.
//!
//! Static statements use `$1`, `$2`, ... which both PostgreSQL and SQLite read (the
//! same number may appear twice). A built statement can hold many placeholders (a
//! batch insert), and SQLite resolves a `$N` by name, once per placeholder: there
//! it gets plain `?`, bound in order.

use sqlx::any::{Any, AnyArguments};
use sqlx::query::Query;
use sqlx::{Arguments, AssertSqlSafe, Encode, Type};

use crate::db::Backend;

/// A statement under construction (sqlx's `QueryBuilder` writes `?` for every
/// backend behind the `Any` driver, which PostgreSQL does not read).
pub(crate) struct Builder {
    backend: Backend,
    sql: String,
    args: AnyArguments,
    bound: usize,
    error: Option<sqlx::error::BoxDynError>,
}

impl Builder {
    pub(crate) fn new(backend: Backend, sql: &str) -> Self {
        Self {
            backend,
            sql: sql.to_owned(),
            args: AnyArguments::default(),
            bound: 0,
            error: None,
        }
    }

    /// Appends SQL text (never a value from outside: those are bound).
    pub(crate) fn push(&mut self, sql: &str) -> &mut Self {
        self.sql.push_str(sql);
        self
    }

    /// Appends a placeholder and binds `value` to it.
    pub(crate) fn push_bind<'t, T>(&mut self, value: T) -> &mut Self
    where
        T: Encode<'t, Any> + Type<Any>,
    {
        self.bound += 1;
        match self.backend {
            Backend::Sqlite => self.sql.push('?'),
            Backend::Postgres => {
                self.sql.push('$');
                self.sql.push_str(&self.bound.to_string());
            }
        }
        if let Err(e) = self.args.add(value)
            && self.error.is_none()
        {
            self.error = Some(e);
        }
        self
    }

    /// The statement, ready to run (an error when a value could not be encoded).
    pub(crate) fn build(self) -> Result<Query<'static, Any, AnyArguments>, sqlx::Error> {
        match self.error {
            Some(e) => Err(sqlx::Error::Encode(e)),
            None => Ok(sqlx::query_with(AssertSqlSafe(self.sql), self.args)),
        }
    }
}

/// Placeholders `$first..$first+count` separated by commas, for a statement built
/// once and cached (e.g. a batch insert's rows); `?` on SQLite (see the module's doc).
pub(crate) fn placeholders(backend: Backend, first: usize, count: usize) -> String {
    let mut out = String::new();
    for i in 0..count {
        if i > 0 {
            out.push_str(", ");
        }
        match backend {
            Backend::Sqlite => out.push('?'),
            Backend::Postgres => {
                out.push('$');
                out.push_str(&(first + i).to_string());
            }
        }
    }
    out
}
