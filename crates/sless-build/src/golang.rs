//! The `go` and `custom` builds: a Go function compiled with the Go shim into one
//! binary, and a custom runtime's `bootstrap` checked for being an executable file.
//!
//! `go build` runs in the build sandbox without a network (`GOPROXY=off`,
//! `GOTOOLCHAIN=local`, `-mod=vendor` when the code has `vendor/`), as the sandbox
//! user, with the server's Go build cache (`BuildConfig::go_cache`) mounted
//! writable at `/go-cache`: every build shares it, so a code-only change compiles
//! only the function's package and links, in about a second. Nothing of the
//! user's runs during a build (`CGO_ENABLED=0`, no `go generate`), which is what
//! makes sharing the cache across namespaces safe: its entries are written by
//! the Go toolchain alone.
//!
//! The shim (`runtimes/go/sless_main.go`) is `package main` like the handler, so it
//! is copied next to `handler.go` as [`SHIM_FILE`], with [`ENTRY_FILE`] registering
//! the entrypoint, and `go.mod` is written when the code has none. The binary
//! lands in the build as [`BINARY`], which instances run.

use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use tokio::time::Instant;

use crate::{BuildError, BuildRequest, Builder, io_err, ro, rw, step};

/// The shim's file in a Go build (a name unlikely to meet the user's).
pub const SHIM_FILE: &str = "zz_sless_main.go";
/// The generated file that hands the entrypoint to the shim.
pub const ENTRY_FILE: &str = "zz_sless_entry.go";
/// The compiled function, relative to the build's code directory (`/code` in the sandbox).
pub const BINARY: &str = sless_core::GO_BINARY;
/// `go.mod` for code that brings none.
const DEFAULT_GO_MOD: &str = "module handler\n\ngo 1.19\n";

impl Builder {
    /// Compiles the Go function unpacked in `code` into `code/.sless-handler`.
    pub(crate) async fn go_build(
        &self,
        key: &str,
        req: &BuildRequest,
        code: &Path,
        deadline: Instant,
    ) -> Result<(), BuildError> {
        let log = &req.log;
        let shim = self.cfg.runtime_dir.join("go").join("sless_main.go");
        let shim_text = tokio::fs::read_to_string(&shim).await.map_err(|e| {
            BuildError::Internal(format!(
                "the runtime shim {} is missing: {e}",
                shim.display()
            ))
        })?;
        let sources = go_sources(code).map_err(io_err("reading the Go sources"))?;
        let entry = entry_file(&req.entrypoint, &sources);
        write_file(&code.join(SHIM_FILE), &shim_text)?;
        write_file(&code.join(ENTRY_FILE), &entry)?;
        if !code.join("go.mod").is_file() {
            log("==> no go.mod, using `module handler` (standard library only)");
            write_file(&code.join("go.mod"), DEFAULT_GO_MOD)?;
        }
        let vendored = code.join("vendor").is_dir();
        log(&format!(
            "==> go build{}",
            if vendored { " -mod=vendor" } else { "" }
        ));
        let out = tempfile::Builder::new()
            .prefix(".tmp-go-out-")
            .tempdir_in(&self.cfg.builds_dir)
            .map_err(io_err("creating the Go output directory"))?;
        self.sandbox.grant_write(out.path())?;
        let mut env = vec![
            ("GOCACHE".to_string(), "/go-cache".to_string()),
            ("GOPATH".into(), "/tmp/go".into()),
            ("GOPROXY".into(), "off".into()),
            ("GOSUMDB".into(), "off".into()),
            ("GOTOOLCHAIN".into(), "local".into()),
            ("GOTELEMETRY".into(), "off".into()),
            ("GO111MODULE".into(), "on".into()),
            ("CGO_ENABLED".into(), "0".into()),
        ];
        if vendored {
            env.push(("GOFLAGS".into(), "-mod=vendor".into()));
        } else {
            env.push(("GOFLAGS".into(), String::new()));
        }
        let spec = self.spec(
            key,
            "go",
            self.cfg.go.clone(),
            [
                "build",
                "-trimpath",
                "-buildvcs=false",
                "-o",
                "/out/handler",
                ".",
            ],
            vec![
                ro(code, "/code"),
                rw(out.path(), "/out"),
                rw(&self.cfg.go_cache, "/go-cache"),
            ],
            "/code",
            false,
            env,
        );
        let result = step::run(&self.sandbox, &spec, log, deadline).await?;
        self.step_result(result, "go build")?;
        let built = out.path().join("handler");
        let dest = code.join(BINARY);
        let (uid, gid) = self.owner;
        tokio::task::spawn_blocking(move || -> io::Result<()> {
            std::fs::rename(&built, &dest)?;
            std::os::unix::fs::chown(&dest, Some(uid), Some(gid))?;
            std::fs::set_permissions(&dest, std::fs::Permissions::from_mode(0o755))
        })
        .await
        .map_err(|e| BuildError::Internal(format!("publishing task: {e}")))?
        .map_err(io_err("moving the Go binary into the build"))?;
        Ok(())
    }

    /// A custom runtime's entrypoint (`bootstrap`) must be an executable file in the archive.
    pub(crate) fn check_bootstrap(
        &self,
        req: &BuildRequest,
        code: &Path,
    ) -> Result<(), BuildError> {
        let name = &req.entrypoint;
        (req.log)(&format!("==> checking the executable {name}"));
        let path = code.join(name);
        let failed = |message: String| Err(BuildError::Failed { message });
        match std::fs::symlink_metadata(&path) {
            Err(_) => failed(format!(
                "{name}: not found in the archive; a custom runtime needs an executable file {name:?} at the archive's root that serves the instance protocol"
            )),
            Ok(meta) if !meta.is_file() => failed(format!(
                "{name}: is not a regular file; a custom runtime needs an executable file"
            )),
            Ok(meta) if meta.permissions().mode() & 0o111 == 0 => failed(format!(
                "{name}: is not executable (its mode in the zip lacks the x bits); set them (chmod +x {name}) and zip it again"
            )),
            Ok(_) => Ok(()),
        }
    }
}

fn write_file(path: &Path, text: &str) -> Result<(), BuildError> {
    std::fs::write(path, text).map_err(io_err(format!("writing {}", path.display())))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o644))
        .map_err(io_err(format!("setting the mode of {}", path.display())))
}

/// The text of the `.go` files at the top of the code (tests excluded).
fn go_sources(code: &Path) -> io::Result<String> {
    let mut all = String::new();
    for entry in std::fs::read_dir(code)? {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.ends_with(".go") && !name.ends_with("_test.go") && entry.file_type()?.is_file() {
            all.push_str(&std::fs::read_to_string(entry.path()).unwrap_or_default());
            all.push('\n');
        }
    }
    Ok(all)
}

/// The registration of `entrypoint` (`Handle`): `HandleContext` when the code declares
/// it, `Handle` taking a `context.Context` first, or plain `Handle`. The compiler
/// checks the signature, so a wrong one fails the build with its own message.
pub(crate) fn entry_file(entrypoint: &str, sources: &str) -> String {
    let with_context = format!("{entrypoint}Context");
    let register = if declared(sources, &with_context).is_some() {
        format!("slessUseContext({with_context})")
    } else if declared(sources, entrypoint).is_some_and(|params| params.contains("context.Context"))
    {
        format!("slessUseContext({entrypoint})")
    } else {
        format!("slessUsePlain({entrypoint})")
    };
    format!(
        "// Generated by sless: hands the entrypoint to the runtime shim ({SHIM_FILE}).\npackage main\n\nvar _ = {register}\n"
    )
}

/// The first parameter of the top-level function `name`, if the sources declare it.
fn declared<'a>(sources: &'a str, name: &str) -> Option<&'a str> {
    sources.lines().find_map(|line| {
        let rest = line.strip_prefix("func")?.trim_start();
        let rest = rest.strip_prefix(name)?.trim_start();
        let params = rest.strip_prefix('(')?;
        Some(params.split([',', ')']).next().unwrap_or(""))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_entrypoint_is_registered_by_its_signature() {
        let plain = "package main\nfunc Handle(event map[string]any) (any, error) {\n";
        assert!(entry_file("Handle", plain).contains("slessUsePlain(Handle)"));
        let ctx = "package main\nfunc HandleContext(ctx context.Context, e map[string]any) (any, error) {}\nfunc Handle(e map[string]any) (any, error) {}\n";
        assert!(entry_file("Handle", ctx).contains("slessUseContext(HandleContext)"));
        let ctx_first = "func Main(ctx context.Context, e map[string]any) (any, error) {}";
        assert!(entry_file("Main", ctx_first).contains("slessUseContext(Main)"));
        // Missing: the compiler says `undefined: Handle`.
        assert!(entry_file("Handle", "package main\n").contains("slessUsePlain(Handle)"));
        // A prefix of another name is not a declaration of it.
        assert!(
            entry_file("Handle", "func Handler(e map[string]any) {}")
                .contains("slessUsePlain(Handle)")
        );
    }
}
