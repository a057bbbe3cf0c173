//! `sless secret set|ls|rm`: named sets of values functions read from their
//! environment and from /run/secrets. Values are never printed.

use std::collections::BTreeMap;
use std::io::Read;
use std::process::ExitCode;

use anyhow::{Context, bail};

use super::{Ctx, table};

/// Manage secrets: values stored encrypted, given to functions that reference them.
#[derive(clap::Subcommand, Debug)]
pub enum SecretCommand {
    /// Create or replace a secret. Without --from-literal or --from-file, reads
    /// KEY=VALUE lines from stdin (nothing is echoed).
    #[command(after_help = "Examples:
  sless secret set db --from-literal user=app --from-file password=./db-password
  printf 'dsn=postgres://...\\n' | sless secret set db
  sless deploy . --env-secret DB_DSN=db/dsn")]
    Set {
        /// Secret name (a DNS label: lowercase letters, digits, '-').
        name: String,
        /// A key and its value; repeat for several.
        #[arg(long = "from-literal", value_name = "KEY=VALUE", value_parser = super::deploy::parse_env)]
        literal: Vec<(String, String)>,
        /// A key and the file holding its value; repeat for several.
        #[arg(long = "from-file", value_name = "KEY=PATH", value_parser = super::deploy::parse_env)]
        file: Vec<(String, String)>,
    },
    /// List the namespace's secrets and their keys.
    Ls {
        /// Print the API's JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Delete secrets (refused while a function or job references them).
    Rm {
        #[arg(required = true)]
        names: Vec<String>,
    },
}

pub async fn run(ctx: &Ctx, command: SecretCommand) -> anyhow::Result<ExitCode> {
    let ns = &ctx.namespace;
    match command {
        SecretCommand::Set {
            name,
            literal,
            file,
        } => {
            let mut data = BTreeMap::new();
            for (key, value) in literal {
                data.insert(key, value);
            }
            for (key, path) in file {
                let value = std::fs::read_to_string(&path)
                    .with_context(|| format!("cannot read {path} for key {key}"))?;
                data.insert(key, value);
            }
            if data.is_empty() {
                let mut input = String::new();
                std::io::stdin()
                    .read_to_string(&mut input)
                    .context("cannot read KEY=VALUE lines from stdin")?;
                data = parse_lines(&input)?;
            }
            let secret = ctx.client.put_secret(ns, &name, &data).await?;
            println!(
                "secret {} set (keys: {})",
                secret.name,
                secret.keys.join(", ")
            );
            Ok(ExitCode::SUCCESS)
        }
        SecretCommand::Ls { json } => {
            let secrets = ctx.client.list_secrets(ns).await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&secrets)?);
            } else {
                let rows: Vec<Vec<String>> = secrets
                    .iter()
                    .map(|s| {
                        vec![
                            s.name.clone(),
                            s.keys.join(","),
                            table::time(Some(&s.updated_at)),
                        ]
                    })
                    .collect();
                print!("{}", table::render(&["NAME", "KEYS", "UPDATED"], &rows));
            }
            Ok(ExitCode::SUCCESS)
        }
        SecretCommand::Rm { names } => {
            for name in names {
                ctx.client.delete_secret(ns, &name).await?;
                println!("secret {name} deleted");
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// `KEY=VALUE` lines; blank lines and lines starting with `#` are skipped. Errors
/// name the line, never its value.
fn parse_lines(input: &str) -> anyhow::Result<BTreeMap<String, String>> {
    let mut data = BTreeMap::new();
    for (n, line) in input.lines().enumerate() {
        let line = line.trim_end_matches('\r');
        if line.trim().is_empty() || line.trim_start().starts_with('#') {
            continue;
        }
        let Some((key, value)) = line.split_once('=') else {
            bail!("stdin line {}: expected KEY=VALUE", n + 1);
        };
        data.insert(key.trim().to_string(), value.to_string());
    }
    if data.is_empty() {
        bail!("no KEY=VALUE given (use --from-literal, --from-file or KEY=VALUE lines on stdin)");
    }
    Ok(data)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stdin_lines_are_key_value_pairs() {
        let data = parse_lines("# comment\nA=1\n\nB=x=y\r\n").unwrap();
        assert_eq!(data["A"], "1");
        assert_eq!(data["B"], "x=y");
        let err = parse_lines("hunter2\n").unwrap_err().to_string();
        assert_eq!(err, "stdin line 1: expected KEY=VALUE");
        assert!(parse_lines("").is_err());
    }
}
