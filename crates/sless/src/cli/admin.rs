//! Tenancy subcommands: `ns create|ls|rm|restore`, `token create|ls|rm|rotate-admin`, `whoami`.

use std::process::ExitCode;

use anyhow::Context;
use serde_json::Value;

use super::{Ctx, table};

/// Manage namespaces (admin tokens can create and delete; others list their own).
#[derive(clap::Subcommand, Debug)]
pub enum NsCommand {
    /// Create a namespace; succeeds if it already exists.
    #[command(after_help = "Example:\n  sless ns create team-a")]
    Create {
        /// Namespace name (a DNS label).
        name: String,
    },
    /// List the namespaces the token can see.
    Ls {
        /// Print JSON instead of a list.
        #[arg(long)]
        json: bool,
    },
    /// Delete a namespace; it must be empty unless --force, which moves it with
    /// everything in it to the server's trash (see `sless ns restore`).
    #[command(
        after_help = "Examples:\n  sless ns rm team-a\n  sless ns rm team-a --force   # with its functions, devices, secrets...: to the trash"
    )]
    Rm {
        /// Namespace to delete.
        name: String,
        /// Delete everything in it too (kept in the trash for the server's
        /// --trash-retention-hours, 72 by default).
        #[arg(long)]
        force: bool,
    },
    /// Bring back a namespace deleted with --force, whole (needs an admin token):
    /// functions and their code, triggers, jobs, secrets, devices and their
    /// credentials, telemetry, calls, dead letters, records, tokens and quotas.
    #[command(after_help = "Example:\n  sless ns restore team-a")]
    Restore {
        /// Namespace to restore (the one deleted last under this name).
        name: String,
    },
}

/// Runs `sless ns ...`.
pub async fn ns(ctx: &Ctx, command: NsCommand) -> anyhow::Result<ExitCode> {
    match command {
        NsCommand::Create { name } => {
            let created = ctx
                .client
                .ensure_namespace(&name)
                .await
                .with_context(|| format!("cannot create namespace {name}"))?;
            println!(
                "{}",
                if created {
                    format!("created namespace {name}")
                } else {
                    format!("namespace {name} exists")
                }
            );
        }
        NsCommand::Ls { json } => {
            let namespaces = ctx
                .client
                .list_namespaces()
                .await
                .context("cannot list namespaces")?;
            if json {
                println!("{}", serde_json::to_string_pretty(&namespaces)?);
            } else {
                let rows: Vec<Vec<String>> = namespaces
                    .into_iter()
                    .map(|n| vec![n.name, n.created_at.unwrap_or_default()])
                    .collect();
                print!("{}", table::render(&["NAME", "CREATED"], &rows));
            }
        }
        NsCommand::Rm { name, force } => {
            ctx.client
                .delete_namespace(&name, force)
                .await
                .with_context(|| format!("cannot delete namespace {name}"))?;
            if force {
                println!(
                    "moved namespace {name} and everything in it to the trash; \
                     `sless ns restore {name}` brings it back (until the server's \
                     --trash-retention-hours, 72 by default, have passed)"
                );
            } else {
                println!("deleted namespace {name}");
            }
        }
        NsCommand::Restore { name } => {
            let restored = ctx
                .client
                .restore_namespace(&name)
                .await
                .with_context(|| format!("cannot restore namespace {name}"))?;
            println!(
                "restored namespace {} ({} functions)",
                restored.name, restored.usage.functions
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Manage API tokens.
#[derive(clap::Subcommand, Debug)]
pub enum TokenCommand {
    /// Create a token that may act only in namespace NS (needs an admin token). It is
    /// printed once; the server keeps only its hash.
    #[command(
        after_help = "Examples:\n  SLESS_TOKEN=$(sless token create --namespace team-a) sless -n team-a ls\n  sless token create team-a"
    )]
    Create {
        /// Namespace the token is for [default: the global --namespace].
        ns: Option<String>,
    },
    /// List tokens by id, creation and last use (never their values): all of them
    /// for an admin token, the own namespace's for any other.
    #[command(after_help = "Examples:\n  sless token ls\n  sless token ls team-a")]
    Ls {
        /// Only this namespace's tokens.
        ns: Option<String>,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Revoke a token by its id (from `sless token ls`); it is refused from the next request on.
    #[command(after_help = "Example:\n  sless token rm 0123456789ab")]
    Rm {
        /// The token's id.
        id: String,
    },
    /// Replace the admin token with a new one (needs the admin token), printed once.
    /// The old one is refused at once; the server keeps the new one in
    /// `<data dir>/admin-token`. Refused when the server's admin token is set by
    /// SLESS_ADMIN_TOKEN.
    #[command(
        name = "rotate-admin",
        after_help = "Example:\n  sless token rotate-admin"
    )]
    RotateAdmin,
}

/// Runs `sless token ...`.
pub async fn token(ctx: &Ctx, command: TokenCommand) -> anyhow::Result<ExitCode> {
    match command {
        TokenCommand::Create { ns } => {
            let ns = ns.unwrap_or_else(|| ctx.namespace.clone());
            let token = ctx
                .client
                .create_token(&ns)
                .await
                .with_context(|| format!("cannot create a token for {ns}"))?;
            println!("{token}");
        }
        TokenCommand::Ls { ns, json } => {
            let tokens = ctx
                .client
                .list_tokens(ns.as_deref())
                .await
                .context("cannot list tokens")?;
            if json {
                println!("{}", serde_json::to_string_pretty(&tokens)?);
            } else {
                let rows: Vec<Vec<String>> = tokens
                    .into_iter()
                    .map(|t| {
                        vec![
                            t.id,
                            t.namespace,
                            t.created_at,
                            t.last_used_at.unwrap_or_else(|| "never".into()),
                        ]
                    })
                    .collect();
                print!(
                    "{}",
                    table::render(&["ID", "NAMESPACE", "CREATED", "LAST USED"], &rows)
                );
            }
        }
        TokenCommand::Rm { id } => {
            ctx.client
                .delete_token(&id)
                .await
                .with_context(|| format!("cannot revoke token {id}"))?;
            println!("revoked token {id}");
        }
        TokenCommand::RotateAdmin => {
            let token = ctx
                .client
                .rotate_admin_token()
                .await
                .context("cannot rotate the admin token")?;
            println!("{token}");
            if let super::TokenSource::File(path, _) = &ctx.token {
                eprintln!(
                    "the old admin token no longer works; the server has written the new one to its \
                     data directory ({} if it is this one)",
                    path.display()
                );
            } else {
                eprintln!("the old admin token no longer works: use the new one from now on");
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Runs `sless whoami`.
pub async fn whoami(ctx: &Ctx) -> anyhow::Result<ExitCode> {
    let who = ctx
        .client
        .whoami()
        .await
        .context("cannot ask the server who we are")?;
    print!("{}", describe_whoami(&who, ctx.client.base_url()));
    Ok(ExitCode::SUCCESS)
}

fn describe_whoami(who: &Value, server: &str) -> String {
    let admin = who["admin"].as_bool().unwrap_or(false);
    let namespaces: Vec<&str> = who["namespaces"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    let namespaces = if namespaces.is_empty() {
        "(none)".to_string()
    } else {
        namespaces.join(", ")
    };
    format!(
        "server:      {server}\nadmin:       {}\nnamespaces:  {namespaces}\n",
        if admin { "yes" } else { "no" }
    )
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn whoami_reads_well() {
        let text = describe_whoami(
            &json!({"admin": true, "namespaces": ["default", "team-a"]}),
            "http://s",
        );
        assert_eq!(
            text,
            "server:      http://s\nadmin:       yes\nnamespaces:  default, team-a\n"
        );
        let text = describe_whoami(&json!({}), "http://s");
        assert!(
            text.contains("admin:       no\nnamespaces:  (none)"),
            "{text}"
        );
    }
}
