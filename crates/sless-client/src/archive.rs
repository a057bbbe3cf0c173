//! Packs a function folder into a deterministic zip archive for upload.
//!
//! The same files always give the same bytes (sorted entries, fixed timestamps, normalised
//! modes), so the server's "same bytes do not rebuild" rule turns a repeated deploy into a
//! no-op. Symlinks are followed only while they stay inside the folder.

use std::fs::File;
use std::io::{Cursor, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Component, Path};

use anyhow::{Context, anyhow, bail};
use walkdir::WalkDir;
use zip::write::SimpleFileOptions;
use zip::{CompressionMethod, DateTime, ZipWriter};

/// Directories never worth shipping: VCS data, installed dependencies (the server installs
/// them from the manifest at build time), and caches.
const SKIPPED_DIRS: &[&str] = &[".git", "node_modules", "__pycache__", ".venv"];

/// Deploy settings file at the folder root; read by `deploy`, not part of the code.
pub const SETTINGS_FILE: &str = "sless.json";

/// A packed folder.
#[derive(Debug)]
pub struct Archive {
    /// The zip bytes.
    pub bytes: Vec<u8>,
    /// How many regular files it holds.
    pub files: usize,
}

/// True when the walk should not descend into or include `entry`.
fn skipped(entry: &walkdir::DirEntry) -> bool {
    let name = entry.file_name().to_string_lossy();
    if entry.file_type().is_dir() {
        return SKIPPED_DIRS.contains(&name.as_ref());
    }
    name.ends_with(".pyc") || (entry.depth() == 1 && name == SETTINGS_FILE)
}

/// The archive name of `relative`: `/`-separated, UTF-8, no `.`/`..` components.
fn entry_name(relative: &Path) -> anyhow::Result<String> {
    let mut parts = Vec::new();
    for component in relative.components() {
        match component {
            Component::Normal(part) => {
                parts.push(part.to_str().with_context(|| {
                    format!("{} has a name that is not UTF-8", relative.display())
                })?)
            }
            _ => bail!("unexpected path component in {}", relative.display()),
        }
    }
    Ok(parts.join("/"))
}

/// Explains a failed walk; a symlink to an ancestor of the folder is reported as leading
/// outside it (walkdir sees it first as a loop).
fn walk_error(root: &Path, err: walkdir::Error) -> anyhow::Error {
    let link = err
        .path()
        .map(|p| p.strip_prefix(root).unwrap_or(p).display().to_string())
        .unwrap_or_default();
    match err.loop_ancestor() {
        Some(ancestor) if !ancestor.starts_with(root) => anyhow!(
            "{link} is a symlink to {}, outside {}; only files inside the folder can be deployed",
            ancestor.display(),
            root.display()
        ),
        Some(ancestor) => anyhow!("{link} is a symlink loop back to {}", ancestor.display()),
        None => anyhow::Error::new(err).context(format!("cannot read {}", root.display())),
    }
}

/// Zips the files below `root`. Fails on a symlink that leads outside `root`, a broken
/// symlink, a symlink loop, or a folder with no files to ship.
pub fn zip_dir(root: &Path) -> anyhow::Result<Archive> {
    let root = root
        .canonicalize()
        .with_context(|| format!("cannot open {}", root.display()))?;
    if !root.is_dir() {
        bail!("{} is not a directory", root.display());
    }
    // The DOS epoch as every entry's time: real mtimes would make identical code differ.
    let base = SimpleFileOptions::default()
        .compression_method(CompressionMethod::Deflated)
        .last_modified_time(DateTime::default());
    let mut zip = ZipWriter::new(Cursor::new(Vec::new()));
    let mut files = 0;

    let walk = WalkDir::new(&root)
        .follow_links(true)
        .sort_by_file_name()
        .min_depth(1);
    for entry in walk.into_iter().filter_entry(|e| !skipped(e)) {
        let entry = match entry {
            Ok(entry) => entry,
            Err(err) => return Err(walk_error(&root, err)),
        };
        let path = entry.path();
        let relative = path
            .strip_prefix(&root)
            .with_context(|| format!("{} is outside the folder", path.display()))?;
        if entry.path_is_symlink() {
            let target = path
                .canonicalize()
                .with_context(|| format!("{} is a broken symlink", relative.display()))?;
            if !target.starts_with(&root) {
                bail!(
                    "{} is a symlink to {}, outside {}; only files inside the folder can be deployed",
                    relative.display(),
                    target.display(),
                    root.display()
                );
            }
        }
        let name = entry_name(relative)?;
        let file_type = entry.file_type();
        if file_type.is_dir() {
            zip.add_directory(format!("{name}/"), base.unix_permissions(0o755))
                .with_context(|| format!("cannot add {name}/ to the archive"))?;
        } else if file_type.is_file() {
            let metadata = entry
                .metadata()
                .with_context(|| format!("cannot stat {}", relative.display()))?;
            // Only the executable bit matters to the function; normalising the rest keeps the
            // bytes independent of the local umask.
            let mode = if metadata.permissions().mode() & 0o111 != 0 {
                0o755
            } else {
                0o644
            };
            let options = base
                .unix_permissions(mode)
                .large_file(metadata.len() >= u64::from(u32::MAX));
            zip.start_file(name.as_str(), options)
                .with_context(|| format!("cannot add {name} to the archive"))?;
            let mut file =
                File::open(path).with_context(|| format!("cannot read {}", relative.display()))?;
            std::io::copy(&mut file, &mut zip)
                .with_context(|| format!("cannot read {}", relative.display()))?;
            files += 1;
        }
        // Sockets, FIFOs and devices are not code; they are left out.
    }
    if files == 0 {
        bail!("{} holds no files to deploy", root.display());
    }
    let mut cursor = zip.finish().context("cannot finish the archive")?;
    cursor.flush().context("cannot finish the archive")?;
    Ok(Archive {
        bytes: cursor.into_inner(),
        files,
    })
}

#[cfg(test)]
mod tests {
    use std::io::Read;
    use std::os::unix::fs::symlink;
    use std::time::{Duration, SystemTime};

    use zip::ZipArchive;

    use super::*;

    fn write(root: &Path, rel: &str, content: &str) {
        let path = root.join(rel);
        std::fs::create_dir_all(path.parent().expect("has a parent")).expect("mkdir");
        std::fs::write(path, content).expect("write");
    }

    fn names(bytes: &[u8]) -> Vec<String> {
        let archive = ZipArchive::new(Cursor::new(bytes)).expect("valid zip");
        // Raw names in central-directory order: the order the writer used.
        archive
            .file_names_raw()
            .map(|n| String::from_utf8_lossy(n).into_owned())
            .collect()
    }

    fn read(bytes: &[u8], name: &str) -> String {
        let mut archive = ZipArchive::new(Cursor::new(bytes)).expect("valid zip");
        let mut out = String::new();
        archive
            .by_name(name)
            .expect("entry")
            .read_to_string(&mut out)
            .expect("read");
        out
    }

    #[test]
    fn identical_files_give_identical_bytes() {
        let dir = tempfile::tempdir().expect("tempdir");
        write(dir.path(), "handler.py", "def handle(e):\n    return e\n");
        write(dir.path(), "lib/util.py", "X = 1\n");
        let first = zip_dir(dir.path()).expect("zip");
        // A new mtime (as after a checkout) must not change the bytes.
        let file = File::options()
            .write(true)
            .open(dir.path().join("handler.py"))
            .expect("open");
        file.set_modified(SystemTime::now() - Duration::from_secs(86_400))
            .expect("set mtime");
        let second = zip_dir(dir.path()).expect("zip");
        assert_eq!(first.bytes, second.bytes);
        assert_eq!(first.files, 2);
        // A content change does change them.
        write(dir.path(), "lib/util.py", "X = 2\n");
        assert_ne!(zip_dir(dir.path()).expect("zip").bytes, first.bytes);
    }

    #[test]
    fn entries_are_sorted_and_junk_is_skipped() {
        let dir = tempfile::tempdir().expect("tempdir");
        for rel in [
            "handler.py",
            "b.txt",
            "a/z.py",
            "a/m.py",
            ".git/config",
            "node_modules/left-pad/index.js",
            "__pycache__/handler.cpython-311.pyc",
            "a/old.pyc",
            ".venv/bin/python",
            "sless.json",
            "a/sless.json",
        ] {
            write(dir.path(), rel, rel);
        }
        let archive = zip_dir(dir.path()).expect("zip");
        // Only the root sless.json is deploy settings; a nested one is the user's file.
        assert_eq!(
            names(&archive.bytes),
            [
                "a/",
                "a/m.py",
                "a/sless.json",
                "a/z.py",
                "b.txt",
                "handler.py"
            ]
        );
        assert_eq!(read(&archive.bytes, "a/m.py"), "a/m.py");
    }

    #[test]
    fn keeps_the_exec_bit_and_normalises_the_rest() {
        let dir = tempfile::tempdir().expect("tempdir");
        write(dir.path(), "run.sh", "#!/bin/sh\n");
        write(dir.path(), "handler.py", "");
        let set = |rel: &str, mode| {
            std::fs::set_permissions(dir.path().join(rel), std::fs::Permissions::from_mode(mode))
                .expect("chmod")
        };
        set("run.sh", 0o700);
        set("handler.py", 0o600);
        let archive = zip_dir(dir.path()).expect("zip");
        let mut zip = ZipArchive::new(Cursor::new(archive.bytes)).expect("valid zip");
        assert_eq!(
            zip.by_name("run.sh")
                .expect("entry")
                .unix_mode()
                .map(|m| m & 0o777),
            Some(0o755)
        );
        assert_eq!(
            zip.by_name("handler.py")
                .expect("entry")
                .unix_mode()
                .map(|m| m & 0o777),
            Some(0o644)
        );
    }

    #[test]
    fn follows_symlinks_inside_the_folder() {
        let dir = tempfile::tempdir().expect("tempdir");
        write(dir.path(), "shared/config.json", "{}");
        symlink("shared/config.json", dir.path().join("config.json")).expect("symlink");
        let archive = zip_dir(dir.path()).expect("zip");
        assert_eq!(read(&archive.bytes, "config.json"), "{}");
    }

    #[test]
    fn refuses_symlinks_leaving_the_folder() {
        let outside = tempfile::tempdir().expect("tempdir");
        write(outside.path(), "secret.txt", "top secret");
        let dir = tempfile::tempdir().expect("tempdir");
        write(dir.path(), "handler.py", "");
        symlink(
            outside.path().join("secret.txt"),
            dir.path().join("leak.txt"),
        )
        .expect("symlink");
        let err = zip_dir(dir.path()).expect_err("must refuse");
        assert!(
            format!("{err:#}").contains("leak.txt is a symlink to"),
            "{err:#}"
        );

        std::fs::remove_file(dir.path().join("leak.txt")).expect("rm");
        symlink("..", dir.path().join("up")).expect("symlink");
        let err = zip_dir(dir.path()).expect_err("must refuse a directory link too");
        assert!(format!("{err:#}").contains("outside"), "{err:#}");
    }

    #[test]
    fn refuses_broken_symlinks_loops_and_empty_folders() {
        let dir = tempfile::tempdir().expect("tempdir");
        let err = zip_dir(dir.path()).expect_err("empty");
        assert!(format!("{err:#}").contains("holds no files"), "{err:#}");
        symlink("nowhere", dir.path().join("dangling")).expect("symlink");
        assert!(zip_dir(dir.path()).is_err());
        std::fs::remove_file(dir.path().join("dangling")).expect("rm");
        write(dir.path(), "a/handler.py", "");
        symlink("..", dir.path().join("a/again")).expect("symlink");
        let err = zip_dir(dir.path()).expect_err("loop");
        assert!(
            format!("{err:#}").contains("a/again is a symlink loop"),
            "{err:#}"
        );
    }
}
