//! The property the `archive` fuzz target in `fuzz/` checks, as a function the
//! unit tests replay too (the seeds, the kept regressions and generated inputs),
//! so `cargo test` exercises it without cargo-fuzz. Not an API.
//!
//! [`check_archive`] panics when the property fails: that is how a fuzzer or a
//! test learns of it, so the `expect`s below are the point, not shortcuts.

use std::path::Path;

use crate::{ArchiveLimits, extract_zip, inspect_zip, list_source};

/// Small limits, so that arbitrary bytes can reach them.
fn limits() -> ArchiveLimits {
    ArchiveLimits {
        max_compressed: 1 << 20,
        max_unpacked: 4 << 20,
        max_files: 64,
    }
}

/// Inspects, lists and extracts `data` as an uploaded archive: none of it
/// panics, an accepted archive is within the limits, and whatever extraction
/// writes is a file, folder or link that stays inside the destination.
///
/// # Panics
///
/// When any of that does not hold.
pub fn check_archive(data: &[u8]) {
    let limits = limits();
    let inspected = inspect_zip(data, &limits);
    let _ = list_source(data, &limits);
    let Ok(info) = inspected else {
        return;
    };
    assert!(info.files <= limits.max_files);
    assert!(info.unpacked_bytes <= limits.max_unpacked);
    let dir = tempfile::tempdir().expect("a temporary directory");
    let dest = dir.path().join("code");
    if let Ok(written) = extract_zip(data, &dest, &limits) {
        assert!(written.files <= limits.max_files);
        assert!(written.unpacked_bytes <= limits.max_unpacked);
        check_inside(&dest);
    }
}

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

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use proptest::prelude::*;
    use proptest::sample::Index;

    use super::*;

    /// Every file of `fuzz/seeds/archive` and `fuzz/regressions/archive`.
    fn corpus() -> Vec<(PathBuf, Vec<u8>)> {
        let fuzz = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz");
        let mut files = Vec::new();
        for dir in ["seeds", "regressions"] {
            let Ok(entries) = std::fs::read_dir(fuzz.join(dir).join("archive")) else {
                continue;
            };
            for entry in entries {
                let path = entry.unwrap().path();
                files.push((path.clone(), std::fs::read(&path).unwrap()));
            }
        }
        files.sort();
        files
    }

    #[test]
    fn the_fuzz_corpus_holds() {
        let corpus = corpus();
        assert!(corpus.len() >= 3, "no seeds found: {corpus:?}");
        for (path, data) in &corpus {
            eprintln!("replaying {}", path.display());
            check_archive(data);
        }
    }

    /// The check is live: a link that resolves outside the destination fails it.
    #[test]
    #[should_panic(expected = "escapes to")]
    fn a_link_out_of_the_destination_fails_the_check() {
        let base = tempfile::tempdir().unwrap();
        let dest = base.path().join("code");
        std::fs::create_dir_all(dest.join("sub")).unwrap();
        std::os::unix::fs::symlink(base.path(), dest.join("sub/up")).unwrap();
        check_inside(&dest);
    }

    /// A seed with up to 8 byte edits: overwrite, insert, remove or truncate.
    fn mutated(seeds: Vec<Vec<u8>>) -> impl Strategy<Value = Vec<u8>> {
        let edits = proptest::collection::vec((any::<Index>(), any::<u8>(), 0u8..8), 0..8);
        (0..seeds.len(), edits).prop_map(move |(i, edits)| {
            let mut data = seeds[i].clone();
            for (at, byte, kind) in edits {
                let len = data.len();
                match kind {
                    0..4 if len > 0 => data[at.index(len)] = byte,
                    4 | 5 => data.insert(at.index(len + 1), byte),
                    6 if len > 0 => {
                        data.remove(at.index(len));
                    }
                    _ => data.truncate(at.index(len + 1)),
                }
            }
            data
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        /// The fuzz target's property on seeds with a few bytes changed, and on
        /// arbitrary bytes.
        #[test]
        fn the_archive_property_holds_on_mutated_seeds(
            data in prop_oneof![
                4 => mutated(corpus().into_iter().map(|(_, d)| d).collect()),
                1 => proptest::collection::vec(any::<u8>(), 0..512),
            ]
        ) {
            check_archive(&data);
        }
    }
}
