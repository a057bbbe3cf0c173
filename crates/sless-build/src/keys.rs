//! Content addresses of builds and installed dependencies, and which local files
//! a dependency manifest pulls in (so changing a vendored package reinstalls).

use std::fs;
use std::io;
use std::path::{Component, Path};

use sha2::{Digest, Sha256};
use sless_core::RuntimeFamily;

/// Bumped whenever the layout or the steps of a build change, so that builds made
/// by an older sless are not reused.
pub const BUILDER_FORMAT_VERSION: u32 = 1;

/// The key of a finished build: same inputs, same key, same directory.
pub fn build_key(family: RuntimeFamily, entrypoint: &str, code_sha256: &str) -> String {
    let mut h = Sha256::new();
    for part in [
        "sless-build",
        &BUILDER_FORMAT_VERSION.to_string(),
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

/// Accumulates the inputs of a dependency install.
pub(crate) struct DepsKey(Sha256);

impl DepsKey {
    pub(crate) fn new(family: RuntimeFamily) -> Self {
        let mut key = DepsKey(Sha256::new());
        key.add("sless-deps", BUILDER_FORMAT_VERSION.to_string().as_bytes());
        key.add("family", family.as_str().as_bytes());
        key
    }

    /// Adds one named input (a manifest, a lock file, a vendored package).
    pub(crate) fn add(&mut self, name: &str, bytes: &[u8]) {
        for part in [name.as_bytes(), bytes] {
            self.0.update((part.len() as u64).to_le_bytes());
            self.0.update(part);
        }
    }

    /// Adds the file or directory tree at `rel` (inside `code`), if it exists
    /// and stays inside `code`. Returns whether it was added.
    pub(crate) fn add_local(&mut self, code: &Path, rel: &str) -> io::Result<bool> {
        let rel = rel.trim();
        let rel_path = Path::new(rel);
        let inside = !rel.is_empty()
            && rel_path
                .components()
                .all(|c| matches!(c, Component::Normal(_) | Component::CurDir));
        if !inside {
            return Ok(false);
        }
        let path = code.join(rel_path);
        // Symlinks in the code stay inside the archive (checked at upload), so
        // following them here reads archive content only.
        let Ok(meta) = fs::metadata(&path) else {
            return Ok(false);
        };
        if meta.is_file() {
            self.add(&format!("file:{rel}"), &fs::read(&path)?);
        } else if meta.is_dir() {
            let mut entries: Vec<_> = walkdir::WalkDir::new(&path)
                .sort_by_file_name()
                .into_iter()
                .collect::<Result<_, _>>()
                .map_err(io::Error::other)?;
            entries.retain(|e| e.file_type().is_file());
            for entry in entries {
                let sub = entry.path().strip_prefix(code).unwrap_or(entry.path());
                self.add(&format!("file:{}", sub.display()), &fs::read(entry.path())?);
            }
        } else {
            return Ok(false);
        }
        Ok(true)
    }

    pub(crate) fn finish(self) -> String {
        hex::encode(self.0.finalize())
    }
}

/// Local paths a `requirements.txt` may refer to: wheels, sdists, project
/// folders and nested `-r`/`-c` files. Every token is a candidate; the ones that
/// do not exist in the code (like `requests==2.32`) are ignored by
/// [`DepsKey::add_local`].
pub(crate) fn requirement_paths(requirements: &str) -> Vec<String> {
    let mut out = Vec::new();
    for line in requirements.lines() {
        let line = line.split(" #").next().unwrap_or_default();
        if line.trim_start().starts_with('#') {
            continue;
        }
        for token in line.split(|c: char| c.is_whitespace() || c == '=') {
            let token = token.strip_prefix("file:").unwrap_or(token);
            let token = token.split('#').next().unwrap_or_default();
            if !token.is_empty() && !token.starts_with('-') {
                out.push(token.to_string());
            }
        }
    }
    out
}

/// The `file:` dependencies of a `package.json` (tarballs or folders).
pub(crate) fn package_json_paths(package_json: &[u8]) -> Vec<String> {
    let Ok(serde_json::Value::Object(doc)) = serde_json::from_slice(package_json) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for section in ["dependencies", "optionalDependencies"] {
        if let Some(serde_json::Value::Object(deps)) = doc.get(section) {
            for spec in deps.values().filter_map(|v| v.as_str()) {
                if let Some(path) = spec.strip_prefix("file:") {
                    out.push(path.to_string());
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn build_keys_depend_on_every_input() {
        let base = build_key(RuntimeFamily::Python3, "handler.handle", "abc");
        assert_eq!(
            base,
            build_key(RuntimeFamily::Python3, "handler.handle", "abc")
        );
        assert_eq!(base.len(), 64);
        for other in [
            build_key(RuntimeFamily::Nodejs, "handler.handle", "abc"),
            build_key(RuntimeFamily::Python3, "handler.main", "abc"),
            build_key(RuntimeFamily::Python3, "handler.handle", "abd"),
            // Length prefixes keep shifted boundaries apart.
            build_key(RuntimeFamily::Python3, "handler.handleabc", ""),
        ] {
            assert_ne!(base, other);
        }
    }

    #[test]
    fn local_files_change_the_deps_key() {
        let dir = tempfile::tempdir().unwrap();
        fs::create_dir_all(dir.path().join("vendor/pkg")).unwrap();
        fs::write(dir.path().join("vendor/a.whl"), b"one").unwrap();
        fs::write(dir.path().join("vendor/pkg/x.js"), b"x").unwrap();
        let key = |extra: &str| {
            let mut k = DepsKey::new(RuntimeFamily::Python3);
            k.add("requirements.txt", b"./vendor/a.whl\n");
            assert!(k.add_local(dir.path(), "./vendor/a.whl").unwrap());
            assert!(k.add_local(dir.path(), "vendor/pkg").unwrap());
            assert!(!k.add_local(dir.path(), "../etc/passwd").unwrap());
            assert!(!k.add_local(dir.path(), "/etc/passwd").unwrap());
            assert!(!k.add_local(dir.path(), "requests").unwrap());
            k.add("extra", extra.as_bytes());
            k.finish()
        };
        let before = key("");
        assert_eq!(before, key(""));
        fs::write(dir.path().join("vendor/a.whl"), b"two").unwrap();
        let after_wheel = key("");
        assert_ne!(before, after_wheel);
        fs::write(dir.path().join("vendor/pkg/x.js"), b"y").unwrap();
        assert_ne!(after_wheel, key(""));
    }

    #[test]
    fn manifests_name_their_local_paths() {
        let req = "requests==2.32  # web\n# ./not/this.whl\n./vendor/tinylib-0.1-py3-none-any.whl\n-r more.txt\n-e file:./proj#egg=proj\n";
        let paths = requirement_paths(req);
        for p in [
            "./vendor/tinylib-0.1-py3-none-any.whl",
            "more.txt",
            "./proj",
            "requests",
        ] {
            assert!(paths.contains(&p.to_string()), "{p} in {paths:?}");
        }
        assert!(!paths.iter().any(|p| p.contains("not/this")));
        let pkg = br#"{"dependencies": {"a": "file:vendor/a.tgz", "b": "^1.0"}, "optionalDependencies": {"c": "file:./c"}, "devDependencies": {"d": "file:d"}}"#;
        assert_eq!(package_json_paths(pkg), ["vendor/a.tgz", "./c"]);
        assert!(package_json_paths(b"not json").is_empty());
    }
}
