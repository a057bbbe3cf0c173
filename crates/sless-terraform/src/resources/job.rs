//! `sless_job`: a one-shot run of a function, or self-contained with its own code.

use std::time::Duration;

use anyhow::Context;
use async_trait::async_trait;
use serde_json::{Map, Value as Json, json};
use sless_client::{Job, JobPhase};
use tf_provider::value::ValueAny;

use super::function::{changed_code, code_attrs, env_json, env_state, plan_code};
use crate::resource::{Ctx, SlessResource, deleted, found, ns_name, object_id};
use crate::schema::{self, Attr, Def, Preset, Ty};
use crate::value::{Obj, bool_of, from_json, get, num_of, opt_string, str_of, string};

fn job_def() -> Def {
    let mut attrs = vec![
        Attr::computed("id", Ty::Str, "`namespace/name`."),
        Attr::optional_computed("namespace", Ty::Str, "The namespace; default the provider's.").force_new(),
        Attr::required("name", Ty::Str, "The job's name (a DNS label).").force_new(),
        Attr::optional("function", Ty::Str, "The function to run; or leave it out and give `runtime` and code (a self-contained job).").force_new(),
        Attr::optional("runtime", Ty::Str, "Self-contained jobs: the runtime.").force_new(),
        Attr::optional_computed("entrypoint", Ty::Str, "Self-contained jobs: `module.function`; default `handler.handle`."),
        Attr::optional("env", Ty::MapStr, "Self-contained jobs: environment variables."),
        Attr::optional("secret_env", Ty::MapStr, "Self-contained jobs: variables from secrets, `NAME = \"secret/key\"`."),
        Attr::optional("memory_mb", Ty::Num, "Self-contained jobs: memory limit in MiB."),
        Attr::with_default("event", Ty::Json, Preset::Str("{}"), "The event as JSON (`jsonencode({...})`)."),
        Attr::with_default("run_id", Ty::Num, Preset::Num(1), "Raise it to run the job again; 0 creates it without running it."),
        Attr::optional("timeout_sec", Ty::Num, "Seconds each attempt may run; default the function's."),
        Attr::with_default("max_attempts", Ty::Num, Preset::Num(1), "Attempts per run (retries back off)."),
        Attr::with_default("wait", Ty::Bool, Preset::Bool(false), "Apply waits until the run ends and fails if it failed, recording `result`.").local(),
        Attr::with_default("wait_timeout_sec", Ty::Num, Preset::Num(600), "How long an apply waits for the run (with `wait`) or the build.").local(),
    ];
    let mut code = code_attrs();
    for a in &mut code {
        a.desc = match a.name {
            "source_dir" => {
                "Self-contained jobs: a folder holding the code (zipped deterministically)."
            }
            "source_zip" => "Self-contained jobs: a zip archive of the code.",
            _ => a.desc,
        };
    }
    attrs.extend(code);
    attrs.extend([
        Attr::computed(
            "phase",
            Ty::Str,
            "`Pending`, `Building`, `Running`, `Succeeded`, `Failed` or `Skipped`.",
        )
        .volatile(),
        Attr::computed(
            "result",
            Ty::Str,
            "The handler's return value as JSON, once the run succeeded.",
        )
        .volatile(),
        Attr::computed(
            "message",
            Ty::Str,
            "On failure: the error and the tail of the output.",
        )
        .volatile(),
    ]);
    Def {
        desc: "A job: one run of a function (or of its own code) with an event; raise `run_id` to run it again.",
        attrs,
        blocks: vec![],
    }
}

fn spec_json(obj: &Obj) -> anyhow::Result<Map<String, Json>> {
    let mut spec = Map::new();
    let event = str_of(obj, "event").unwrap_or("{}");
    spec.insert(
        "event".into(),
        serde_json::from_str(event).context("event is not JSON")?,
    );
    for k in ["function", "runtime", "entrypoint"] {
        if let Some(v) = str_of(obj, k) {
            spec.insert(k.into(), json!(v));
        }
    }
    let env = env_json(obj)?;
    if str_of(obj, "runtime").is_some() {
        spec.insert("env".into(), Json::Object(env));
    }
    for k in ["memory_mb", "run_id", "timeout_sec", "max_attempts"] {
        spec.insert(k.into(), num_of(obj, k).map_or(Json::Null, |n| json!(n)));
    }
    Ok(spec)
}

fn job_state(j: &Job) -> Obj {
    let field = |k: &str| j.spec.get(k).map(from_json).unwrap_or(ValueAny::Null);
    let mut out = Obj::new();
    out.insert("id".into(), string(format!("{}/{}", j.namespace, j.name)));
    out.insert("namespace".into(), string(&j.namespace));
    out.insert("name".into(), string(&j.name));
    for k in [
        "function",
        "runtime",
        "entrypoint",
        "memory_mb",
        "run_id",
        "timeout_sec",
        "max_attempts",
    ] {
        out.insert(k.into(), field(k));
    }
    env_state(j.spec.get("env"), &mut out);
    out.insert(
        "event".into(),
        string(
            j.spec
                .get("event")
                .map(Json::to_string)
                .unwrap_or_else(|| "{}".into()),
        ),
    );
    out.insert("code_sha256".into(), opt_string(j.code_sha256.clone()));
    out.insert("phase".into(), string(j.status.phase.to_string()));
    out.insert(
        "result".into(),
        opt_string(j.status.result.as_ref().map(Json::to_string)),
    );
    out.insert("message".into(), string(&j.status.message));
    out
}

pub struct JobResource {
    def: Def,
}

impl Default for JobResource {
    fn default() -> Self {
        JobResource { def: job_def() }
    }
}

impl JobResource {
    /// Uploads new code when the plan has it, then waits for the run when asked to.
    async fn converge(
        &self,
        ctx: &Ctx,
        ns: &str,
        name: &str,
        prior: Option<&Obj>,
        planned: &Obj,
    ) -> anyhow::Result<Job> {
        if let Some(bytes) = changed_code(prior, planned)? {
            ctx.client
                .upload_job_code(ns, name, bytes)
                .await
                .with_context(|| format!("cannot upload the code of job {ns}/{name}"))?;
        }
        let run_id = num_of(planned, "run_id").unwrap_or(1).max(0) as u64;
        let timeout =
            Duration::from_secs(num_of(planned, "wait_timeout_sec").unwrap_or(600).max(1) as u64);
        if bool_of(planned, "wait") == Some(true) && run_id > 0 {
            let job = ctx
                .client
                .wait_job(ns, name, run_id, Some(timeout), |_| {})
                .await
                .with_context(|| format!("job {ns}/{name} run {run_id} did not finish"))?;
            if job.status.phase == JobPhase::Failed {
                return Err(anyhow::anyhow!("{}", job.status.message.trim_end()))
                    .with_context(|| format!("job {ns}/{name} run {run_id} failed"));
            }
            return Ok(job);
        }
        ctx.client
            .get_job(ns, name, None)
            .await
            .with_context(|| format!("cannot read job {ns}/{name}"))
    }
}

#[async_trait]
impl SlessResource for JobResource {
    fn def(&self) -> &Def {
        &self.def
    }

    fn validate(&self, config: &Obj) -> Vec<(&'static str, String)> {
        let function = !matches!(get(config, "function"), ValueAny::Null);
        let runtime = !matches!(get(config, "runtime"), ValueAny::Null);
        let mut errors = Vec::new();
        if function == runtime {
            errors.push(("function", "set function (run a function) or runtime with source_dir/source_zip (a self-contained job), not both".to_string()));
        }
        if function
            && (!matches!(get(config, "source_dir"), ValueAny::Null)
                || !matches!(get(config, "source_zip"), ValueAny::Null))
        {
            errors.push((
                "source_dir",
                "a job that runs a function takes no code of its own".to_string(),
            ));
        }
        errors
    }

    fn plan(&self, prior: Option<&Obj>, config: &Obj, planned: &mut Obj) -> anyhow::Result<()> {
        if matches!(get(config, "runtime"), ValueAny::Null) {
            planned.insert("code_sha256".into(), ValueAny::Null);
            planned.insert("entrypoint".into(), ValueAny::Null);
        } else {
            plan_code(prior, config, planned, "sless_job")?;
            if matches!(get(config, "entrypoint"), ValueAny::Null) {
                planned.insert("entrypoint".into(), string("handler.handle"));
            }
        }
        Ok(())
    }

    async fn read(&self, ctx: &Ctx, st: &Obj) -> anyhow::Result<Option<Obj>> {
        let (ns, name) = ns_name(st)?;
        Ok(found(
            ctx.client.get_job(ns, name, None).await,
            format!("cannot read job {ns}/{name}"),
        )?
        .map(|j| job_state(&j)))
    }

    async fn create(&self, ctx: &Ctx, planned: &Obj) -> anyhow::Result<Obj> {
        let (ns, name) = ns_name(planned)?;
        let mut body = spec_json(planned)?;
        body.retain(|_, v| !v.is_null());
        body.insert("name".into(), json!(name));
        ctx.client
            .create_job(ns, &Json::Object(body))
            .await
            .with_context(|| format!("cannot create job {ns}/{name}"))?;
        match self.converge(ctx, ns, name, None, planned).await {
            Ok(j) => Ok(job_state(&j)),
            Err(err) => {
                let _ = ctx.client.delete_job(ns, name).await;
                Err(err)
            }
        }
    }

    async fn update(&self, ctx: &Ctx, prior: &Obj, planned: &Obj) -> anyhow::Result<Obj> {
        let (ns, name) = ns_name(planned)?;
        if schema::spec_changed(&self.def, prior, planned) {
            let mut patch = spec_json(planned)?;
            // A function job has no env; a self-contained one removes keys with nulls.
            if let (Ok(old), Some(Json::Object(new))) = (env_json(prior), patch.get_mut("env")) {
                for k in old.keys() {
                    new.entry(k.clone()).or_insert(Json::Null);
                }
            }
            for k in ["function", "runtime"] {
                patch.remove(k);
            }
            ctx.client
                .patch_job(ns, name, &Json::Object(patch))
                .await
                .with_context(|| format!("cannot update job {ns}/{name}"))?;
        }
        let j = self.converge(ctx, ns, name, Some(prior), planned).await?;
        Ok(job_state(&j))
    }

    async fn delete(&self, ctx: &Ctx, st: &Obj) -> anyhow::Result<()> {
        let (ns, name) = ns_name(st)?;
        deleted(
            ctx.client.delete_job(ns, name).await,
            format!("cannot delete job {}", object_id(st)),
        )
    }
}
