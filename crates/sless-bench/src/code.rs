//! The functions the bench deploys, generated inline, and the zip archives that carry them.

use std::io::Write;

use crate::error::{BenchError, Result};

/// A Python hello function: the smallest useful handler.
pub const HELLO_PY: &str = "def handle(event):\n    return {\"hello\": \"world\"}\n";

/// A Node hello function; the plain Node baseline runs this same file.
pub const HELLO_NODE: &str = "exports.handle = async (event) => ({ hello: \"world\" });\n";

/// The Go hello of the Go figures; `run` changes only a comment (a code-only change).
pub fn hello_go(run: u64) -> String {
    format!(
        "package main\n\n// run {run}\nfunc Handle(event map[string]any) (any, error) {{\n\treturn map[string]any{{\"hello\": \"world\"}}, nil\n}}\n"
    )
}

/// A Python handler that answers its event: the shim-vs-baseline comparison.
pub const ECHO_PY: &str = "def handle(event):\n    return event\n";

/// A CPU-bound Python handler (a loop summing 200k integers, some milliseconds of pure
/// interpreter work), so throughput is bounded by CPU per instance, not by I/O.
pub const CPU_PY: &str = "\
def handle(event):
    total = 0
    for i in range(200000):
        total += i
    return {\"total\": total}
";

/// The `ThreadingHTTPServer` baseline, written next to the code at run time.
pub const THREADING_BASELINE_PY: &str = include_str!("../baseline/threading_server.py");

/// The plain Node `http` baseline, written next to the code at run time.
pub const PLAIN_NODE_JS: &str = include_str!("../baseline/plain_node_server.js");

/// A no-dependency Python function whose bytes differ for every `run`, so each upload is a
/// new revision and a new build (the platform skips identical archives).
pub fn deploy_py(run: u64) -> String {
    format!("# deploy run {run}\n{HELLO_PY}")
}

/// A zip archive of `(path, content)` pairs, deflated like the CLI's.
pub fn zip(files: &[(&str, &str)]) -> Result<Vec<u8>> {
    let zip_err = |e: zip::result::ZipError| BenchError::Setup(format!("cannot build a zip: {e}"));
    let mut out = std::io::Cursor::new(Vec::new());
    {
        let mut writer = zip::ZipWriter::new(&mut out);
        let options = zip::write::SimpleFileOptions::default()
            .compression_method(zip::CompressionMethod::Deflated);
        for (path, content) in files {
            writer.start_file(*path, options).map_err(zip_err)?;
            writer
                .write_all(content.as_bytes())
                .map_err(|e| BenchError::Setup(format!("cannot build a zip: {e}")))?;
        }
        writer.finish().map_err(zip_err)?;
    }
    Ok(out.into_inner())
}

#[cfg(test)]
mod tests {
    use std::io::Read;

    use super::*;

    #[test]
    fn zips_hold_the_files() {
        let bytes = zip(&[("handler.py", HELLO_PY), ("a/b.txt", "x")]).expect("zip");
        let mut archive = zip::ZipArchive::new(std::io::Cursor::new(bytes)).expect("read");
        assert_eq!(archive.len(), 2);
        let mut text = String::new();
        archive
            .by_name("handler.py")
            .expect("entry")
            .read_to_string(&mut text)
            .expect("read entry");
        assert_eq!(text, HELLO_PY);
    }

    #[test]
    fn every_deploy_run_has_different_bytes() {
        assert_ne!(deploy_py(1), deploy_py(2));
        assert!(deploy_py(7).ends_with(HELLO_PY));
    }

    #[test]
    fn python_handlers_compile_and_answer() {
        // Runs each handler with the interpreter functions run with, so a typo here fails
        // in the unit tests rather than as a Failed build in the middle of a bench run.
        for (code, expect) in [
            (HELLO_PY, "{'hello': 'world'}"),
            (ECHO_PY, "{'n': 1}"),
            (CPU_PY, "{'total': 19999900000}"),
        ] {
            let program = format!("{code}\nprint(handle({{'n': 1}}))\n");
            let out = std::process::Command::new("/usr/bin/python3")
                .arg("-c")
                .arg(&program)
                .output()
                .expect("run python");
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), expect);
        }
    }
}
