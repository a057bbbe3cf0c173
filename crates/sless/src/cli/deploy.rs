//! `sless deploy`: package a folder, create or update the function, upload, and follow the
//! build until the new revision is Ready or Failed.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow, bail};
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::{Map, Value};
use sless_client::Function;

use super::Ctx;
use super::archive::{self, SETTINGS_FILE};

/// Deploy a folder as a function.
///
/// Packs DIR (skipping .git, node_modules, __pycache__, .venv and *.pyc), creates the
/// function or updates the settings you pass, uploads the code, and waits until the new
/// revision is Ready (printing its URL on stdout) or Failed (printing the build log tail and
/// exiting with 1). Uploading identical code again does not rebuild.
///
/// Settings come from, lowest first: the API defaults, `sless.json` in DIR (the API's spec
/// fields, e.g. {"memory_mb": 256, "env": {"A": "b"}}, plus an optional "name"; it is not
/// uploaded), then flags.
/// On an existing function only the settings you give are changed (env keys are merged).
#[derive(clap::Args, Debug)]
#[command(after_help = "Examples:
  sless deploy ./hello                         # name 'hello', runtime from handler.py / handler.js / handler.go / bootstrap
  sless deploy . --name api --runtime nodejs20 --env LOG_LEVEL=debug --env REGION=eu
  sless deploy ./svc --min-instances 1 --memory 256 --timeout 60
  URL=$(sless deploy ./hello) && curl \"$URL\"")]
pub struct DeployArgs {
    /// Folder holding the function's code.
    #[arg(default_value = ".")]
    pub dir: PathBuf,

    /// Function name (a DNS label: lowercase letters, digits, '-'); defaults to the folder name.
    #[arg(long)]
    pub name: Option<String>,

    /// Runtime, e.g. python3, python3.11, nodejs, nodejs20, go, custom; detected from the files when omitted.
    #[arg(long)]
    pub runtime: Option<String>,

    /// Handler as module.function (default handler.handle; Handle for go).
    #[arg(long)]
    pub entrypoint: Option<String>,

    /// Environment variable for the function; repeat for several.
    #[arg(long = "env", value_name = "KEY=VALUE", value_parser = parse_env)]
    pub env: Vec<(String, String)>,

    /// Environment variable from a secret's key (sless secret set); repeat for several.
    #[arg(long = "env-secret", value_name = "VAR=SECRET/KEY", value_parser = parse_env_secret)]
    pub env_secret: Vec<(String, String, String)>,

    /// Memory limit in MiB (32..4096).
    #[arg(long, value_name = "MB")]
    pub memory: Option<u32>,

    /// Request timeout in seconds (0..900, 0 = no limit).
    #[arg(long, value_name = "SEC")]
    pub timeout: Option<u32>,

    /// Instances kept running even when idle (0 = scale to zero).
    #[arg(long, value_name = "N")]
    pub min_instances: Option<u32>,

    /// Most instances to run at once.
    #[arg(long, value_name = "N")]
    pub max_instances: Option<u32>,

    /// Requests one instance serves at once.
    #[arg(long, value_name = "N")]
    pub concurrency: Option<u32>,

    /// Seconds an idle instance above --min-instances is kept.
    #[arg(long, value_name = "SEC")]
    pub idle_timeout: Option<u32>,

    /// Require a token of the namespace to call the function's public URL.
    #[arg(long)]
    pub private: bool,

    /// Wait until the new revision is Ready or Failed (the default).
    #[arg(long, overrides_with = "no_wait")]
    pub wait: bool,

    /// Return as soon as the code is uploaded.
    #[arg(long, overrides_with = "wait")]
    pub no_wait: bool,

    /// Give up waiting after this many seconds.
    #[arg(long, value_name = "SEC", default_value_t = 600)]
    pub wait_timeout: u64,
}

/// Parses one `--env-secret VAR=SECRET/KEY`.
pub fn parse_env_secret(s: &str) -> Result<(String, String, String), String> {
    let (var, reference) = s
        .split_once('=')
        .ok_or_else(|| format!("expected VAR=SECRET/KEY, got {s:?}"))?;
    let (secret, key) = reference
        .split_once('/')
        .filter(|(secret, key)| !secret.is_empty() && !key.is_empty())
        .ok_or_else(|| format!("expected VAR=SECRET/KEY, got {s:?}"))?;
    Ok((var.to_string(), secret.to_string(), key.to_string()))
}

/// Parses one `--env KEY=VALUE`; the value may itself contain `=`.
pub fn parse_env(s: &str) -> Result<(String, String), String> {
    let (key, value) = s
        .split_once('=')
        .ok_or_else(|| format!("expected KEY=VALUE, got {s:?}"))?;
    if key.is_empty() {
        return Err(format!("the variable name is empty in {s:?}"));
    }
    Ok((key.to_string(), value.to_string()))
}

/// Guesses the runtime family from the files in `dir`. The handler module (from `entrypoint`,
/// default `handler`), `handler.go` and a custom runtime's `bootstrap` are strong signals; dependency manifests decide only when
/// there is no strong one. Two families at the same strength are an error, not a guess.
pub fn detect_runtime(dir: &Path, entrypoint: Option<&str>) -> anyhow::Result<&'static str> {
    let module = entrypoint
        .and_then(|e| e.rsplit_once('.'))
        .map(|(m, _)| m)
        .unwrap_or("handler");
    let exists = |rel: &str| dir.join(rel).is_file();
    let python_module = format!("{}.py", module.replace('.', "/"));
    let mut strong = Vec::new();
    if exists(&python_module) {
        strong.push(("python3", python_module.clone()));
    }
    if let Some(js) = ["js", "mjs", "cjs"]
        .iter()
        .map(|ext| format!("{module}.{ext}"))
        .find(|f| exists(f))
    {
        strong.push(("nodejs", js));
    }
    if exists("handler.go") {
        strong.push(("go", "handler.go".to_string()));
    }
    if exists("bootstrap") {
        strong.push(("custom", "bootstrap".to_string()));
    }
    let weak: Vec<(&str, String)> = [
        ("python3", "requirements.txt"),
        ("nodejs", "package.json"),
        ("go", "go.mod"),
    ]
    .into_iter()
    .filter(|(_, f)| exists(f))
    .map(|(r, f)| (r, f.to_string()))
    .collect();
    for found in [strong, weak] {
        match found.as_slice() {
            [] => continue,
            [(runtime, _)] => return Ok(runtime),
            several => {
                let seen: Vec<String> = several.iter().map(|(r, f)| format!("{f} ({r})")).collect();
                bail!(
                    "{} looks like more than one runtime: {}; pass --runtime",
                    dir.display(),
                    seen.join(", ")
                );
            }
        }
    }
    bail!(
        "cannot tell the runtime of {}: no {python_module}, {module}.js, handler.go, bootstrap, go.mod, requirements.txt or package.json; \
         pass --runtime (python3, nodejs, go or custom)",
        dir.display()
    )
}

/// Checks a function name against the API's naming rule, saying where the name came from.
pub fn validate_function_name(name: &str, origin: &str) -> anyhow::Result<()> {
    sless_core::validate_name("name", name).map_err(|e| {
        anyhow!(
            "function name {name:?} ({origin}) is invalid: {}; pass --name",
            e.message
        )
    })
}

/// Reads `sless.json` from `dir`, if present: an object of spec fields plus an optional `name`.
fn load_settings(dir: &Path) -> anyhow::Result<Map<String, Value>> {
    let path = dir.join(SETTINGS_FILE);
    let text = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Map::new()),
        Err(e) => return Err(e).with_context(|| format!("cannot read {}", path.display())),
    };
    let value: Value = serde_json::from_str(&text)
        .with_context(|| format!("{} is not valid JSON", path.display()))?;
    let Value::Object(map) = value else {
        bail!(
            "{} must hold a JSON object of function settings",
            path.display()
        );
    };
    let known = sless_core::function::SPEC_FIELDS;
    if let Some(key) = map
        .keys()
        .find(|k| k.as_str() != "name" && !known.contains(&k.as_str()))
    {
        bail!(
            "{}: unknown field {key:?}; known fields: name, {}",
            path.display(),
            known.join(", ")
        );
    }
    Ok(map)
}

/// What to deploy, worked out before any request is sent.
#[derive(Debug, PartialEq)]
pub struct Plan {
    pub name: String,
    /// Spec fields for create (with `name` added) or, on an existing function, for the patch.
    pub spec: Map<String, Value>,
    /// True when the runtime was guessed from the files rather than given.
    pub runtime_detected: bool,
}

/// Merges `sless.json` and the flags into a [`Plan`] and validates the name.
pub fn plan(args: &DeployArgs) -> anyhow::Result<Plan> {
    if !args.dir.is_dir() {
        bail!("{} is not a directory", args.dir.display());
    }
    let mut spec = load_settings(&args.dir)?;
    let settings_name = spec.remove("name");

    let name = match (&args.name, settings_name) {
        (Some(name), _) => {
            validate_function_name(name, "from --name")?;
            name.clone()
        }
        (None, Some(Value::String(name))) => {
            validate_function_name(&name, "from sless.json")?;
            name
        }
        (None, Some(other)) => bail!("sless.json: \"name\" must be a string, got {other}"),
        (None, None) => {
            let dir = args
                .dir
                .canonicalize()
                .with_context(|| format!("cannot open {}", args.dir.display()))?;
            let folder = dir
                .file_name()
                .and_then(|n| n.to_str())
                .unwrap_or_default()
                .to_string();
            validate_function_name(&folder, "the folder name")?;
            folder
        }
    };

    let mut set = |key: &str, value: Option<Value>| {
        if let Some(value) = value {
            spec.insert(key.to_string(), value);
        }
    };
    set("runtime", args.runtime.clone().map(Value::from));
    set("entrypoint", args.entrypoint.clone().map(Value::from));
    set("memory_mb", args.memory.map(Value::from));
    set("timeout_sec", args.timeout.map(Value::from));
    set("min_instances", args.min_instances.map(Value::from));
    set("max_instances", args.max_instances.map(Value::from));
    set("concurrency", args.concurrency.map(Value::from));
    set("idle_timeout_sec", args.idle_timeout.map(Value::from));
    set("private", args.private.then_some(Value::Bool(true)));
    if !args.env.is_empty() || !args.env_secret.is_empty() {
        let env = spec
            .entry("env")
            .or_insert_with(|| Value::Object(Map::new()));
        let Value::Object(env) = env else {
            bail!("sless.json: \"env\" must be an object of strings");
        };
        for (key, value) in &args.env {
            env.insert(key.clone(), Value::from(value.as_str()));
        }
        for (var, secret, key) in &args.env_secret {
            env.insert(
                var.clone(),
                serde_json::json!({"secret": secret, "key": key}),
            );
        }
    }

    let runtime_detected = !spec.contains_key("runtime");
    if runtime_detected {
        let entrypoint = spec.get("entrypoint").and_then(Value::as_str);
        let runtime = detect_runtime(&args.dir, entrypoint)?;
        spec.insert("runtime".to_string(), Value::from(runtime));
    }
    Ok(Plan {
        name,
        spec,
        runtime_detected,
    })
}

/// The merge patch that brings `existing` to `plan`: only fields that differ, and for `env`
/// only the keys that differ. A detected runtime does not replace a version alias of the
/// same family (`python3.11` stays when `python3` was guessed).
pub fn patch_for(existing: &Function, plan: &Plan) -> Map<String, Value> {
    let mut patch = Map::new();
    for (key, wanted) in &plan.spec {
        let current = existing.spec.get(key);
        if key == "runtime" && plan.runtime_detected {
            let current = current.and_then(Value::as_str).unwrap_or("");
            let family = wanted.as_str().unwrap_or("");
            if !current.is_empty() && current.starts_with(family) {
                continue;
            }
        }
        if key == "env"
            && let (Some(Value::Object(current)), Value::Object(wanted)) = (current, wanted)
        {
            let changed: Map<String, Value> = wanted
                .iter()
                .filter(|(k, v)| current.get(*k) != Some(v))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            if !changed.is_empty() {
                patch.insert(key.clone(), Value::Object(changed));
            }
            continue;
        }
        if current != Some(wanted) {
            patch.insert(key.clone(), wanted.clone());
        }
    }
    patch
}

/// Runs `sless deploy`.
pub async fn run(ctx: &Ctx, args: DeployArgs) -> anyhow::Result<ExitCode> {
    let plan = plan(&args)?;
    let (ns, name) = (ctx.namespace.as_str(), plan.name.as_str());
    let archive = archive::zip_dir(&args.dir)?;
    let runtime = plan
        .spec
        .get("runtime")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let mut progress = Progress::new();
    progress.line(&format!(
        "deploying {ns}/{name}: {runtime}{}, {} file{}, {}",
        if plan.runtime_detected {
            " (detected)"
        } else {
            ""
        },
        archive.files,
        if archive.files == 1 { "" } else { "s" },
        human_size(archive.bytes.len()),
    ));

    let function = create_or_update(ctx, &plan).await?;
    let upload = ctx
        .client
        .upload_code(ns, name, archive.bytes)
        .await
        .with_context(|| format!("cannot upload the code of {ns}/{name}"))?;
    // The patch may have made a revision after the upload's if the server treated the code as
    // unchanged; wait for whichever is newer.
    let target = upload.revision.max(function.status.revision);
    let sha = upload.code_sha256.get(..12).unwrap_or(&upload.code_sha256);
    progress.line(&format!("uploaded revision {target} (code sha256 {sha}…)"));

    if args.no_wait {
        progress.finish();
        println!("{}", ctx.public_url(&function));
        return Ok(ExitCode::SUCCESS);
    }
    let result = ctx
        .client
        .wait_ready(
            ns,
            name,
            target,
            Duration::from_secs(args.wait_timeout),
            |f| progress.observe(f, target),
        )
        .await;
    progress.finish();
    let function = result.with_context(|| format!("waiting for {ns}/{name} to become ready"))?;
    let elapsed = progress.start.elapsed().as_secs_f64();
    if function.status.phase == "Failed" {
        bail!(
            "deploy of {ns}/{name} failed (revision {}, after {elapsed:.1}s):\n{}",
            function.status.revision,
            function.status.message.trim_end()
        );
    }
    eprintln!(
        "{ns}/{name} revision {} is ready ({elapsed:.1}s)",
        function.status.revision
    );
    println!("{}", ctx.public_url(&function));
    Ok(ExitCode::SUCCESS)
}

/// Creates the function, or on `409` updates the settings that differ. Creates the namespace
/// when it is missing and the token may do so.
async fn create_or_update(ctx: &Ctx, plan: &Plan) -> anyhow::Result<Function> {
    let (ns, name) = (ctx.namespace.as_str(), plan.name.as_str());
    let mut body = plan.spec.clone();
    body.insert("name".to_string(), Value::from(name));
    let body = Value::Object(body);
    let err = match ctx.client.create_function(ns, &body).await {
        Ok(created) => return Ok(created),
        Err(err) => err,
    };
    match err.status() {
        Some(409) => {
            let existing = ctx
                .client
                .get_function(ns, name)
                .await
                .with_context(|| format!("cannot read {ns}/{name}"))?;
            let patch = patch_for(&existing, plan);
            if patch.is_empty() {
                return Ok(existing);
            }
            let keys: Vec<&str> = patch.keys().map(String::as_str).collect();
            eprintln!("updating {}", keys.join(", "));
            ctx.client
                .patch_function(ns, name, &Value::Object(patch))
                .await
                .with_context(|| format!("cannot update {ns}/{name}"))
        }
        // A missing namespace reads as 404; an admin can create it on the spot.
        Some(404) if ctx.client.ensure_namespace(ns).await.unwrap_or(false) => {
            eprintln!("created namespace {ns}");
            ctx.client
                .create_function(ns, &body)
                .await
                .with_context(|| format!("cannot create {ns}/{name}"))
        }
        _ => Err(err).with_context(|| format!("cannot create {ns}/{name}")),
    }
}

fn human_size(bytes: usize) -> String {
    const KIB: f64 = 1024.0;
    let b = bytes as f64;
    if b < KIB {
        format!("{bytes} B")
    } else if b < KIB * KIB {
        format!("{:.1} KiB", b / KIB)
    } else {
        format!("{:.1} MiB", b / (KIB * KIB))
    }
}

/// Progress of a deploy or a job on stderr: a spinner on a terminal, one line per phase
/// change otherwise (so CI logs stay readable).
pub(super) struct Progress {
    bar: Option<ProgressBar>,
    pub(super) start: Instant,
    shown: String,
}

impl Progress {
    pub(super) fn new() -> Progress {
        let bar = std::io::stderr().is_terminal().then(|| {
            let bar = ProgressBar::new_spinner();
            if let Ok(style) = ProgressStyle::with_template("{spinner} {msg} {elapsed}") {
                bar.set_style(style);
            }
            bar.enable_steady_tick(Duration::from_millis(100));
            bar
        });
        Progress {
            bar,
            start: Instant::now(),
            shown: String::new(),
        }
    }

    pub(super) fn line(&self, text: &str) {
        match &self.bar {
            Some(bar) => bar.println(text),
            None => eprintln!("{text}"),
        }
    }

    /// Shows what the platform is doing with revision `target`, once per change.
    fn observe(&mut self, function: &Function, target: u64) {
        let status = &function.status;
        let text = if status.revision < target {
            format!("waiting for revision {target}…")
        } else {
            match status.phase.as_str() {
                "Pending" => "pending…".to_string(),
                "Building" => "building…".to_string(),
                "Ready" => "ready".to_string(),
                "Failed" => "failed".to_string(),
                other => format!("{}…", other.to_lowercase()),
            }
        };
        self.show(text);
    }

    /// Shows `text` as the current state, unless it is already shown.
    pub(super) fn show(&mut self, text: String) {
        if text == self.shown {
            return;
        }
        match &self.bar {
            Some(bar) => bar.set_message(text.clone()),
            None => eprintln!("{:>6.1}s  {text}", self.start.elapsed().as_secs_f64()),
        }
        self.shown = text;
    }

    pub(super) fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;
    use serde_json::json;

    use super::*;

    #[derive(Parser)]
    struct Harness {
        #[command(flatten)]
        deploy: DeployArgs,
    }

    fn args(argv: &[&str]) -> DeployArgs {
        Harness::try_parse_from(std::iter::once("deploy").chain(argv.iter().copied()))
            .expect("parses")
            .deploy
    }

    fn write(dir: &Path, rel: &str, content: &str) {
        std::fs::write(dir.join(rel), content).expect("write");
    }

    #[test]
    fn env_flags_parse() {
        assert_eq!(parse_env("A=b"), Ok(("A".into(), "b".into())));
        assert_eq!(
            parse_env("URL=http://x/?a=1"),
            Ok(("URL".into(), "http://x/?a=1".into()))
        );
        assert_eq!(parse_env("EMPTY="), Ok(("EMPTY".into(), String::new())));
        assert!(
            parse_env("NOEQUALS")
                .expect_err("no =")
                .contains("KEY=VALUE")
        );
        assert!(parse_env("=v").is_err());
        let a = args(&["--env", "A=1", "--env", "B=x=y", "/tmp"]);
        assert_eq!(
            a.env,
            [
                ("A".to_string(), "1".to_string()),
                ("B".to_string(), "x=y".to_string())
            ]
        );
        assert!(Harness::try_parse_from(["deploy", "--env", "oops", "/tmp"]).is_err());
    }

    #[test]
    fn wait_flags_override_each_other() {
        assert!(!args(&["/tmp"]).no_wait);
        assert!(args(&["--no-wait", "/tmp"]).no_wait);
        assert!(!args(&["--no-wait", "--wait", "/tmp"]).no_wait);
    }

    #[test]
    fn detects_runtimes() {
        let cases: &[(&[&str], &str)] = &[
            (&["handler.py"], "python3"),
            (&["requirements.txt"], "python3"),
            (&["handler.js"], "nodejs"),
            (&["package.json"], "nodejs"),
            (&["go.mod", "main.go"], "go"),
            (&["handler.go"], "go"),
            (&["handler.go", "go.mod"], "go"),
            (&["bootstrap"], "custom"),
            (&["bootstrap", "requirements.txt"], "custom"),
            // The handler file beats another family's manifest.
            (&["handler.py", "package.json"], "python3"),
        ];
        for (files, want) in cases {
            let dir = tempfile::tempdir().expect("tempdir");
            for f in *files {
                write(dir.path(), f, "");
            }
            assert_eq!(
                detect_runtime(dir.path(), None).expect("detected"),
                *want,
                "{files:?}"
            );
        }
    }

    #[test]
    fn detection_follows_the_entrypoint_module() {
        let dir = tempfile::tempdir().expect("tempdir");
        write(dir.path(), "main.mjs", "");
        assert_eq!(
            detect_runtime(dir.path(), Some("main.handle")).expect("detected"),
            "nodejs"
        );
        assert!(detect_runtime(dir.path(), None).is_err());
    }

    #[test]
    fn ambiguous_or_unknown_runtime_asks_for_the_flag() {
        let dir = tempfile::tempdir().expect("tempdir");
        let err = detect_runtime(dir.path(), None).expect_err("nothing there");
        assert!(err.to_string().contains("pass --runtime"), "{err}");
        write(dir.path(), "handler.py", "");
        write(dir.path(), "handler.js", "");
        let err = detect_runtime(dir.path(), None).expect_err("two handlers");
        assert!(err.to_string().contains("more than one runtime"), "{err}");
        assert!(err.to_string().contains("handler.js (nodejs)"), "{err}");
    }

    #[test]
    fn names_are_validated_before_any_request() {
        assert!(validate_function_name("hello-2", "x").is_ok());
        let err = validate_function_name("My_Func", "the folder name").expect_err("invalid");
        let text = err.to_string();
        assert!(
            text.starts_with("function name \"My_Func\" (the folder name) is invalid"),
            "{text}"
        );
        assert!(text.ends_with("pass --name"), "{text}");

        let root = tempfile::tempdir().expect("tempdir");
        let dir = root.path().join("Bad_Name");
        std::fs::create_dir(&dir).expect("mkdir");
        write(&dir, "handler.py", "");
        let dir_arg = dir.to_str().expect("utf-8");
        assert!(plan(&args(&[dir_arg])).is_err());
        assert_eq!(
            plan(&args(&["--name", "good", dir_arg]))
                .expect("plan")
                .name,
            "good"
        );
    }

    #[test]
    fn name_defaults_to_the_folder_even_for_dot() {
        let root = tempfile::tempdir().expect("tempdir");
        let dir = root.path().join("hello");
        std::fs::create_dir(&dir).expect("mkdir");
        write(&dir, "handler.py", "");
        let plan = plan(&args(&[dir.join(".").to_str().expect("utf-8")])).expect("plan");
        assert_eq!(plan.name, "hello");
        assert_eq!(
            plan.spec,
            json!({"runtime": "python3"})
                .as_object()
                .cloned()
                .expect("object")
        );
        assert!(plan.runtime_detected);
    }

    #[test]
    fn flags_override_sless_json() {
        let root = tempfile::tempdir().expect("tempdir");
        let dir = root.path();
        write(dir, "handler.js", "");
        write(
            dir,
            "sless.json",
            r#"{"name": "from-file", "memory_mb": 256, "timeout_sec": 5, "env": {"A": "1", "B": "2"}}"#,
        );
        let p = plan(&args(&[
            "--memory",
            "512",
            "--env",
            "B=3",
            "--private",
            dir.to_str().expect("utf-8"),
        ]))
        .expect("plan");
        assert_eq!(p.name, "from-file");
        let want = json!({"runtime": "nodejs", "memory_mb": 512, "timeout_sec": 5, "env": {"A": "1", "B": "3"}, "private": true});
        assert_eq!(Value::Object(p.spec), want);

        write(dir, "sless.json", r#"{"memroy_mb": 1}"#);
        let err = plan(&args(&["--name", "x", dir.to_str().expect("utf-8")])).expect_err("typo");
        assert!(
            err.to_string().contains("unknown field \"memroy_mb\""),
            "{err}"
        );
    }

    #[test]
    fn patch_holds_only_what_changed() {
        let existing = Function {
            name: "hello".into(),
            spec: json!({"runtime": "python3.11", "memory_mb": 128, "env": {"A": "1", "B": "2"}}),
            ..Function::default()
        };
        let spec = json!({"runtime": "python3", "memory_mb": 128, "timeout_sec": 60, "env": {"A": "1", "B": "9"}});
        let mut plan = Plan {
            name: "hello".into(),
            spec: spec.as_object().cloned().expect("object"),
            runtime_detected: true,
        };
        assert_eq!(
            Value::Object(patch_for(&existing, &plan)),
            json!({"timeout_sec": 60, "env": {"B": "9"}})
        );
        // A runtime the user asked for is sent as given.
        plan.runtime_detected = false;
        assert_eq!(
            patch_for(&existing, &plan).get("runtime"),
            Some(&json!("python3"))
        );
        // A detected runtime of another family replaces the old one.
        plan.runtime_detected = true;
        plan.spec.insert("runtime".into(), json!("nodejs"));
        assert_eq!(
            patch_for(&existing, &plan).get("runtime"),
            Some(&json!("nodejs"))
        );
    }

    #[test]
    fn sizes_read_well() {
        assert_eq!(human_size(812), "812 B");
        assert_eq!(human_size(12_595), "12.3 KiB");
        assert_eq!(human_size(3 * 1024 * 1024), "3.0 MiB");
    }
}
