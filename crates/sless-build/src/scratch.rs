//! The size-limited tmpfs one install writes to, so a runaway install (a
//! postinstall writing without end) fills its own bounded space, not the host's disk.
//!
//! The server (root) mounts a tmpfs of the limit on a fresh `.tmp-install-*`
//! directory under the deps directory and binds it into the sandbox; pages the
//! install writes are charged to its memory cgroup. When the install is done the
//! tree is copied to disk (see `Builder::ensure_deps`) and the tmpfs unmounted.
//! Not root: a plain directory, checked only once the install has finished.

use std::io;
use std::path::{Path, PathBuf};
use std::process::Stdio;

use crate::{BuildError, io_err};

const MOUNT: &str = "/usr/bin/mount";
const UMOUNT: &str = "/usr/bin/umount";
const PREFIX: &str = ".tmp-install-";
/// The tmpfs allows one inode per this many bytes of its size (at least 1024), so
/// millions of empty files cannot turn into millions of inodes on disk.
const BYTES_PER_INODE: u64 = 2048;

/// One install's scratch space; unmounted and removed when dropped.
pub(crate) struct Scratch {
    dir: Option<tempfile::TempDir>,
    mounted: bool,
}

impl Scratch {
    /// A fresh directory under `parent`, with a tmpfs of `bytes` on it when `bounded`.
    pub(crate) async fn new(
        parent: &Path,
        bytes: u64,
        bounded: bool,
    ) -> Result<Scratch, BuildError> {
        let dir = tempfile::Builder::new()
            .prefix(PREFIX)
            .tempdir_in(parent)
            .map_err(io_err("creating an install directory"))?;
        if !bounded {
            return Ok(Scratch {
                dir: Some(dir),
                mounted: false,
            });
        }
        let inodes = (bytes / BYTES_PER_INODE).max(1024);
        let out = tokio::process::Command::new(MOUNT)
            .args(["-t", "tmpfs", "-o"])
            .arg(format!(
                "size={bytes},nr_inodes={inodes},mode=0700,nosuid,nodev"
            ))
            .arg("sless-install")
            .arg(dir.path())
            .env_clear()
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .output()
            .await
            .map_err(io_err(format!("running {MOUNT}")))?;
        if !out.status.success() {
            return Err(BuildError::Internal(format!(
                "cannot mount the install's tmpfs on {} ({}): {}",
                dir.path().display(),
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
        Ok(Scratch {
            dir: Some(dir),
            mounted: true,
        })
    }

    pub(crate) fn path(&self) -> &Path {
        self.dir
            .as_ref()
            .map_or(Path::new("/nonexistent"), |d| d.path())
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let Some(dir) = self.dir.take() else {
            return;
        };
        if self.mounted {
            // A short blocking call (a millisecond or two) at the end of an install.
            unmount(dir.path());
        }
        drop(dir);
    }
}

/// Detaches the tmpfs on `path`; its memory goes with the last reference.
fn unmount(path: &Path) {
    let done = std::process::Command::new(UMOUNT)
        .arg("--lazy")
        .arg(path)
        .env_clear()
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
    match done {
        Ok(status) if status.success() => {}
        other => {
            tracing::warn!(path = %path.display(), result = ?other, "cannot unmount an install's tmpfs")
        }
    }
}

/// Unmounts the install tmpfs left under `dir` by a server that died mid-install,
/// so the `.tmp-` entries can be removed. Best effort.
pub(crate) fn unmount_stale(dir: &Path) {
    let Ok(dir) = dir.canonicalize() else {
        return;
    };
    let Ok(mounts) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return;
    };
    for point in stale_mounts(&mounts, &dir) {
        tracing::info!(path = %point.display(), "unmounting an interrupted install's tmpfs");
        unmount(&point);
    }
}

/// The mount points in `mountinfo` that are install scratch directories of `dir`.
fn stale_mounts(mountinfo: &str, dir: &Path) -> Vec<PathBuf> {
    mountinfo
        .lines()
        .filter_map(|line| line.split(' ').nth(4))
        .map(|point| PathBuf::from(unescape(point)))
        .filter(|point| {
            point.parent() == Some(dir)
                && point
                    .file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with(PREFIX))
        })
        .collect()
}

/// Undoes mountinfo's octal escapes (`\040` for a space).
fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes
            .get(i + 1..i + 4)
            .filter(|d| d.iter().all(|b| (b'0'..=b'7').contains(b)));
        if bytes[i] == b'\\'
            && let Some(digits) = octal
        {
            let code = digits.iter().fold(0u32, |n, d| n * 8 + u32::from(d - b'0'));
            out.push(u8::try_from(code).unwrap_or(b'?'));
            i += 4;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The apparent size of the regular files under `root`, each link counted: what a
/// copy would write.
pub(crate) fn tree_bytes(root: &Path) -> io::Result<u64> {
    let mut total = 0u64;
    for entry in walkdir::WalkDir::new(root) {
        let entry = entry.map_err(io::Error::other)?;
        if entry.file_type().is_file() {
            total = total.saturating_add(entry.metadata().map_err(io::Error::other)?.len());
        }
    }
    Ok(total)
}

/// The failure of an install that outgrew `limit`, followed by `detail`.
pub(crate) fn over_limit(limit: u64, detail: &str) -> BuildError {
    let mut message = format!(
        "the installed dependencies exceed the limit of {} MiB (the server's --max-deps-mb)",
        limit >> 20
    );
    if !detail.is_empty() {
        message.push_str(":\n");
        message.push_str(detail);
    }
    BuildError::Failed { message }
}

/// An install that failed for want of space ran into the tmpfs's limit (the only
/// file system it can fill): say so first.
pub(crate) fn explain_overflow(err: BuildError, limit: u64) -> BuildError {
    match err {
        BuildError::Failed { message }
            if message.contains("ENOSPC") || message.contains("No space left on device") =>
        {
            over_limit(limit, &message)
        }
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_only_this_directorys_install_mounts() {
        let info = "\
36 25 0:32 / /data/deps/.tmp-install-abc rw,nosuid,nodev - tmpfs sless-install rw,size=1024k
37 25 0:33 / /data/deps/.tmp-install-a\\040b rw - tmpfs sless-install rw
38 25 0:34 / /other/deps/.tmp-install-x rw - tmpfs sless-install rw
39 25 0:35 / /data/deps/.tmp-install-y/inner rw - tmpfs t rw
40 25 0:36 / /data/deps/abc rw - tmpfs t rw
";
        let found = stale_mounts(info, Path::new("/data/deps"));
        assert_eq!(
            found,
            vec![
                PathBuf::from("/data/deps/.tmp-install-abc"),
                PathBuf::from("/data/deps/.tmp-install-a b"),
            ]
        );
    }

    #[test]
    fn an_install_out_of_space_names_the_limit() {
        let err = explain_overflow(
            BuildError::Failed {
                message: "installing package.json dependencies failed (exit status: 1):\nError: ENOSPC: no space left on device, write".into(),
            },
            20 << 20,
        );
        let text = err.to_string();
        assert!(
            text.starts_with("the installed dependencies exceed the limit of 20 MiB"),
            "{text}"
        );
        assert!(text.contains("ENOSPC"), "{text}");
        let other = explain_overflow(
            BuildError::Failed {
                message: "installing requirements.txt failed (exit status: 1)".into(),
            },
            20 << 20,
        );
        assert_eq!(
            other.to_string(),
            "installing requirements.txt failed (exit status: 1)"
        );
    }
}
