//! File-tree chores around a sandboxed step: handing a tree to the sandbox user,
//! taking it back (owned by the server, world-readable, not writable), copying,
//! and publishing a finished tree under its final name.

use std::fs;
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use sless_sandbox::Sandbox;

/// Every directory and file under `root` (itself included) becomes writable by
/// the sandbox user. Symlinks are left alone: changing the owner of a link's
/// target is exactly what must not happen.
pub(crate) fn grant_tree(sandbox: &Sandbox, root: &Path) -> io::Result<()> {
    for entry in walkdir::WalkDir::new(root) {
        let entry = entry.map_err(io::Error::other)?;
        if !entry.file_type().is_symlink() {
            sandbox
                .grant_write(entry.path())
                .map_err(io::Error::other)?;
        }
    }
    Ok(())
}

/// Takes back a tree the sandbox user wrote: owner `uid:gid`, directories 0755,
/// files 0755 when any execute bit was set and 0644 otherwise. Setting the mode
/// explicitly also drops setuid/setgid/sticky bits the build may have set.
pub(crate) fn seal_tree(root: &Path, uid: u32, gid: u32) -> io::Result<()> {
    for entry in walkdir::WalkDir::new(root) {
        let entry = entry.map_err(io::Error::other)?;
        let path = entry.path();
        // `lchown`: a symlink made by the build must not hand its target to anyone.
        std::os::unix::fs::lchown(path, Some(uid), Some(gid))?;
        let kind = entry.file_type();
        if kind.is_symlink() {
            continue;
        }
        let mode = if kind.is_dir() {
            0o755
        } else {
            let old = entry
                .metadata()
                .map_err(io::Error::other)?
                .permissions()
                .mode();
            if old & 0o111 != 0 { 0o755 } else { 0o644 }
        };
        fs::set_permissions(path, fs::Permissions::from_mode(mode))?;
    }
    Ok(())
}

/// Copies the tree `src` into the existing empty directory `dst`: directories,
/// regular files (with their modes) and symlinks (as links).
pub(crate) fn copy_tree(src: &Path, dst: &Path) -> io::Result<()> {
    for entry in walkdir::WalkDir::new(src).min_depth(1) {
        let entry = entry.map_err(io::Error::other)?;
        let rel = entry.path().strip_prefix(src).map_err(io::Error::other)?;
        let to = dst.join(rel);
        let kind = entry.file_type();
        if kind.is_dir() {
            fs::create_dir(&to)?;
        } else if kind.is_symlink() {
            std::os::unix::fs::symlink(fs::read_link(entry.path())?, &to)?;
        } else if kind.is_file() {
            fs::copy(entry.path(), &to)?;
        }
    }
    Ok(())
}

/// Replaces each symlink under `modules` that leads to a folder elsewhere in
/// `project` with a copy of that folder.
///
/// npm links `file:` folder dependencies of the project itself
/// (`node_modules/x -> ../libs/x`) even with `--install-links`; such links would
/// dangle once `node_modules` moves to the dependencies directory. Links inside
/// `modules` (`.bin/`) and links leaving `project` are left as they are: the
/// first stay valid, the second only mean something inside the sandbox.
pub(crate) fn materialize_links(project: &Path, modules: &Path) -> io::Result<usize> {
    let project = project.canonicalize()?;
    let modules_real = modules.canonicalize()?;
    let links: Vec<_> = walkdir::WalkDir::new(modules)
        .into_iter()
        .filter_map(Result::ok)
        .filter(|e| e.file_type().is_symlink())
        .map(|e| e.into_path())
        .collect();
    let mut replaced = 0;
    for link in links {
        let Ok(target) = link.canonicalize() else {
            continue;
        };
        if !target.is_dir() || !target.starts_with(&project) || target.starts_with(&modules_real) {
            continue;
        }
        fs::remove_file(&link)?;
        fs::create_dir(&link)?;
        copy_tree(&target, &link)?;
        replaced += 1;
    }
    Ok(replaced)
}

/// Publishes the finished tree `tmp` as `dest`: writes `marker` inside it, then
/// renames it into place. The marker goes in before the rename, so a directory
/// under its final name with a marker is always complete; one without a marker
/// (from a crash of an older layout, or a hand edit) is replaced.
pub(crate) fn publish(
    tmp: tempfile::TempDir,
    dest: &Path,
    marker: &str,
    contents: &[u8],
) -> io::Result<()> {
    let marker_path = tmp.path().join(marker);
    // The user's archive may hold a file or folder of that name; ours wins.
    match fs::symlink_metadata(&marker_path) {
        Ok(meta) if meta.is_dir() => fs::remove_dir_all(&marker_path)?,
        Ok(_) => fs::remove_file(&marker_path)?,
        Err(_) => {}
    }
    fs::write(&marker_path, contents)?;
    fs::set_permissions(&marker_path, fs::Permissions::from_mode(0o644))?;
    if fs::symlink_metadata(dest).is_ok() {
        fs::remove_dir_all(dest)?;
    }
    fs::rename(tmp.path(), dest)?;
    // Renamed away: nothing left for the guard to delete.
    let _ = tmp.keep();
    Ok(())
}

/// Removes leftovers of builds interrupted by a crash (`.tmp-*` in `dir`).
pub(crate) fn remove_stale_temps(dir: &Path) -> io::Result<usize> {
    let mut removed = 0;
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        if entry.file_name().to_string_lossy().starts_with(".tmp-") {
            let path = entry.path();
            if entry.file_type()?.is_dir() {
                fs::remove_dir_all(&path)?;
            } else {
                fs::remove_file(&path)?;
            }
            removed += 1;
        }
    }
    Ok(removed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    fn mode(p: &Path) -> u32 {
        fs::symlink_metadata(p).unwrap().permissions().mode() & 0o7777
    }

    #[test]
    fn seal_normalises_modes_and_owner() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        fs::create_dir(root.join("d")).unwrap();
        fs::write(root.join("d/plain"), b"").unwrap();
        fs::write(root.join("d/tool"), b"").unwrap();
        fs::set_permissions(root.join("d/plain"), fs::Permissions::from_mode(0o666)).unwrap();
        fs::set_permissions(root.join("d/tool"), fs::Permissions::from_mode(0o4700)).unwrap();
        fs::set_permissions(root.join("d"), fs::Permissions::from_mode(0o777)).unwrap();
        std::os::unix::fs::symlink("/etc/hostname", root.join("link")).unwrap();
        let me = fs::metadata(root).unwrap();
        seal_tree(root, me.uid(), me.gid()).unwrap();
        assert_eq!(mode(root), 0o755);
        assert_eq!(mode(&root.join("d")), 0o755);
        assert_eq!(mode(&root.join("d/plain")), 0o644);
        assert_eq!(
            mode(&root.join("d/tool")),
            0o755,
            "setuid dropped, executable kept"
        );
        assert!(
            fs::symlink_metadata(root.join("link"))
                .unwrap()
                .file_type()
                .is_symlink()
        );
    }

    #[test]
    fn copy_keeps_files_modes_and_links() {
        let src = tempfile::tempdir().unwrap();
        let dst = tempfile::tempdir().unwrap();
        fs::create_dir_all(src.path().join("a/b")).unwrap();
        fs::write(src.path().join("a/b/f"), b"data").unwrap();
        fs::set_permissions(src.path().join("a/b/f"), fs::Permissions::from_mode(0o755)).unwrap();
        std::os::unix::fs::symlink("b/f", src.path().join("a/l")).unwrap();
        copy_tree(src.path(), dst.path()).unwrap();
        assert_eq!(fs::read(dst.path().join("a/b/f")).unwrap(), b"data");
        assert_eq!(mode(&dst.path().join("a/b/f")), 0o755);
        assert_eq!(
            fs::read_link(dst.path().join("a/l")).unwrap(),
            Path::new("b/f")
        );
    }

    #[test]
    fn links_to_project_folders_become_copies() {
        let p = tempfile::tempdir().unwrap();
        let root = p.path();
        fs::create_dir_all(root.join("libs/dep")).unwrap();
        fs::write(root.join("libs/dep/index.js"), b"x").unwrap();
        fs::create_dir_all(root.join("node_modules/.bin")).unwrap();
        fs::create_dir_all(root.join("node_modules/real/bin")).unwrap();
        std::os::unix::fs::symlink("../libs/dep", root.join("node_modules/dep")).unwrap();
        std::os::unix::fs::symlink("../real/bin", root.join("node_modules/.bin/tool")).unwrap();
        std::os::unix::fs::symlink("/usr", root.join("node_modules/outside")).unwrap();
        assert_eq!(
            materialize_links(root, &root.join("node_modules")).unwrap(),
            1
        );
        let dep = root.join("node_modules/dep");
        assert!(fs::symlink_metadata(&dep).unwrap().is_dir());
        assert_eq!(fs::read(dep.join("index.js")).unwrap(), b"x");
        assert!(
            fs::symlink_metadata(root.join("node_modules/.bin/tool"))
                .unwrap()
                .is_symlink()
        );
        assert!(
            fs::symlink_metadata(root.join("node_modules/outside"))
                .unwrap()
                .is_symlink()
        );
    }

    #[test]
    fn publish_replaces_an_unmarked_destination_and_writes_the_marker() {
        let parent = tempfile::tempdir().unwrap();
        let dest = parent.path().join("final");
        fs::create_dir(&dest).unwrap();
        fs::write(dest.join("stale"), b"").unwrap();
        let tmp = tempfile::Builder::new()
            .prefix(".tmp-")
            .tempdir_in(parent.path())
            .unwrap();
        fs::write(tmp.path().join("new"), b"").unwrap();
        fs::create_dir(tmp.path().join(".marker")).unwrap();
        let tmp_path = tmp.path().to_path_buf();
        publish(tmp, &dest, ".marker", b"ok").unwrap();
        assert!(!tmp_path.exists());
        assert!(dest.join("new").exists() && !dest.join("stale").exists());
        assert_eq!(fs::read(dest.join(".marker")).unwrap(), b"ok");
    }

    #[test]
    fn stale_temps_are_removed() {
        let dir = tempfile::tempdir().unwrap();
        fs::create_dir(dir.path().join(".tmp-build-x")).unwrap();
        fs::write(dir.path().join(".tmp-build-x/f"), b"").unwrap();
        fs::create_dir(dir.path().join("keep")).unwrap();
        assert_eq!(remove_stale_temps(dir.path()).unwrap(), 1);
        assert!(dir.path().join("keep").exists());
        assert!(!dir.path().join(".tmp-build-x").exists());
    }
}
