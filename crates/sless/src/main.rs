//! The `sless` binary: `sless serve` runs the platform; every other subcommand is a client
//! of its REST API.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

use sless::cli::{
    Ctx, GlobalArgs, admin, backup, calls, deploy, devices, functions, invocations, jobs, secrets,
    triggers,
};
use sless::serve;

/// sless — serverless functions on one machine.
///
/// Run `sless serve`, then deploy a folder with a handler.py (def handle(event)) or a
/// handler.js (exports.handle = async (event) => ...) and call it over HTTP.
#[derive(Parser, Debug)]
#[command(name = "sless", version, propagate_version = true)]
#[command(after_help = "Quick start:
  sless serve &                       # admin token goes to ~/.local/share/sless/admin-token
  mkdir hello && printf 'def handle(event):\\n    return {\"hi\": event}\\n' > hello/handler.py
  sless deploy ./hello                # prints the function URL when it is ready
  sless invoke hello --data '{\"x\": 1}'
  curl http://127.0.0.1:8080/fn/default/hello
  sless ls && sless logs hello --tail 20
  sless trigger create nightly --function hello --cron '0 3 * * *'
  sless job run once --function hello --event '{\"x\": 2}' --wait
  sless invocations --function hello --since 10m
  sless invoke hello --async --data '{\"x\": 3}' # prints the call id
  sless calls get <call-id> --wait
  sless dead-letters ls")]
struct Cli {
    #[command(flatten)]
    global: GlobalArgs,

    #[command(subcommand)]
    command: Command,
}

// Parsed once per process: the size of `serve`'s many flags costs nothing worth a box.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand, Debug)]
enum Command {
    /// Run the sless server (API, gateway, controller) in the foreground.
    Serve(serve::ServeArgs),
    /// Deploy a folder as a function and wait until it is ready.
    Deploy(deploy::DeployArgs),
    /// Call a function with a JSON event and print its answer.
    Invoke(functions::InvokeArgs),
    /// List functions with their phase, revision and URL.
    Ls(functions::LsArgs),
    /// Show one function's spec and status.
    Status(functions::StatusArgs),
    /// Print (or follow) a function's logs.
    Logs(functions::LogsArgs),
    /// Delete functions.
    Rm(functions::RmArgs),
    /// Create, list, enable, disable and delete triggers (HTTP routes, cron schedules).
    #[command(subcommand, alias = "triggers")]
    Trigger(triggers::TriggerCommand),
    /// Run one-shot jobs, list them and see their results.
    #[command(subcommand, alias = "jobs")]
    Job(jobs::JobCommand),
    /// Set, list and delete secrets (values functions read from env and /run/secrets).
    #[command(subcommand, alias = "secrets")]
    Secret(secrets::SecretCommand),
    /// List recent invocations, newest first.
    Invocations(invocations::InvocationsArgs),
    /// See async calls and their results (queue one with `sless invoke F --async`).
    #[command(subcommand, alias = "call")]
    Calls(calls::CallsCommand),
    /// List, redrive and delete dead letters (what exhausted its delivery policy).
    #[command(subcommand, name = "dead-letters", alias = "dead-letter")]
    DeadLetters(calls::DeadLettersCommand),
    /// Create, list, disable and delete devices (MQTT clients with credentials of their own)
    /// and send them commands; needs `sless serve --mqtt-listen`.
    #[command(subcommand, alias = "devices")]
    Device(devices::DeviceCommand),
    /// Print (or follow) the telemetry devices sent, oldest first.
    Telemetry(devices::TelemetryArgs),
    /// Create, list, delete and restore namespaces.
    #[command(subcommand, alias = "namespace")]
    Ns(admin::NsCommand),
    /// Create namespace tokens.
    #[command(subcommand)]
    Token(admin::TokenCommand),
    /// Show what the current token may do.
    Whoami,
    /// Write a backup of the server (metadata, records and code) to a file.
    Backup(backup::BackupArgs),
    /// Rebuild a server's data from a backup, before starting it (offline).
    Restore(backup::RestoreArgs),
}

#[tokio::main]
async fn main() -> ExitCode {
    // `sless serve --config FILE` adds the file's settings beneath flags and env.
    let cli = match sless::config::parse::<Cli>() {
        Ok(cli) => cli,
        Err(err) => return report(Err(err), None),
    };
    let command = match cli.command {
        Command::Serve(args) => {
            return report(serve::main(args).await.map(|()| ExitCode::SUCCESS), None);
        }
        Command::Restore(args) => return report(backup::restore(args).await, None),
        other => other,
    };
    let ctx = match Ctx::new(&cli.global) {
        Ok(ctx) => ctx,
        Err(err) => return report(Err(err), None),
    };
    let result = run(&ctx, command).await;
    report(result, Some(&ctx))
}

/// Runs one client subcommand.
async fn run(ctx: &Ctx, command: Command) -> anyhow::Result<ExitCode> {
    match command {
        Command::Serve(_) | Command::Restore(_) => {
            anyhow::bail!("serve and restore are not client commands")
        }
        Command::Backup(args) => backup::backup(ctx, args).await,
        Command::Deploy(args) => deploy::run(ctx, args).await,
        Command::Invoke(args) => functions::invoke(ctx, args).await,
        Command::Ls(args) => functions::ls(ctx, args).await,
        Command::Status(args) => functions::status(ctx, args).await,
        Command::Logs(args) => functions::logs(ctx, args).await,
        Command::Rm(args) => functions::rm(ctx, args).await,
        Command::Trigger(command) => triggers::run(ctx, command).await,
        Command::Job(command) => jobs::run(ctx, command).await,
        Command::Secret(command) => secrets::run(ctx, command).await,
        Command::Invocations(args) => invocations::run(ctx, args).await,
        Command::Calls(command) => calls::calls(ctx, command).await,
        Command::DeadLetters(command) => calls::dead_letters(ctx, command).await,
        Command::Device(command) => devices::run(ctx, command).await,
        Command::Telemetry(args) => devices::telemetry(ctx, args).await,
        Command::Ns(command) => admin::ns(ctx, command).await,
        Command::Token(command) => admin::token(ctx, command).await,
        Command::Whoami => admin::whoami(ctx).await,
    }
}

/// Prints an error as `error: ...` (with its causes) plus a hint when there is one.
fn report(result: anyhow::Result<ExitCode>, ctx: Option<&Ctx>) -> ExitCode {
    match result {
        Ok(code) => code,
        Err(err) => {
            eprintln!("error: {err:#}");
            if let Some(hint) = ctx.and_then(|ctx| ctx.hint(&err)) {
                eprintln!("hint: {hint}");
            }
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;

    #[test]
    fn cli_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn global_flags_work_after_the_subcommand() {
        let cli = Cli::try_parse_from([
            "sless",
            "ls",
            "-n",
            "team-a",
            "--server",
            "http://h:1",
            "--token",
            "t",
        ])
        .expect("parses");
        assert_eq!(cli.global.namespace, "team-a");
        assert_eq!(cli.global.server, "http://h:1");
        assert_eq!(cli.global.token.as_deref(), Some("t"));
    }

    #[test]
    fn subcommands_parse() {
        let cli = Cli::try_parse_from(["sless", "ns", "rm", "team-a", "--force"]).expect("parses");
        assert!(matches!(
            cli.command,
            Command::Ns(admin::NsCommand::Rm { force: true, .. })
        ));
        let cli = Cli::try_parse_from(["sless", "namespace", "restore", "team-a"]).expect("parses");
        assert!(matches!(
            cli.command,
            Command::Ns(admin::NsCommand::Restore { name }) if name == "team-a"
        ));
        let cli =
            Cli::try_parse_from(["sless", "logs", "hello", "-f", "--tail", "5"]).expect("parses");
        assert!(matches!(
            cli.command,
            Command::Logs(functions::LogsArgs {
                follow: true,
                tail: Some(5),
                ..
            })
        ));
        assert!(
            Cli::try_parse_from(["sless", "rm"]).is_err(),
            "rm needs a name"
        );
    }

    #[test]
    fn token_subcommands_parse() {
        let cli = Cli::try_parse_from(["sless", "token", "create", "--namespace", "team-a"])
            .expect("parses");
        assert_eq!(cli.global.namespace, "team-a");
        assert!(matches!(
            cli.command,
            Command::Token(admin::TokenCommand::Create { ns: None })
        ));
        let cli = Cli::try_parse_from(["sless", "token", "rm", "0123456789ab"]).expect("parses");
        assert!(matches!(
            cli.command,
            Command::Token(admin::TokenCommand::Rm { ref id }) if id == "0123456789ab"
        ));
        let cli = Cli::try_parse_from(["sless", "token", "rotate-admin"]).expect("parses");
        assert!(matches!(
            cli.command,
            Command::Token(admin::TokenCommand::RotateAdmin)
        ));
        let cli = Cli::try_parse_from(["sless", "token", "ls", "--json"]).expect("parses");
        assert!(matches!(
            cli.command,
            Command::Token(admin::TokenCommand::Ls {
                ns: None,
                json: true
            })
        ));
    }

    #[test]
    fn trigger_job_and_invocation_commands_are_wired() {
        let cli = Cli::try_parse_from(["sless", "trigger", "disable", "nightly", "-n", "team-a"])
            .expect("parses");
        assert_eq!(cli.global.namespace, "team-a");
        assert!(matches!(
            cli.command,
            Command::Trigger(triggers::TriggerCommand::Disable { .. })
        ));
        let cli = Cli::try_parse_from(["sless", "jobs", "ls"]).expect("the plural works too");
        assert!(matches!(
            cli.command,
            Command::Job(jobs::JobCommand::Ls { json: false })
        ));
        let cli = Cli::try_parse_from(["sless", "job", "run", "once", "-f", "hello", "--wait"])
            .expect("parses");
        assert!(matches!(
            cli.command,
            Command::Job(jobs::JobCommand::Run(jobs::RunArgs { wait: true, .. }))
        ));
        let cli = Cli::try_parse_from(["sless", "invocations", "--status", "500", "--json"])
            .expect("parses");
        assert!(matches!(
            cli.command,
            Command::Invocations(invocations::InvocationsArgs {
                status: Some(500),
                json: true,
                ..
            })
        ));
    }

    #[test]
    fn device_and_telemetry_commands_are_wired() {
        let cli = Cli::try_parse_from(["sless", "device", "disable", "t77", "-n", "team-a"])
            .expect("parses");
        assert_eq!(cli.global.namespace, "team-a");
        assert!(matches!(
            cli.command,
            Command::Device(devices::DeviceCommand::Disable { .. })
        ));
        let cli = Cli::try_parse_from(["sless", "devices", "ls"]).expect("the plural works too");
        assert!(matches!(
            cli.command,
            Command::Device(devices::DeviceCommand::Ls { json: false })
        ));
        let cli = Cli::try_parse_from(["sless", "telemetry", "t77", "--since", "10m", "-f"])
            .expect("parses");
        assert!(matches!(
            cli.command,
            Command::Telemetry(devices::TelemetryArgs { follow: true, .. })
        ));
    }
}
