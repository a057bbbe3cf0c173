//! The two things a reconcile drives, as small traits: [`Build`] (the builder)
//! and [`Deploy`] (the executor's pools). The server passes the real
//! [`Builder`] and [`Executor`]; unit tests pass fakes that count calls and fail
//! on demand, so the reconcile loop is tested without root or a sandbox.

use async_trait::async_trait;
use sless_build::{BuildError, BuildOutput, BuildRequest, Builder};
use sless_executor::{DeployError, Deployment, Executor};

/// Turns a revision's code into files an instance can run.
#[async_trait]
pub trait Build: Send + Sync + 'static {
    /// Builds `request`'s code, or reuses an identical earlier build.
    async fn build(&self, request: BuildRequest) -> Result<BuildOutput, BuildError>;
}

#[async_trait]
impl Build for Builder {
    async fn build(&self, request: BuildRequest) -> Result<BuildOutput, BuildError> {
        Builder::build(self, request).await
    }
}

/// Makes a revision serve, and stops serving a function.
#[async_trait]
pub trait Deploy: Send + Sync + 'static {
    /// Makes `deployment` the revision that serves its function; the old one
    /// keeps serving when the new one cannot start.
    async fn deploy(&self, deployment: Deployment) -> Result<(), DeployError>;
    /// Whether some revision of the function serves.
    fn is_deployed(&self, namespace: &str, name: &str) -> bool;
    /// Stops serving the function.
    fn remove(&self, namespace: &str, name: &str);
}

#[async_trait]
impl Deploy for Executor {
    async fn deploy(&self, deployment: Deployment) -> Result<(), DeployError> {
        Executor::deploy(self, deployment).await
    }

    fn is_deployed(&self, namespace: &str, name: &str) -> bool {
        Executor::is_deployed(self, namespace, name)
    }

    fn remove(&self, namespace: &str, name: &str) {
        Executor::remove(self, namespace, name)
    }
}
