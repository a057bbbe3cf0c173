//! Zip archives from users: validation without extraction, bounded extraction,
//! and the source listing.
//!
//! Every function here runs [`inspect_zip`] first, so nothing is written for an
//! archive that names a path outside the root, holds a symlink that leads out,
//! or declares more data than the limits allow. Extraction then counts the bytes
//! it actually writes, because the declared sizes are the uploader's word.
//!
//! Symlinks whose target stays inside the archive (followed through the
//! archive's other links, as the kernel would) are created as symlinks, after
//! every regular file has been written, so no file is ever written through a
//! link. Entries *inside* a symlinked directory are refused.
//!
//! These functions do blocking file IO; async callers run them in
//! `tokio::task::spawn_blocking`.

use std::collections::{BTreeSet, HashMap};
use std::fs;
use std::io::{Cursor, Read, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;

use base64::Engine;
use zip::{CompressionMethod, ZipArchive};

use crate::paths::{self, PathProblem};

/// The longest symlink target accepted (Linux's `PATH_MAX`).
const MAX_LINK_TARGET: u64 = 4096;

/// Size and count limits for one archive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ArchiveLimits {
    /// The largest archive accepted, in bytes (default 64 MiB).
    pub max_compressed: u64,
    /// The most bytes an archive may unpack to (default 512 MiB).
    pub max_unpacked: u64,
    /// The most entries (files, directories and links) an archive may hold.
    pub max_files: usize,
}

impl Default for ArchiveLimits {
    fn default() -> Self {
        ArchiveLimits {
            max_compressed: 64 << 20,
            max_unpacked: 512 << 20,
            max_files: 20_000,
        }
    }
}

/// What [`inspect_zip`] found in an acceptable archive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ArchiveInfo {
    /// Regular files and symlinks (directories are not counted).
    pub files: usize,
    /// Sum of the regular files' sizes (declared by [`inspect_zip`], written by
    /// [`extract_zip`]).
    pub unpacked_bytes: u64,
}

/// Why an archive is refused. The messages are meant for the uploader.
#[derive(Debug, thiserror::Error)]
pub enum ArchiveError {
    /// The upload has no bytes, or the zip holds no files (directories only).
    #[error("the archive is empty: it holds no files")]
    Empty,
    /// The bytes are not a zip archive we can read (garbage, corrupt data,
    /// encryption, an unsupported compression method).
    #[error("the archive cannot be read: {0}")]
    Unreadable(String),
    /// An entry would land outside the destination: absolute path, `..`,
    /// backslashes, or a symlink whose target is absolute or leaves the archive.
    #[error("unsafe archive: {0}")]
    UnsafePath(String),
    /// Over one of the [`ArchiveLimits`].
    #[error("archive too large: {0}")]
    TooLarge(String),
    /// Writing the extracted files failed on our side (disk full, permissions);
    /// not the uploader's fault.
    #[error("extracting the archive: {0}")]
    Io(#[from] std::io::Error),
}

/// One file of an archive, as `GET .../source` shows it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct SourceFile {
    /// The path inside the archive, normalised (`a/b.py`).
    pub name: String,
    /// UTF-8 text, or base64 when `binary`.
    pub content: String,
    /// The file is not UTF-8 text (or contains NUL bytes); `content` is base64.
    pub binary: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Dir,
    File { executable: bool },
    Symlink,
}

/// One entry that passed validation.
#[derive(Debug)]
struct Entry {
    index: usize,
    /// The name as written in the archive, for messages.
    name: String,
    /// Normalised components; never empty, never `.`/`..`.
    parts: Vec<String>,
    kind: Kind,
    declared_size: u64,
}

/// A validated archive: its reader and the entries worth extracting.
struct Plan<'a> {
    zip: ZipArchive<Cursor<&'a [u8]>>,
    entries: Vec<Entry>,
    links: HashMap<String, String>,
    info: ArchiveInfo,
}

/// Validates an archive without extracting it.
///
/// Refuses: an empty upload or a zip without files ([`ArchiveError::Empty`]);
/// bytes that are not a readable zip ([`ArchiveError::Unreadable`]); absolute
/// paths, `..` components, backslashes, and symlinks whose target is absolute or
/// leaves the archive root ([`ArchiveError::UnsafePath`]); more than
/// `max_compressed` bytes, more than `max_files` entries or declared sizes over
/// `max_unpacked` ([`ArchiveError::TooLarge`]).
pub fn inspect_zip(bytes: &[u8], limits: &ArchiveLimits) -> Result<ArchiveInfo, ArchiveError> {
    plan(bytes, limits).map(|p| p.info)
}

/// Validates the archive with [`inspect_zip`], then extracts it into `dest`.
///
/// `dest` is created if missing and must be empty. Regular files get mode 0644,
/// or 0755 when the archive marks them executable; directories 0755 (the
/// process umask does not apply). The unpacked limit is enforced on the bytes
/// actually written, so an archive that lies about its sizes stops at the limit.
/// On error, whatever was written stays in `dest` for the caller to remove.
pub fn extract_zip(
    bytes: &[u8],
    dest: &Path,
    limits: &ArchiveLimits,
) -> Result<ArchiveInfo, ArchiveError> {
    let mut plan = plan(bytes, limits)?;

    fs::create_dir_all(dest)?;
    if fs::read_dir(dest)?.next().is_some() {
        return Err(ArchiveError::Io(std::io::Error::new(
            std::io::ErrorKind::AlreadyExists,
            format!("destination {} is not empty", dest.display()),
        )));
    }
    fs::set_permissions(dest, fs::Permissions::from_mode(0o755))?;

    // Every directory, explicit or implied by a deeper entry, parents first
    // (a sorted set of component lists orders `a` before `a/b`).
    let mut dirs: BTreeSet<&[String]> = BTreeSet::new();
    for entry in &plan.entries {
        let own = if entry.kind == Kind::Dir {
            entry.parts.len()
        } else {
            entry.parts.len() - 1
        };
        for depth in 1..=own {
            dirs.insert(&entry.parts[..depth]);
        }
    }
    for dir in dirs {
        let path = dest.join(dir.join("/"));
        fs::create_dir(&path)?;
        fs::set_permissions(&path, fs::Permissions::from_mode(0o755))?;
    }

    let mut written: u64 = 0;
    let mut buf = vec![0u8; 64 * 1024];
    for entry in &plan.entries {
        let Kind::File { executable } = entry.kind else {
            continue;
        };
        let mode = if executable { 0o755 } else { 0o644 };
        let path = dest.join(entry.parts.join("/"));
        // `create_new` never follows or replaces anything already there.
        let mut out = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .open(&path)?;
        let mut file = plan
            .zip
            .by_index(entry.index)
            .map_err(|e| corrupt(&entry.name, e))?;
        let mut entry_written: u64 = 0;
        loop {
            let n = file.read(&mut buf).map_err(|e| corrupt(&entry.name, e))?;
            if n == 0 {
                break;
            }
            // The zip reader already refuses data beyond an entry's declared size;
            // counting here as well keeps the limit independent of that detail.
            entry_written += n as u64;
            written += n as u64;
            if written > limits.max_unpacked {
                return Err(ArchiveError::TooLarge(format!(
                    "the archive unpacks to more than {}, the limit",
                    human(limits.max_unpacked)
                )));
            }
            if entry_written > entry.declared_size {
                return Err(ArchiveError::Unreadable(format!(
                    "entry {:?} holds more data than its header declares ({} bytes)",
                    entry.name, entry.declared_size
                )));
            }
            out.write_all(&buf[..n])?;
        }
        // The mode given to `open` is filtered by the umask; set it exactly.
        out.set_permissions(fs::Permissions::from_mode(mode))?;
    }

    // Links last, so no file above was written through one.
    for entry in plan.entries.iter().filter(|e| e.kind == Kind::Symlink) {
        let target = &plan.links[&entry.parts.join("/")];
        std::os::unix::fs::symlink(target, dest.join(entry.parts.join("/")))?;
    }

    plan.info.unpacked_bytes = written;
    Ok(plan.info)
}

/// The archive's regular files, sorted by name, for `GET .../source`: UTF-8
/// text as is, anything else base64 with `binary: true`. Directories and
/// symlinks are left out. Validates the archive like [`inspect_zip`] first.
pub fn list_source(bytes: &[u8], limits: &ArchiveLimits) -> Result<Vec<SourceFile>, ArchiveError> {
    let mut plan = plan(bytes, limits)?;
    let mut out = Vec::new();
    let mut read_total: u64 = 0;
    for entry in &plan.entries {
        let Kind::File { .. } = entry.kind else {
            continue;
        };
        let file = plan
            .zip
            .by_index(entry.index)
            .map_err(|e| corrupt(&entry.name, e))?;
        // One byte over the declared size is enough to tell a liar.
        let mut data = Vec::with_capacity(entry.declared_size.min(1 << 20) as usize);
        file.take(entry.declared_size + 1)
            .read_to_end(&mut data)
            .map_err(|e| corrupt(&entry.name, e))?;
        if data.len() as u64 > entry.declared_size {
            return Err(ArchiveError::Unreadable(format!(
                "entry {:?} holds more data than its header declares ({} bytes)",
                entry.name, entry.declared_size
            )));
        }
        read_total += data.len() as u64;
        if read_total > limits.max_unpacked {
            return Err(ArchiveError::TooLarge(format!(
                "the archive unpacks to more than {}, the limit",
                human(limits.max_unpacked)
            )));
        }
        let name = entry.parts.join("/");
        let file = match String::from_utf8(data) {
            Ok(text) if !text.contains('\0') => SourceFile {
                name,
                content: text,
                binary: false,
            },
            Ok(text) => SourceFile {
                name,
                content: b64(text.as_bytes()),
                binary: true,
            },
            Err(e) => SourceFile {
                name,
                content: b64(e.as_bytes()),
                binary: true,
            },
        };
        out.push(file);
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}

fn b64(data: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(data)
}

fn corrupt(name: &str, e: impl std::fmt::Display) -> ArchiveError {
    ArchiveError::Unreadable(format!("entry {name:?} is corrupt: {e}"))
}

/// `12.0 MiB`, for limits in messages.
fn human(bytes: u64) -> String {
    const MIB: u64 = 1 << 20;
    if bytes >= MIB && bytes.is_multiple_of(MIB) {
        format!("{} MiB", bytes / MIB)
    } else if bytes >= MIB {
        format!("{:.1} MiB", bytes as f64 / MIB as f64)
    } else {
        format!("{bytes} bytes")
    }
}

fn unsafe_entry(name: &str, problem: PathProblem) -> ArchiveError {
    let why = match problem {
        PathProblem::Nul => "contains a NUL byte",
        PathProblem::Backslash => "contains a backslash (zip paths use /)",
        PathProblem::Absolute => "is an absolute path",
        PathProblem::Leaves => "leaves the archive",
        PathProblem::DotDot => "has a \"..\" component",
        PathProblem::TooLong => "has a name component longer than 255 bytes",
        PathProblem::Loop => "is part of a symlink loop",
    };
    ArchiveError::UnsafePath(format!("entry {name:?} {why}"))
}

fn unsafe_link(name: &str, target: &str, problem: PathProblem) -> ArchiveError {
    let why = match problem {
        PathProblem::Absolute => "points to an absolute path",
        PathProblem::Loop => "is part of a symlink loop",
        PathProblem::Nul | PathProblem::Backslash => "has a malformed target",
        PathProblem::Leaves | PathProblem::DotDot | PathProblem::TooLong => "leaves the archive",
    };
    ArchiveError::UnsafePath(format!("symlink {name:?} -> {target:?} {why}"))
}

/// Everything [`inspect_zip`] promises, returning what extraction needs.
fn plan<'a>(bytes: &'a [u8], limits: &ArchiveLimits) -> Result<Plan<'a>, ArchiveError> {
    if bytes.is_empty() {
        return Err(ArchiveError::Empty);
    }
    if bytes.len() as u64 > limits.max_compressed {
        return Err(ArchiveError::TooLarge(format!(
            "the archive is {}, the limit is {}",
            human(bytes.len() as u64),
            human(limits.max_compressed)
        )));
    }
    let mut zip = ZipArchive::new(Cursor::new(bytes))
        .map_err(|e| ArchiveError::Unreadable(format!("not a valid zip file ({e})")))?;
    if zip.len() > limits.max_files {
        return Err(ArchiveError::TooLarge(format!(
            "the archive has {} entries, the limit is {}",
            zip.len(),
            limits.max_files
        )));
    }

    let mut entries = Vec::with_capacity(zip.len());
    let mut declared: u64 = 0;
    for index in 0..zip.len() {
        let meta = zip
            .by_index_data(index)
            .map_err(|e| ArchiveError::Unreadable(format!("entry {index} cannot be read ({e})")))?;
        let name = meta
            .name()
            .map_err(|e| ArchiveError::Unreadable(format!("entry {index} has a bad name ({e})")))?
            .into_owned();
        if meta.encrypted() {
            return Err(ArchiveError::Unreadable(format!(
                "entry {name:?} is encrypted; upload an archive without a password"
            )));
        }
        let method = meta.compression();
        if method != CompressionMethod::Stored && method != CompressionMethod::Deflated {
            return Err(ArchiveError::Unreadable(format!(
                "entry {name:?} uses the {method} compression method; only deflate and store are supported"
            )));
        }
        let parts = paths::entry_components(&name).map_err(|p| unsafe_entry(&name, p))?;
        let kind = if meta.is_symlink() {
            Kind::Symlink
        } else if meta.is_dir() {
            Kind::Dir
        } else {
            Kind::File {
                executable: meta.unix_mode().is_some_and(|m| m & 0o111 != 0),
            }
        };
        if parts.is_empty() {
            // `./` is a harmless spelling of the root; anything else without a
            // name cannot be written anywhere.
            if kind == Kind::Dir {
                continue;
            }
            return Err(ArchiveError::UnsafePath(format!(
                "entry {name:?} has no file name"
            )));
        }
        let declared_size = meta.size();
        match kind {
            Kind::File { .. } => declared = declared.saturating_add(declared_size),
            Kind::Symlink if declared_size > MAX_LINK_TARGET => {
                return Err(ArchiveError::UnsafePath(format!(
                    "symlink {name:?} has a target longer than {MAX_LINK_TARGET} bytes"
                )));
            }
            _ => {}
        }
        let parts = parts.into_iter().map(str::to_string).collect();
        entries.push(Entry {
            index,
            name,
            parts,
            kind,
            declared_size,
        });
    }

    // Each normalised path once, with its kind; two spellings of one file
    // (`a/b` and `./a/b`) would make the result depend on their order.
    let mut kinds: HashMap<String, Kind> = HashMap::with_capacity(entries.len());
    for entry in &entries {
        let key = entry.parts.join("/");
        if let Some(old) = kinds.insert(key.clone(), entry.kind)
            && !(old == Kind::Dir && entry.kind == Kind::Dir)
        {
            return Err(ArchiveError::Unreadable(format!(
                "the archive holds {key:?} twice"
            )));
        }
    }
    for entry in &entries {
        for depth in 1..entry.parts.len() {
            let prefix = entry.parts[..depth].join("/");
            match kinds.get(&prefix) {
                Some(Kind::Symlink) => {
                    return Err(ArchiveError::UnsafePath(format!(
                        "entry {:?} is inside the symlink {prefix:?}",
                        entry.name
                    )));
                }
                Some(Kind::File { .. }) => {
                    return Err(ArchiveError::Unreadable(format!(
                        "entry {:?} is inside the file {prefix:?}",
                        entry.name
                    )));
                }
                _ => {}
            }
        }
    }

    let mut links = HashMap::new();
    for entry in entries.iter().filter(|e| e.kind == Kind::Symlink) {
        let mut target = String::new();
        zip.by_index(entry.index)
            .map_err(|e| corrupt(&entry.name, e))?
            .take(MAX_LINK_TARGET)
            .read_to_string(&mut target)
            .map_err(|e| corrupt(&entry.name, e))?;
        if target.is_empty() {
            return Err(ArchiveError::UnsafePath(format!(
                "symlink {:?} has an empty target",
                entry.name
            )));
        }
        links.insert(entry.parts.join("/"), target);
    }
    for entry in entries.iter().filter(|e| e.kind == Kind::Symlink) {
        let parts: Vec<&str> = entry.parts.iter().map(String::as_str).collect();
        paths::resolve_link(&links, &parts)
            .map_err(|p| unsafe_link(&entry.name, &links[&entry.parts.join("/")], p))?;
    }

    let files = entries.iter().filter(|e| e.kind != Kind::Dir).count();
    if files == 0 {
        return Err(ArchiveError::Empty);
    }
    if declared > limits.max_unpacked {
        return Err(ArchiveError::TooLarge(format!(
            "the archive unpacks to {}, the limit is {}",
            human(declared),
            human(limits.max_unpacked)
        )));
    }
    Ok(Plan {
        zip,
        entries,
        links,
        info: ArchiveInfo {
            files,
            unpacked_bytes: declared,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use zip::write::SimpleFileOptions;

    /// What to put in a test archive.
    enum E<'a> {
        File(&'a str, &'a [u8]),
        Exec(&'a str, &'a [u8]),
        Dir(&'a str),
        Link(&'a str, &'a str),
    }

    fn zip_of(entries: &[E]) -> Vec<u8> {
        let mut w = zip::ZipWriter::new(Cursor::new(Vec::new()));
        let opts = SimpleFileOptions::default().compression_method(CompressionMethod::Deflated);
        for e in entries {
            match e {
                E::File(name, data) | E::Exec(name, data) => {
                    let mode = if matches!(e, E::Exec(..)) {
                        0o755
                    } else {
                        0o644
                    };
                    w.start_file(*name, opts.unix_permissions(mode)).unwrap();
                    w.write_all(data).unwrap();
                }
                E::Dir(name) => w.add_directory(*name, opts).unwrap(),
                E::Link(name, target) => w.add_symlink(*name, *target, opts).unwrap(),
            }
        }
        w.finish().unwrap().into_inner()
    }

    fn limits() -> ArchiveLimits {
        ArchiveLimits::default()
    }

    fn unsafe_message(bytes: &[u8]) -> String {
        match inspect_zip(bytes, &limits()) {
            Err(ArchiveError::UnsafePath(m)) => m,
            other => panic!("expected UnsafePath, got {other:?}"),
        }
    }

    fn mode(path: &Path) -> u32 {
        fs::symlink_metadata(path).unwrap().permissions().mode() & 0o777
    }

    #[test]
    fn a_normal_archive_extracts_with_nested_dirs_and_modes() {
        let bytes = zip_of(&[
            E::File("handler.py", b"def handle(e):\n    return e\n"),
            E::Dir("lib/"),
            E::File("lib/deep/util.py", b"X = 1\n"),
            E::Exec("bin/run.sh", b"#!/bin/sh\necho hi\n"),
        ]);
        let info = inspect_zip(&bytes, &limits()).unwrap();
        assert_eq!(
            info,
            ArchiveInfo {
                files: 3,
                unpacked_bytes: 28 + 6 + 18
            }
        );

        let dir = tempfile::tempdir().unwrap();
        let dest = dir.path().join("out");
        let got = extract_zip(&bytes, &dest, &limits()).unwrap();
        assert_eq!(got, info);
        assert_eq!(
            fs::read(dest.join("handler.py")).unwrap(),
            b"def handle(e):\n    return e\n"
        );
        assert_eq!(fs::read(dest.join("lib/deep/util.py")).unwrap(), b"X = 1\n");
        assert_eq!(mode(&dest.join("handler.py")), 0o644);
        assert_eq!(mode(&dest.join("bin/run.sh")), 0o755, "executable bit kept");
        for d in ["", "lib", "lib/deep", "bin"] {
            assert_eq!(mode(&dest.join(d)), 0o755, "{d}");
        }
    }

    #[test]
    fn empty_and_garbage_archives() {
        assert!(matches!(
            inspect_zip(b"", &limits()),
            Err(ArchiveError::Empty)
        ));
        assert!(matches!(
            inspect_zip(&zip_of(&[]), &limits()),
            Err(ArchiveError::Empty)
        ));
        let only_dirs = zip_of(&[E::Dir("a/"), E::Dir("a/b/")]);
        assert!(matches!(
            inspect_zip(&only_dirs, &limits()),
            Err(ArchiveError::Empty)
        ));
        let garbage = b"this is not a zip file at all, just some text".repeat(10);
        assert!(matches!(
            inspect_zip(&garbage, &limits()),
            Err(ArchiveError::Unreadable(_))
        ));
        let mut truncated = zip_of(&[E::File("a.py", &[1u8; 1000])]);
        truncated.truncate(truncated.len() / 2);
        assert!(matches!(
            inspect_zip(&truncated, &limits()),
            Err(ArchiveError::Unreadable(_))
        ));
    }

    #[test]
    fn unsafe_entry_names_are_refused_with_their_name() {
        let m = unsafe_message(&zip_of(&[E::File("ok.py", b""), E::File("../evil", b"x")]));
        assert_eq!(m, r#"entry "../evil" leaves the archive"#);
        let m = unsafe_message(&zip_of(&[E::File("/abs", b"x")]));
        assert_eq!(m, r#"entry "/abs" is an absolute path"#);
        let m = unsafe_message(&zip_of(&[E::File("a/../../b", b"x")]));
        assert_eq!(m, r#"entry "a/../../b" leaves the archive"#);
        let m = unsafe_message(&zip_of(&[E::File("a/../b", b"x")]));
        assert!(m.contains(r#"has a ".." component"#), "{m}");
        let m = unsafe_message(&zip_of(&[E::File("..\\evil", b"x")]));
        assert!(m.contains("backslash"), "{m}");
        // The Display form keeps the entry name for the API's message.
        let err = inspect_zip(&zip_of(&[E::File("../x", b"")]), &limits()).unwrap_err();
        assert_eq!(
            err.to_string(),
            r#"unsafe archive: entry "../x" leaves the archive"#
        );
    }

    #[test]
    fn symlinks_that_leave_are_refused() {
        let m = unsafe_message(&zip_of(&[
            E::File("a.py", b""),
            E::Link("pw", "/etc/passwd"),
        ]));
        assert_eq!(
            m,
            r#"symlink "pw" -> "/etc/passwd" points to an absolute path"#
        );
        let m = unsafe_message(&zip_of(&[E::File("a.py", b""), E::Link("x", "../../..")]));
        assert_eq!(m, r#"symlink "x" -> "../../.." leaves the archive"#);
        // Lexically inside, but `d/up` is the root, so `d/up/..` is its parent.
        let m = unsafe_message(&zip_of(&[
            E::File("a.py", b""),
            E::Link("d/up", ".."),
            E::Link("esc", "d/up/.."),
        ]));
        assert!(m.starts_with(r#"symlink "esc""#), "{m}");
        // Writing through a link is refused even when the link itself is fine.
        let m = unsafe_message(&zip_of(&[E::Link("lnk", "sub"), E::File("lnk/x.py", b"")]));
        assert_eq!(m, r#"entry "lnk/x.py" is inside the symlink "lnk""#);
    }

    #[test]
    fn symlinks_that_stay_inside_are_created() {
        let bytes = zip_of(&[
            E::File("lib/v1/mod.py", b"V = 1\n"),
            E::Link("lib/current", "v1"),
            E::Link("lib/v1/root", "../.."),
        ]);
        let dir = tempfile::tempdir().unwrap();
        let info = extract_zip(&bytes, dir.path(), &limits()).unwrap();
        assert_eq!(info.files, 3);
        assert_eq!(
            fs::read_link(dir.path().join("lib/current")).unwrap(),
            Path::new("v1")
        );
        assert_eq!(
            fs::read(dir.path().join("lib/current/mod.py")).unwrap(),
            b"V = 1\n"
        );
        assert!(dir.path().join("lib/v1/root/lib").is_dir());
    }

    #[test]
    fn declared_sizes_over_the_limits_are_refused() {
        let small = ArchiveLimits {
            max_compressed: 1 << 20,
            max_unpacked: 1000,
            max_files: 3,
        };
        let big = zip_of(&[E::File("a", &[0u8; 600]), E::File("b", &[0u8; 600])]);
        assert!(matches!(
            inspect_zip(&big, &small),
            Err(ArchiveError::TooLarge(_))
        ));
        let many = zip_of(&[
            E::File("a", b""),
            E::File("b", b""),
            E::File("c", b""),
            E::File("d", b""),
        ]);
        assert!(
            matches!(inspect_zip(&many, &small), Err(ArchiveError::TooLarge(m)) if m.contains("4 entries"))
        );
        let tiny = ArchiveLimits {
            max_compressed: 100,
            ..small
        };
        let err = inspect_zip(&big, &tiny).unwrap_err();
        assert!(
            matches!(err, ArchiveError::TooLarge(ref m) if m.contains("limit is 100 bytes")),
            "{err}"
        );
    }

    /// Rewrites every uncompressed-size field of a single-entry zip, as a bomb
    /// that lies about its size would.
    fn lie_about_size(mut bytes: Vec<u8>, size: u32) -> Vec<u8> {
        let mut patched = 0;
        for i in 0..bytes.len().saturating_sub(4) {
            match &bytes[i..i + 4] {
                b"PK\x03\x04" => {
                    bytes[i + 22..i + 26].copy_from_slice(&size.to_le_bytes());
                    patched += 1;
                }
                b"PK\x01\x02" => {
                    bytes[i + 24..i + 28].copy_from_slice(&size.to_le_bytes());
                    patched += 1;
                }
                _ => {}
            }
        }
        assert_eq!(patched, 2, "one local and one central header");
        bytes
    }

    #[test]
    fn a_bomb_lying_about_its_size_stops_at_the_limit() {
        let limit = ArchiveLimits {
            max_unpacked: 1 << 20,
            ..limits()
        };
        let honest = zip_of(&[E::File("zeros.bin", &vec![0u8; 2 << 20])]);
        assert!(honest.len() < 10_000, "deflated zeros are small");
        assert!(matches!(
            inspect_zip(&honest, &limit),
            Err(ArchiveError::TooLarge(_))
        ));

        let bomb = lie_about_size(honest, 100);
        assert_eq!(
            inspect_zip(&bomb, &limit).unwrap().unpacked_bytes,
            100,
            "the lie passes inspection"
        );
        let dir = tempfile::tempdir().unwrap();
        let err = extract_zip(&bomb, dir.path(), &limit).unwrap_err();
        assert!(
            matches!(err, ArchiveError::Unreadable(_) | ArchiveError::TooLarge(_)),
            "{err}"
        );
        let on_disk = fs::metadata(dir.path().join("zeros.bin"))
            .map(|m| m.len())
            .unwrap_or(0);
        assert!(on_disk <= 100, "wrote {on_disk} bytes");
        assert!(matches!(
            list_source(&bomb, &limit),
            Err(ArchiveError::Unreadable(_))
        ));
    }

    #[test]
    fn extraction_needs_an_empty_destination() {
        let bytes = zip_of(&[E::File("a.py", b"")]);
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("old"), b"").unwrap();
        assert!(matches!(
            extract_zip(&bytes, dir.path(), &limits()),
            Err(ArchiveError::Io(_))
        ));
    }

    #[test]
    fn duplicates_and_file_dir_clashes_are_unreadable() {
        let dup = zip_of(&[E::File("a/b", b"1"), E::File("./a/b", b"2")]);
        assert!(
            matches!(inspect_zip(&dup, &limits()), Err(ArchiveError::Unreadable(m)) if m.contains("twice"))
        );
        let clash = zip_of(&[E::File("a", b"1"), E::File("a/b", b"2")]);
        assert!(
            matches!(inspect_zip(&clash, &limits()), Err(ArchiveError::Unreadable(m)) if m.contains("inside the file"))
        );
    }

    #[test]
    fn list_source_sorts_and_encodes_binary_files() {
        let bytes = zip_of(&[
            E::File("z.py", b"print('z')\n"),
            E::Dir("data/"),
            E::File("data/blob.bin", &[0xff, 0x00, 0x10]),
            E::File("data/nul.txt", b"a\0b"),
            E::File("a.txt", "h\u{e9}llo".as_bytes()),
            E::Link("link", "a.txt"),
        ]);
        let files = list_source(&bytes, &limits()).unwrap();
        let names: Vec<_> = files.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(names, ["a.txt", "data/blob.bin", "data/nul.txt", "z.py"]);
        assert_eq!(
            files[0],
            SourceFile {
                name: "a.txt".into(),
                content: "h\u{e9}llo".into(),
                binary: false
            }
        );
        assert_eq!(files[1].content, "/wAQ");
        assert!(files[1].binary && files[2].binary);
        assert!(!files[3].binary);
        let json = serde_json::to_value(&files[3]).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"name": "z.py", "content": "print('z')\n", "binary": false})
        );
    }

    #[test]
    fn list_source_refuses_what_inspect_refuses() {
        let bytes = zip_of(&[E::File("../x", b"")]);
        assert!(matches!(
            list_source(&bytes, &limits()),
            Err(ArchiveError::UnsafePath(_))
        ));
    }

    mod props {
        use super::*;
        use proptest::prelude::*;

        fn name() -> impl Strategy<Value = String> {
            let seg = prop_oneof![
                Just(".."),
                Just("."),
                Just(""),
                Just("a"),
                Just("b"),
                Just("/"),
                Just("\\")
            ];
            proptest::collection::vec(seg, 1..6).prop_map(|s| s.join("/"))
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(128))]

            /// Whatever passes inspection is extracted entirely inside `dest`.
            #[test]
            fn accepted_archives_stay_inside(names in proptest::collection::btree_set(name(), 1..6)) {
                let mut w = zip::ZipWriter::new(Cursor::new(Vec::new()));
                let opts = SimpleFileOptions::default();
                for n in &names {
                    w.start_file(n.as_str(), opts).unwrap();
                    w.write_all(n.as_bytes()).unwrap();
                }
                let bytes = w.finish().unwrap().into_inner();
                let base = tempfile::tempdir().unwrap();
                let dest = base.path().join("x/dest");
                if let Ok(info) = inspect_zip(&bytes, &limits()) {
                    let extracted = extract_zip(&bytes, &dest, &limits());
                    let files: Vec<_> = walkdir::WalkDir::new(base.path())
                        .into_iter()
                        .map(|e| e.unwrap())
                        .filter(|e| !e.file_type().is_dir())
                        .map(|e| e.into_path())
                        .collect();
                    prop_assert!(files.iter().all(|f| f.starts_with(&dest)), "{files:?}");
                    if extracted.is_ok() {
                        prop_assert_eq!(files.len(), info.files);
                    }
                }
            }
        }
    }
}
