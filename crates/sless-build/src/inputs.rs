//! The files of the code a dependency install may read, found by reading the
//! manifests; the install then runs on a copy holding only those files.
//!
//! The deps key hashes exactly these files, and the installer sees exactly
//! these files (see `stage`): a reference the parser misses cannot make the
//! key incomplete, it makes the install fail because the file is not there.
//! Handler sources not named by a manifest are not inputs, so a code-only
//! change reuses the installed dependencies.
//!
//! Manifests that point outside the archive (absolute paths, `..`, `file:` URLs
//! to the host, `${VAR}` expansion, `file:` indexes) are refused with a message
//! naming the manifest and the offending value: an install may read only the
//! archive and the network.

use std::collections::{BTreeSet, VecDeque};
use std::fs;
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::{Component, Path, PathBuf};

/// Why the inputs of an install could not be gathered.
#[derive(Debug, thiserror::Error)]
pub(crate) enum InputError {
    /// The manifest is at fault; the message is for the function's owner.
    #[error("{0}")]
    Refused(String),
    /// Reading the code failed.
    #[error("reading {path}: {source}")]
    Io {
        path: String,
        #[source]
        source: io::Error,
    },
}

fn refused(file: &str, what: impl std::fmt::Display) -> InputError {
    InputError::Refused(format!("{file}: {what}"))
}

/// The set of files (relative, `/`-separated, normalised) an install reads.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct Inputs {
    files: BTreeSet<String>,
}

impl Inputs {
    /// The files in a stable order.
    pub(crate) fn files(&self) -> impl Iterator<Item = &str> {
        self.files.iter().map(String::as_str)
    }

    /// Adds `rel` if it is a regular file, or every regular file under it if it
    /// is a folder. Returns whether anything of that name exists. Symlinks are
    /// not followed (the archive checker refuses them; this is a second line).
    fn add_existing(&mut self, code: &Path, rel: &str) -> Result<bool, InputError> {
        let path = code.join(rel);
        let Ok(meta) = fs::symlink_metadata(&path) else {
            return Ok(false);
        };
        if meta.is_file() {
            self.files.insert(rel.to_string());
        } else if meta.is_dir() {
            for entry in walkdir::WalkDir::new(&path).sort_by_file_name() {
                let entry = entry.map_err(|e| InputError::Io {
                    path: rel.to_string(),
                    source: io::Error::other(e),
                })?;
                if entry.file_type().is_file()
                    && let Ok(sub) = entry.path().strip_prefix(code)
                {
                    self.files.insert(sub.to_string_lossy().into_owned());
                }
            }
        }
        Ok(true)
    }

    fn read(&self, code: &Path, rel: &str) -> Result<Vec<u8>, InputError> {
        fs::read(code.join(rel)).map_err(|source| InputError::Io {
            path: rel.to_string(),
            source,
        })
    }
}

/// `rel` made relative to the code root, if it stays inside: no absolute
/// paths, no home directory, no `..` above the root. `.` components are
/// dropped; the code root itself is `"."`.
fn inside(rel: &str) -> Option<String> {
    if rel.is_empty() || rel.starts_with('~') || rel.contains('\0') {
        return None;
    }
    let mut parts: Vec<String> = Vec::new();
    for c in Path::new(rel).components() {
        match c {
            Component::Normal(p) => parts.push(p.to_string_lossy().into_owned()),
            Component::CurDir => {}
            Component::ParentDir => {
                parts.pop()?;
            }
            Component::RootDir | Component::Prefix(_) => return None,
        }
    }
    Some(if parts.is_empty() {
        ".".into()
    } else {
        parts.join("/")
    })
}

/// `base/rel` relative to the code root (`base` is a folder inside it).
fn join_inside(base: &str, rel: &str) -> Option<String> {
    if rel.starts_with('/') || rel.starts_with('~') {
        return None;
    }
    inside(&format!("{base}/{rel}"))
}

/// The folder `rel` is in (`"."` for the root).
fn parent_of(rel: &str) -> &str {
    rel.rsplit_once('/').map_or(".", |(dir, _)| dir)
}

/// A URL scheme (`https`, `git+ssh`, `file`), if `s` starts with one.
fn scheme(s: &str) -> Option<&str> {
    let (head, _) = s.split_once(':')?;
    let ok = head.len() > 1
        && head.starts_with(|c: char| c.is_ascii_alphabetic())
        && head
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'));
    ok.then_some(head)
}

/// The path of a `file:` URL or plain path, if it is relative; `None` for
/// anything that names a host path (`file:///x`, `file://host/x`, `/x`).
fn file_url_path(value: &str) -> Option<&str> {
    let path = value.strip_prefix("file:").unwrap_or(value);
    (!path.starts_with('/')).then_some(path)
}

/// The local path a pip requirement or option value names, without its
/// `#fragment` and `[extras]`.
fn strip_pip_decorations(value: &str) -> &str {
    let value = value.split('#').next().unwrap_or_default();
    match value.find('[') {
        Some(i) if value.ends_with(']') => &value[..i],
        _ => value,
    }
}

/// Requirement tokens that pip takes for a path rather than a project name.
fn looks_like_path(token: &str) -> bool {
    const ARCHIVES: [&str; 6] = [".whl", ".zip", ".tar.gz", ".tgz", ".tar.bz2", ".tar"];
    token.starts_with('.')
        || token.starts_with('/')
        || token.starts_with('~')
        || token.contains('/')
        || ARCHIVES.iter().any(|ext| token.ends_with(ext))
}

/// pip options allowed in a requirements file, and whether each takes a value.
/// `-r`, `-c`, `-e`, `-f`, `-i` and `--extra-index-url` are handled apart.
const PIP_PLAIN_OPTIONS: [(&str, bool); 11] = [
    ("--no-index", false),
    ("--pre", false),
    ("--prefer-binary", false),
    ("--require-hashes", false),
    ("--only-binary", true),
    ("--no-binary", true),
    ("--trusted-host", true),
    ("--use-feature", true),
    ("--hash", true),
    ("--config-settings", true),
    ("--global-option", true),
];

/// `requirements.txt` and every file it makes pip read: nested `-r`/`-c` files
/// (relative to the file naming them, as pip resolves them), local wheels,
/// sdists and project folders, `-e` folders and `--find-links` folders.
pub(crate) fn python(code: &Path) -> Result<Inputs, InputError> {
    let mut inputs = Inputs::default();
    let mut queue = VecDeque::from(["requirements.txt".to_string()]);
    let mut seen = BTreeSet::new();
    while let Some(file) = queue.pop_front() {
        if !seen.insert(file.clone()) {
            continue;
        }
        inputs.add_existing(code, &file)?;
        let text = inputs.read(code, &file)?;
        let text = String::from_utf8_lossy(&text);
        for line in logical_lines(&text) {
            python_line(code, &file, &line, &mut inputs, &mut queue)?;
        }
    }
    Ok(inputs)
}

/// Lines with `\` continuations joined and comments (`#` at the start or after
/// whitespace) removed, as pip reads them.
fn logical_lines(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut current = String::new();
    for raw in text.lines() {
        let mut line = raw.to_string();
        if let Some(i) = comment_start(&line) {
            line.truncate(i);
        }
        if let Some(body) = line.strip_suffix('\\') {
            current.push_str(body);
            current.push(' ');
            continue;
        }
        current.push_str(&line);
        let done = std::mem::take(&mut current);
        if !done.trim().is_empty() {
            out.push(done);
        }
    }
    if !current.trim().is_empty() {
        out.push(current);
    }
    out
}

fn comment_start(line: &str) -> Option<usize> {
    let bytes = line.as_bytes();
    (0..bytes.len()).find(|&i| bytes[i] == b'#' && (i == 0 || bytes[i - 1].is_ascii_whitespace()))
}

fn python_line(
    code: &Path,
    file: &str,
    line: &str,
    inputs: &mut Inputs,
    queue: &mut VecDeque<String>,
) -> Result<(), InputError> {
    if line.contains("${") {
        return Err(refused(
            file,
            format!(
                "`{}`: environment variables are not expanded in builds",
                line.trim()
            ),
        ));
    }
    let mut tokens = line.split_whitespace();
    while let Some(token) = tokens.next() {
        if !token.starts_with('-') {
            python_requirement(code, file, token, inputs)?;
            // The rest of the line is the requirement's specifiers and markers
            // (`name == 1.0; python_version < "3.12"`) or its options.
            continue;
        }
        let (name, inline) = split_option(token);
        let value = |tokens: &mut std::str::SplitWhitespace<'_>| {
            inline
                .map(str::to_string)
                .or_else(|| tokens.next().map(str::to_string))
                .ok_or_else(|| refused(file, format!("{name} needs a value")))
        };
        match name {
            "-r" | "--requirement" | "-c" | "--constraint" => {
                let v = value(&mut tokens)?;
                let rel = file_url_path(&v)
                    .filter(|p| scheme(p).is_none())
                    .and_then(|p| join_inside(parent_of(file), p))
                    .ok_or_else(|| {
                        refused(
                            file,
                            format!("{name} {v}: only files in the archive can be named"),
                        )
                    })?;
                if !code.join(&rel).is_file() {
                    return Err(refused(
                        file,
                        format!("{name} {v}: there is no file {rel} in the archive"),
                    ));
                }
                queue.push_back(rel);
            }
            "-e" | "--editable" => {
                let v = value(&mut tokens)?;
                python_location(code, file, name, &v, inputs)?;
            }
            "-f" | "--find-links" => {
                let v = value(&mut tokens)?;
                python_location(code, file, name, &v, inputs)?;
            }
            "-i" | "--index-url" | "--extra-index-url" => {
                let v = value(&mut tokens)?;
                if !matches!(scheme(&v), Some("http" | "https")) {
                    return Err(refused(
                        file,
                        format!("{name} {v}: an index must be an http(s) URL"),
                    ));
                }
            }
            _ => match PIP_PLAIN_OPTIONS.iter().find(|(n, _)| *n == name) {
                Some((_, true)) => {
                    value(&mut tokens)?;
                }
                Some((_, false)) => {}
                None => {
                    return Err(refused(
                        file,
                        format!("option {name} is not allowed in a requirements file"),
                    ));
                }
            },
        }
    }
    Ok(())
}

/// `--opt=value` → (`--opt`, `value`); `-rfile` → (`-r`, `file`); else no value.
fn split_option(token: &str) -> (&str, Option<&str>) {
    if let Some(long) = token.strip_prefix("--") {
        return match long.split_once('=') {
            Some((n, v)) => (&token[..n.len() + 2], Some(v)),
            None => (token, None),
        };
    }
    if token.len() > 2 && token.is_char_boundary(2) {
        let (n, v) = token.split_at(2);
        return (n, Some(v.strip_prefix('=').unwrap_or(v)));
    }
    (token, None)
}

/// A requirement token: a project name with specifiers (ignored), a remote URL
/// (allowed), or a local path or `file:` URL (must stay inside; added).
fn python_requirement(
    code: &Path,
    file: &str,
    token: &str,
    inputs: &mut Inputs,
) -> Result<(), InputError> {
    // `name@url` without spaces: the URL part counts.
    let token = match token.split_once('@') {
        Some((_, url)) if scheme(url).is_some() => url,
        _ => token,
    };
    if scheme(token).is_some() || looks_like_path(token) {
        python_location(code, file, "requirement", token, inputs)?;
    }
    Ok(())
}

/// A place pip reads packages from: remote URLs pass, VCS URLs pass unless
/// they name a host path, local paths must stay inside the archive.
fn python_location(
    code: &Path,
    file: &str,
    what: &str,
    value: &str,
    inputs: &mut Inputs,
) -> Result<(), InputError> {
    let outside = || {
        refused(
            file,
            format!(
                "{what} {value} reads outside the archive; name a file in the archive or an http(s) URL"
            ),
        )
    };
    match scheme(value) {
        Some("http" | "https") => return Ok(()),
        Some(s) if s.ends_with("+file") => return Err(outside()),
        Some(s) if s.contains('+') => return Ok(()),
        Some("file") | None => {}
        Some(_) => return Err(outside()),
    }
    let path = file_url_path(strip_pip_decorations(value)).ok_or_else(outside)?;
    let from_root = inside(path).ok_or_else(outside)?;
    // pip resolves some of these against the working directory (the code root)
    // and some against the requirements file's folder; both are inputs.
    let from_file = join_inside(parent_of(file), path);
    inputs.add_existing(code, &from_root)?;
    if let Some(rel) = from_file {
        inputs.add_existing(code, &rel)?;
    }
    Ok(())
}

/// Scripts of the project itself that `npm install` runs.
const ROOT_INSTALL_SCRIPTS: [&str; 7] = [
    "preinstall",
    "install",
    "postinstall",
    "preprepare",
    "prepare",
    "postprepare",
    "dependencies",
];

/// `package.json`, its lock files and `.npmrc`, and every local package its
/// dependencies (and the lock file's entries) name.
pub(crate) fn node(code: &Path) -> Result<Inputs, InputError> {
    const MANIFEST: &str = "package.json";
    let mut inputs = Inputs::default();
    for name in [
        MANIFEST,
        "package-lock.json",
        "npm-shrinkwrap.json",
        ".npmrc",
    ] {
        inputs.add_existing(code, name)?;
    }
    if inputs.files.contains(".npmrc") {
        npmrc(&String::from_utf8_lossy(&inputs.read(code, ".npmrc")?))?;
    }
    // An unreadable package.json is left to npm, which names the problem.
    if let Ok(serde_json::Value::Object(doc)) =
        serde_json::from_slice::<serde_json::Value>(&inputs.read(code, MANIFEST)?)
    {
        if doc
            .get("workspaces")
            .is_some_and(|w| !w.is_null() && w != &serde_json::json!([]))
        {
            return Err(refused(MANIFEST, "workspaces are not supported"));
        }
        // npm runs the project's own install scripts in the project, and they
        // may read any of its files: then every file is an input.
        if let Some(serde_json::Value::Object(scripts)) = doc.get("scripts")
            && ROOT_INSTALL_SCRIPTS
                .iter()
                .any(|s| scripts.contains_key(*s))
        {
            inputs.add_existing(code, ".")?;
        }
        for section in [
            "dependencies",
            "devDependencies",
            "optionalDependencies",
            "peerDependencies",
            "overrides",
        ] {
            if let Some(v) = doc.get(section) {
                node_specs(code, MANIFEST, v, &mut inputs)?;
            }
        }
    }
    for lock in ["package-lock.json", "npm-shrinkwrap.json"] {
        if !inputs.files.contains(lock) {
            continue;
        }
        let Ok(doc) = serde_json::from_slice::<serde_json::Value>(&inputs.read(code, lock)?) else {
            continue;
        };
        // Entries outside node_modules are the project's own local packages.
        if let Some(serde_json::Value::Object(packages)) = doc.get("packages") {
            for key in packages.keys() {
                if !key.is_empty()
                    && !key.starts_with("node_modules/")
                    && !key.contains("/node_modules/")
                {
                    node_local(code, lock, key, key, &mut inputs)?;
                }
            }
        }
        lock_resolved(code, lock, &doc, &mut inputs)?;
    }
    Ok(inputs)
}

/// Every string value under a dependencies section (`overrides` nests).
fn node_specs(
    code: &Path,
    file: &str,
    value: &serde_json::Value,
    inputs: &mut Inputs,
) -> Result<(), InputError> {
    match value {
        serde_json::Value::String(spec) => node_spec(code, file, spec, inputs),
        serde_json::Value::Object(map) => map
            .values()
            .try_for_each(|v| node_specs(code, file, v, inputs)),
        _ => Ok(()),
    }
}

/// One dependency spec, read the way npm does: `file:`/`link:` and anything
/// that starts like a path or ends like a tarball is local.
fn node_spec(code: &Path, file: &str, spec: &str, inputs: &mut Inputs) -> Result<(), InputError> {
    let spec = spec.trim();
    // `npm:name@spec` aliases a registry package.
    if spec.starts_with("npm:") {
        return Ok(());
    }
    match scheme(spec) {
        Some(s) if s.ends_with("+file") => Err(refused(
            file,
            format!(
                "{spec} reads outside the archive; name a package in the archive or the registry"
            ),
        )),
        Some("file" | "link") => {
            let path = spec.split_once(':').map_or("", |(_, p)| p);
            node_local(code, file, spec, path, inputs)
        }
        Some(_) => Ok(()),
        None => {
            let local = spec.starts_with('.')
                || spec.starts_with('/')
                || spec.starts_with('~')
                || [".tgz", ".tar.gz", ".tar"]
                    .iter()
                    .any(|ext| spec.ends_with(ext));
            if local {
                node_local(code, file, spec, spec, inputs)
            } else {
                Ok(())
            }
        }
    }
}

fn node_local(
    code: &Path,
    file: &str,
    spec: &str,
    path: &str,
    inputs: &mut Inputs,
) -> Result<(), InputError> {
    // `file://` URLs with an empty host are absolute paths.
    let path = path.strip_prefix("//").map_or(path, |p| p);
    let rel = inside(path).ok_or_else(|| {
        refused(
            file,
            format!(
                "{spec} reads outside the archive; name a package in the archive or the registry"
            ),
        )
    })?;
    inputs.add_existing(code, &rel)?;
    Ok(())
}

/// `resolved` fields of a lock file that name local tarballs or folders.
fn lock_resolved(
    code: &Path,
    file: &str,
    value: &serde_json::Value,
    inputs: &mut Inputs,
) -> Result<(), InputError> {
    match value {
        serde_json::Value::Object(map) => {
            for (k, v) in map {
                match (k.as_str(), v) {
                    ("resolved" | "version", serde_json::Value::String(s))
                        if matches!(scheme(s), Some("file" | "link"))
                            || scheme(s).is_some_and(|s| s.ends_with("+file")) =>
                    {
                        node_spec(code, file, s, inputs)?;
                    }
                    _ => lock_resolved(code, file, v, inputs)?,
                }
            }
            Ok(())
        }
        serde_json::Value::Array(items) => items
            .iter()
            .try_for_each(|v| lock_resolved(code, file, v, inputs)),
        _ => Ok(()),
    }
}

/// `.npmrc` settings may not name host paths (`cafile=/etc/...`,
/// `userconfig=~/...`), expand variables, or point a registry at files.
fn npmrc(text: &str) -> Result<(), InputError> {
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        let value = line
            .split_once('=')
            .map_or("", |(_, v)| v)
            .trim()
            .trim_matches('"');
        let bad = line.contains("${")
            || value.starts_with('/')
            || value.starts_with('~')
            || value.starts_with("file:")
            || value.split(['/', '\\']).any(|p| p == "..");
        if bad {
            return Err(refused(
                ".npmrc",
                format!(
                    "`{line}` names a path outside the archive; settings may not point at files"
                ),
            ));
        }
    }
    Ok(())
}

/// Copies `inputs` from `code` into the empty folder `dest`, keeping their
/// relative paths: folders 0755, files 0644 (0755 if executable), so the
/// sandbox user can read them.
pub(crate) fn stage(code: &Path, inputs: &Inputs, dest: &Path) -> io::Result<()> {
    fs::set_permissions(dest, fs::Permissions::from_mode(0o755))?;
    for rel in inputs.files() {
        let to = dest.join(rel);
        if let Some(parent) = to.parent() {
            let mut missing: Vec<PathBuf> = Vec::new();
            let mut p = parent;
            while p != dest && !p.is_dir() {
                missing.push(p.to_path_buf());
                match p.parent() {
                    Some(up) => p = up,
                    None => break,
                }
            }
            for dir in missing.iter().rev() {
                fs::create_dir(dir)?;
                fs::set_permissions(dir, fs::Permissions::from_mode(0o755))?;
            }
        }
        let from = code.join(rel);
        let exec = fs::metadata(&from)?.permissions().mode() & 0o111 != 0;
        fs::copy(&from, &to)?;
        fs::set_permissions(
            &to,
            fs::Permissions::from_mode(if exec { 0o755 } else { 0o644 }),
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tree(files: &[(&str, &str)]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        for (rel, content) in files {
            let p = dir.path().join(rel);
            fs::create_dir_all(p.parent().unwrap()).unwrap();
            fs::write(p, content).unwrap();
        }
        dir
    }

    fn files(inputs: &Inputs) -> Vec<&str> {
        inputs.files().collect()
    }

    fn refusal(r: Result<Inputs, InputError>) -> String {
        match r {
            Err(InputError::Refused(m)) => m,
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    #[test]
    fn nested_requirement_files_and_what_they_name_are_inputs() {
        let dir = tree(&[
            (
                "requirements.txt",
                "-rmore.txt\n--constraint=sub/c.txt\n-f ./wheels\nrequests==2.32  # web\n",
            ),
            (
                "more.txt",
                "./vendor/a.whl \\\n  --hash=sha256:abc\n-e file:./proj#egg=proj\nb[x] @ file:vendor/b.tar.gz\n",
            ),
            ("sub/c.txt", "-r ../deeper.txt\n"),
            ("deeper.txt", "# only a comment\n"),
            ("vendor/a.whl", "A"),
            ("vendor/b.tar.gz", "B"),
            ("vendor/unused.whl", "U"),
            ("proj/setup.py", "P"),
            ("proj/pkg/__init__.py", "P"),
            ("wheels/w.whl", "W"),
            ("handler.py", "H"),
        ]);
        let inputs = python(dir.path()).unwrap();
        assert_eq!(
            files(&inputs),
            [
                "deeper.txt",
                "more.txt",
                "proj/pkg/__init__.py",
                "proj/setup.py",
                "requirements.txt",
                "sub/c.txt",
                "vendor/a.whl",
                "vendor/b.tar.gz",
                "wheels/w.whl",
            ]
        );
    }

    #[test]
    fn requirements_reaching_outside_are_refused() {
        for (line, named) in [
            ("-r /etc/passwd", "/etc/passwd"),
            ("-r ../x.txt", "../x.txt"),
            ("-c https://example.com/c.txt", "https://example.com/c.txt"),
            ("--requirement=file:///etc/x", "file:///etc/x"),
            ("-i file:///srv/simple", "file:///srv/simple"),
            ("--extra-index-url /srv/simple", "/srv/simple"),
            ("-f /usr/share/python-wheels", "/usr/share/python-wheels"),
            ("--find-links=file:///tmp", "file:///tmp"),
            ("-e /opt/proj", "/opt/proj"),
            ("-e git+file:///srv/repo#egg=x", "git+file:///srv/repo"),
            ("/usr/share/x.whl", "/usr/share/x.whl"),
            ("../x.whl", "../x.whl"),
            ("x @ file:///root/x.whl", "file:///root/x.whl"),
            ("x@file://host/x.whl", "file://host/x.whl"),
            ("~/x.whl", "~/x.whl"),
            ("-r ${HOME}/x.txt", "${HOME}"),
            ("--src /tmp", "--src"),
            ("-r missing.txt", "missing.txt"),
        ] {
            let dir = tree(&[("requirements.txt", &format!("{line}\n"))]);
            let message = refusal(python(dir.path()));
            assert!(
                message.starts_with("requirements.txt: ") && message.contains(named),
                "{line}: {message}"
            );
        }
        // Remote and plain requirements pass.
        let dir = tree(&[(
            "requirements.txt",
            "-i https://pypi.org/simple\nrequests>=2; python_version < \"3.12\"\nx @ https://e.com/x.whl\n-e git+https://e.com/r.git#egg=r\n--only-binary :all:\n",
        )]);
        assert_eq!(files(&python(dir.path()).unwrap()), ["requirements.txt"]);
    }

    #[test]
    fn node_inputs_cover_local_specs_lock_files_and_npmrc() {
        let dir = tree(&[
            (
                "package.json",
                r#"{"dependencies": {"a": "file:vendor/a.tgz", "b": "./libs/b", "c": "vendor/c.tgz", "r": "^1.0", "n": "npm:x@1"},
                    "devDependencies": {"d": "file:./libs/d"}, "overrides": {"e": {"f": "file:vendor/f.tgz"}}}"#,
            ),
            (
                "package-lock.json",
                r#"{"packages": {"": {}, "libs/b": {}, "node_modules/a": {"resolved": "file:vendor/a.tgz"}}}"#,
            ),
            (
                ".npmrc",
                "fund=false\nregistry=https://registry.npmjs.org/\n",
            ),
            ("vendor/a.tgz", "A"),
            ("vendor/c.tgz", "C"),
            ("vendor/f.tgz", "F"),
            ("libs/b/index.js", "B"),
            ("libs/d/index.js", "D"),
            ("handler.js", "H"),
        ]);
        assert_eq!(
            files(&node(dir.path()).unwrap()),
            [
                ".npmrc",
                "libs/b/index.js",
                "libs/d/index.js",
                "package-lock.json",
                "package.json",
                "vendor/a.tgz",
                "vendor/c.tgz",
                "vendor/f.tgz",
            ]
        );
    }

    #[test]
    fn project_install_scripts_make_every_file_an_input() {
        let dir = tree(&[
            (
                "package.json",
                r#"{"scripts": {"postinstall": "node tools/setup.js", "test": "x"}}"#,
            ),
            ("tools/setup.js", "S"),
            ("handler.js", "H"),
        ]);
        assert_eq!(
            files(&node(dir.path()).unwrap()),
            ["handler.js", "package.json", "tools/setup.js"]
        );
        let dir = tree(&[
            ("package.json", r#"{"scripts": {"test": "node t.js"}}"#),
            ("handler.js", "H"),
        ]);
        assert_eq!(files(&node(dir.path()).unwrap()), ["package.json"]);
    }

    #[test]
    fn node_specs_reaching_outside_are_refused() {
        for (package, lock, npmrc, named) in [
            (
                r#"{"dependencies": {"x": "file:../x"}}"#,
                None,
                None,
                "file:../x",
            ),
            (
                r#"{"dependencies": {"x": "file:///usr/lib/x"}}"#,
                None,
                None,
                "file:///usr/lib/x",
            ),
            (
                r#"{"dependencies": {"x": "/usr/lib/node_modules/npm"}}"#,
                None,
                None,
                "/usr/lib/node_modules/npm",
            ),
            (
                r#"{"dependencies": {"x": "~/x.tgz"}}"#,
                None,
                None,
                "~/x.tgz",
            ),
            (
                r#"{"dependencies": {"x": "git+file:///srv/r.git"}}"#,
                None,
                None,
                "git+file:///srv/r.git",
            ),
            (
                r#"{"optionalDependencies": {"x": "../../x.tgz"}}"#,
                None,
                None,
                "../../x.tgz",
            ),
            (
                r#"{"workspaces": ["packages/*"]}"#,
                None,
                None,
                "workspaces",
            ),
            (
                "{}",
                Some(r#"{"packages": {"../outside": {}}}"#),
                None,
                "../outside",
            ),
            (
                "{}",
                Some(r#"{"packages": {"node_modules/x": {"resolved": "file:/srv/x.tgz"}}}"#),
                None,
                "file:/srv/x.tgz",
            ),
            (
                "{}",
                None,
                Some("cafile=/etc/ssl/private/k.pem\n"),
                "/etc/ssl/private/k.pem",
            ),
            ("{}", None, Some("userconfig = \"~/.npmrc\"\n"), "~/.npmrc"),
            (
                "{}",
                None,
                Some("registry=file:/srv/registry\n"),
                "file:/srv/registry",
            ),
            ("{}", None, Some("//r/:_authToken=${TOKEN}\n"), "${TOKEN}"),
        ] {
            let mut files = vec![("package.json", package)];
            if let Some(lock) = lock {
                files.push(("package-lock.json", lock));
            }
            if let Some(npmrc) = npmrc {
                files.push((".npmrc", npmrc));
            }
            let dir = tree(&files);
            let message = refusal(node(dir.path()));
            assert!(
                message.contains(named),
                "{package} {lock:?} {npmrc:?}: {message}"
            );
        }
    }

    #[test]
    fn staging_copies_only_the_inputs() {
        let dir = tree(&[
            ("requirements.txt", "./vendor/a.whl\n"),
            ("vendor/a.whl", "A"),
            ("vendor/other.whl", "O"),
            ("handler.py", "H"),
        ]);
        let inputs = python(dir.path()).unwrap();
        let dest = tempfile::tempdir().unwrap();
        stage(dir.path(), &inputs, dest.path()).unwrap();
        let mut copied: Vec<String> = walkdir::WalkDir::new(dest.path())
            .into_iter()
            .map(|e| e.unwrap())
            .filter(|e| e.file_type().is_file())
            .map(|e| {
                e.path()
                    .strip_prefix(dest.path())
                    .unwrap()
                    .to_string_lossy()
                    .into_owned()
            })
            .collect();
        copied.sort();
        assert_eq!(copied, ["requirements.txt", "vendor/a.whl"]);
        let mode = |p: &Path| fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(dest.path()), 0o755);
        assert_eq!(mode(&dest.path().join("vendor")), 0o755);
        assert_eq!(mode(&dest.path().join("vendor/a.whl")), 0o644);
    }

    #[test]
    fn paths_are_normalised_and_kept_inside() {
        assert_eq!(inside("./a/./b").as_deref(), Some("a/b"));
        assert_eq!(inside(".").as_deref(), Some("."));
        assert_eq!(inside("a/../b").as_deref(), Some("b"));
        assert_eq!(inside("a/../../b"), None);
        assert_eq!(inside("/a"), None);
        assert_eq!(inside("~/a"), None);
        assert_eq!(join_inside("sub", "../x").as_deref(), Some("x"));
        assert_eq!(join_inside("sub", "../../x"), None);
        assert_eq!(join_inside("sub", "/x"), None);
        assert_eq!(join_inside("sub", "x").as_deref(), Some("sub/x"));
        assert_eq!(join_inside(".", "./x").as_deref(), Some("x"));
        assert_eq!(split_option("-rmore.txt"), ("-r", Some("more.txt")));
        assert_eq!(
            split_option("--hash=sha256:1"),
            ("--hash", Some("sha256:1"))
        );
        assert_eq!(split_option("-e"), ("-e", None));
    }
}
