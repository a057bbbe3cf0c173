//! Content addresses of builds and installed dependencies. Both are scoped to
//! a namespace: two tenants never share a build or an install, even for
//! byte-identical archives.

use sha2::{Digest, Sha256};
use sless_core::RuntimeFamily;

/// Bumped whenever the layout or the steps of a build change, so that builds made
/// by an older sless are not reused. 2: keys carry the namespace, installs read
/// only the files their manifests name.
pub const BUILDER_FORMAT_VERSION: u32 = 2;

/// The key of a finished build: same inputs, same key, same directory.
pub fn build_key(
    namespace: &str,
    family: RuntimeFamily,
    entrypoint: &str,
    code_sha256: &str,
) -> String {
    let mut h = Sha256::new();
    for part in [
        "sless-build",
        &BUILDER_FORMAT_VERSION.to_string(),
        namespace,
        family.as_str(),
        entrypoint,
        code_sha256,
    ] {
        // Length-prefixed, so no two different inputs hash the same bytes.
        h.update((part.len() as u64).to_le_bytes());
        h.update(part.as_bytes());
    }
    hex::encode(h.finalize())
}

/// Accumulates the inputs of a dependency install: the namespace, the
/// toolchain that installs, and every file the installer may read.
pub(crate) struct DepsKey(Sha256);

impl DepsKey {
    pub(crate) fn new(namespace: &str, family: RuntimeFamily, toolchain: &str) -> Self {
        let mut key = DepsKey(Sha256::new());
        key.add("sless-deps", BUILDER_FORMAT_VERSION.to_string().as_bytes());
        key.add("namespace", namespace.as_bytes());
        key.add("family", family.as_str().as_bytes());
        key.add("toolchain", toolchain.as_bytes());
        key
    }

    /// Adds one named input (a manifest, a lock file, a vendored package).
    pub(crate) fn add(&mut self, name: &str, bytes: &[u8]) {
        for part in [name.as_bytes(), bytes] {
            self.0.update((part.len() as u64).to_le_bytes());
            self.0.update(part);
        }
    }

    pub(crate) fn finish(self) -> String {
        hex::encode(self.0.finalize())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn build_keys_depend_on_every_input() {
        let key = |ns, family, ep, sha| build_key(ns, family, ep, sha);
        let base = key("default", RuntimeFamily::Python3, "handler.handle", "abc");
        assert_eq!(
            base,
            key("default", RuntimeFamily::Python3, "handler.handle", "abc")
        );
        assert_eq!(base.len(), 64);
        for other in [
            key("team-b", RuntimeFamily::Python3, "handler.handle", "abc"),
            key("default", RuntimeFamily::Nodejs, "handler.handle", "abc"),
            key("default", RuntimeFamily::Python3, "handler.main", "abc"),
            key("default", RuntimeFamily::Python3, "handler.handle", "abd"),
            // Length prefixes keep shifted boundaries apart.
            key("default", RuntimeFamily::Python3, "handler.handleabc", ""),
        ] {
            assert_ne!(base, other);
        }
    }

    #[test]
    fn deps_keys_depend_on_namespace_toolchain_and_files() {
        let key = |ns: &str, toolchain: &str, file: &[u8]| {
            let mut k = DepsKey::new(ns, RuntimeFamily::Python3, toolchain);
            k.add("file:requirements.txt", b"-rmore.txt\n");
            k.add("file:vendor/a.whl", file);
            k.finish()
        };
        let base = key("team-a", "3.11.2 pip 23.0.1", b"one");
        assert_eq!(base, key("team-a", "3.11.2 pip 23.0.1", b"one"));
        for other in [
            key("team-b", "3.11.2 pip 23.0.1", b"one"),
            key("team-a", "3.12.1 pip 24.0", b"one"),
            key("team-a", "3.11.2 pip 23.0.1", b"two"),
        ] {
            assert_ne!(base, other);
        }
    }
}
