//! The wire shapes of the `/v1` API's response bodies, defined once: `sless-api` builds
//! every body from these types and `sless-client` decodes the same types.
//!
//! Decoding is lenient where a newer server may differ: missing fields take defaults,
//! unknown fields are ignored, and a phase this build does not know decodes as `Unknown`.
//! The server writes a body through [`to_body`], which orders keys as every body always
//! had them (sorted), so the bytes on the wire stay what the contract pinned.
//! Depends on nothing heavier than `sless-core`, serde and chrono.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

pub mod schema;

pub use schema::{FunctionSpecSchema, JobSpecSchema};
pub use sless_core::invocation::InvocationSource;
pub use sless_core::{TriggerKind, TriggerResult, TriggerSpec, TriggerType};

/// A timestamp as every body writes it: RFC 3339, UTC, milliseconds (`2025-01-31T12:00:00.123Z`).
pub fn timestamp(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

/// The JSON document a body is sent as: keys sorted at every level, as they always were.
pub fn to_body<T: Serialize>(body: &T) -> Result<Value, serde_json::Error> {
    serde_json::to_value(body)
}

/// Declares a phase enum that travels as its name and decodes names it does not know
/// as `Unknown(name)`, so a newer server's phase does not break an older client.
macro_rules! phase_enum {
    ($(#[$doc:meta])* $name:ident { $($(#[$vdoc:meta])* $variant:ident),+ $(,)? }) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
        pub enum $name {
            #[default]
            $($(#[$vdoc])* $variant,)+
            /// A phase this build does not know (from a newer server).
            Unknown(String),
        }

        impl $name {
            /// The phase's name, as on the wire.
            pub fn as_str(&self) -> &str {
                match self {
                    $($name::$variant => stringify!($variant),)+
                    $name::Unknown(name) => name,
                }
            }

            /// The phase named `name`; `Unknown` for a name this build does not know.
            pub fn parse(name: &str) -> Self {
                match name {
                    $(stringify!($variant) => $name::$variant,)+
                    other => $name::Unknown(other.to_string()),
                }
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl From<&str> for $name {
            fn from(name: &str) -> Self {
                $name::parse(name)
            }
        }

        impl PartialEq<str> for $name {
            fn eq(&self, other: &str) -> bool {
                self.as_str() == other
            }
        }

        impl PartialEq<&str> for $name {
            fn eq(&self, other: &&str) -> bool {
                self.as_str() == *other
            }
        }

        impl Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(self.as_str())
            }
        }

        /// In the OpenAPI document: one of the names this build knows.
        impl utoipa::PartialSchema for $name {
            fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
                utoipa::openapi::ObjectBuilder::new()
                    .schema_type(utoipa::openapi::schema::Type::String)
                    .enum_values(Some([$(stringify!($variant)),+]))
                    .into()
            }
        }

        impl utoipa::ToSchema for $name {}

        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                Ok($name::parse(&String::deserialize(d)?))
            }
        }
    };
}

phase_enum! {
    /// The phase of a function's latest revision.
    FunctionPhase { Pending, Building, Ready, Failed }
}

phase_enum! {
    /// The phase of a job's current run.
    JobPhase { Pending, Building, Running, Succeeded, Failed, Skipped }
}

impl From<sless_core::Phase> for FunctionPhase {
    fn from(p: sless_core::Phase) -> Self {
        match p {
            sless_core::Phase::Pending => FunctionPhase::Pending,
            sless_core::Phase::Building => FunctionPhase::Building,
            sless_core::Phase::Ready => FunctionPhase::Ready,
            sless_core::Phase::Failed => FunctionPhase::Failed,
        }
    }
}

impl From<sless_core::JobPhase> for JobPhase {
    fn from(p: sless_core::JobPhase) -> Self {
        match p {
            sless_core::JobPhase::Pending => JobPhase::Pending,
            sless_core::JobPhase::Building => JobPhase::Building,
            sless_core::JobPhase::Running => JobPhase::Running,
            sless_core::JobPhase::Succeeded => JobPhase::Succeeded,
            sless_core::JobPhase::Failed => JobPhase::Failed,
            sless_core::JobPhase::Skipped => JobPhase::Skipped,
        }
    }
}

impl FunctionPhase {
    /// True for a phase the platform leaves only on a new revision: `Ready`, `Failed`.
    pub fn is_settled(&self) -> bool {
        matches!(self, FunctionPhase::Ready | FunctionPhase::Failed)
    }
}

impl JobPhase {
    /// True for the phases a run does not leave: `Succeeded`, `Failed`, `Skipped`.
    pub fn is_terminal(&self) -> bool {
        matches!(
            self,
            JobPhase::Succeeded | JobPhase::Failed | JobPhase::Skipped
        )
    }
}

/// The `{"items": [...]}` wrapper every list endpoint answers with.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Items<T> {
    #[serde(default = "Vec::new")]
    pub items: Vec<T>,
}

impl<T> Items<T> {
    pub fn new(items: Vec<T>) -> Self {
        Items { items }
    }
}

/// The platform's own error: `{"error": {"code", "message"}}`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

/// The inside of an [`ErrorBody`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(default)]
pub struct ErrorDetail {
    /// Machine-readable, e.g. `not_found`.
    pub code: String,
    /// For people; names the field for `400`.
    pub message: String,
}

impl ErrorBody {
    pub fn new(code: impl Into<String>, message: impl Into<String>) -> Self {
        ErrorBody {
            error: ErrorDetail {
                code: code.into(),
                message: message.into(),
            },
        }
    }
}

/// `GET /healthz` and `GET /readyz`: `{"status": "ok" | "ready" | "unavailable"}`, plus
/// what is wrong when unavailable.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(default)]
pub struct Health {
    pub status: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub problems: Option<Vec<String>>,
}

/// `GET /v1/whoami`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(default)]
pub struct Whoami {
    pub admin: bool,
    pub namespaces: Vec<String>,
}

/// `POST /v1/tokens`: the token, shown this once.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(default)]
pub struct TokenCreated {
    pub token: String,
    pub namespace: String,
}

/// A namespace. Decodes from an object or, as older servers listed them, a bare name.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, ToSchema)]
pub struct Namespace {
    pub name: String,
    /// When it was created (RFC 3339); always sent by this server.
    pub created_at: Option<String>,
}

impl<'de> Deserialize<'de> for Namespace {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Wire {
            Name(String),
            Object {
                name: String,
                #[serde(default)]
                created_at: Option<String>,
            },
        }
        Ok(match Wire::deserialize(d)? {
            Wire::Name(name) => Namespace {
                name,
                created_at: None,
            },
            Wire::Object { name, created_at } => Namespace { name, created_at },
        })
    }
}

/// A function. The server fills `spec` with the typed [`sless_core::FunctionSpec`];
/// a client reads it as JSON, so spec fields a newer server adds survive a round trip.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Function<S = Value> {
    pub name: String,
    pub namespace: String,
    pub spec: S,
    pub status: FunctionStatus,
    pub created_at: String,
    pub updated_at: String,
}

impl Function {
    /// The spec's `runtime`, or `""` when absent.
    pub fn runtime(&self) -> &str {
        self.spec
            .get("runtime")
            .and_then(|v| v.as_str())
            .unwrap_or("")
    }
}

/// What the platform reports about a function's latest revision.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(default)]
pub struct FunctionStatus {
    pub phase: FunctionPhase,
    /// Why the phase is what it is; on `Failed`, the reason and the tail of the build log.
    pub message: String,
    /// The latest revision; `phase` describes this one.
    pub revision: u64,
    /// SHA-256 of the uploaded archive, `None` before the first upload.
    pub code_sha256: Option<String>,
    /// The public invoke URL, `/fn/{ns}/{name}` on the server.
    pub url: String,
    pub instances: InstanceCounts,
    /// When a build last ran (RFC 3339).
    pub last_built_at: Option<String>,
}

impl FunctionStatus {
    /// True when `phase` is one the platform leaves only on a new revision.
    pub fn is_settled(&self) -> bool {
        self.phase.is_settled()
    }
}

/// Instances of a function by readiness.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(default)]
pub struct InstanceCounts {
    pub ready: u32,
    pub starting: u32,
}

impl From<sless_core::InstanceCounts> for InstanceCounts {
    fn from(c: sless_core::InstanceCounts) -> Self {
        InstanceCounts {
            ready: c.ready,
            starting: c.starting,
        }
    }
}

/// `PUT .../functions/{name}/code` → `202`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(default)]
pub struct CodeUploaded {
    /// The revision that carries this code.
    pub revision: u64,
    /// SHA-256 of the archive as the server computed it.
    pub code_sha256: String,
}

/// One file of `GET .../functions/{name}/source`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(default)]
pub struct SourceFile {
    /// The path inside the archive (`a/b.py`).
    pub name: String,
    /// UTF-8 text, or base64 when `binary`.
    pub content: String,
    pub binary: bool,
}

/// A trigger: its spec's fields at the top level (`function`, `type`, `enabled` and
/// the type's own), plus status and times.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Trigger {
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub namespace: String,
    #[serde(flatten)]
    pub spec: TriggerSpec,
    #[serde(default)]
    pub status: TriggerStatus,
    #[serde(default)]
    pub created_at: String,
    #[serde(default)]
    pub updated_at: String,
}

impl Trigger {
    /// The type word: `http`, `cron`, `queue` (`unknown` for a newer server's type).
    pub fn kind(&self) -> &'static str {
        self.spec
            .trigger_type()
            .map_or("unknown", TriggerType::as_str)
    }

    /// http: the route below `/t/{ns}`.
    pub fn path(&self) -> Option<&str> {
        match &self.spec.kind {
            TriggerKind::Http { path, .. } => Some(path),
            _ => None,
        }
    }

    /// http: the methods the route accepts (empty for other types).
    pub fn methods(&self) -> &[String] {
        match &self.spec.kind {
            TriggerKind::Http { methods, .. } => methods,
            _ => &[],
        }
    }

    /// cron: the schedule expression.
    pub fn schedule(&self) -> Option<&str> {
        match &self.spec.kind {
            TriggerKind::Cron { schedule, .. } => Some(schedule),
            _ => None,
        }
    }

    /// cron: the IANA time zone the schedule is read in.
    pub fn timezone(&self) -> Option<&str> {
        match &self.spec.kind {
            TriggerKind::Cron { timezone, .. } => Some(timezone),
            _ => None,
        }
    }

    /// cron: the event the handler gets (plus `fired_at`).
    pub fn event(&self) -> Option<&Value> {
        match &self.spec.kind {
            TriggerKind::Cron { event, .. } => Some(event),
            _ => None,
        }
    }

    /// queue: `{"kind", "url", "topic", "group", ...}`.
    pub fn source(&self) -> Option<&sless_core::QueueSource> {
        match &self.spec.kind {
            TriggerKind::Queue { source, .. } => Some(source),
            _ => None,
        }
    }

    /// queue and device: the delivery policy.
    pub fn delivery(&self) -> Option<&sless_core::DeliveryPolicy> {
        match &self.spec.kind {
            TriggerKind::Queue { delivery, .. } | TriggerKind::Device { delivery, .. } => {
                Some(delivery)
            }
            _ => None,
        }
    }

    /// device: which devices' telemetry it delivers.
    pub fn devices(&self) -> Option<&str> {
        match &self.spec.kind {
            TriggerKind::Device { devices, .. } => Some(devices),
            _ => None,
        }
    }

    /// cron: seconds before each fire at which an instance is started.
    pub fn prewarm_sec(&self) -> Option<u32> {
        match &self.spec.kind {
            TriggerKind::Cron { prewarm_sec, .. } => Some(*prewarm_sec),
            _ => None,
        }
    }
}

/// What the platform reports about a trigger's firing.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(default)]
pub struct TriggerStatus {
    /// When it last fired (RFC 3339).
    pub last_fired_at: Option<String>,
    /// When it fires next (RFC 3339); `None` for http triggers and disabled ones.
    pub next_fire_at: Option<String>,
    /// How the last firing went (its text: `ok: status 200`, `running`, ...).
    #[schema(value_type = Option<String>)]
    pub last_result: Option<TriggerResult>,
    /// queue and device triggers: `connected`, `connecting` or `failed`.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>)]
    pub connection: Option<sless_core::ConnectionState>,
    /// queue and device triggers: why the connection last failed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    /// queue and device triggers: `received`, `succeeded`, `retried`, `failed`, `dead_lettered`.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub counters: Option<sless_core::DeliveryCounters>,
    /// queue triggers: messages waiting in the broker, where the broker tells it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lag: Option<u64>,
}

impl From<sless_core::TriggerStatus> for TriggerStatus {
    fn from(s: sless_core::TriggerStatus) -> Self {
        TriggerStatus {
            last_fired_at: s.last_fired_at.map(timestamp),
            next_fire_at: s.next_fire_at.map(timestamp),
            last_result: s.last_result,
            connection: s.connection,
            last_error: s.last_error,
            counters: s.counters,
            lag: s.lag,
        }
    }
}

/// A job. The server fills `spec` with the typed [`sless_core::JobSpec`]; a client
/// reads it as JSON (see [`Function`]).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Job<S = Value> {
    pub name: String,
    pub namespace: String,
    pub spec: S,
    pub status: JobStatus,
    /// Self-contained jobs: SHA-256 of the uploaded archive.
    pub code_sha256: Option<String>,
    pub created_at: String,
    pub updated_at: String,
}

impl Job {
    /// The spec's `function`, `None` for a self-contained job.
    pub fn function(&self) -> Option<&str> {
        self.spec.get("function").and_then(|v| v.as_str())
    }

    /// The spec's `runtime` (self-contained jobs), `None` for a function job.
    pub fn runtime(&self) -> Option<&str> {
        self.spec.get("runtime").and_then(|v| v.as_str())
    }

    /// The spec's `run_id`: the run the user asked for last.
    pub fn spec_run_id(&self) -> u64 {
        self.spec
            .get("run_id")
            .and_then(|v| v.as_u64())
            .unwrap_or(0)
    }

    /// The spec's `max_attempts` (1 when absent, the API's default).
    pub fn max_attempts(&self) -> u64 {
        self.spec
            .get("max_attempts")
            .and_then(|v| v.as_u64())
            .unwrap_or(1)
    }
}

/// What the platform reports about a job's current run.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(default)]
pub struct JobStatus {
    pub phase: JobPhase,
    /// The run this status describes.
    pub run_id: u64,
    /// The handler's return value once the run succeeded.
    pub result: Option<Value>,
    /// On failure, the error and the tail of the output.
    pub message: String,
    pub started_at: Option<String>,
    pub finished_at: Option<String>,
    /// Attempts made for this run so far.
    pub attempts: u32,
}

impl JobStatus {
    /// True for the phases a run does not leave: `Succeeded`, `Failed`, `Skipped`.
    pub fn is_terminal(&self) -> bool {
        self.phase.is_terminal()
    }
}

impl From<sless_core::JobStatus> for JobStatus {
    fn from(s: sless_core::JobStatus) -> Self {
        JobStatus {
            phase: s.phase.into(),
            run_id: s.run_id,
            result: s.result,
            message: s.message,
            started_at: s.started_at.map(timestamp),
            finished_at: s.finished_at.map(timestamp),
            attempts: s.attempts,
        }
    }
}

/// `PUT .../jobs/{name}/code` → `202`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(default)]
pub struct JobCodeUploaded {
    pub code_sha256: String,
    /// The run the code is for.
    pub run_id: u64,
}

/// One recorded invocation of a function.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(default)]
pub struct Invocation {
    pub id: String,
    pub function: String,
    /// The revision that answered; 0 when no instance did.
    pub revision: u64,
    /// `http`, `invoke`, `cron`, `queue` or `job`.
    #[schema(value_type = String)]
    pub source: Source,
    pub request_id: String,
    /// RFC 3339.
    pub started_at: String,
    /// How long the call took, in milliseconds (fractional: the server measures finer).
    pub duration_ms: f64,
    /// The HTTP status the caller saw.
    pub status: u16,
    /// The call waited for a new instance to start.
    pub cold_start: bool,
    /// The platform's error, or the handler's exception message.
    pub error: Option<String>,
    /// Deliveries (queue, device, async): the attempt it was, from 1. Absent otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub attempt: Option<u32>,
    /// The queue or device trigger that delivered it. Absent otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub trigger: Option<String>,
    /// The async call it was an attempt of. Absent otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub call_id: Option<String>,
}

/// What started an invocation, as its record names it: one of the platform's
/// [`InvocationSource`]s, or (decoding a newer server's answer) a source this build
/// does not know, so a new kind of invoker does not break an older client.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Source {
    /// A source this build knows; written as its name (`"http"`).
    Known(InvocationSource),
    /// A name this build does not know.
    Unknown(String),
}

impl Source {
    /// The source's name, as on the wire.
    pub fn as_str(&self) -> &str {
        match self {
            Source::Known(s) => s.as_str(),
            Source::Unknown(name) => name,
        }
    }
}

/// An empty name: what a record without a source decodes as.
impl Default for Source {
    fn default() -> Self {
        Source::Unknown(String::new())
    }
}

impl From<InvocationSource> for Source {
    fn from(s: InvocationSource) -> Self {
        Source::Known(s)
    }
}

impl From<&str> for Source {
    fn from(name: &str) -> Self {
        InvocationSource::parse(name)
            .map_or_else(|| Source::Unknown(name.to_string()), Source::Known)
    }
}

impl std::fmt::Display for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl PartialEq<&str> for Source {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

// --- Secrets ---

/// A secret as every endpoint shows it: its keys, never a value.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(default)]
pub struct Secret {
    pub name: String,
    pub keys: Vec<String>,
    pub created_at: String,
    pub updated_at: String,
}

#[cfg(test)]
mod tests;

// Token listing, admin rotation and the audit log.

/// One item of `GET /v1/tokens`: a namespace token, never its value or hash.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(default)]
pub struct TokenInfo {
    /// Stable, and tells nothing about the value; `DELETE /v1/tokens/{id}` revokes it.
    pub id: String,
    pub namespace: String,
    pub created_at: String,
    /// When it was last used (to within about a minute); `null` if never.
    pub last_used_at: Option<String>,
}

/// `POST /v1/tokens/admin/rotate`: the new admin token, shown this once.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(default)]
pub struct AdminToken {
    pub token: String,
}

/// The object an audit entry's request acted on.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(default)]
pub struct AuditObject {
    /// `namespace`, `function`, `trigger`, `job`, `secret`, `token`, ...
    pub kind: String,
    /// Its name or id, when known.
    pub name: Option<String>,
}

/// One item of `GET /v1/audit`: a control-plane request and its outcome (never its body).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(default)]
pub struct AuditEntry {
    pub id: String,
    /// When the request was answered (RFC 3339).
    pub time: String,
    /// `admin`, `token:<id>`, `jwt:<sub>`, or `anonymous` when authentication failed.
    pub actor: String,
    pub namespace: Option<String>,
    /// e.g. `function.create`, `function.patch`, `secret.put`, `token.delete`.
    pub action: String,
    pub object: AuditObject,
    /// The client's IP address.
    pub address: Option<String>,
    /// The HTTP status of the answer.
    pub status: u16,
}

/// Quotas: `GET /v1/namespaces/{ns}` (and `PUT`) answers with the namespace, the
/// quotas in force for it and what it uses now.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(default)]
pub struct NamespaceDetail {
    pub name: String,
    pub created_at: Option<String>,
    pub quota: QuotaCounts,
    pub usage: QuotaCounts,
}

/// One number per quota: the limits in force, or the current usage.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(default)]
pub struct QuotaCounts {
    pub functions: u64,
    pub instances: u64,
    pub memory_mb: u64,
    pub invocations_per_sec: u64,
    pub queued_calls: u64,
    pub devices: u64,
    pub storage_mb: u64,
}

/// `202` of an async call (`/async/...`, `/invoke?async=true`): the call's id.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(default)]
pub struct CallQueued {
    pub call_id: String,
}

/// An async call: `GET /v1/namespaces/{ns}/calls/{id}`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(default)]
pub struct Call {
    pub id: String,
    pub function: String,
    /// `Queued`, `Running`, `Succeeded` or `Failed`.
    pub phase: String,
    /// Attempts started so far.
    pub attempts: u32,
    /// The function's answer, once the call ended with one.
    pub response: Option<CallResponse>,
    /// Why the last attempt failed.
    pub error: Option<String>,
    /// RFC 3339.
    pub queued_at: String,
    pub started_at: Option<String>,
    pub finished_at: Option<String>,
}

/// The function's answer to an async call.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(default)]
pub struct CallResponse {
    pub status: u16,
    pub headers: std::collections::BTreeMap<String, String>,
    /// The JSON value when the function answered JSON, otherwise the text.
    #[schema(value_type = Object)]
    pub body: Value,
}

/// A dead letter: `GET /v1/namespaces/{ns}/dead-letters`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(default)]
pub struct DeadLetter {
    pub id: String,
    /// `queue`, `device` or `async`.
    pub source: String,
    /// The queue or device trigger it came through (none for async calls).
    pub trigger: Option<String>,
    pub function: String,
    /// What was delivered, mapped like an event: JSON, text, or `{"base64": ...}`.
    #[schema(value_type = Object)]
    pub payload: Value,
    /// The last attempt's `context.message` (`{"call_id"}` for an async call).
    #[schema(value_type = Object)]
    pub message: Value,
    pub attempts: u32,
    pub last_status: u16,
    pub error: Option<String>,
    /// RFC 3339.
    pub failed_at: String,
}

/// `202` of `POST .../dead-letters/redrive?trigger=`: how many were sent back.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(default)]
pub struct Redriven {
    pub redriven: u64,
}

// --- Devices and telemetry ---

/// How a device reaches the broker. `password` only in the answers to create and to
/// `POST .../credentials` (shown that once; sless keeps a hash).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(default)]
pub struct DeviceMqtt {
    pub host: String,
    pub port: u16,
    /// MQTT over WebSocket (`ws://host:port/mqtt`), when the server listens for it.
    pub ws_url: Option<String>,
    /// A suggestion: a device may connect with any client id.
    pub client_id: String,
    /// `{ns}_{name}`.
    pub username: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub password: Option<String>,
    /// `{ns}/telemetry/{name}`: the only topic the device may publish to.
    pub publish_topic: String,
    /// `{ns}/commands/{name}`: the only topic it may subscribe to.
    pub subscribe_topic: String,
}

/// What sless knows of a device's connection and traffic.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(default)]
pub struct DeviceStatus {
    /// Connected to the broker now.
    pub online: bool,
    /// When its newest stored message arrived (RFC 3339).
    pub last_seen_at: Option<String>,
    /// Messages stored since it was created.
    pub messages: u64,
}

/// A device: `GET /v1/namespaces/{ns}/devices/{name}`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(default)]
pub struct Device {
    pub name: String,
    pub namespace: String,
    pub labels: std::collections::BTreeMap<String, String>,
    pub enabled: bool,
    pub mqtt: DeviceMqtt,
    pub status: DeviceStatus,
    pub created_at: String,
    pub updated_at: String,
}

/// One telemetry message: `GET .../devices/{name}/telemetry`, `GET .../telemetry`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(default)]
pub struct Telemetry {
    pub device: String,
    /// RFC 3339.
    pub received_at: String,
    /// JSON as sent, other text as a string, binary as `{"base64": ...}`.
    #[schema(value_type = Object)]
    pub payload: Value,
}

/// `202` of `POST .../devices/{name}/commands`: where the command was published.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(default)]
pub struct CommandSent {
    pub topic: String,
}
