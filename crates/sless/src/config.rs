//! `sless serve --config FILE`: the server's flags from a TOML file, and
//! `--print-config`, the effective configuration with secrets redacted.
//!
//! The file's keys are the `serve` flags' long names, kebab-case as on the command
//! line (`max-body-mb = 8`, `blob-url = "s3://bucket/code"`), with TOML types:
//! integers for numbers, `true`/`false` for switches, strings for the rest.
//! Precedence: defaults < file < environment (`SLESS_*`, `AWS_*`) < flags. The file
//! is applied through clap itself: its settings become flags (checked by each
//! flag's own value parser), except those whose flag was given on the command
//! line or in the environment. An unknown key or a wrong type stops the start with a
//! message naming the key and the file.

use std::ffi::OsString;
use std::path::Path;

use anyhow::{Context, Result, bail};
use clap::parser::ValueSource;
use clap::{ArgAction, CommandFactory};

use crate::serve::ServeArgs;

/// The subcommand whose flags a config file sets.
const SERVE: &str = "serve";

/// Flags that make no sense in the file.
const NOT_IN_FILE: &[&str] = &["config", "print-config", "help", "version"];

/// Parses the process's command line into `C` as clap would, with `sless serve
/// --config FILE` applied; exits with clap's message (and code) on a usage error.
pub fn parse<C: clap::Parser>() -> Result<C> {
    parse_from(std::env::args_os().collect())
}

/// [`parse`] for a given command line (its first item is the program).
pub fn parse_from<C: clap::Parser>(argv: Vec<OsString>) -> Result<C> {
    let command = C::command();
    let matches = command
        .clone()
        .try_get_matches_from(&argv)
        .unwrap_or_else(|e| e.exit());
    let file = match matches.subcommand() {
        Some((SERVE, serve)) => serve.get_one::<std::path::PathBuf>("config").cloned(),
        _ => None,
    };
    let matches = match (file, matches.subcommand()) {
        (Some(file), Some((_, serve))) => {
            let serve_command = command
                .find_subcommand(SERVE)
                .context("no serve subcommand")?;
            let extra = file_flags(serve_command, serve, &file)?;
            let mut argv = argv;
            argv.extend(extra);
            // The first parse succeeded, so what fails now is a value from the file.
            command.try_get_matches_from(&argv).map_err(|e| {
                anyhow::anyhow!("config file {}: {}", file.display(), clap_message(&e))
            })?
        }
        _ => matches,
    };
    <C as clap::FromArgMatches>::from_arg_matches(&matches)
        .map_err(|e| anyhow::anyhow!("{}", clap_message(&e)))
}

/// clap's message without its `error: ` prefix and usage lines.
fn clap_message(e: &clap::Error) -> String {
    let text = e.to_string();
    let first = text.lines().next().unwrap_or_default();
    first.strip_prefix("error: ").unwrap_or(first).to_string()
}

/// The `--flag=value` arguments the file at `path` adds: every key, checked, whose
/// flag the command line and the environment left alone.
fn file_flags(
    command: &clap::Command,
    given: &clap::ArgMatches,
    path: &Path,
) -> Result<Vec<OsString>> {
    let shown = path.display();
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read the config file {shown} (--config)"))?;
    let table: toml::Table = text
        .parse()
        .map_err(|e: toml::de::Error| anyhow::anyhow!("config file {shown}: {e}"))?;
    let kinds = default_kinds();
    let mut flags = Vec::new();
    for (key, value) in &table {
        let arg = command
            .get_arguments()
            .find(|a| a.get_long() == Some(key.as_str()))
            .filter(|_| !NOT_IN_FILE.contains(&key.as_str()));
        let Some(arg) = arg else {
            let hint =
                if key.contains('_') && !NOT_IN_FILE.contains(&key.replace('_', "-").as_str()) {
                    format!(
                        " (keys are the flags' long names with dashes: `{}`)",
                        key.replace('_', "-")
                    )
                } else {
                    " (keys are the long names of `sless serve`'s flags)".to_string()
                };
            bail!("config file {shown}: unknown key `{key}`{hint}");
        };
        let text = match (value, kinds.get(key.as_str())) {
            (toml::Value::String(s), None | Some(Kind::String)) => s.clone(),
            (toml::Value::Integer(i), None | Some(Kind::Integer)) => i.to_string(),
            (toml::Value::Boolean(b), None | Some(Kind::Boolean)) => b.to_string(),
            (other, expected) => bail!(
                "config file {shown}: `{key}` must be {}, not {}",
                expected.map_or("a string, an integer or a boolean", |k| k.name()),
                kind_of(other)
            ),
        };
        if matches!(
            given.value_source(arg.get_id().as_str()),
            Some(ValueSource::CommandLine | ValueSource::EnvVariable)
        ) {
            continue;
        }
        if matches!(arg.get_action(), ArgAction::SetTrue) {
            if text == "true" {
                flags.push(OsString::from(format!("--{key}")));
            }
        } else {
            flags.push(OsString::from(format!("--{key}={text}")));
        }
    }
    Ok(flags)
}

/// The TOML type of a setting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    String,
    Integer,
    Boolean,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::String => "a string",
            Kind::Integer => "an integer",
            Kind::Boolean => "a boolean (true or false)",
        }
    }
}

fn kind_of(value: &toml::Value) -> &'static str {
    match value {
        toml::Value::String(_) => "a string",
        toml::Value::Integer(_) => "an integer",
        toml::Value::Float(_) => "a float",
        toml::Value::Boolean(_) => "a boolean",
        toml::Value::Datetime(_) => "a date",
        toml::Value::Array(_) => "an array",
        toml::Value::Table(_) => "a table",
    }
}

/// The TOML type of every setting that has a default (those without one, unset
/// options, take a string or an integer as their flag's parser allows).
fn default_kinds() -> std::collections::HashMap<String, Kind> {
    let Ok(defaults) = ServeArgs::from_flags(Vec::<OsString>::new()) else {
        return Default::default();
    };
    let Ok(toml::Value::Table(table)) = toml::Value::try_from(&defaults) else {
        return Default::default();
    };
    table
        .into_iter()
        .filter_map(|(k, v)| {
            let kind = match v {
                toml::Value::String(_) => Kind::String,
                toml::Value::Integer(_) => Kind::Integer,
                toml::Value::Boolean(_) => Kind::Boolean,
                _ => return None,
            };
            Some((k, kind))
        })
        .collect()
}

/// `sless serve --print-config`: every setting with its effective value, in the
/// config file's format, with a comment line of help each; unset options are
/// commented out; secrets are `***` and passwords in URLs are masked.
pub fn render(args: &ServeArgs) -> Result<String> {
    #[derive(clap::Parser)]
    struct Flags {
        #[command(flatten)]
        args: ServeArgs,
    }
    let mut resolved = args.clone();
    if resolved.data_dir.is_none() {
        resolved.data_dir = Some(crate::cli::default_data_dir());
    }
    let toml::Value::Table(values) =
        toml::Value::try_from(&resolved).context("cannot serialise the configuration")?
    else {
        bail!("the configuration is not a table");
    };
    let mut out = String::from(
        "# sless serve: the effective configuration (defaults < --config file < environment\n\
         # < flags). Usable as a --config file; secrets are shown as \"***\".\n",
    );
    for arg in Flags::command().get_arguments() {
        let Some(key) = arg.get_long() else { continue };
        if NOT_IN_FILE.contains(&key) {
            continue;
        }
        out.push('\n');
        if let Some(help) = arg.get_help() {
            let help = help.to_string();
            out.push_str(&format!("# {}\n", help.lines().next().unwrap_or_default()));
        }
        match values.get(key) {
            Some(value) => {
                let value = redact(key, value);
                out.push_str(&format!("{key} = {value}\n"));
            }
            None => out.push_str(&format!("# {key} = (not set)\n")),
        }
    }
    Ok(out)
}

/// Whether the setting `key` holds a secret itself (not the path to one).
fn is_secret(key: &str) -> bool {
    let secret = ["secret", "password", "token", "access-key", "private-key"]
        .iter()
        .any(|s| key.contains(s));
    secret && !key.ends_with("-file") && !key.ends_with("-dir")
}

fn redact(key: &str, value: &toml::Value) -> toml::Value {
    match value {
        toml::Value::String(_) if is_secret(key) => toml::Value::String("***".into()),
        toml::Value::String(s) => toml::Value::String(redact_url(s)),
        other => other.clone(),
    }
}

/// `scheme://user:***@host/...?password=***`: the password of a URL's user info
/// and the values of query parameters that look secret are masked.
pub fn redact_url(text: &str) -> String {
    let Some((scheme, rest)) = text.split_once("://") else {
        return text.to_string();
    };
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    let authority = match authority.rsplit_once('@') {
        Some((user_info, host)) => match user_info.split_once(':') {
            Some((user, _password)) => format!("{user}:***@{host}"),
            None => authority.to_string(),
        },
        None => authority.to_string(),
    };
    let tail = match tail.split_once('?') {
        Some((path, query)) => {
            let (query, fragment) = match query.split_once('#') {
                Some((q, f)) => (q, Some(f)),
                None => (query, None),
            };
            let query: Vec<String> = query
                .split('&')
                .map(|pair| match pair.split_once('=') {
                    Some((name, _))
                        if is_secret(&name.to_ascii_lowercase().replace('_', "-"))
                            || name.eq_ignore_ascii_case("key") =>
                    {
                        format!("{name}=***")
                    }
                    _ => pair.to_string(),
                })
                .collect();
            let mut tail = format!("{path}?{}", query.join("&"));
            if let Some(f) = fragment {
                tail.push('#');
                tail.push_str(f);
            }
            tail
        }
        None => tail.to_string(),
    };
    format!("{scheme}://{authority}{tail}")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A `sless` with only the serve subcommand, as main.rs has it.
    #[derive(clap::Parser, Debug)]
    struct Cli {
        #[command(subcommand)]
        command: Command,
    }

    #[derive(clap::Subcommand, Debug)]
    enum Command {
        Serve(Box<ServeArgs>),
    }

    fn serve_with(file: &str, flags: &[&str]) -> Result<ServeArgs> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("sless.toml");
        std::fs::write(&path, file)?;
        let mut argv: Vec<OsString> = vec!["sless".into(), "serve".into(), "--config".into()];
        argv.push(path.into_os_string());
        argv.extend(flags.iter().map(OsString::from));
        let Command::Serve(args) = parse_from::<Cli>(argv)?.command;
        Ok(*args)
    }

    #[test]
    fn file_values_apply_and_flags_override_them() {
        let args = serve_with(
            "max-body-mb = 9\nbuilds = 3\nblob-url = \"s3://code/x\"\n\
             allow-host-network = true\nasync-callback-allow-private = false\n\
             listen = \"127.0.0.1:9999\"\n",
            &["--builds", "5"],
        )
        .unwrap();
        assert_eq!(args.max_body_mb, 9);
        assert_eq!(args.builds, 5, "the flag wins");
        assert_eq!(args.blobs.blob_url.as_deref(), Some("s3://code/x"));
        assert!(args.allow_host_network);
        assert!(!args.async_callback_allow_private);
        assert_eq!(args.listen.port(), 9999);
        // Untouched settings keep their defaults.
        assert_eq!(args.max_archive_mb, 64);
    }

    #[test]
    fn bad_files_name_the_key_and_the_file() {
        for (file, says) in [
            ("max-bdy-mb = 1", "unknown key `max-bdy-mb`"),
            (
                "max_body_mb = 1",
                "flags' long names with dashes: `max-body-mb`",
            ),
            ("config = \"x\"", "unknown key `config`"),
            (
                "max-body-mb = \"6\"",
                "`max-body-mb` must be an integer, not a string",
            ),
            (
                "allow-host-network = 1",
                "`allow-host-network` must be a boolean",
            ),
            ("builds = 1.5", "`builds` must be an integer, not a float"),
            (
                "listen = \"nowhere\"",
                "invalid value 'nowhere' for '--listen",
            ),
            ("max-deps-mb = 0", "invalid value '0' for '--max-deps-mb"),
            ("max-body-mb = [1]", "must be an integer, not an array"),
            ("= 1", "sless.toml"),
        ] {
            let err = serve_with(file, &[]).expect_err(file);
            let message = format!("{err:#}");
            assert!(message.contains(says), "{file}: {message}");
            assert!(message.contains("sless.toml"), "{file}: {message}");
        }
    }

    #[test]
    fn a_missing_file_is_an_error_naming_it() {
        let argv: Vec<OsString> = ["sless", "serve", "--config", "/nonexistent/sless.toml"]
            .map(OsString::from)
            .to_vec();
        let err = parse_from::<Cli>(argv).expect_err("missing");
        assert!(
            format!("{err:#}").contains("/nonexistent/sless.toml"),
            "{err:#}"
        );
    }

    #[test]
    fn printed_configuration_loads_back_and_hides_secrets() {
        let mut args = ServeArgs::from_flags([
            "--blob-url",
            "s3://code/x",
            "--s3-secret-access-key",
            "very-secret",
            "--s3-access-key-id",
            "AKIAEXAMPLE",
            "--jwt-jwks-url",
            "https://u:pw@idp.example/jwks?token=abc&x=1",
            "--max-body-mb",
            "7",
        ])
        .unwrap();
        args.data_dir = Some("/var/lib/sless".into());
        let text = render(&args).unwrap();
        assert!(!text.contains("very-secret"), "{text}");
        assert!(!text.contains("AKIAEXAMPLE"), "{text}");
        assert!(!text.contains(":pw@"), "{text}");
        assert!(text.contains("s3-secret-access-key = \"***\""), "{text}");
        assert!(
            text.contains("jwt-jwks-url = \"https://u:***@idp.example/jwks?token=***&x=1\""),
            "{text}"
        );
        assert!(text.contains("max-body-mb = 7\n"), "{text}");
        assert!(text.contains("data-dir = \"/var/lib/sless\""), "{text}");
        assert!(text.contains("# public-url = (not set)"), "{text}");
        // Every flag is listed.
        for key in ["listen", "gc-grace-sec", "tls-key", "log-format"] {
            assert!(text.contains(&format!("{key} = ")), "{key}: {text}");
        }
        // The printed file is a valid config file (the redacted secret aside).
        let reloaded = serve_with(&text, &[]).unwrap();
        assert_eq!(reloaded.max_body_mb, 7);
        assert_eq!(reloaded.blobs.blob_url.as_deref(), Some("s3://code/x"));
    }

    #[test]
    fn urls_lose_their_passwords() {
        for (url, redacted) in [
            ("postgres://u:pw@h/db", "postgres://u:***@h/db"),
            ("postgres://u@h/db", "postgres://u@h/db"),
            (
                "postgres://h/db?password=x&sslmode=require",
                "postgres://h/db?password=***&sslmode=require",
            ),
            ("amqp://a:b@c:5672/%2f", "amqp://a:***@c:5672/%2f"),
            ("not a url", "not a url"),
            ("s3://bucket/prefix", "s3://bucket/prefix"),
        ] {
            assert_eq!(redact_url(url), redacted);
        }
    }
}
