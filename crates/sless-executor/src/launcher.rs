//! The seam between a pool and its instances: how an instance is started
//! ([`Launcher`]) and what a pool does with a running one ([`Instance`]).
//!
//! The executor uses [`crate::instance::SandboxLauncher`], whose instances are
//! sandboxed processes; the pool's unit tests use a fake that needs no root. Pools
//! are generic over the launcher, so the invoke path calls its instances without a
//! vtable or a boxed future.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicU32, Ordering};
use std::time::Duration;

use bytes::Bytes;
use sless_core::{NetworkMode, RuntimeFamily};
use sless_logs::LogSink;
use sless_sandbox::Exit;
use tokio::sync::watch;

use crate::instance::{CallError, SpecialiseError, StartError};
use crate::liveness::Activity;
use crate::output::Pipe;
use crate::{Deployment, InvokeRequest};

pub(crate) const STARTING: u8 = 0;
pub(crate) const READY: u8 = 1;
/// Takes no new requests; stopped once its in-flight requests are done.
pub(crate) const DRAINING: u8 = 2;
/// Killed on purpose; its exit is not a crash.
pub(crate) const STOPPING: u8 = 3;

/// The part of an instance's state its pool keeps: where it is in its life and
/// how many requests it holds. Plain atomics, so picking an instance costs no lock.
pub(crate) struct Lifecycle {
    /// [`STARTING`], [`READY`], [`DRAINING`] or [`STOPPING`].
    pub state: AtomicU8,
    /// Requests in flight.
    pub inflight: AtomicU32,
}

impl Lifecycle {
    pub fn new() -> Self {
        Self {
            state: AtomicU8::new(STARTING),
            inflight: AtomicU32::new(0),
        }
    }

    pub fn state(&self) -> u8 {
        self.state.load(Ordering::Acquire)
    }

    pub fn set_state(&self, state: u8) {
        self.state.store(state, Ordering::Release);
    }

    pub fn inflight(&self) -> u32 {
        self.inflight.load(Ordering::Acquire)
    }
}

/// Starts instances: of a function (a fresh start), or generic ones that the warm
/// pool keeps and [`Instance::specialise`] later gives a function.
pub(crate) trait Launcher: Send + Sync + 'static {
    /// What it starts.
    type Instance: Instance;

    /// Starts an instance of `d` named `id`, whose output goes to `sink`, and
    /// returns once it is ready to serve.
    fn start(
        &self,
        sink: &LogSink,
        d: &Deployment,
        id: String,
    ) -> impl Future<Output = Result<Arc<Self::Instance>, StartError>> + Send;

    /// Starts a generic instance of `family` with `network`: sandboxed, interpreter
    /// and shim loaded, no function yet.
    fn start_generic(
        &self,
        family: RuntimeFamily,
        network: NetworkMode,
        id: String,
    ) -> impl Future<Output = Result<Arc<Self::Instance>, StartError>> + Send;
}

/// A running instance, as its pool sees it.
pub(crate) trait Instance: Send + Sync + 'static {
    /// Its name (unique within the executor).
    fn id(&self) -> &str;

    /// Its state and requests in flight.
    fn life(&self) -> &Lifecycle;

    /// The revision it serves; 0 while it is generic.
    fn revision(&self) -> u64;

    /// Sends one event; returns (handler returned normally, body).
    fn call(
        &self,
        req: &InvokeRequest,
        timeout: Option<Duration>,
    ) -> impl Future<Output = Result<(bool, Bytes), CallError>> + Send;

    /// Gives a generic instance the function of `d`, its output going to `sink`.
    fn specialise(
        &self,
        d: &Deployment,
        sink: &LogSink,
    ) -> impl Future<Output = Result<(), SpecialiseError>> + Send;

    /// Asks its serving loop whether it still answers, on a connection of its own.
    fn probe(&self) -> impl Future<Output = bool> + Send;

    /// What the liveness monitor samples; `None` once it is stopping.
    fn activity(&self) -> Option<super::liveness::Activity>;

    /// How long since its last request ended (or it started).
    fn idle_for(&self) -> Duration;

    /// Kills it on purpose (its exit will not count as a crash).
    fn kill(&self);

    /// Kills it because its serving loop stopped answering; the requests it holds
    /// then fail, saying so.
    fn kill_unresponsive(&self);

    /// Whether it was killed by [`Instance::kill_unresponsive`].
    fn is_unresponsive(&self) -> bool;

    /// Whether its process has exited.
    fn is_dead(&self) -> bool;

    /// Its exit, once it has one.
    fn exit(&self) -> watch::Receiver<Option<Exit>>;

    /// Its output pipes (stdout, stderr), whose pumps say when they find them empty;
    /// none when its output is not piped.
    fn output(&self) -> &[Arc<Pipe>] {
        &[]
    }

    /// Freezes it if it has been idle for `after`; called under the pool's lock.
    fn freeze_if_idle(&self, after: Duration) -> bool;

    /// Thaws it if frozen; called under the pool's lock before a request is sent.
    fn thaw(&self) -> std::io::Result<()>;

    /// Removes what it left on disk, once it has exited.
    fn cleanup(&self);
}

/// What the liveness monitor samples, for an instance that keeps [`Lifecycle`]
/// and a count of answers.
pub(crate) fn activity(life: &Lifecycle, dead: bool, answered: u64) -> Option<Activity> {
    if life.state() == STOPPING || dead {
        return None;
    }
    Some(Activity {
        inflight: life.inflight(),
        answered,
    })
}
