//! Where the blob store lives, as `--blob-url` names it: a local directory
//! (`file:///abs/dir`) or an S3 bucket with an optional key prefix
//! (`s3://bucket/prefix`). Parsed strictly, so a typo stops the server at start
//! instead of writing archives somewhere unexpected.

use std::fmt;
use std::path::PathBuf;

/// A parsed blob store location.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BlobLocation {
    /// A directory on this machine (absolute).
    Local(PathBuf),
    /// An S3 bucket; `prefix` is `""` or slash-separated segments without a
    /// leading or trailing slash.
    S3 { bucket: String, prefix: String },
}

/// Why a blob URL was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid blob URL {url:?}: {reason}")]
pub struct LocationError {
    pub url: String,
    pub reason: String,
}

impl BlobLocation {
    /// Parses `s3://bucket[/prefix]` or `file:///absolute/dir`.
    pub fn parse(url: &str) -> Result<BlobLocation, LocationError> {
        let fail = |reason: &str| LocationError {
            url: url.to_string(),
            reason: reason.to_string(),
        };
        if url.contains(['?', '#']) {
            return Err(fail("query strings and fragments are not allowed"));
        }
        if url.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(fail("whitespace and control characters are not allowed"));
        }
        if let Some(rest) = url.strip_prefix("s3://") {
            let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
            check_bucket(bucket).map_err(|r| fail(&r))?;
            let prefix = prefix.strip_suffix('/').unwrap_or(prefix);
            if !prefix.is_empty() {
                for segment in prefix.split('/') {
                    if segment.is_empty() {
                        return Err(fail("the prefix has an empty segment (`//`)"));
                    }
                    if segment == "." || segment == ".." {
                        return Err(fail("the prefix may not contain `.` or `..` segments"));
                    }
                }
            }
            return Ok(BlobLocation::S3 {
                bucket: bucket.to_string(),
                prefix: prefix.to_string(),
            });
        }
        if let Some(path) = url.strip_prefix("file://") {
            if !path.starts_with('/') {
                return Err(fail(
                    "a file URL needs an absolute path with no host: file:///var/lib/sless/blobs",
                ));
            }
            if path.split('/').any(|s| s == "..") {
                return Err(fail("the path may not contain `..`"));
            }
            return Ok(BlobLocation::Local(PathBuf::from(path)));
        }
        Err(fail(
            "expected s3://bucket/prefix (S3) or file:///absolute/dir (a local directory)",
        ))
    }
}

impl fmt::Display for BlobLocation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BlobLocation::Local(dir) => write!(f, "file://{}", dir.display()),
            BlobLocation::S3 { bucket, prefix } if prefix.is_empty() => write!(f, "s3://{bucket}"),
            BlobLocation::S3 { bucket, prefix } => write!(f, "s3://{bucket}/{prefix}"),
        }
    }
}

/// S3's bucket naming rules: 3 to 63 characters of lowercase letters, digits,
/// dots and hyphens, beginning and ending with a letter or digit, no `..`, and not
/// shaped like an IP address.
fn check_bucket(bucket: &str) -> Result<(), String> {
    if bucket.is_empty() {
        return Err("no bucket name: expected s3://bucket/prefix".into());
    }
    if !(3..=63).contains(&bucket.len()) {
        return Err(format!(
            "bucket name {bucket:?} must be 3 to 63 characters long"
        ));
    }
    if !bucket
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'.' || b == b'-')
    {
        return Err(format!(
            "bucket name {bucket:?} may hold only lowercase letters, digits, `.` and `-`"
        ));
    }
    let alnum = |b: Option<u8>| b.is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
    if !alnum(bucket.bytes().next()) || !alnum(bucket.bytes().last()) {
        return Err(format!(
            "bucket name {bucket:?} must begin and end with a letter or digit"
        ));
    }
    if bucket.contains("..") {
        return Err(format!("bucket name {bucket:?} may not contain `..`"));
    }
    if bucket.parse::<std::net::Ipv4Addr>().is_ok() {
        return Err(format!("bucket name {bucket:?} may not be an IP address"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s3(bucket: &str, prefix: &str) -> BlobLocation {
        BlobLocation::S3 {
            bucket: bucket.into(),
            prefix: prefix.into(),
        }
    }

    #[test]
    fn s3_urls() {
        assert_eq!(BlobLocation::parse("s3://code").unwrap(), s3("code", ""));
        assert_eq!(BlobLocation::parse("s3://code/").unwrap(), s3("code", ""));
        assert_eq!(
            BlobLocation::parse("s3://my-bucket.eu/sless/blobs/").unwrap(),
            s3("my-bucket.eu", "sless/blobs")
        );
        assert_eq!(
            BlobLocation::parse("s3://my-bucket.eu/sless/blobs")
                .unwrap()
                .to_string(),
            "s3://my-bucket.eu/sless/blobs"
        );
        assert_eq!(s3("abc", "").to_string(), "s3://abc");
    }

    #[test]
    fn file_urls() {
        assert_eq!(
            BlobLocation::parse("file:///var/lib/sless/blobs").unwrap(),
            BlobLocation::Local("/var/lib/sless/blobs".into())
        );
        assert_eq!(
            BlobLocation::Local("/x/y".into()).to_string(),
            "file:///x/y"
        );
    }

    #[test]
    fn bad_urls_say_what_is_wrong() {
        for (url, says) in [
            ("", "expected s3://bucket/prefix"),
            ("/var/lib/blobs", "expected s3://bucket/prefix"),
            ("http://bucket/x", "expected s3://bucket/prefix"),
            ("S3://bucket", "expected s3://bucket/prefix"),
            ("s3://", "no bucket name"),
            ("s3:///prefix", "no bucket name"),
            ("s3://ab", "3 to 63 characters"),
            (&format!("s3://{}", "a".repeat(64)), "3 to 63 characters"),
            ("s3://My-Bucket", "lowercase letters"),
            ("s3://bucket_1", "lowercase letters"),
            ("s3://user@bucket", "lowercase letters"),
            ("s3://bucket:9000/x", "lowercase letters"),
            ("s3://-bucket", "begin and end"),
            ("s3://bucket.", "begin and end"),
            ("s3://a..b", "`..`"),
            ("s3://192.168.1.1", "IP address"),
            ("s3://bucket/a//b", "empty segment"),
            ("s3://bucket/a/../b", "`.` or `..`"),
            ("s3://bucket/p?versionId=1", "query strings"),
            ("s3://bucket/p#x", "fragments"),
            ("s3://bucket/a b", "whitespace"),
            ("file://host/dir", "absolute path"),
            ("file://relative", "absolute path"),
            ("file:///a/../etc", "`..`"),
        ] {
            let err = BlobLocation::parse(url).expect_err(url);
            assert!(err.to_string().contains(says), "{url}: {err}");
            assert!(err.to_string().contains(&format!("{url:?}")), "{err}");
        }
    }
}
