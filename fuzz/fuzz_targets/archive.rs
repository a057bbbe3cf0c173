//! The archive checker on arbitrary bytes: never panics, and whatever it lets
//! `extract_zip` write stays inside the destination and within the limits.

#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;
use sless_blob::{ArchiveLimits, extract_zip, inspect_zip, list_source};

fn limits() -> ArchiveLimits {
    ArchiveLimits {
        max_compressed: 1 << 20,
        max_unpacked: 4 << 20,
        max_files: 64,
    }
}

fuzz_target!(|data: &[u8]| {
    let limits = limits();
    let inspected = inspect_zip(data, &limits);
    let _ = list_source(data, &limits);
    let Ok(info) = inspected else {
        return;
    };
    assert!(info.files <= limits.max_files);
    assert!(info.unpacked_bytes <= limits.max_unpacked);
    let dir = tempfile::tempdir().expect("tempdir");
    let dest = dir.path().join("code");
    if let Ok(written) = extract_zip(data, &dest, &limits) {
        assert!(written.files <= limits.max_files);
        assert!(written.unpacked_bytes <= limits.max_unpacked);
        check_inside(&dest);
    }
});

/// Every entry under `dest` is a file, folder or link whose target stays inside.
fn check_inside(dest: &Path) {
    let root = dest.canonicalize().expect("dest exists");
    let mut stack = vec![dest.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).expect("read_dir") {
            let entry = entry.expect("entry");
            let kind = entry.file_type().expect("file type");
            let path = entry.path();
            if kind.is_symlink() {
                // A dangling link is allowed (its target may be a later entry
                // that failed); one that resolves must resolve inside.
                if let Ok(target) = path.canonicalize() {
                    assert!(
                        target.starts_with(&root),
                        "{} escapes to {}",
                        path.display(),
                        target.display()
                    );
                }
            } else if kind.is_dir() {
                stack.push(path);
            } else {
                assert!(kind.is_file(), "{} is not a file", path.display());
            }
        }
    }
}
