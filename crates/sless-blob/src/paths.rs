//! Path rules for archive entries and symlink targets: what "stays inside the
//! archive" means, decided on the names alone, before anything is written.

use std::collections::HashMap;

/// How many symlinks one resolution may pass through before it is called a loop
/// (the Linux kernel's limit, so anything the kernel could resolve we can too).
const MAX_LINK_HOPS: usize = 40;

/// The longest file name component Linux accepts.
const MAX_COMPONENT: usize = 255;

/// Why a name is refused; the caller turns it into a user-facing error.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum PathProblem {
    /// Contains a NUL byte.
    Nul,
    /// Uses `\`, which some tools treat as a separator.
    Backslash,
    /// Starts with `/` or a drive letter.
    Absolute,
    /// A `..` component that climbs above the root.
    Leaves,
    /// A `..` component that stays inside; refused anyway (the API contract says
    /// archives with `..` components are rejected, and no zip tool writes them).
    DotDot,
    /// A component longer than the file system allows.
    TooLong,
    /// A symlink chain longer than the kernel would follow (usually a loop).
    Loop,
}

/// Splits an entry name into its normal components: `a/./b/` → `["a", "b"]`.
///
/// Empty and `.` components are dropped; everything that could name a path
/// outside the destination is refused.
pub(crate) fn entry_components(name: &str) -> Result<Vec<&str>, PathProblem> {
    check_chars(name)?;
    if name.starts_with('/') || has_drive_letter(name) {
        return Err(PathProblem::Absolute);
    }
    let mut parts = Vec::new();
    let mut depth: usize = 0;
    let mut dotdot = false;
    for part in name.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                dotdot = true;
                depth = depth.checked_sub(1).ok_or(PathProblem::Leaves)?;
            }
            _ => {
                if part.len() > MAX_COMPONENT {
                    return Err(PathProblem::TooLong);
                }
                depth += 1;
                parts.push(part);
            }
        }
    }
    if dotdot {
        return Err(PathProblem::DotDot);
    }
    Ok(parts)
}

fn check_chars(name: &str) -> Result<(), PathProblem> {
    if name.contains('\0') {
        return Err(PathProblem::Nul);
    }
    if name.contains('\\') {
        return Err(PathProblem::Backslash);
    }
    Ok(())
}

/// `C:` or `C:/...`: harmless on Linux, but a clear sign of an archive made to
/// escape on some other extractor, so refused like an absolute path.
fn has_drive_letter(name: &str) -> bool {
    let b = name.as_bytes();
    b.len() >= 2 && b[0].is_ascii_alphabetic() && b[1] == b':' && (b.len() == 2 || b[2] == b'/')
}

/// Where a symlink resolves once extracted, as components below the root, or
/// `Err` if it leaves the root (directly, or through other links in the archive).
///
/// `links` maps every symlink entry's normalised path (`a/b`) to its raw target.
/// This follows the kernel's rules on a tree that holds exactly the archive's
/// entries: `..` steps up from the real location reached so far, so a link
/// `a/up -> ..` is fine but `b -> a/up/..` is not (it would reach the parent of
/// the root).
pub(crate) fn resolve_link(
    links: &HashMap<String, String>,
    link_path: &[&str],
) -> Result<Vec<String>, PathProblem> {
    let mut hops = 0;
    let key = link_path.join("/");
    let target = links.get(&key).map(String::as_str).unwrap_or_default();
    let parent: Vec<String> = link_path[..link_path.len().saturating_sub(1)]
        .iter()
        .map(|s| s.to_string())
        .collect();
    follow(links, parent, target, &mut hops)
}

fn follow(
    links: &HashMap<String, String>,
    mut at: Vec<String>,
    target: &str,
    hops: &mut usize,
) -> Result<Vec<String>, PathProblem> {
    check_chars(target)?;
    if target.starts_with('/') || has_drive_letter(target) {
        return Err(PathProblem::Absolute);
    }
    for part in target.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                at.pop().ok_or(PathProblem::Leaves)?;
            }
            _ => {
                at.push(part.to_string());
                if let Some(next) = links.get(&at.join("/")) {
                    *hops += 1;
                    if *hops > MAX_LINK_HOPS {
                        return Err(PathProblem::Loop);
                    }
                    at.pop();
                    at = follow(links, at, next, hops)?;
                }
            }
        }
    }
    Ok(at)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn links(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect()
    }

    #[test]
    fn normal_names_are_split() {
        assert_eq!(entry_components("a/b/c.py"), Ok(vec!["a", "b", "c.py"]));
        assert_eq!(entry_components("./a//b/"), Ok(vec!["a", "b"]));
        assert_eq!(entry_components("C/x"), Ok(vec!["C", "x"]));
        assert_eq!(entry_components("..foo/bar.."), Ok(vec!["..foo", "bar.."]));
    }

    #[test]
    fn unsafe_names_are_refused() {
        assert_eq!(entry_components("../evil"), Err(PathProblem::Leaves));
        assert_eq!(entry_components("a/../../b"), Err(PathProblem::Leaves));
        assert_eq!(entry_components("a/../b"), Err(PathProblem::DotDot));
        assert_eq!(entry_components("/abs"), Err(PathProblem::Absolute));
        assert_eq!(entry_components("C:/windows"), Err(PathProblem::Absolute));
        assert_eq!(entry_components("C:"), Err(PathProblem::Absolute));
        assert_eq!(entry_components("..\\evil"), Err(PathProblem::Backslash));
        assert_eq!(entry_components("a\0b"), Err(PathProblem::Nul));
        assert_eq!(
            entry_components(&"x".repeat(256)),
            Err(PathProblem::TooLong)
        );
    }

    #[test]
    fn links_inside_resolve() {
        let l = links(&[("a/up", ".."), ("lib", "a/b/c"), ("same", ".")]);
        assert_eq!(resolve_link(&l, &["a", "up"]), Ok(vec![]));
        assert_eq!(
            resolve_link(&l, &["lib"]),
            Ok(vec!["a".into(), "b".into(), "c".into()])
        );
        assert_eq!(resolve_link(&l, &["same"]), Ok(vec![]));
    }

    #[test]
    fn links_that_leave_are_refused() {
        let l = links(&[
            ("x", "../../.."),
            ("abs", "/etc/passwd"),
            ("a/up", ".."),
            ("sneaky", "a/up/.."),
            ("loop1", "loop2"),
            ("loop2", "loop1"),
        ]);
        assert_eq!(resolve_link(&l, &["x"]), Err(PathProblem::Leaves));
        assert_eq!(resolve_link(&l, &["abs"]), Err(PathProblem::Absolute));
        // Lexically `a/up/..` is `a`, but `a/up` is the root, so `..` leaves it.
        assert_eq!(resolve_link(&l, &["sneaky"]), Err(PathProblem::Leaves));
        assert_eq!(resolve_link(&l, &["loop1"]), Err(PathProblem::Loop));
    }

    mod props {
        use super::*;
        use proptest::prelude::*;
        use std::path::Path;

        fn segment() -> impl Strategy<Value = &'static str> {
            prop_oneof![
                Just(".."),
                Just("."),
                Just(""),
                Just("a"),
                Just("b"),
                Just("c"),
                Just("l1"),
                Just("C:"),
                Just("x\\y")
            ]
        }

        /// Steps that walk between the links of the test tree, so chains of
        /// links through `..` come up often.
        fn link_segment() -> impl Strategy<Value = &'static str> {
            prop_oneof![
                3 => Just(".."),
                1 => Just("."),
                1 => Just("a"),
                1 => Just("b"),
                1 => Just("c"),
                2 => Just("l1"),
                2 => Just("l2"),
                2 => Just("l3"),
                2 => Just("l4"),
            ]
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(300))]

            #[test]
            fn accepted_names_are_plain_and_relative(segs in proptest::collection::vec(segment(), 0..8), lead in any::<bool>()) {
                let name = format!("{}{}", if lead { "/" } else { "" }, segs.join("/"));
                if let Ok(parts) = entry_components(&name) {
                    prop_assert!(!name.starts_with('/'));
                    prop_assert!(!name.split('/').any(|p| p == ".."));
                    prop_assert!(parts.iter().all(|p| !p.is_empty() && *p != "." && !p.contains('\\')));
                }
            }

            /// Whatever `resolve_link` accepts, the kernel resolves to the same
            /// place inside the root, on a real tree whose surroundings hold the
            /// same names (so an escape would land on something that exists).
            #[test]
            fn accepted_links_resolve_where_the_kernel_does(
                targets in proptest::collection::vec(proptest::collection::vec(link_segment(), 1..5), 4)
            ) {
                let base = tempfile::tempdir().unwrap();
                let root = base.path().join("root");
                for dir in ["a/b", "c", "root/a/b", "root/c"] {
                    std::fs::create_dir_all(base.path().join(dir)).unwrap();
                }
                let places = ["l1", "a/l2", "a/b/l3", "l4"];
                let mut links = HashMap::new();
                for (place, target) in places.iter().zip(&targets) {
                    let target = target.join("/");
                    if std::os::unix::fs::symlink(&target, root.join(place)).is_ok() {
                        links.insert(place.to_string(), target);
                    }
                }
                let real_root = root.canonicalize().unwrap();
                for place in places {
                    if !links.contains_key(place) {
                        continue;
                    }
                    let parts: Vec<&str> = place.split('/').collect();
                    // A dangling or looping link has no kernel answer to compare.
                    if let Ok(resolved) = resolve_link(&links, &parts)
                        && let Ok(real) = root.join(place).canonicalize()
                    {
                        prop_assert!(real.starts_with(&real_root), "{place} -> {real:?}");
                        prop_assert_eq!(real, real_root.join(Path::new(&resolved.join("/"))));
                    }
                }
            }
        }
    }
}
