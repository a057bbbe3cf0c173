//! Code archives stored by sha256, and safe zip handling: validation, extraction
//! and the source listing behind `GET .../source`.
//!
//! Two halves with one purpose — an uploaded archive is untrusted input:
//! - [`store`]: [`BlobStore`] keeps the archive bytes under their sha256
//!   ([`LocalBlobStore`] is the default, a directory on disk; [`S3BlobStore`] an
//!   S3 bucket); [`BlobLocation`] parses `--blob-url`.
//! - [`archive`]: [`inspect_zip`] refuses unsafe or oversized archives before
//!   anything touches the disk, [`extract_zip`] unpacks one while enforcing the
//!   limits on the bytes actually written, [`list_source`] returns the files.

#![cfg_attr(test, allow(clippy::unwrap_used))]

pub mod archive;
#[cfg(test)]
mod conformance;
#[doc(hidden)]
pub mod fuzzing;
pub mod location;
mod paths;
#[cfg(feature = "s3")]
pub mod s3;
pub mod store;

pub use archive::{
    ArchiveError, ArchiveInfo, ArchiveLimits, SourceFile, extract_zip, inspect_zip, list_source,
};
pub use location::{BlobLocation, LocationError};
#[cfg(feature = "s3")]
pub use s3::{S3BlobStore, S3Config};
pub use store::{BlobError, BlobInfo, BlobStore, LocalBlobStore, Stored, sha256_hex};
