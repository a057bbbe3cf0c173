//! `sless backup` (a running server's snapshot into a file) and `sless restore`
//! (a new server's data from one, offline).

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;

use super::Ctx;

/// `sless backup --out FILE`.
#[derive(clap::Args, Debug)]
#[command(
    after_help = "The backup is one zip: every namespace, function, trigger, job, secret \
(still sealed: keep the server's secret key apart, it is not in the backup), device, token, \
queued call, dead letter, invocation record and telemetry row, and the code archives the \
functions and jobs name. The server keeps serving while it is read, from one consistent \
snapshot. Needs the admin token.

Example:
  sless backup --out sless-$(date +%F).zip"
)]
pub struct BackupArgs {
    /// File to write (replaced only once the whole backup arrived).
    #[arg(long, short = 'o')]
    pub out: PathBuf,
}

/// `sless restore FILE --data-dir DIR`.
#[derive(clap::Args, Debug)]
#[command(
    after_help = "Restores into a server that is not running, whose store is new and \
empty: the data directory (and, with --database-url, the database; with --blob-url, the \
bucket prefix) the restored server will be started with. Then start it with the same \
flags and the secret key of the server the backup came from (SLESS_SECRET_KEY or the \
`secret-key` file of its data directory): its functions are built again from their archives.

Example:
  sless restore sless-2026-12-01.zip --data-dir /var/lib/sless
  sless restore backup.zip --data-dir /var/lib/sless --database-url postgres://sless@db/sless"
)]
pub struct RestoreArgs {
    /// The backup (`sless backup --out`).
    pub file: PathBuf,
    /// The new server's data directory.
    #[arg(long, env = "SLESS_DATA_DIR")]
    pub data_dir: PathBuf,
    /// The new server's database (`postgres://...`); default: `<data-dir>/sless.db`.
    #[arg(long, env = "SLESS_DATABASE_URL", value_name = "URL")]
    pub database_url: Option<String>,
    /// The new server's code archives (`s3://bucket/prefix`), as `sless serve` takes them.
    #[command(flatten)]
    pub blobs: crate::serve::BlobFlags,
}

pub async fn backup(ctx: &Ctx, args: BackupArgs) -> anyhow::Result<ExitCode> {
    let dir = match args.out.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let mut part = tempfile::NamedTempFile::new_in(&dir)
        .with_context(|| format!("cannot write in {}", dir.display()))?;
    let mut resp = ctx.client.backup().await?;
    let mut written = 0u64;
    while let Some(chunk) = resp.chunk().await.context("receiving the backup")? {
        part.write_all(&chunk)
            .with_context(|| format!("writing {}", part.path().display()))?;
        written += chunk.len() as u64;
    }
    part.as_file().sync_all()?;
    // A backup cut short would not open: check it is whole before it replaces anything.
    let summary = {
        let mut zip = zip::ZipArchive::new(part.reopen()?)
            .context("the server's answer is not a complete backup")?;
        let manifest: serde_json::Value = serde_json::from_reader(
            zip.by_name("manifest.json")
                .context("the backup has no manifest")?,
        )?;
        manifest
    };
    part.persist(&args.out)
        .with_context(|| format!("writing {}", args.out.display()))?;
    let rows: u64 = summary["tables"]
        .as_object()
        .map(|t| t.values().filter_map(|v| v.as_u64()).sum())
        .unwrap_or(0);
    eprintln!(
        "backup written to {} ({written} bytes: {rows} rows, {} code archives)",
        args.out.display(),
        summary["blobs"]
    );
    Ok(ExitCode::SUCCESS)
}

pub async fn restore(args: RestoreArgs) -> anyhow::Result<ExitCode> {
    crate::serve::create_private_dir(&args.data_dir)?;
    let store = match &args.database_url {
        Some(url) => sless_store::SqlStore::from_url(url)
            .await
            .with_context(|| {
                format!(
                    "cannot open the database {}",
                    crate::config::redact_url(url)
                )
            })?,
        None => sless_store::SqlStore::open(&args.data_dir.join("sless.db"))
            .await
            .with_context(|| format!("cannot open the store in {}", args.data_dir.display()))?,
    };
    let blobs = args.blobs.open(&args.data_dir).await?;
    let summary = sless_api::backup::restore(&args.file, &store, blobs.as_ref())
        .await
        .with_context(|| format!("cannot restore {}", args.file.display()))?;
    let count = |t: &str| summary.tables.get(t).copied().unwrap_or(0);
    eprintln!(
        "restored {} into {}: {} namespaces, {} functions, {} triggers, {} jobs, {} secrets, {} devices, {} code archives",
        args.file.display(),
        args.data_dir.display(),
        count("namespaces"),
        count("functions"),
        count("triggers"),
        count("jobs"),
        count("secrets"),
        count("devices"),
        summary.blobs
    );
    eprintln!(
        "start it with: sless serve --data-dir {}{}{} (and the secret key of the server the backup came from)",
        args.data_dir.display(),
        args.database_url
            .as_deref()
            .map(|u| format!(" --database-url {}", crate::config::redact_url(u)))
            .unwrap_or_default(),
        args.blobs
            .blob_url
            .as_deref()
            .map(|u| format!(" --blob-url {u}"))
            .unwrap_or_default()
    );
    Ok(ExitCode::SUCCESS)
}
