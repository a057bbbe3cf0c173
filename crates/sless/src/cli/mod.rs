//! The command-line client: global flags, credentials, and the subcommands that talk to a server.

pub mod admin;
pub mod backup;
pub use sless_client::archive;
pub mod calls;
pub mod deploy;
pub mod devices;
pub mod functions;
pub mod invocations;
pub mod jobs;
pub mod secrets;
pub mod table;
pub mod triggers;

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use anyhow::Context as _;
use sless_client::{Client, ClientError, Function};

/// Name of the file in the data directory where the server keeps the generated admin token.
pub const ADMIN_TOKEN_FILE: &str = "admin-token";

/// Flags every client subcommand shares. Each has an environment twin, so a shell can set
/// them once (`export SLESS_SERVER=...`).
#[derive(clap::Args, Debug, Clone)]
pub struct GlobalArgs {
    /// Base URL of the sless server.
    #[arg(
        long,
        global = true,
        env = "SLESS_SERVER",
        help_heading = "Global options",
        default_value = "http://127.0.0.1:8080"
    )]
    pub server: String,

    /// Bearer token for the API. Without it, the admin token the server wrote to
    /// `<data dir>/admin-token` is used when this user can read it.
    #[arg(
        long,
        global = true,
        env = "SLESS_TOKEN",
        hide_env_values = true,
        help_heading = "Global options"
    )]
    pub token: Option<String>,

    /// Namespace to work in.
    #[arg(
        short = 'n',
        long,
        global = true,
        env = "SLESS_NAMESPACE",
        help_heading = "Global options",
        default_value = "default"
    )]
    pub namespace: String,

    /// PEM file of the CA certificate(s) to trust for an https:// server, instead of the
    /// system's trust store (for a server with a private CA).
    #[arg(
        long,
        global = true,
        env = "SLESS_CA_CERT",
        value_name = "PATH",
        help_heading = "Global options"
    )]
    pub ca_cert: Option<PathBuf>,
}

/// The per-user data directory: `$SLESS_DATA_DIR`, else `$XDG_DATA_HOME/sless`, else
/// `$HOME/.local/share/sless`. The server keeps its state there by default and the CLI
/// looks there for the admin token, so both must agree on this one function.
pub fn default_data_dir() -> PathBuf {
    data_dir_from(|key| std::env::var_os(key))
}

/// [`default_data_dir`] over an injectable environment, so it can be tested without
/// mutating the process environment.
fn data_dir_from(env: impl Fn(&str) -> Option<OsString>) -> PathBuf {
    let non_empty = |key: &str| env(key).filter(|v| !v.is_empty());
    if let Some(dir) = non_empty("SLESS_DATA_DIR") {
        return PathBuf::from(dir);
    }
    // The XDG spec says relative values are invalid and must be ignored.
    if let Some(xdg) = non_empty("XDG_DATA_HOME")
        .map(PathBuf::from)
        .filter(|p| p.is_absolute())
    {
        return xdg.join("sless");
    }
    if let Some(home) = non_empty("HOME") {
        return PathBuf::from(home).join(".local/share/sless");
    }
    // No HOME at all (a bare service environment): keep state next to where we were started.
    PathBuf::from(".sless")
}

/// Where the token for a request comes from; kept to explain a `401` to the user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenSource {
    /// `--token` or `SLESS_TOKEN`.
    Given(String),
    /// Read from the admin-token file at this path.
    File(PathBuf, String),
    /// No token: nothing given and no file at this path.
    Missing(PathBuf),
}

impl TokenSource {
    /// The token itself, if there is one.
    pub fn token(&self) -> Option<String> {
        match self {
            TokenSource::Given(t) | TokenSource::File(_, t) => Some(t.clone()),
            TokenSource::Missing(_) => None,
        }
    }
}

/// Picks the token: the explicit one (flag or env, already merged by clap) when non-empty,
/// else the admin-token file in `data_dir` when it exists.
pub fn resolve_token(explicit: Option<&str>, data_dir: &Path) -> anyhow::Result<TokenSource> {
    if let Some(token) = explicit.map(str::trim).filter(|t| !t.is_empty()) {
        return Ok(TokenSource::Given(token.to_string()));
    }
    let path = data_dir.join(ADMIN_TOKEN_FILE);
    match std::fs::read_to_string(&path) {
        Ok(text) => match text.trim() {
            "" => Ok(TokenSource::Missing(path)),
            token => Ok(TokenSource::File(path.clone(), token.to_string())),
        },
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(TokenSource::Missing(path)),
        Err(e) => Err(e).with_context(|| {
            format!(
                "cannot read the admin token at {} (pass --token or set SLESS_TOKEN)",
                path.display()
            )
        }),
    }
}

/// What every client subcommand needs: a connected client and the namespace to act in.
pub struct Ctx {
    pub client: Client,
    pub namespace: String,
    pub token: TokenSource,
}

impl Ctx {
    /// Resolves the token and builds the client from the global flags.
    pub fn new(global: &GlobalArgs) -> anyhow::Result<Ctx> {
        let token = resolve_token(global.token.as_deref(), &default_data_dir())?;
        let ca_pem = match &global.ca_cert {
            Some(path) => Some(
                std::fs::read(path)
                    .with_context(|| format!("--ca-cert: cannot read {}", path.display()))?,
            ),
            None => None,
        };
        let client = match Client::with_ca_cert(&global.server, token.token(), ca_pem.as_deref()) {
            Err(e @ ClientError::InvalidCaCert { .. }) => {
                let path = global.ca_cert.as_deref().unwrap_or(Path::new(""));
                return Err(anyhow::Error::new(e).context(format!("--ca-cert {}", path.display())));
            }
            other => other?,
        };
        Ok(Ctx {
            client,
            namespace: global.namespace.clone(),
            token,
        })
    }

    /// The function's public URL, absolute even when the server reports only a path.
    pub fn public_url(&self, function: &Function) -> String {
        let url = &function.status.url;
        if url.is_empty() {
            self.client
                .function_url(&function.namespace, &function.name)
        } else if url.starts_with('/') {
            format!("{}{url}", self.client.base_url())
        } else {
            url.clone()
        }
    }

    /// A hint for errors the user can fix locally: an unreachable server, or credentials the
    /// server refused (saying where the token came from, or that there was none).
    pub fn hint(&self, err: &anyhow::Error) -> Option<String> {
        let client_error = err.chain().find_map(|e| e.downcast_ref::<ClientError>())?;
        if client_error.is_untrusted_certificate() {
            return Some(
                "the server's TLS certificate is not trusted: pass --ca-cert PATH (or set \
                 SLESS_CA_CERT) with the CA that signed it, and check that --server names a host \
                 the certificate is for"
                    .to_string(),
            );
        }
        if client_error.is_connect() {
            return Some(format!(
                "is `sless serve` running at {}? (see --server/SLESS_SERVER)",
                self.client.base_url()
            ));
        }
        if client_error.status() != Some(401) {
            return None;
        }
        Some(match &self.token {
            TokenSource::Given(_) => "the token from --token/SLESS_TOKEN was refused".to_string(),
            TokenSource::File(path, _) => format!(
                "the admin token from {} was refused; does it belong to this server?",
                path.display()
            ),
            TokenSource::Missing(path) => format!(
                "no token was sent: pass --token, set SLESS_TOKEN, or run as the user who owns {}",
                path.display()
            ),
        })
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<OsString> {
        let map: HashMap<String, OsString> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), OsString::from(v)))
            .collect();
        move |key| map.get(key).cloned()
    }

    #[test]
    fn data_dir_precedence() {
        let all = [
            ("SLESS_DATA_DIR", "/srv/sless"),
            ("XDG_DATA_HOME", "/x"),
            ("HOME", "/home/u"),
        ];
        assert_eq!(data_dir_from(env(&all)), PathBuf::from("/srv/sless"));
        assert_eq!(data_dir_from(env(&all[1..])), PathBuf::from("/x/sless"));
        assert_eq!(
            data_dir_from(env(&all[2..])),
            PathBuf::from("/home/u/.local/share/sless")
        );
        // Empty and relative values are ignored, as unset ones.
        let odd = [
            ("SLESS_DATA_DIR", ""),
            ("XDG_DATA_HOME", "rel"),
            ("HOME", "/home/u"),
        ];
        assert_eq!(
            data_dir_from(env(&odd)),
            PathBuf::from("/home/u/.local/share/sless")
        );
        assert_eq!(data_dir_from(env(&[])), PathBuf::from(".sless"));
    }

    #[test]
    fn explicit_token_wins_over_the_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join(ADMIN_TOKEN_FILE), "from-file\n").expect("write");
        assert_eq!(
            resolve_token(Some("given"), dir.path()).expect("ok"),
            TokenSource::Given("given".into())
        );
    }

    #[test]
    fn token_file_is_read_and_trimmed() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join(ADMIN_TOKEN_FILE);
        std::fs::write(&path, "  abc123\n").expect("write");
        // An empty flag (SLESS_TOKEN= in the environment) does not hide the file.
        let source = resolve_token(Some(""), dir.path()).expect("ok");
        assert_eq!(source, TokenSource::File(path, "abc123".into()));
        assert_eq!(source.token().as_deref(), Some("abc123"));
    }

    #[test]
    fn missing_or_empty_token_file_means_no_token() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join(ADMIN_TOKEN_FILE);
        assert_eq!(
            resolve_token(None, dir.path()).expect("ok"),
            TokenSource::Missing(path.clone())
        );
        std::fs::write(&path, "\n").expect("write");
        let source = resolve_token(None, dir.path()).expect("ok");
        assert_eq!(source.token(), None);
    }

    #[test]
    fn unreadable_token_file_is_an_error() {
        let dir = tempfile::tempdir().expect("tempdir");
        // A directory where the file should be cannot be read as text, even by root.
        std::fs::create_dir(dir.path().join(ADMIN_TOKEN_FILE)).expect("mkdir");
        let err = resolve_token(None, dir.path()).expect_err("unreadable");
        assert!(
            format!("{err:#}").contains("cannot read the admin token"),
            "{err:#}"
        );
    }

    #[test]
    fn unauthorized_errors_get_a_hint() {
        let ctx = Ctx {
            client: Client::new("http://127.0.0.1:1", None).expect("client"),
            namespace: "default".into(),
            token: TokenSource::Missing(PathBuf::from("/d/admin-token")),
        };
        let err = anyhow::Error::new(ClientError::from_response(
            401,
            br#"{"error":{"code":"unauthorized","message":"no token"}}"#,
        ));
        let hint = ctx.hint(&err).expect("a hint");
        assert!(
            hint.starts_with("no token was sent: pass --token"),
            "{hint}"
        );
        assert!(hint.ends_with("/d/admin-token"), "{hint}");
        let other = anyhow::Error::new(ClientError::from_response(404, b""));
        assert_eq!(ctx.hint(&other), None);
        assert_eq!(ctx.hint(&anyhow::anyhow!("local trouble")), None);
    }

    #[tokio::test]
    async fn unreachable_servers_get_a_hint() {
        // Bind then drop a listener so the port is known to be closed.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let server = format!("http://{}", listener.local_addr().expect("addr"));
        drop(listener);
        let ctx = Ctx {
            client: Client::new(&server, None).expect("client"),
            namespace: "default".into(),
            token: TokenSource::Given("t".into()),
        };
        let err = ctx.client.whoami().await.expect_err("refused");
        let hint = ctx.hint(&anyhow::Error::new(err).context("doing things"));
        assert_eq!(
            hint.as_deref(),
            Some(
                format!("is `sless serve` running at {server}? (see --server/SLESS_SERVER)")
                    .as_str()
            )
        );
    }
}
