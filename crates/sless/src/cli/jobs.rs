//! `sless job run|ls|status|rm`: one-shot runs of a function, or of a folder of code, with an
//! event; `run` on an existing job runs it again.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, anyhow, bail};
use serde_json::{Map, Value};
use sless_client::Job;

use super::archive;
use super::deploy::{Progress, detect_runtime, parse_env};
use super::functions::read_event;
use super::{Ctx, table};

/// Run one-shot jobs and see how they went.
#[derive(clap::Subcommand, Debug)]
pub enum JobCommand {
    /// Run a function (or a folder of code) once with an event; again if the job exists.
    Run(RunArgs),
    /// List the namespace's jobs with the phase of their latest run.
    #[command(after_help = "Examples:
  sless job ls
  sless job ls --json | jq '.[] | select(.status.phase == \"Failed\") | .name'")]
    Ls {
        /// Print the API's JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Show a job's latest run: phase, attempts, result or failure message.
    #[command(after_help = "Examples:
  sless job status import
  sless job status import --json | jq .status.result")]
    Status {
        /// Job to show.
        name: String,
        /// Print the API's JSON instead of a summary.
        #[arg(long)]
        json: bool,
    },
    /// Delete jobs (a running attempt is stopped).
    #[command(after_help = "Example:\n  sless job rm import cleanup")]
    Rm {
        /// Jobs to delete.
        #[arg(required = true)]
        names: Vec<String>,
    },
}

/// Run a job: call a function once with an event, or build and run a folder of code.
///
/// With --function the job calls that function. With DIR the job is self-contained: DIR is
/// packed like `sless deploy` packs it (runtime detected from the files unless --runtime),
/// built, and run once. If the job NAME exists already it is run again (its run number goes
/// up by one; a new --event, --timeout or --attempts replaces the old one, DIR's code is
/// uploaded again).
///
/// Without --wait the command returns once the run is requested. With --wait it follows the
/// run on stderr, then prints the handler's result as JSON on stdout and exits 0, or prints
/// the failure (error and output tail) and exits 1.
// The DIR-only flags conflict with --function rather than `requires = "dir"`: clap drops a
// requirement on an argument that conflicts with one present, and the group makes --function
// and DIR conflict.
#[derive(clap::Args, Debug)]
#[command(group(clap::ArgGroup::new("what").required(true).args(["function", "dir"])))]
#[command(after_help = "Examples:
  sless job run once --function hello --event '{\"name\": \"Ada\"}' --wait
  sless job run once --function hello --wait          # run it again
  sless job run import ./importer --env SOURCE=s3://bucket/x --timeout 900 --attempts 3
  sless job run report ./report --runtime python3.11 --event @params.json --wait > result.json")]
pub struct RunArgs {
    /// Job name (a DNS label: lowercase letters, digits, '-').
    pub name: String,

    /// Folder holding self-contained job code.
    pub dir: Option<PathBuf>,

    /// Function the job calls.
    #[arg(short, long)]
    pub function: Option<String>,

    /// Runtime of DIR's code, e.g. python3, nodejs20; detected from the files when omitted.
    #[arg(long, conflicts_with = "function")]
    pub runtime: Option<String>,

    /// Handler in DIR as module.function (default handler.handle).
    #[arg(long, conflicts_with = "function")]
    pub entrypoint: Option<String>,

    /// Environment variable for DIR's code; repeat for several.
    #[arg(long = "env", value_name = "KEY=VALUE", value_parser = parse_env, conflicts_with = "function")]
    pub env: Vec<(String, String)>,

    /// Memory limit of DIR's code in MiB.
    #[arg(long, value_name = "MB", conflicts_with = "function")]
    pub memory: Option<u32>,

    /// Event for the handler, as JSON text, @FILE, or @- for stdin (default {}).
    #[arg(long, value_name = "JSON|@FILE")]
    pub event: Option<String>,

    /// Seconds each attempt may take (default: the function's timeout; 600 for DIR).
    #[arg(long, value_name = "SEC")]
    pub timeout: Option<u32>,

    /// Attempts before the run counts as failed (default 1); retries back off.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=100))]
    pub attempts: Option<u32>,

    /// Wait for the run to finish and print its result.
    #[arg(long)]
    pub wait: bool,

    /// With --wait, give up waiting after this many seconds (the run goes on).
    #[arg(long, value_name = "SEC", requires = "wait")]
    pub wait_timeout: Option<u64>,
}

/// What `job run` will ask for, worked out before any request is sent.
#[derive(Debug, PartialEq)]
struct Plan {
    /// Spec fields (no `name`, no `run_id`).
    spec: Map<String, Value>,
    /// The folder to upload, for a self-contained job.
    dir: Option<PathBuf>,
}

/// Checks the arguments and builds the job's spec; `event` is the parsed `--event`.
fn plan(args: &RunArgs, event: Option<Value>) -> anyhow::Result<Plan> {
    sless_core::validate_name("name", &args.name)
        .map_err(|e| anyhow!("job name {:?} is invalid: {}", args.name, e.message))?;
    let mut spec = Map::new();
    match (&args.function, &args.dir) {
        (Some(function), None) => {
            sless_core::validate_name("name", function)
                .map_err(|e| anyhow!("function name {function:?} is invalid: {}", e.message))?;
            spec.insert("function".into(), Value::from(function.as_str()));
        }
        (None, Some(dir)) => {
            if !dir.is_dir() {
                bail!("{} is not a directory", dir.display());
            }
            let runtime = match &args.runtime {
                Some(runtime) => runtime.clone(),
                None => detect_runtime(dir, args.entrypoint.as_deref())?.to_string(),
            };
            spec.insert("runtime".into(), Value::from(runtime));
            if let Some(entrypoint) = &args.entrypoint {
                spec.insert("entrypoint".into(), Value::from(entrypoint.as_str()));
            }
            if !args.env.is_empty() {
                let env: Map<String, Value> = args
                    .env
                    .iter()
                    .map(|(k, v)| (k.clone(), Value::from(v.as_str())))
                    .collect();
                spec.insert("env".into(), Value::Object(env));
            }
            if let Some(memory) = args.memory {
                spec.insert("memory_mb".into(), Value::from(memory));
            }
        }
        // clap's "what" group makes exactly one of them present.
        _ => bail!("give either --function FUNCTION or a DIR of code, not both"),
    }
    if let Some(event) = event {
        spec.insert("event".into(), event);
    }
    if let Some(timeout) = args.timeout {
        spec.insert("timeout_sec".into(), Value::from(timeout));
    }
    if let Some(attempts) = args.attempts {
        spec.insert("max_attempts".into(), Value::from(attempts));
    }
    Ok(Plan {
        spec,
        dir: args.dir.clone(),
    })
}

/// The merge patch that runs `existing` again as `plan` asks: the next run number plus the
/// fields that differ. Refuses to turn a function job into a self-contained one or back,
/// which would need fields removed that the user never mentioned.
fn rerun_patch(existing: &Job, plan: &Plan) -> anyhow::Result<(u64, Map<String, Value>)> {
    let name = format!("{}/{}", existing.namespace, existing.name);
    match (existing.function(), plan.spec.contains_key("function")) {
        (None, true) => bail!(
            "job {name} exists and runs its own code, not a function; `sless job rm {}` first",
            existing.name
        ),
        (Some(function), false) => bail!(
            "job {name} exists and calls function {function}, not a folder of code; `sless job rm {}` first",
            existing.name
        ),
        _ => {}
    }
    let run_id = existing.spec_run_id().max(existing.status.run_id) + 1;
    let mut patch = Map::new();
    patch.insert("run_id".into(), Value::from(run_id));
    for (key, wanted) in &plan.spec {
        if existing.spec.get(key) != Some(wanted) {
            patch.insert(key.clone(), wanted.clone());
        }
    }
    Ok((run_id, patch))
}

/// Runs `sless job ...`.
pub async fn run(ctx: &Ctx, command: JobCommand) -> anyhow::Result<ExitCode> {
    let ns = ctx.namespace.as_str();
    match command {
        JobCommand::Run(args) => return run_job(ctx, args).await,
        JobCommand::Ls { json } => {
            let jobs = ctx
                .client
                .list_jobs(ns)
                .await
                .with_context(|| format!("cannot list jobs in {ns}"))?;
            if json {
                println!("{}", serde_json::to_string_pretty(&jobs)?);
            } else {
                print!("{}", jobs_table(&jobs));
            }
        }
        JobCommand::Status { name, json } => {
            let job = ctx
                .client
                .get_job(ns, &name, None)
                .await
                .with_context(|| format!("cannot read job {ns}/{name}"))?;
            if json {
                println!("{}", serde_json::to_string_pretty(&job)?);
            } else {
                print!("{}", summary(&job));
            }
        }
        JobCommand::Rm { names } => {
            for name in &names {
                ctx.client
                    .delete_job(ns, name)
                    .await
                    .with_context(|| format!("cannot delete job {ns}/{name}"))?;
                println!("deleted job {ns}/{name}");
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Runs `sless job run`.
async fn run_job(ctx: &Ctx, args: RunArgs) -> anyhow::Result<ExitCode> {
    let (ns, name) = (ctx.namespace.as_str(), args.name.as_str());
    let event = match &args.event {
        Some(data) => Some(read_event(Some(data), "--event")?),
        None => None,
    };
    let plan = plan(&args, event)?;
    // Pack before any request, so a folder that cannot be shipped changes nothing.
    let code = match &plan.dir {
        Some(dir) => Some(archive::zip_dir(dir)?.bytes),
        None => None,
    };
    let mut body = plan.spec.clone();
    body.insert("name".into(), Value::from(name));
    let upload = |code: Vec<u8>| async move {
        ctx.client
            .upload_job_code(ns, name, code)
            .await
            .with_context(|| format!("cannot upload the code of job {ns}/{name}"))
    };
    let run_id = match ctx.client.create_job(ns, &Value::Object(body)).await {
        Ok(job) => {
            if let Some(code) = code {
                upload(code).await?;
            }
            job.spec_run_id().max(1)
        }
        Err(err) if err.status() == Some(409) => {
            let existing = ctx
                .client
                .get_job(ns, name, None)
                .await
                .with_context(|| format!("cannot read job {ns}/{name}"))?;
            let (run_id, patch) = rerun_patch(&existing, &plan)?;
            // New code first, so the new run cannot start with the old code.
            if let Some(code) = code {
                upload(code).await?;
            }
            ctx.client
                .patch_job(ns, name, &Value::Object(patch))
                .await
                .with_context(|| format!("cannot run job {ns}/{name} again"))?;
            run_id
        }
        Err(err) => return Err(err).with_context(|| format!("cannot create job {ns}/{name}")),
    };

    if !args.wait {
        println!("started job {ns}/{name} run {run_id}");
        return Ok(ExitCode::SUCCESS);
    }
    let mut progress = Progress::new();
    progress.line(&format!("started job {ns}/{name} run {run_id}"));
    let result = ctx
        .client
        .wait_job(
            ns,
            name,
            run_id,
            args.wait_timeout.map(Duration::from_secs),
            |job| progress.show(phase_text(job, run_id)),
        )
        .await;
    progress.finish();
    let job = result.with_context(|| format!("waiting for job {ns}/{name}"))?;
    let elapsed = progress.start.elapsed().as_secs_f64();
    let status = &job.status;
    match status.phase.as_str() {
        "Succeeded" => {
            eprintln!(
                "job {ns}/{name} run {run_id} succeeded ({}, {elapsed:.1}s)",
                attempts_text(status.attempts)
            );
            let result = status.result.clone().unwrap_or(Value::Null);
            println!("{}", serde_json::to_string_pretty(&result)?);
            Ok(ExitCode::SUCCESS)
        }
        "Skipped" => bail!("job {ns}/{name} run {run_id} was skipped"),
        _ => bail!(
            "job {ns}/{name} run {run_id} failed ({}, {elapsed:.1}s):\n{}",
            attempts_text(status.attempts),
            status.message.trim_end()
        ),
    }
}

fn attempts_text(attempts: u32) -> String {
    format!("{attempts} attempt{}", if attempts == 1 { "" } else { "s" })
}

/// What the run is doing, for the progress line.
fn phase_text(job: &Job, run_id: u64) -> String {
    let status = &job.status;
    if status.run_id < run_id {
        return format!("waiting for run {run_id} to start…");
    }
    match status.phase.as_str() {
        "Pending" => "pending…".to_string(),
        "Building" => "building…".to_string(),
        "Running" if job.max_attempts() > 1 && status.attempts > 0 => {
            format!(
                "running (attempt {} of {})…",
                status.attempts,
                job.max_attempts()
            )
        }
        "Running" => "running…".to_string(),
        other => other.to_lowercase(),
    }
}

/// The FUNCTION cell: the function, or `(runtime)` for a self-contained job.
fn target_text(job: &Job) -> String {
    match (job.function(), job.runtime()) {
        (Some(function), _) => function.to_string(),
        (None, Some(runtime)) => format!("({runtime})"),
        (None, None) => "-".to_string(),
    }
}

fn jobs_table(jobs: &[Job]) -> String {
    let rows: Vec<Vec<String>> = jobs
        .iter()
        .map(|job| {
            vec![
                job.name.clone(),
                target_text(job),
                job.status.phase.to_string(),
                job.status.run_id.to_string(),
                format!("{}/{}", job.status.attempts, job.max_attempts()),
                table::time(job.status.finished_at.as_deref()),
            ]
        })
        .collect();
    table::render(
        &["NAME", "FUNCTION", "PHASE", "RUN", "ATTEMPTS", "FINISHED"],
        &rows,
    )
}

/// `key: value` lines for `sless job status`, then the result or the failure message.
fn summary(job: &Job) -> String {
    let s = &job.status;
    let spec_text = |key: &str| match job.spec.get(key) {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(text)) => text.clone(),
        Some(other) => other.to_string(),
    };
    let rows: Vec<(&str, String)> = vec![
        ("name", format!("{}/{}", job.namespace, job.name)),
        ("phase", s.phase.to_string()),
        ("run", s.run_id.to_string()),
        (
            "attempts",
            format!("{} of {}", s.attempts, job.max_attempts()),
        ),
        ("function", spec_text("function")),
        ("runtime", spec_text("runtime")),
        ("entrypoint", spec_text("entrypoint")),
        ("env", spec_text("env")),
        ("event", spec_text("event")),
        ("timeout", spec_text("timeout_sec")),
        ("started", s.started_at.clone().unwrap_or_default()),
        ("finished", s.finished_at.clone().unwrap_or_default()),
        ("created", job.created_at.clone()),
        ("updated", job.updated_at.clone()),
    ];
    let mut out = String::new();
    // Fields the server did not report are left out rather than shown blank.
    for (key, value) in rows.into_iter().filter(|(_, v)| !v.is_empty() && v != "{}") {
        out.push_str(&format!("{:<12}{value}\n", format!("{key}:")));
    }
    if let Some(result) = &s.result {
        out.push_str("result:\n");
        let pretty = serde_json::to_string_pretty(result).unwrap_or_else(|_| result.to_string());
        for line in pretty.lines() {
            out.push_str(&format!("  {line}\n"));
        }
    }
    if !s.message.is_empty() {
        out.push_str("message:\n");
        for line in s.message.lines() {
            out.push_str(&format!("  {line}\n"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use clap::Parser;
    use serde_json::json;
    use sless_client::JobStatus;

    use super::*;

    #[derive(Parser, Debug)]
    struct Harness {
        #[command(subcommand)]
        job: JobCommand,
    }

    fn parse(argv: &[&str]) -> Result<JobCommand, clap::Error> {
        Harness::try_parse_from(std::iter::once("job").chain(argv.iter().copied())).map(|h| h.job)
    }

    fn run_args(argv: &[&str]) -> RunArgs {
        match parse(&[&["run"], argv].concat()).expect("parses") {
            JobCommand::Run(args) => args,
            other => panic!("not run: {other:?}"),
        }
    }

    fn object(value: Value) -> Map<String, Value> {
        value.as_object().cloned().expect("an object")
    }

    #[test]
    fn function_jobs_plan_their_spec() {
        let args = run_args(&[
            "once",
            "--function",
            "hello",
            "--timeout",
            "60",
            "--attempts",
            "3",
            "--wait",
        ]);
        assert!(args.wait);
        let plan = plan(&args, Some(json!({"n": 1}))).expect("plan");
        assert_eq!(
            plan,
            Plan {
                spec: object(
                    json!({"function": "hello", "event": {"n": 1}, "timeout_sec": 60, "max_attempts": 3})
                ),
                dir: None,
            }
        );
    }

    #[test]
    fn folder_jobs_detect_the_runtime_and_take_env() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("handler.py"), "def handle(e): return e\n").expect("write");
        let path = dir.path().to_str().expect("utf-8");
        let args = run_args(&["batch", path, "--env", "A=1", "--env", "B=x=y"]);
        let plan = plan(&args, None).expect("plan");
        assert_eq!(
            plan.spec,
            object(json!({"runtime": "python3", "env": {"A": "1", "B": "x=y"}}))
        );
        assert_eq!(plan.dir.as_deref(), Some(Path::new(path)));

        let args = run_args(&[
            "batch",
            path,
            "--runtime",
            "nodejs20",
            "--entrypoint",
            "main.run",
            "--memory",
            "256",
        ]);
        assert_eq!(
            super::plan(&args, None).expect("plan").spec,
            object(json!({"runtime": "nodejs20", "entrypoint": "main.run", "memory_mb": 256}))
        );
    }

    #[test]
    fn run_needs_a_function_or_a_folder_but_not_both() {
        for argv in [
            &["run", "once"][..],
            &["run", "once", "./dir", "--function", "hello"],
            &["run", "once", "--function", "hello", "--runtime", "python3"],
            &["run", "once", "--function", "hello", "--env", "A=1"],
            &["run", "once", "--function", "hello", "--attempts", "0"],
            &["run", "once", "--function", "hello", "--wait-timeout", "5"],
            &["rm"],
        ] {
            assert!(parse(argv).is_err(), "{argv:?} should not parse");
        }
        assert!(matches!(
            parse(&["status", "once", "--json"]).expect("parses"),
            JobCommand::Status { json: true, .. }
        ));
    }

    #[test]
    fn plan_checks_names_and_folders_before_sending() {
        let err = plan(&run_args(&["Once", "-f", "hello"]), None).expect_err("bad name");
        assert!(
            err.to_string().starts_with("job name \"Once\" is invalid"),
            "{err}"
        );
        let err = plan(&run_args(&["once", "-f", "hel_lo"]), None).expect_err("bad function");
        assert!(err.to_string().starts_with("function name"), "{err}");
        let err = plan(&run_args(&["once", "/definitely/not/here"]), None).expect_err("no dir");
        assert!(err.to_string().contains("is not a directory"), "{err}");
        let empty = tempfile::tempdir().expect("tempdir");
        let err = plan(
            &run_args(&["once", empty.path().to_str().expect("utf-8")]),
            None,
        )
        .expect_err("no runtime to detect");
        assert!(err.to_string().contains("pass --runtime"), "{err}");
    }

    fn job(spec: Value, status: JobStatus) -> Job {
        Job {
            name: "once".into(),
            namespace: "default".into(),
            spec,
            status,
            ..Job::default()
        }
    }

    #[test]
    fn rerun_raises_the_run_and_sends_what_changed() {
        let existing = job(
            json!({"function": "hello", "event": {"n": 1}, "run_id": 2, "timeout_sec": 60}),
            JobStatus {
                phase: "Succeeded".into(),
                run_id: 2,
                ..JobStatus::default()
            },
        );
        let same_event = Plan {
            spec: object(json!({"function": "hello", "event": {"n": 1}})),
            dir: None,
        };
        let (run_id, patch) = rerun_patch(&existing, &same_event).expect("patch");
        assert_eq!(run_id, 3);
        assert_eq!(Value::Object(patch), json!({"run_id": 3}));

        let new_event = Plan {
            spec: object(json!({"function": "hello", "event": {"n": 2}, "max_attempts": 2})),
            dir: None,
        };
        let (_, patch) = rerun_patch(&existing, &new_event).expect("patch");
        assert_eq!(
            Value::Object(patch),
            json!({"run_id": 3, "event": {"n": 2}, "max_attempts": 2})
        );
    }

    #[test]
    fn rerun_refuses_to_switch_between_function_and_code() {
        let function_job = job(
            json!({"function": "hello", "run_id": 1}),
            JobStatus::default(),
        );
        let folder = Plan {
            spec: object(json!({"runtime": "python3"})),
            dir: Some(PathBuf::from(".")),
        };
        let err = rerun_patch(&function_job, &folder).expect_err("switch");
        assert!(err.to_string().contains("calls function hello"), "{err}");
        let code_job = job(
            json!({"runtime": "python3", "run_id": 1}),
            JobStatus::default(),
        );
        let function = Plan {
            spec: object(json!({"function": "hello"})),
            dir: None,
        };
        let err = rerun_patch(&code_job, &function).expect_err("switch");
        assert!(err.to_string().contains("runs its own code"), "{err}");
    }

    #[test]
    fn progress_tells_an_old_run_from_the_new_one() {
        let mut j = job(
            json!({"function": "hello", "max_attempts": 3}),
            JobStatus {
                phase: "Succeeded".into(),
                run_id: 1,
                ..JobStatus::default()
            },
        );
        assert_eq!(phase_text(&j, 2), "waiting for run 2 to start…");
        j.status = JobStatus {
            phase: "Running".into(),
            run_id: 2,
            attempts: 2,
            ..JobStatus::default()
        };
        assert_eq!(phase_text(&j, 2), "running (attempt 2 of 3)…");
        j.status.phase = "Failed".into();
        assert_eq!(phase_text(&j, 2), "failed");
    }

    #[test]
    fn table_shows_one_row_per_job() {
        let done = job(
            json!({"function": "hello", "max_attempts": 3}),
            JobStatus {
                phase: "Succeeded".into(),
                run_id: 4,
                attempts: 2,
                finished_at: Some("2025-01-01T10:00:00.5Z".into()),
                ..JobStatus::default()
            },
        );
        let mut building = job(
            json!({"runtime": "python3"}),
            JobStatus {
                phase: "Building".into(),
                run_id: 1,
                ..JobStatus::default()
            },
        );
        building.name = "batch".into();
        let out = jobs_table(&[done, building]);
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(
            lines,
            [
                "NAME    FUNCTION    PHASE       RUN   ATTEMPTS   FINISHED",
                "once    hello       Succeeded   4     2/3        2025-01-01T10:00:00Z",
                "batch   (python3)   Building    1     0/1        -",
            ]
        );
    }

    #[test]
    fn summary_shows_result_or_message() {
        let ok = job(
            json!({"function": "hello", "event": {"n": 1}, "run_id": 1}),
            JobStatus {
                phase: "Succeeded".into(),
                run_id: 1,
                attempts: 1,
                result: Some(json!({"sum": 3})),
                ..JobStatus::default()
            },
        );
        let out = summary(&ok);
        assert!(out.starts_with("name:       default/once\n"), "{out}");
        assert!(out.contains("attempts:   1 of 1\n"), "{out}");
        assert!(out.contains("event:      {\"n\":1}\n"), "{out}");
        assert!(
            out.ends_with("result:\n  {\n    \"sum\": 3\n  }\n"),
            "{out}"
        );
        assert!(!out.contains("runtime:"), "{out}");

        let failed = job(
            json!({"runtime": "python3"}),
            JobStatus {
                phase: "Failed".into(),
                message: "ValueError: no\nTraceback tail".into(),
                ..JobStatus::default()
            },
        );
        let out = summary(&failed);
        assert!(out.contains("runtime:    python3\n"), "{out}");
        assert!(
            out.ends_with("message:\n  ValueError: no\n  Traceback tail\n"),
            "{out}"
        );
    }
}
