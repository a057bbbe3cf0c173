//! Backups: `GET /v1/backup` (admins) answers a zip of the whole store and the code
//! archives it names, read in one consistent snapshot while the server keeps
//! serving; [`restore`] writes one back into an empty store and blob store
//! (`sless restore`). Secrets stay sealed: the server key is never in a backup.
//!
//! The zip holds `manifest.json` (`format`, `created_at`, `backend`, rows per table,
//! archives), `tables/<table>.jsonl` (one JSON object per row, see
//! [`sless_store::backup`]) and `blobs/<sha256>` (each archive, stored as is).

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Seek, Write};
use std::path::Path;

use anyhow::{Context, bail};
use axum::body::Body;
use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use serde_json::{Map, Value, json};
use sless_blob::BlobStore;
use sless_store::SqlStore;
use sless_store::backup::{SCHEMA, table};
use zip::write::SimpleFileOptions;

use crate::{ApiError, AppState, Caller};

/// The version of the layout above; a restore refuses any other.
pub const FORMAT: u64 = 1;

/// What a backup holds (or a restore wrote).
#[derive(Debug, Default, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Summary {
    /// Rows per table.
    pub tables: BTreeMap<String, u64>,
    /// Code archives.
    pub blobs: u64,
}

/// Writes a backup of `store` and the archives in `blobs` its functions and jobs
/// name into `out`.
pub async fn write<W: Write + Seek + Send>(
    store: &SqlStore,
    blobs: &dyn BlobStore,
    out: W,
) -> anyhow::Result<Summary> {
    let mut zip = zip::ZipWriter::new(out);
    let deflated =
        SimpleFileOptions::default().compression_method(zip::CompressionMethod::Deflated);
    let mut summary = Summary::default();
    let mut referenced = std::collections::BTreeSet::new();
    let mut failed: Option<anyhow::Error> = None;
    let mut current: Option<&'static str> = None;
    let exported = store
        .export(&mut |t, row| {
            let step = (|| -> anyhow::Result<()> {
                if current != Some(t.name) {
                    zip.start_file(format!("tables/{}.jsonl", t.name), deflated)?;
                    current = Some(t.name);
                }
                if matches!(t.name, "functions" | "jobs")
                    && let Some(Value::String(sha)) = row.get("code_sha256")
                {
                    referenced.insert(sha.clone());
                }
                serde_json::to_writer(&mut zip, &row)?;
                zip.write_all(b"\n")?;
                *summary.tables.entry(t.name.to_string()).or_default() += 1;
                Ok(())
            })();
            step.map_err(|e| {
                let message = e.to_string();
                failed = Some(e);
                sless_store::StoreError::Config(message)
            })
        })
        .await;
    if let Some(e) = failed {
        return Err(e.context("writing the backup"));
    }
    exported.context("reading the store")?;
    let stored = SimpleFileOptions::default().compression_method(zip::CompressionMethod::Stored);
    for sha in &referenced {
        let bytes = blobs
            .get(sha)
            .await
            .with_context(|| format!("reading code archive {sha}"))?;
        zip.start_file(format!("blobs/{sha}"), stored)?;
        zip.write_all(&bytes)?;
        summary.blobs += 1;
    }
    zip.start_file("manifest.json", deflated)?;
    let manifest = json!({
        "format": FORMAT,
        "created_at": sless_api_types::timestamp(chrono::Utc::now()),
        "backend": store.backend().name(),
        "tables": summary.tables,
        "blobs": summary.blobs,
    });
    serde_json::to_writer_pretty(&mut zip, &manifest)?;
    zip.finish()?;
    Ok(summary)
}

/// Rows handed to the store per insert batch while restoring.
const RESTORE_BATCH: usize = 500;

/// Restores the backup in `file` into `store` and `blobs`, which must be empty of
/// everything but the `default` namespace. All the rows land, or none.
pub async fn restore(
    file: &Path,
    store: &SqlStore,
    blobs: &dyn BlobStore,
) -> anyhow::Result<Summary> {
    let reader =
        std::fs::File::open(file).with_context(|| format!("opening {}", file.display()))?;
    let mut zip = zip::ZipArchive::new(reader)
        .with_context(|| format!("{} is not a sless backup (not a zip)", file.display()))?;
    let manifest: Value = {
        let entry = zip.by_name("manifest.json").with_context(|| {
            format!(
                "{} is not a sless backup (no manifest.json)",
                file.display()
            )
        })?;
        serde_json::from_reader(entry).context("manifest.json is not JSON")?
    };
    match manifest.get("format").and_then(Value::as_u64) {
        Some(FORMAT) => {}
        other => {
            bail!("backup format {other:?} is not supported (this sless reads format {FORMAT})")
        }
    }
    let names: Vec<String> = zip
        .file_names()
        .map(|n| n.map(|n| n.into_owned()))
        .collect::<Result<_, _>>()
        .context("reading the backup's entries")?;
    // Every entry must be one this version writes: nothing is silently skipped.
    for name in &names {
        let known = name == "manifest.json"
            || name
                .strip_prefix("tables/")
                .and_then(|n| n.strip_suffix(".jsonl"))
                .is_some_and(|t| table(t).is_some())
            || name
                .strip_prefix("blobs/")
                .is_some_and(|s| s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit()));
        if !known {
            bail!("unexpected entry {name:?} in the backup");
        }
    }
    let mut summary = Summary::default();
    let mut import = store.begin_import().await?;
    for t in SCHEMA {
        let name = format!("tables/{}.jsonl", t.name);
        if zip.index_for_name(&name).is_none() {
            continue;
        }
        let lines: Vec<String> = BufReader::new(zip.by_name(&name)?)
            .lines()
            .collect::<Result<_, _>>()
            .with_context(|| format!("reading {name}"))?;
        let mut batch: Vec<Map<String, Value>> = Vec::with_capacity(RESTORE_BATCH);
        for (i, line) in lines.iter().enumerate() {
            let row: Map<String, Value> = serde_json::from_str(line)
                .with_context(|| format!("{name}, line {}: not a JSON object", i + 1))?;
            batch.push(row);
            if batch.len() == RESTORE_BATCH {
                import
                    .rows(t, &batch)
                    .await
                    .with_context(|| format!("restoring {name}"))?;
                batch.clear();
            }
        }
        import
            .rows(t, &batch)
            .await
            .with_context(|| format!("restoring {name}"))?;
        summary
            .tables
            .insert(t.name.to_string(), lines.len() as u64);
    }
    for name in names.iter().filter(|n| n.starts_with("blobs/")) {
        let mut bytes = Vec::new();
        zip.by_name(name)?.read_to_end(&mut bytes)?;
        let (sha, _) = blobs
            .put(Bytes::from(bytes))
            .await
            .with_context(|| format!("storing {name}"))?;
        if Some(sha.as_str()) != name.strip_prefix("blobs/") {
            bail!("{name} is corrupt: its bytes hash to {sha}");
        }
        summary.blobs += 1;
    }
    import.commit().await?;
    Ok(summary)
}

/// `GET /v1/backup`: the backup, as `application/zip` (admins only; others get 404).
#[utoipa::path(
    get,
    operation_id = "backup",
    path = "/v1/backup",
    tag = "operations",
    responses(
        (status = 200, description = "A zip of the store's tables and the code archives they name", content_type = "application/zip"),
        crate::openapi::ReadErrors
    )
)]
pub async fn get(State(s): State<AppState>, caller: Caller) -> Result<Response, ApiError> {
    if !caller.is_admin() {
        return Err(ApiError::NotFound("no such endpoint".into()));
    }
    let Some(store) = s.backup.clone() else {
        return Err(ApiError::NotFound("no such endpoint".into()));
    };
    let file = tempfile::tempfile()
        .map_err(|e| ApiError::Internal(anyhow::Error::new(e).context("backup")))?;
    let mut writer = std::io::BufWriter::new(file);
    let summary = write(&store, s.blobs.as_ref(), &mut writer)
        .await
        .map_err(|e| ApiError::Internal(e.context("backup")))?;
    let mut file = writer
        .into_inner()
        .map_err(|e| ApiError::Internal(anyhow::Error::new(e).context("backup")))?;
    file.rewind()
        .map_err(|e| ApiError::Internal(anyhow::Error::new(e).context("backup")))?;
    let rows: u64 = summary.tables.values().sum();
    tracing::info!(rows, blobs = summary.blobs, "backup written");
    let stream = tokio_util::io::ReaderStream::new(tokio::fs::File::from_std(file));
    let name = format!(
        "sless-backup-{}.zip",
        chrono::Utc::now().format("%Y%m%dT%H%M%SZ")
    );
    Ok((
        [
            (header::CONTENT_TYPE, "application/zip".to_string()),
            (
                header::CONTENT_DISPOSITION,
                format!("attachment; filename=\"{name}\""),
            ),
        ],
        Body::from_stream(stream),
    )
        .into_response())
}
