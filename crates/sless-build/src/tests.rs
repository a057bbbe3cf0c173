//! Builds with the real sandbox, Python and Node, offline: local wheels and npm
//! tarballs from `tests/fixtures/`, and stand-in shims that implement the check
//! mode of the instance protocol.

use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::sync::Mutex;

use sless_sandbox::SandboxConfig;

use super::*;

/// The check mode of the Python shim, as the instance protocol describes it.
const PY_SHIM: &str = r#"
import importlib, os, sys
if "--check" not in sys.argv:
    sys.exit("stand-in shim: only --check")
mod, _, fn = os.environ["SLESS_ENTRYPOINT"].rpartition(".")
sys.path[:0] = [os.environ["SLESS_CODE_DIR"], os.environ["SLESS_DEPS_DIR"]]
try:
    m = importlib.import_module(mod)
except ModuleNotFoundError as e:
    if e.name != mod:
        raise
    print(f'sless: entrypoint module "{mod}" not found (no {mod.replace(".", "/")}.py)', file=sys.stderr)
    sys.exit(3)
if not callable(getattr(m, fn, None)):
    print(f'sless: entrypoint function "{fn}" not found in module "{mod}"', file=sys.stderr)
    sys.exit(3)
"#;

const NODE_SHIM: &str = r#"
const fs = require('fs'), path = require('path');
const ep = process.env.SLESS_ENTRYPOINT, i = ep.lastIndexOf('.');
const mod = ep.slice(0, i), fn = ep.slice(i + 1);
const file = path.join(process.env.SLESS_CODE_DIR, mod + '.js');
if (!fs.existsSync(file)) {
  console.error(`sless: entrypoint module "${mod}" not found (no ${mod}.js)`);
  process.exit(3);
}
const m = require(file);
if (typeof m[fn] !== 'function') {
  console.error(`sless: entrypoint function "${fn}" not found in module "${mod}"`);
  process.exit(3);
}
"#;

struct TestEnv {
    dir: tempfile::TempDir,
    builder: Builder,
}

impl TestEnv {
    fn new(timeout: Duration) -> TestEnv {
        TestEnv::with_runtime(timeout, None)
    }

    /// `runtime`: the shims to check with; `None` writes the stand-ins.
    fn with_runtime(timeout: Duration, runtime: Option<PathBuf>) -> TestEnv {
        let dir = tempfile::tempdir().unwrap();
        let stand_in = dir.path().join("runtime");
        for shim in ["python", "node", "go"] {
            std::fs::create_dir_all(stand_in.join(shim)).unwrap();
        }
        std::fs::write(stand_in.join("python/sless_runtime.py"), PY_SHIM).unwrap();
        std::fs::write(stand_in.join("node/sless_runtime.js"), NODE_SHIM).unwrap();
        std::fs::write(
            stand_in.join("go/sless_main.go"),
            include_str!("../../../runtimes/go/sless_main.go"),
        )
        .unwrap();
        // The sandbox user must be able to reach the shims through the mount.
        for d in [
            dir.path(),
            &stand_in,
            &stand_in.join("python"),
            &stand_in.join("node"),
            &stand_in.join("go"),
        ] {
            std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        let runtime = runtime.unwrap_or(stand_in);
        let sandbox = Sandbox::new(SandboxConfig {
            cgroup_name: "sless-build-test".into(),
            ..SandboxConfig::default()
        })
        .unwrap();
        let mut cfg = BuildConfig::new(&dir.path().join("data"), runtime);
        cfg.timeout = timeout;
        let builder = Builder::new(cfg, Arc::new(sandbox)).unwrap();
        TestEnv { dir, builder }
    }

    fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    /// Names of `.tmp-*` leftovers in the build and deps directories.
    fn temps(&self) -> Vec<String> {
        ["builds", "deps"]
            .iter()
            .flat_map(|d| std::fs::read_dir(self.data().join(d)).unwrap())
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with(".tmp-"))
            .collect()
    }
}

#[derive(Clone, Default)]
struct Lines(Arc<Mutex<Vec<String>>>);

impl Lines {
    fn log(&self) -> LogFn {
        let lines = self.0.clone();
        Arc::new(move |l: &str| lines.lock().unwrap().push(l.to_string()))
    }
    fn all(&self) -> Vec<String> {
        self.0.lock().unwrap().clone()
    }
    fn any(&self, needle: &str) -> bool {
        self.all().iter().any(|l| l.contains(needle))
    }
}

fn zip_of(files: &[(&str, &[u8])]) -> Bytes {
    let mut w = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    let opts = zip::write::SimpleFileOptions::default()
        .compression_method(zip::CompressionMethod::Deflated)
        .unix_permissions(0o644);
    for (name, data) in files {
        w.start_file(*name, opts).unwrap();
        w.write_all(data).unwrap();
    }
    Bytes::from(w.finish().unwrap().into_inner())
}

fn fixture(name: &str) -> Vec<u8> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures")
        .join(name);
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn request(family: RuntimeFamily, archive: Bytes, lines: &Lines) -> BuildRequest {
    BuildRequest {
        namespace: "default".into(),
        family,
        entrypoint: "handler.handle".into(),
        code_sha256: sless_blob::sha256_hex(&archive),
        archive,
        log: lines.log(),
    }
}

fn failed_message(result: Result<BuildOutput, BuildError>) -> String {
    match result {
        Err(BuildError::Failed { message }) => message,
        other => panic!("expected a failed build, got {other:?}"),
    }
}

const WHEEL: &str = "tinylib-0.1-py3-none-any.whl";
const TARBALL: &str = "tinypkg-0.1.0.tgz";

#[tokio::test]
async fn python_without_deps_builds_once_then_is_reused() {
    let env = TestEnv::new(Duration::from_secs(120));
    let archive = zip_of(&[("handler.py", b"def handle(event):\n    return event\n")]);
    let lines = Lines::default();
    let started = std::time::Instant::now();
    let out = env
        .builder
        .build(request(RuntimeFamily::Python3, archive.clone(), &lines))
        .await
        .unwrap();
    eprintln!(
        "timing: python build without deps took {:?}",
        started.elapsed()
    );
    assert!(!out.reused);
    assert_eq!(out.deps_dir, None);
    assert_eq!(out.code_dir, env.builder.code_dir(&out.build_key));
    assert_eq!(
        out.build_key,
        build_key(
            "default",
            RuntimeFamily::Python3,
            "handler.handle",
            &sless_blob::sha256_hex(&archive)
        )
    );
    assert!(out.code_dir.join("handler.py").is_file());
    assert!(out.code_dir.join(BUILT_MARKER).is_file());
    assert!(lines.any("==> unpacking"), "{:?}", lines.all());
    assert!(
        lines.any("==> checking the entrypoint handler.handle"),
        "{:?}",
        lines.all()
    );
    assert!(env.temps().is_empty(), "{:?}", env.temps());

    let again = Lines::default();
    let started = std::time::Instant::now();
    let out2 = env
        .builder
        .build(request(RuntimeFamily::Python3, archive, &again))
        .await
        .unwrap();
    eprintln!("timing: reused build took {:?}", started.elapsed());
    assert!(out2.reused);
    assert_eq!(out2.code_dir, out.code_dir);
    assert_eq!(
        again.all(),
        ["==> code unchanged, reusing the previous build"]
    );
}

#[tokio::test]
async fn missing_module_and_function_are_named() {
    let env = TestEnv::new(Duration::from_secs(120));
    let lines = Lines::default();
    let archive = zip_of(&[("other.py", b"X = 1\n")]);
    let message = failed_message(
        env.builder
            .build(request(RuntimeFamily::Python3, archive, &lines))
            .await,
    );
    assert_eq!(
        message,
        r#"entrypoint module "handler" not found (no handler.py)"#
    );

    let archive = zip_of(&[("handler.py", b"def other(e):\n    pass\n")]);
    let req = request(RuntimeFamily::Python3, archive, &lines);
    let key = build_key(
        &req.namespace,
        req.family,
        &req.entrypoint,
        &req.code_sha256,
    );
    let message = failed_message(env.builder.build(req).await);
    assert_eq!(
        message,
        r#"entrypoint function "handle" not found in module "handler""#
    );
    assert!(
        !env.builder.code_dir(&key).exists(),
        "nothing half-built is kept"
    );
    assert!(env.temps().is_empty(), "{:?}", env.temps());

    let archive = zip_of(&[("handler.js", b"exports.other = () => 1;\n")]);
    let message = failed_message(
        env.builder
            .build(request(RuntimeFamily::Nodejs, archive, &lines))
            .await,
    );
    assert_eq!(
        message,
        r#"entrypoint function "handle" not found in module "handler""#
    );
}

#[tokio::test]
async fn an_import_error_ends_with_its_traceback() {
    let env = TestEnv::new(Duration::from_secs(120));
    let archive = zip_of(&[(
        "handler.py",
        b"import not_installed_anywhere\ndef handle(e):\n    pass\n",
    )]);
    let message = failed_message(
        env.builder
            .build(request(RuntimeFamily::Python3, archive, &Lines::default()))
            .await,
    );
    assert!(
        message.starts_with("the entrypoint check failed (exited with status "),
        "{message}"
    );
    assert!(
        message.ends_with("ModuleNotFoundError: No module named 'not_installed_anywhere'"),
        "{message}"
    );
}

#[tokio::test]
async fn python_wheel_in_the_archive_is_installed_and_reused_for_code_changes() {
    let env = TestEnv::new(Duration::from_secs(300));
    let wheel = fixture(WHEEL);
    let requirements = format!("./vendor/{WHEEL}\n");
    let wheel_path = format!("vendor/{WHEEL}");
    let handler_v1: &[u8] = b"import tinylib\ndef handle(e):\n    return tinylib.greet(e)\n";
    let archive = zip_of(&[
        ("handler.py", handler_v1),
        ("requirements.txt", requirements.as_bytes()),
        (&wheel_path, &wheel),
    ]);
    let lines = Lines::default();
    let started = std::time::Instant::now();
    let out = env
        .builder
        .build(request(RuntimeFamily::Python3, archive, &lines))
        .await
        .unwrap();
    eprintln!(
        "timing: python build with a local wheel took {:?}",
        started.elapsed()
    );
    assert!(
        lines.any("==> installing requirements.txt"),
        "{:?}",
        lines.all()
    );
    assert!(
        lines.any("Successfully installed tinylib-0.1"),
        "{:?}",
        lines.all()
    );
    let deps = out.deps_dir.clone().expect("deps installed");
    let module = deps.join("tinylib/__init__.py");
    assert!(module.is_file());
    assert!(deps.join(INSTALLED_MARKER).is_file());
    // Handed back to the server's user, readable by all, writable by none else.
    let root_meta = std::fs::metadata(env.data().join("builds")).unwrap();
    for path in [deps.as_path(), &deps.join("tinylib"), &module] {
        let meta = std::fs::metadata(path).unwrap();
        assert_eq!(
            (meta.uid(), meta.gid()),
            (root_meta.uid(), root_meta.gid()),
            "{}",
            path.display()
        );
        let expected = if meta.is_dir() { 0o755 } else { 0o644 };
        assert_eq!(meta.mode() & 0o7777, expected, "{}", path.display());
    }

    // Only the code changes: the installed dependencies are reused, pip does not run.
    let handler_v2: &[u8] = b"import tinylib\ndef handle(e):\n    return tinylib.greet(str(e))\n";
    let archive = zip_of(&[
        ("handler.py", handler_v2),
        ("requirements.txt", requirements.as_bytes()),
        (&wheel_path, &wheel),
    ]);
    let lines = Lines::default();
    let out2 = env
        .builder
        .build(request(RuntimeFamily::Python3, archive, &lines))
        .await
        .unwrap();
    assert!(!out2.reused);
    assert_ne!(out2.build_key, out.build_key);
    assert_eq!(out2.deps_dir, Some(deps));
    assert!(
        lines.any("requirements.txt unchanged, reusing the installed dependencies"),
        "{:?}",
        lines.all()
    );
    assert!(!lines.any("Successfully installed"), "{:?}", lines.all());
    assert!(env.temps().is_empty(), "{:?}", env.temps());
}

#[tokio::test]
async fn a_failing_pip_install_ends_with_the_log_tail() {
    let env = TestEnv::new(Duration::from_secs(120));
    let archive = zip_of(&[
        ("handler.py", b"def handle(e):\n    pass\n"),
        (
            "requirements.txt",
            b"./vendor/missing-0.1-py3-none-any.whl\n",
        ),
    ]);
    let lines = Lines::default();
    let message = failed_message(
        env.builder
            .build(request(RuntimeFamily::Python3, archive, &lines))
            .await,
    );
    assert!(
        message.starts_with("installing requirements.txt failed (exited with status 1):\n"),
        "{message}"
    );
    assert!(
        message.contains("missing-0.1-py3-none-any.whl"),
        "{message}"
    );
    let tail_lines = message.lines().count() - 1;
    assert!((1..=step::TAIL_LINES).contains(&tail_lines), "{message}");
    assert!(env.temps().is_empty(), "{:?}", env.temps());
    let deps: Vec<_> = std::fs::read_dir(env.data().join("deps"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(
        deps,
        [EMPTY_DEPS],
        "no deps directory is kept for a failed install"
    );
}

#[tokio::test]
async fn node_file_dependencies_install_offline() {
    let env = TestEnv::new(Duration::from_secs(300));
    let tarball = fixture(TARBALL);
    let package = format!(
        r#"{{"name": "fn", "version": "1.0.0", "dependencies": {{"tinypkg": "file:vendor/{TARBALL}", "localdep": "file:./libs/localdep"}}}}"#
    );
    let tarball_path = format!("vendor/{TARBALL}");
    let archive = zip_of(&[
        (
            "handler.js",
            b"const t = require('tinypkg'); const l = require('localdep');\nexports.handle = (e) => t.greet(l.name);\n",
        ),
        ("package.json", package.as_bytes()),
        (&tarball_path, &tarball),
        ("libs/localdep/package.json", br#"{"name": "localdep", "version": "1.0.0", "main": "index.js"}"#),
        ("libs/localdep/index.js", b"exports.name = 'local';\n"),
    ]);
    let lines = Lines::default();
    let started = std::time::Instant::now();
    let out = env
        .builder
        .build(request(RuntimeFamily::Nodejs, archive, &lines))
        .await
        .unwrap();
    eprintln!(
        "timing: node build with file: dependencies took {:?}",
        started.elapsed()
    );
    assert!(
        lines.any("==> installing package.json"),
        "{:?}",
        lines.all()
    );
    let deps = out.deps_dir.expect("deps installed");
    assert!(deps.join("node_modules/tinypkg/index.js").is_file());
    let local = deps.join("node_modules/localdep");
    assert!(
        std::fs::symlink_metadata(&local).unwrap().is_dir(),
        "a copy, not a link into the deleted work dir"
    );
    assert_eq!(
        std::fs::read_link(out.code_dir.join("node_modules")).unwrap(),
        Path::new("/deps/node_modules")
    );
    assert!(env.temps().is_empty(), "{:?}", env.temps());
}

#[tokio::test]
async fn a_build_over_its_time_is_killed() {
    let env = TestEnv::new(Duration::from_secs(2));
    let archive = zip_of(&[(
        "handler.py",
        b"import time\ntime.sleep(300)\ndef handle(e):\n    pass\n",
    )]);
    let req = request(RuntimeFamily::Python3, archive, &Lines::default());
    let key = build_key(
        &req.namespace,
        req.family,
        &req.entrypoint,
        &req.code_sha256,
    );
    let started = std::time::Instant::now();
    let result = env.builder.build(req).await;
    assert!(
        matches!(result, Err(BuildError::TimedOut(d)) if d == Duration::from_secs(2)),
        "{result:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(30));
    assert!(!env.builder.code_dir(&key).exists());
    assert!(env.temps().is_empty(), "{:?}", env.temps());
}

#[tokio::test]
async fn concurrent_builds_of_one_key_build_once() {
    let env = TestEnv::new(Duration::from_secs(120));
    let archive = zip_of(&[("handler.py", b"def handle(e):\n    return 1\n")]);
    let (a, b) = (Lines::default(), Lines::default());
    let (ra, rb) = tokio::join!(
        env.builder
            .build(request(RuntimeFamily::Python3, archive.clone(), &a)),
        env.builder
            .build(request(RuntimeFamily::Python3, archive, &b)),
    );
    let (ra, rb) = (ra.unwrap(), rb.unwrap());
    assert_eq!(ra.code_dir, rb.code_dir);
    assert_eq!(
        [ra.reused, rb.reused].iter().filter(|r| **r).count(),
        1,
        "exactly one of them built"
    );
    let checks = a
        .all()
        .into_iter()
        .chain(b.all())
        .filter(|l| l.starts_with("==> checking"))
        .count();
    assert_eq!(checks, 1);
}

#[tokio::test]
async fn unexecutable_unsafe_and_mismatched_requests_are_refused() {
    let env = TestEnv::new(Duration::from_secs(60));
    let lines = Lines::default();
    let archive = zip_of(&[("handler.py", b"")]);
    let not_executable = zip_of(&[("bootstrap", b"#!/bin/sh\n")]);
    let mut req = request(RuntimeFamily::Custom, not_executable, &lines);
    req.entrypoint = "bootstrap".into();
    let result = env.builder.build(req).await;
    assert!(
        matches!(&result, Err(BuildError::Failed { message }) if message.starts_with("bootstrap: is not executable")),
        "{result:?}"
    );

    let evil = zip_of(&[("../evil.py", b"")]);
    let result = env
        .builder
        .build(request(RuntimeFamily::Python3, evil, &lines))
        .await;
    assert!(
        matches!(
            result,
            Err(BuildError::Archive(ArchiveError::UnsafePath(_)))
        ),
        "{result:?}"
    );

    let mut req = request(RuntimeFamily::Python3, archive, &lines);
    req.code_sha256 = "0".repeat(64);
    assert!(matches!(
        env.builder.build(req).await,
        Err(BuildError::Internal(_))
    ));
    assert!(env.temps().is_empty(), "{:?}", env.temps());
}

#[tokio::test]
async fn a_build_whose_deps_vanished_is_built_again() {
    let env = TestEnv::new(Duration::from_secs(300));
    let wheel = fixture(WHEEL);
    let wheel_path = format!("vendor/{WHEEL}");
    let requirements = format!("./vendor/{WHEEL}\n");
    let archive = zip_of(&[
        ("handler.py", b"import tinylib\ndef handle(e):\n    pass\n"),
        ("requirements.txt", requirements.as_bytes()),
        (&wheel_path, &wheel),
    ]);
    let out = env
        .builder
        .build(request(
            RuntimeFamily::Python3,
            archive.clone(),
            &Lines::default(),
        ))
        .await
        .unwrap();
    std::fs::remove_dir_all(out.deps_dir.as_ref().unwrap()).unwrap();
    let again = env
        .builder
        .build(request(RuntimeFamily::Python3, archive, &Lines::default()))
        .await
        .unwrap();
    assert!(!again.reused);
    assert!(
        again
            .deps_dir
            .unwrap()
            .join("tinylib/__init__.py")
            .is_file()
    );
}

/// The shims of this repository (`runtimes/`) give the same check results as
/// the stand-ins: the contract of the instance protocol holds end to end.
#[tokio::test]
async fn the_repository_shims_check_entrypoints() {
    let runtimes = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../runtimes")
        .canonicalize()
        .unwrap();
    let env = TestEnv::with_runtime(Duration::from_secs(120), Some(runtimes));
    let lines = Lines::default();

    let ok = zip_of(&[("handler.py", b"def handle(event):\n    return event\n")]);
    env.builder
        .build(request(RuntimeFamily::Python3, ok, &lines))
        .await
        .unwrap();
    let missing = zip_of(&[("other.py", b"")]);
    let message = failed_message(
        env.builder
            .build(request(RuntimeFamily::Python3, missing, &lines))
            .await,
    );
    assert!(
        message.starts_with(r#"entrypoint module "handler" not found (no handler.py)"#),
        "{message}"
    );

    let wheel = fixture(WHEEL);
    let requirements = format!("./vendor/{WHEEL}\n");
    let wheel_path = format!("vendor/{WHEEL}");
    let with_deps = zip_of(&[
        (
            "handler.py",
            b"import tinylib\ndef handle(e):\n    return tinylib.greet(e)\n",
        ),
        ("requirements.txt", requirements.as_bytes()),
        (&wheel_path, &wheel),
    ]);
    env.builder
        .build(request(RuntimeFamily::Python3, with_deps, &lines))
        .await
        .unwrap();

    let ok = zip_of(&[("handler.js", b"exports.handle = async (e) => e;\n")]);
    env.builder
        .build(request(RuntimeFamily::Nodejs, ok, &lines))
        .await
        .unwrap();
    let no_fn = zip_of(&[("handler.js", b"exports.other = 1;\n")]);
    let message = failed_message(
        env.builder
            .build(request(RuntimeFamily::Nodejs, no_fn, &lines))
            .await,
    );
    assert!(
        message.starts_with(r#"entrypoint function "handle" not found in module "handler""#),
        "{message}"
    );
}

/// Sets a directory's modification time `secs` seconds into the past.
fn age(dir: &Path, secs: u64) {
    std::fs::File::open(dir)
        .unwrap()
        .set_modified(SystemTime::now() - Duration::from_secs(secs))
        .unwrap();
}

#[tokio::test]
async fn collect_removes_unkept_stale_builds_and_the_deps_only_they_named() {
    let env = TestEnv::new(Duration::from_secs(60));
    let (builds, deps) = (env.data().join("builds"), env.data().join("deps"));
    let mk_build = |key: &str, deps_key: Option<&str>| {
        let dir = builds.join(key);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("handler.py"), vec![b'x'; 1000]).unwrap();
        let marker = serde_json::to_vec(&BuiltMarker {
            format: BUILDER_FORMAT_VERSION,
            deps_key: deps_key.map(str::to_string),
        })
        .unwrap();
        std::fs::write(dir.join(BUILT_MARKER), marker).unwrap();
        age(&dir, 3600);
    };
    let mk_deps = |key: &str| {
        let dir = deps.join(key);
        std::fs::create_dir_all(dir.join("pkg")).unwrap();
        std::fs::write(dir.join("pkg/mod.py"), vec![b'y'; 500]).unwrap();
        std::fs::write(dir.join(INSTALLED_MARKER), b"x").unwrap();
        age(&dir, 3600);
    };
    mk_build("kept", Some("d-kept"));
    mk_build("gone", Some("d-gone"));
    mk_build("fresh", None);
    age(&builds.join("fresh"), 0);
    mk_deps("d-kept");
    mk_deps("d-gone");
    mk_deps("d-orphan");
    mk_deps("d-fresh");
    age(&deps.join("d-fresh"), 0);

    let keep: HashSet<String> = ["kept".to_string()].into();
    let cutoff = SystemTime::now() - Duration::from_secs(60);
    let done = env.builder.collect(&keep, cutoff).await.unwrap();
    assert_eq!((done.builds, done.deps), (1, 2));
    assert!(done.bytes >= 1000 + 2 * 500, "{done:?}");
    let names = |d: &Path| {
        let mut v: Vec<String> = std::fs::read_dir(d)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    };
    assert_eq!(names(&builds), vec!["fresh", "kept"]);
    assert_eq!(names(&deps), vec![".empty", "d-fresh", "d-kept"]);
    assert!(env.temps().is_empty(), "{:?}", env.temps());

    // A build reused just now is renewed: the next collection keeps it even
    // though nothing lists it.
    let lines = Lines::default();
    let archive = zip_of(&[("handler.py", b"def handle(e, c):\n    return 1\n")]);
    let out = env
        .builder
        .build(request(RuntimeFamily::Python3, archive.clone(), &lines))
        .await
        .unwrap();
    age(&out.code_dir, 3600);
    let again = env
        .builder
        .build(request(RuntimeFamily::Python3, archive, &lines))
        .await
        .unwrap();
    assert!(again.reused);
    let done = env
        .builder
        .collect(&HashSet::new(), SystemTime::now() - Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(done.builds, 1, "only `kept` goes: {done:?}");
    assert!(out.code_dir.is_dir());
}

#[tokio::test]
async fn collect_keeps_dependencies_a_build_in_progress_uses() {
    let env = TestEnv::new(Duration::from_secs(60));
    let dir = env.data().join("deps").join("d-busy");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join(INSTALLED_MARKER), b"x").unwrap();
    age(&dir, 3600);
    let cutoff = SystemTime::now() - Duration::from_secs(60);
    {
        let _using = env.builder.use_deps("d-busy");
        let done = env.builder.collect(&HashSet::new(), cutoff).await.unwrap();
        assert_eq!(done.deps, 0);
        assert!(dir.is_dir());
    }
    let done = env.builder.collect(&HashSet::new(), cutoff).await.unwrap();
    assert_eq!(done.deps, 1);
    assert!(!dir.exists());
}

#[test]
fn installs_are_isolated_only_where_names_still_resolve() {
    assert!(has_outside_resolver(
        "# generated\nnameserver 10.255.255.53\n"
    ));
    assert!(has_outside_resolver(
        "nameserver 127.0.0.53\nnameserver 192.0.2.1\n"
    ));
    for loopback_only in [
        "nameserver 127.0.0.53\noptions edns0 trust-ad\n",
        "nameserver ::1\n",
        "nameserver 0.0.0.0\n",
        "search example.com\n",
        "",
    ] {
        assert!(!has_outside_resolver(loopback_only), "{loopback_only:?}");
        assert_eq!(install_network(true, loopback_only), Network::Host);
    }
    assert_eq!(
        install_network(true, "nameserver 192.0.2.1\n"),
        Network::Outbound
    );
    assert_eq!(
        install_network(false, "nameserver 192.0.2.1\n"),
        Network::Host
    );
}

#[tokio::test]
async fn go_code_compiles_into_one_binary_and_compile_errors_fail_with_the_compilers_message() {
    let env = TestEnv::new(Duration::from_secs(120));
    let lines = Lines::default();
    let hello = zip_of(&[(
        "handler.go",
        b"package main\n\nfunc Handle(event map[string]any) (any, error) { return \"hi\", nil }\n",
    )]);
    let mut req = request(RuntimeFamily::Go, hello, &lines);
    req.entrypoint = "Handle".into();
    let out = env.builder.build(req).await.unwrap();
    let binary = out.code_dir.join(crate::GO_BINARY);
    let mode = std::fs::metadata(&binary).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o755, "{}", binary.display());
    assert!(out.code_dir.join("go.mod").is_file(), "a go.mod is written");
    assert!(lines.any("no go.mod"), "{:?}", lines.all());

    let broken = zip_of(&[(
        "handler.go",
        b"package main\n\nfunc Handle(event map[string]any) (any, error) { return nope, nil }\n",
    )]);
    let mut req = request(RuntimeFamily::Go, broken, &lines);
    req.entrypoint = "Handle".into();
    let message = failed_message(env.builder.build(req).await);
    assert!(message.starts_with("go build failed"), "{message}");
    assert!(
        message.contains("handler.go:3:57: undefined: nope"),
        "{message}"
    );
    assert_eq!(env.temps(), Vec::<String>::new());
}
