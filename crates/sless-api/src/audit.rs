//! The audit log: [`record`], the router's outermost middleware, writes one entry for
//! every control-plane change asked of `/v1/` (every `POST`, `PUT`, `PATCH` and
//! `DELETE` except the data-plane `.../invoke`): who asked, from which address, what
//! (an action such as `function.create`) to which object, and the status it got,
//! refused requests included. The request body is never read here and never stored.
//!
//! Who asked is learnt from the [`Caller`] extractor, which fills a slot the
//! middleware puts in the request's extensions (a request whose credentials fail
//! is `anonymous`); a handler may add what only it knows (the namespace of a
//! token it deleted), and a create's object name comes from its JSON body's
//! `name` field. `GET /v1/audit` lists the log to admins.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::Json;
use axum::extract::{ConnectInfo, FromRequestParts, Query, Request, State};
use axum::http::request::Parts;
use axum::http::{Extensions, Method};
use axum::middleware::Next;
use axum::response::Response;
use chrono::{DateTime, Utc};
use serde::Deserialize;
use serde_json::Value;
use sless_api_types::{AuditObject, Items, timestamp};
use sless_store::{AuditEntry, AuditFilter, MAX_AUDIT_LIMIT};

use crate::{ApiError, AppState, Caller, body, ranged_param};

/// What the request's handling learnt for its audit entry.
#[derive(Debug, Default)]
struct Note {
    actor: Option<String>,
    namespace: Option<String>,
    object_name: Option<String>,
}

/// The slot in a request's extensions where [`Note`]s are left.
#[derive(Clone, Default)]
struct Slot(Arc<Mutex<Note>>);

impl Slot {
    fn with(&self, f: impl FnOnce(&mut Note)) {
        f(&mut self.0.lock().unwrap_or_else(|e| e.into_inner()));
    }

    fn take(&self) -> Note {
        std::mem::take(&mut *self.0.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

/// Longest object name kept (a path segment can be long; the log need not be).
const MAX_NAME: usize = 253;

/// The authenticated caller, for the entry of the request being handled.
pub(crate) fn note_actor(extensions: &Extensions, caller: &Caller) {
    if let Some(slot) = extensions.get::<Slot>() {
        slot.with(|n| n.actor = Some(caller.actor_label()));
    }
}

/// What a handler adds to its request's audit entry.
pub struct Notes(Option<Slot>);

impl Notes {
    pub(crate) fn of(extensions: &Extensions) -> Self {
        Notes(extensions.get::<Slot>().cloned())
    }

    /// A JSON request body's `name` (a create's object name), when it is a valid
    /// name. Only that field is looked at; nothing else of the body is kept.
    pub(crate) fn body(&self, body: &Value) {
        if let (Some(slot), Some(Value::String(name))) = (&self.0, body.get("name"))
            && sless_core::validate_name("name", name).is_ok()
        {
            slot.with(|n| n.object_name = Some(name.clone()));
        }
    }

    /// The namespace acted in, when the path does not name it.
    pub fn namespace(&self, namespace: &str) {
        if let Some(slot) = &self.0 {
            slot.with(|n| n.namespace = Some(namespace.to_string()));
        }
    }

    /// The object's name or id, when the path does not name it.
    pub fn object(&self, name: &str) {
        if let Some(slot) = &self.0 {
            slot.with(|n| n.object_name = Some(name.to_string()));
        }
    }
}

impl<S: Send + Sync> FromRequestParts<S> for Notes {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        Ok(Notes(parts.extensions.get::<Slot>().cloned()))
    }
}

/// What a request does, as the log names it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Target {
    action: String,
    kind: String,
    namespace: Option<String>,
    name: Option<String>,
}

fn clip(s: &str) -> String {
    s.chars().take(MAX_NAME).collect()
}

/// `functions` → `function`.
fn singular(collection: &str) -> String {
    clip(collection.strip_suffix('s').unwrap_or(collection))
}

/// The audited target of `method path`, or `None` when the request is not audited
/// (reads, the data-plane invoke, anything outside `/v1/`).
fn target(method: &Method, path: &str) -> Option<Target> {
    let verb = match *method {
        Method::POST => "create",
        Method::PUT => "put",
        Method::PATCH => "patch",
        Method::DELETE => "delete",
        _ => return None,
    };
    let rest = path.strip_prefix("/v1/")?;
    let segments: Vec<&str> = rest.trim_end_matches('/').split('/').collect();
    if segments.last() == Some(&"invoke") {
        return None;
    }
    let t = |action: String, kind: String, namespace: Option<&str>, name: Option<&str>| Target {
        action,
        kind,
        namespace: namespace.map(clip),
        name: name.map(clip),
    };
    Some(match segments.as_slice() {
        ["tokens", "admin", "rotate"] => t(
            "token.rotate_admin".into(),
            "token".into(),
            None,
            Some("admin"),
        ),
        ["namespaces", ns] => t(
            format!("namespace.{verb}"),
            "namespace".into(),
            Some(ns),
            Some(ns),
        ),
        ["namespaces", ns, "restore"] if verb == "create" => t(
            "namespace.restore".into(),
            "namespace".into(),
            Some(ns),
            Some(ns),
        ),
        ["namespaces", ns, collection] => {
            let kind = singular(collection);
            t(format!("{kind}.{verb}"), kind, Some(ns), None)
        }
        ["namespaces", ns, collection, name] => {
            let kind = singular(collection);
            t(format!("{kind}.{verb}"), kind, Some(ns), Some(name))
        }
        ["namespaces", ns, collection, name, sub, ..] => {
            let kind = singular(collection);
            let action = match (verb, *sub) {
                ("put", "code") => format!("{kind}.upload_code"),
                (verb, sub) => format!("{kind}.{verb}_{}", clip(sub)),
            };
            t(action, kind, Some(ns), Some(name))
        }
        [collection] => {
            let kind = singular(collection);
            t(format!("{kind}.{verb}"), kind, None, None)
        }
        [collection, name, ..] => {
            let kind = singular(collection);
            t(format!("{kind}.{verb}"), kind, None, Some(name))
        }
        [] => return None,
    })
}

/// The middleware: see the module's documentation. The entry is written before the
/// answer goes out, by a task of its own, so a client that hangs up meanwhile
/// cannot keep its change out of the log. A failure to write is logged; the
/// answer is sent regardless.
pub async fn record(State(s): State<AppState>, mut req: Request, next: Next) -> Response {
    let Some(target) = target(req.method(), req.uri().path()) else {
        return next.run(req).await;
    };
    let slot = Slot::default();
    req.extensions_mut().insert(slot.clone());
    let address = req
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|c| c.0.ip().to_canonical().to_string());
    let response = next.run(req).await;
    let note = slot.take();
    let entry = AuditEntry {
        id: sless_records::new_id(),
        at: Utc::now(),
        actor: note.actor.unwrap_or_else(|| "anonymous".into()),
        namespace: target.namespace.or(note.namespace),
        action: target.action,
        object_kind: target.kind,
        object_name: target.name.or(note.object_name),
        address,
        status: response.status().as_u16(),
    };
    let audit = s.audit.clone();
    let write = tokio::spawn(async move {
        if let Err(e) = audit.record_audit(&entry).await {
            tracing::error!(error = %e, action = %entry.action, actor = %entry.actor,
                "cannot write an audit log entry");
        }
    });
    if let Err(e) = write.await {
        tracing::error!(error = %e, "the audit log writer failed");
    }
    response
}

#[derive(Deserialize)]
pub struct ListQuery {
    namespace: Option<String>,
    since: Option<String>,
    limit: Option<String>,
}

/// `GET /v1/audit?namespace=&since=&limit=` (admins only; to others, like `POST
/// /v1/tokens`, it does not exist): entries newest first.
#[utoipa::path(
    get,
    path = "/v1/audit",
    tag = "audit",
    params(crate::openapi::AuditParams),
    responses((status = 200, description = "Control-plane changes, newest first", body = sless_api_types::Items<sless_api_types::AuditEntry>), crate::openapi::ReadErrors)
)]
pub async fn list(
    State(s): State<AppState>,
    caller: Caller,
    Query(q): Query<ListQuery>,
) -> Result<Json<Value>, ApiError> {
    if !caller.is_admin() {
        return Err(ApiError::NotFound("no such endpoint".into()));
    }
    let namespace = q.namespace.filter(|n| !n.is_empty());
    if let Some(ns) = &namespace {
        sless_core::validate_name("namespace", ns)?;
    }
    let since = match q.since.as_deref().filter(|v| !v.is_empty()) {
        None => None,
        Some(v) => Some(
            DateTime::parse_from_rfc3339(v)
                .map_err(|_| {
                    ApiError::bad(format!(
                        "since: must be an RFC 3339 time such as 2025-01-31T12:00:00Z, got {v:?}"
                    ))
                })?
                .with_timezone(&Utc),
        ),
    };
    let limit = ranged_param("limit", q.limit.as_deref(), 1, u64::from(MAX_AUDIT_LIMIT))?;
    let filter = AuditFilter {
        namespace,
        since,
        limit: limit.map(|l| l as u32),
    };
    let items: Vec<_> = s
        .audit
        .list_audit(&filter)
        .await?
        .into_iter()
        .map(|e| sless_api_types::AuditEntry {
            id: e.id,
            time: timestamp(e.at),
            actor: e.actor,
            namespace: e.namespace,
            action: e.action,
            object: AuditObject {
                kind: e.object_kind,
                name: e.object_name,
            },
            address: e.address,
            status: e.status,
        })
        .collect();
    body(&Items::new(items))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Actor;

    fn of(method: Method, path: &str) -> Option<(String, String, Option<String>, Option<String>)> {
        target(&method, path).map(|t| (t.action, t.kind, t.namespace, t.name))
    }

    fn some(
        a: &str,
        k: &str,
        ns: Option<&str>,
        n: Option<&str>,
    ) -> Option<(String, String, Option<String>, Option<String>)> {
        Some((a.into(), k.into(), ns.map(Into::into), n.map(Into::into)))
    }

    #[test]
    fn control_plane_writes_are_named_and_reads_and_invokes_are_not_audited() {
        assert_eq!(
            of(Method::POST, "/v1/namespaces/team/functions"),
            some("function.create", "function", Some("team"), None)
        );
        assert_eq!(
            of(Method::PATCH, "/v1/namespaces/team/functions/hello"),
            some("function.patch", "function", Some("team"), Some("hello"))
        );
        assert_eq!(
            of(Method::PUT, "/v1/namespaces/team/secrets/db"),
            some("secret.put", "secret", Some("team"), Some("db"))
        );
        assert_eq!(
            of(Method::PUT, "/v1/namespaces/team/functions/hello/code"),
            some(
                "function.upload_code",
                "function",
                Some("team"),
                Some("hello")
            )
        );
        assert_eq!(
            of(Method::DELETE, "/v1/namespaces/team"),
            some("namespace.delete", "namespace", Some("team"), Some("team"))
        );
        assert_eq!(
            of(Method::POST, "/v1/namespaces/team/restore"),
            some("namespace.restore", "namespace", Some("team"), Some("team"))
        );
        assert_eq!(
            of(Method::DELETE, "/v1/tokens/0123456789ab"),
            some("token.delete", "token", None, Some("0123456789ab"))
        );
        assert_eq!(
            of(Method::POST, "/v1/tokens"),
            some("token.create", "token", None, None)
        );
        assert_eq!(
            of(Method::POST, "/v1/tokens/admin/rotate"),
            some("token.rotate_admin", "token", None, Some("admin"))
        );
        assert_eq!(
            of(Method::POST, "/v1/namespaces/team/functions/hello/invoke"),
            None
        );
        assert_eq!(of(Method::GET, "/v1/namespaces/team/functions"), None);
        assert_eq!(of(Method::POST, "/fn/team/hello"), None);
    }

    #[test]
    fn a_jwt_caller_is_logged_by_its_subject_and_a_failed_one_as_anonymous() {
        let caller = Caller::Namespace {
            namespace: "team".into(),
            actor: Actor::Jwt("alice@example.com".into()),
        };
        assert_eq!(caller.actor_label(), "jwt:alice@example.com");
        let mut ext = Extensions::new();
        let slot = Slot::default();
        ext.insert(slot.clone());
        note_actor(&ext, &caller);
        let notes = Notes::of(&ext);
        notes.body(&serde_json::json!({"name": "hello", "env": {"K": "secret"}}));
        let note = slot.take();
        assert_eq!(note.actor.as_deref(), Some("jwt:alice@example.com"));
        assert_eq!(note.object_name.as_deref(), Some("hello"));
        notes.body(&serde_json::json!({"name": "Not A Name"}));
        assert_eq!(slot.take().object_name, None, "an invalid name is not kept");
        assert_eq!(Slot::default().take().actor, None);
    }
}
