//! `sless calls` (async calls and their results) and `sless dead-letters` (messages
//! and calls that exhausted their delivery policy: list, redrive, delete).

use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use sless_client::{Call, DeadLetter};

use super::{Ctx, table};

/// The phases a call goes through.
const PHASES: [&str; 4] = ["Queued", "Running", "Succeeded", "Failed"];

/// See and wait for async calls (queued with `sless invoke F --async`, `/async/...`
/// or `/invoke?async=true`).
#[derive(clap::Subcommand, Debug)]
pub enum CallsCommand {
    /// List calls, newest first.
    #[command(after_help = "Examples:
  sless calls ls
  sless calls ls --function resize --phase Failed")]
    Ls {
        /// Only calls of this function.
        #[arg(short, long)]
        function: Option<String>,
        /// Only calls in this phase.
        #[arg(long, value_parser = PHASES)]
        phase: Option<String>,
        /// At most this many (1 to 1000).
        #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=1000))]
        limit: Option<u32>,
        /// Print the API's JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Show one call: its phase, attempts and (once ended) the function's response.
    #[command(after_help = "Examples:
  sless calls get 3f2a...            # as it stands now
  sless calls get 3f2a... --wait     # once it has ended; exit status 1 when it failed")]
    Get {
        /// The call id `sless invoke --async` printed.
        id: String,
        /// Wait until the call has ended (Succeeded or Failed).
        #[arg(long)]
        wait: bool,
        /// With --wait, give up after this many seconds.
        #[arg(long, value_name = "SECONDS", default_value_t = 600)]
        timeout: u64,
    },
}

/// Messages of queue triggers and async calls that exhausted their delivery policy.
#[derive(clap::Subcommand, Debug)]
pub enum DeadLettersCommand {
    /// List dead letters, newest first.
    #[command(after_help = "Examples:
  sless dead-letters ls
  sless dead-letters ls --trigger orders-in --json")]
    Ls {
        /// Only this trigger's.
        #[arg(short, long)]
        trigger: Option<String>,
        /// Only this function's.
        #[arg(short, long)]
        function: Option<String>,
        /// Print the API's JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Deliver again from attempt 1: one dead letter, or all of a trigger's. A dead
    /// letter goes away when its redrive succeeds and comes back updated otherwise.
    #[command(after_help = "Examples:
  sless dead-letters redrive 3f2a...
  sless dead-letters redrive --trigger orders-in")]
    Redrive {
        /// The dead letter's id.
        #[arg(required_unless_present = "trigger", conflicts_with = "trigger")]
        id: Option<String>,
        /// Redrive every dead letter of this trigger.
        #[arg(short, long)]
        trigger: Option<String>,
    },
    /// Delete dead letters.
    Rm {
        /// Ids of the dead letters.
        #[arg(required = true)]
        ids: Vec<String>,
    },
}

/// Runs `sless calls ...`.
pub async fn calls(ctx: &Ctx, command: CallsCommand) -> anyhow::Result<ExitCode> {
    let ns = &ctx.namespace;
    match command {
        CallsCommand::Ls {
            function,
            phase,
            limit,
            json,
        } => {
            let calls = ctx
                .client
                .list_calls(ns, function.as_deref(), phase.as_deref(), limit)
                .await
                .with_context(|| format!("cannot list calls in {ns}"))?;
            if json {
                println!("{}", serde_json::to_string_pretty(&calls)?);
            } else {
                print!("{}", calls_table(&calls));
            }
            Ok(ExitCode::SUCCESS)
        }
        CallsCommand::Get { id, wait, timeout } => {
            let deadline = std::time::Instant::now() + Duration::from_secs(timeout);
            let mut pause = Duration::from_millis(100);
            let call = loop {
                let call = ctx
                    .client
                    .get_call(ns, &id)
                    .await
                    .with_context(|| format!("cannot read call {id} in {ns}"))?;
                let ended = matches!(call.phase.as_str(), "Succeeded" | "Failed");
                if !wait || ended {
                    break call;
                }
                if std::time::Instant::now() >= deadline {
                    anyhow::bail!(
                        "call {id} has not ended after {timeout} s (phase {})",
                        call.phase
                    );
                }
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(2));
            };
            println!("{}", serde_json::to_string_pretty(&call)?);
            Ok(if wait && call.phase == "Failed" {
                ExitCode::FAILURE
            } else {
                ExitCode::SUCCESS
            })
        }
    }
}

/// Runs `sless dead-letters ...`.
pub async fn dead_letters(ctx: &Ctx, command: DeadLettersCommand) -> anyhow::Result<ExitCode> {
    let ns = &ctx.namespace;
    match command {
        DeadLettersCommand::Ls {
            trigger,
            function,
            json,
        } => {
            let items = ctx
                .client
                .list_dead_letters(ns, trigger.as_deref(), function.as_deref())
                .await
                .with_context(|| format!("cannot list dead letters in {ns}"))?;
            if json {
                println!("{}", serde_json::to_string_pretty(&items)?);
            } else {
                print!("{}", dead_letters_table(&items));
            }
        }
        DeadLettersCommand::Redrive { id, trigger } => match (id, trigger) {
            (_, Some(trigger)) => {
                let done = ctx
                    .client
                    .redrive_trigger_dead_letters(ns, &trigger)
                    .await
                    .with_context(|| format!("cannot redrive the dead letters of {trigger}"))?;
                println!("redriving {} dead letters of {trigger}", done.redriven);
            }
            (Some(id), None) => {
                ctx.client
                    .redrive_dead_letter(ns, &id)
                    .await
                    .with_context(|| format!("cannot redrive dead letter {id}"))?;
                println!("redriving {id}");
            }
            (None, None) => anyhow::bail!("give a dead letter's id or --trigger"),
        },
        DeadLettersCommand::Rm { ids } => {
            for id in ids {
                ctx.client
                    .delete_dead_letter(ns, &id)
                    .await
                    .with_context(|| format!("cannot delete dead letter {id}"))?;
                println!("deleted {id}");
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn calls_table(calls: &[Call]) -> String {
    let rows: Vec<Vec<String>> = calls
        .iter()
        .map(|c| {
            vec![
                c.id.clone(),
                c.function.clone(),
                c.phase.clone(),
                c.attempts.to_string(),
                c.response
                    .as_ref()
                    .map_or(String::new(), |r| r.status.to_string()),
                table::time_ms(Some(&c.queued_at)),
                table::time_ms(c.finished_at.as_deref()),
                table::one_line(c.error.as_deref().unwrap_or(""), 60),
            ]
        })
        .collect();
    table::render(
        &[
            "ID", "FUNCTION", "PHASE", "ATTEMPTS", "STATUS", "QUEUED", "FINISHED", "ERROR",
        ],
        &rows,
    )
}

fn dead_letters_table(items: &[DeadLetter]) -> String {
    let rows: Vec<Vec<String>> = items
        .iter()
        .map(|d| {
            vec![
                d.id.clone(),
                d.source.clone(),
                d.trigger.clone().unwrap_or_default(),
                d.function.clone(),
                d.attempts.to_string(),
                d.last_status.to_string(),
                table::time_ms(Some(&d.failed_at)),
                table::one_line(d.error.as_deref().unwrap_or(""), 60),
            ]
        })
        .collect();
    table::render(
        &[
            "ID", "SOURCE", "TRIGGER", "FUNCTION", "ATTEMPTS", "STATUS", "FAILED", "ERROR",
        ],
        &rows,
    )
}
