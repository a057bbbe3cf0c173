//! The live connection state of one connector, read by the trigger's `status`.

use std::sync::Mutex;

use sless_core::ConnectionState;

/// Shared between a connector (which writes it) and the API (which reads it).
#[derive(Debug)]
pub struct ConnectionStatus {
    inner: Mutex<Inner>,
}

#[derive(Debug, Clone)]
struct Inner {
    state: ConnectionState,
    last_error: Option<String>,
    lag: Option<u64>,
}

impl Default for ConnectionStatus {
    fn default() -> Self {
        Self {
            inner: Mutex::new(Inner {
                state: ConnectionState::Connecting,
                last_error: None,
                lag: None,
            }),
        }
    }
}

impl ConnectionStatus {
    fn with<T>(&self, f: impl FnOnce(&mut Inner) -> T) -> T {
        f(&mut self.inner.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// Subscribed and positioned: every message published from now on is delivered.
    pub fn connected(&self) {
        self.with(|i| i.state = ConnectionState::Connected);
    }

    /// (Re)connecting; `error` is why the last connection ended, if it failed.
    pub fn connecting(&self, error: Option<String>) {
        self.with(|i| {
            i.state = ConnectionState::Connecting;
            if error.is_some() {
                i.last_error = error;
            }
        });
    }

    /// The source cannot work as configured (refused credentials, a missing
    /// topic the broker will not create); the connector still retries.
    pub fn failed(&self, error: String) {
        self.with(|i| {
            i.state = ConnectionState::Failed;
            i.last_error = Some(error);
        });
    }

    /// Messages waiting in the broker, where it tells.
    pub fn set_lag(&self, lag: Option<u64>) {
        self.with(|i| i.lag = lag);
    }

    pub fn state(&self) -> ConnectionState {
        self.with(|i| i.state)
    }

    pub fn last_error(&self) -> Option<String> {
        self.with(|i| i.last_error.clone())
    }

    pub fn lag(&self) -> Option<u64> {
        self.with(|i| i.lag)
    }
}
