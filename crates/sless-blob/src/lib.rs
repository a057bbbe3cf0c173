//! Code archives stored by sha256, and safe zip handling: validation, extraction
//! and the source listing behind `GET .../source`.
//!
//! Two halves with one purpose — an uploaded archive is untrusted input:
//! - [`store`]: [`BlobStore`] keeps the archive bytes under their sha256
//!   ([`LocalBlobStore`] is the default, a directory on disk).
//! - [`archive`]: [`inspect_zip`] refuses unsafe or oversized archives before
//!   anything touches the disk, [`extract_zip`] unpacks one while enforcing the
//!   limits on the bytes actually written, [`list_source`] returns the files.

#![cfg_attr(test, allow(clippy::unwrap_used))]

pub mod archive;
#[doc(hidden)]
pub mod fuzzing;
mod paths;
pub mod store;

pub use archive::{
    ArchiveError, ArchiveInfo, ArchiveLimits, SourceFile, extract_zip, inspect_zip, list_source,
};
pub use store::{BlobError, BlobInfo, BlobStore, LocalBlobStore, Stored, sha256_hex};
