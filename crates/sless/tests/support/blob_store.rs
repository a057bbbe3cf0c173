//! Which blob store the test servers use: the data directory's (the default) or,
//! with `SLESS_TEST_BLOB=s3`, an S3 bucket of each server's own in one moto per
//! test binary. Shared by the end-to-end and the in-process test binaries.

// Each binary uses the half it needs (the spawned server takes the environment,
// the in-process one flags).
#![allow(dead_code)]

use std::path::Path;
use std::sync::OnceLock;

use sha2::Digest;
use sless_brokers::Moto;

/// Where a test server keeps its code archives, when that is S3.
pub struct S3Blobs {
    /// `s3://bucket/code`.
    pub blob_url: String,
    moto: &'static Moto,
}

impl S3Blobs {
    /// The standard AWS variables pointing at the test's moto.
    pub fn env(&self) -> Vec<(&'static str, String)> {
        self.moto.aws_env()
    }

    /// The same as `sless serve` flags.
    pub fn flags(&self) -> Vec<String> {
        vec![
            "--blob-url".into(),
            self.blob_url.clone(),
            "--s3-endpoint".into(),
            self.moto.endpoint(),
            "--s3-region".into(),
            sless_brokers::moto::REGION.into(),
            "--s3-access-key-id".into(),
            sless_brokers::moto::ACCESS_KEY_ID.into(),
            "--s3-secret-access-key".into(),
            sless_brokers::moto::SECRET_ACCESS_KEY.into(),
        ]
    }
}

/// Whether the tests run against S3 (`SLESS_TEST_BLOB=s3`).
pub fn s3_mode() -> bool {
    match std::env::var("SLESS_TEST_BLOB").as_deref() {
        Ok("s3") => true,
        Ok("" | "local") | Err(_) => false,
        Ok(other) => panic!("SLESS_TEST_BLOB={other:?}: expected `s3` or `local`"),
    }
}

/// This test binary's moto, started on first use.
pub fn moto() -> &'static Moto {
    static MOTO: OnceLock<Moto> = OnceLock::new();
    MOTO.get_or_init(|| Moto::start().expect("moto_server starts (see .ci/run)"))
}

/// With `SLESS_TEST_BLOB=s3`, the bucket of the server whose data is in
/// `data_dir` (named after it, so a restarted server finds its archives again),
/// created if needed; `None` otherwise.
pub fn for_server(data_dir: &Path) -> Option<S3Blobs> {
    if !s3_mode() {
        return None;
    }
    let digest = sha2::Sha256::digest(data_dir.as_os_str().as_encoded_bytes());
    let bucket = format!("sless-test-{}", &hex::encode(digest)[..16]);
    let moto = moto();
    moto.create_bucket(&bucket).expect("create the test bucket");
    Some(S3Blobs {
        blob_url: format!("s3://{bucket}/code"),
        moto,
    })
}
