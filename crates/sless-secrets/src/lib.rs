//! Secrets: the server's secret key and the sealing of secret values.
//!
//! The key is 32 bytes, from `SLESS_SECRET_KEY` (64 hex characters or base64) or
//! generated once into `<data-dir>/secret.key` (mode 0600). A value is sealed with
//! XChaCha20-Poly1305 under a fresh random 24-byte nonce; the associated data binds
//! it to its namespace, secret and key, so a ciphertext copied to another row (or
//! another key of the same secret) does not open.
//!
//! No IO beyond reading and creating the key file; nothing here logs.

use std::fmt;
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;

use base64::Engine as _;
use chacha20poly1305::aead::{Aead, AeadCore, KeyInit, OsRng, Payload};
use chacha20poly1305::{XChaCha20Poly1305, XNonce};
use zeroize::Zeroizing;

/// Bytes in a key.
pub const KEY_LEN: usize = 32;
/// Bytes in a nonce (prepended to every sealed value).
pub const NONCE_LEN: usize = 24;
/// The key file's name in the data directory.
pub const KEY_FILE: &str = "secret.key";

/// Why no key could be had.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error(
        "SLESS_SECRET_KEY must be 32 bytes written as 64 hex characters or as base64 \
         (got {0} characters that are neither)"
    )]
    BadEnv(usize),
    #[error("{path}: {problem}")]
    BadFile { path: String, problem: String },
    #[error("{path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
}

/// Why a value did not open.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// Wrong key, tampered bytes, or a ciphertext of another namespace, secret or key.
    #[error("a sealed secret value does not open with the server's key")]
    Invalid,
}

/// The server's secret key, and sealing with it. Its `Debug` shows nothing of the key.
#[derive(Clone)]
pub struct Cipher {
    aead: XChaCha20Poly1305,
}

impl fmt::Debug for Cipher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Cipher(..)")
    }
}

/// Where a value belongs: bound into its ciphertext as associated data.
#[derive(Debug, Clone, Copy)]
pub struct Slot<'a> {
    pub namespace: &'a str,
    pub secret: &'a str,
    pub key: &'a str,
}

impl Slot<'_> {
    fn aad(&self) -> Vec<u8> {
        // Length-prefixed, so no two slots share an encoding.
        let mut aad = b"sless-secret-v1".to_vec();
        for part in [self.namespace, self.secret, self.key] {
            aad.extend_from_slice(&(part.len() as u64).to_be_bytes());
            aad.extend_from_slice(part.as_bytes());
        }
        aad
    }
}

impl Cipher {
    pub fn new(key: &[u8; KEY_LEN]) -> Self {
        Cipher {
            aead: XChaCha20Poly1305::new(key.into()),
        }
    }

    /// The key from `env` (the value of `SLESS_SECRET_KEY`) when given, else the one in
    /// `<data_dir>/secret.key`, generated there on first use.
    pub fn load(env: Option<&str>, data_dir: &Path) -> Result<Self, KeyError> {
        let key = match env {
            Some(text) => parse_key(text)?,
            None => key_file(&data_dir.join(KEY_FILE))?,
        };
        Ok(Cipher::new(&key))
    }

    /// `nonce || ciphertext+tag` of `value` in `slot`.
    pub fn seal(&self, slot: Slot<'_>, value: &[u8]) -> Vec<u8> {
        let nonce = XChaCha20Poly1305::generate_nonce(&mut OsRng);
        let aad = slot.aad();
        let sealed = self
            .aead
            .encrypt(
                &nonce,
                Payload {
                    msg: value,
                    aad: &aad,
                },
            )
            // Encryption fails only for messages past 256 GiB; values are bounded far below.
            .unwrap_or_default();
        let mut out = Vec::with_capacity(NONCE_LEN + sealed.len());
        out.extend_from_slice(&nonce);
        out.extend_from_slice(&sealed);
        out
    }

    /// The value `seal` sealed in `slot`.
    pub fn open(&self, slot: Slot<'_>, sealed: &[u8]) -> Result<Zeroizing<Vec<u8>>, OpenError> {
        if sealed.len() < NONCE_LEN {
            return Err(OpenError::Invalid);
        }
        let (nonce, body) = sealed.split_at(NONCE_LEN);
        let nonce: [u8; NONCE_LEN] = nonce.try_into().map_err(|_| OpenError::Invalid)?;
        let aad = slot.aad();
        self.aead
            .decrypt(
                &XNonce::from(nonce),
                Payload {
                    msg: body,
                    aad: &aad,
                },
            )
            .map(Zeroizing::new)
            .map_err(|_| OpenError::Invalid)
    }
}

/// 64 hex characters or base64 (standard or URL-safe, padded or not) of 32 bytes.
pub fn parse_key(text: &str) -> Result<Zeroizing<[u8; KEY_LEN]>, KeyError> {
    let text = text.trim();
    let mut key = Zeroizing::new([0u8; KEY_LEN]);
    if text.len() == 2 * KEY_LEN && hex::decode_to_slice(text, &mut key[..]).is_ok() {
        return Ok(key);
    }
    let engines = [
        &base64::engine::general_purpose::STANDARD,
        &base64::engine::general_purpose::STANDARD_NO_PAD,
        &base64::engine::general_purpose::URL_SAFE,
        &base64::engine::general_purpose::URL_SAFE_NO_PAD,
    ];
    for engine in engines {
        if let Ok(bytes) = engine.decode(text).map(Zeroizing::new)
            && bytes.len() == KEY_LEN
        {
            key.copy_from_slice(&bytes);
            return Ok(key);
        }
    }
    Err(KeyError::BadEnv(text.len()))
}

/// Reads the key file, or creates it (0600, random) when there is none. A file others
/// may read, or of the wrong length, is refused.
fn key_file(path: &Path) -> Result<Zeroizing<[u8; KEY_LEN]>, KeyError> {
    let shown = path.display().to_string();
    let io = |source| KeyError::Io {
        path: shown.clone(),
        source,
    };
    match std::fs::metadata(path) {
        Ok(meta) => {
            let mode = meta.permissions().mode();
            if mode & 0o077 != 0 {
                return Err(KeyError::BadFile {
                    path: shown,
                    problem: format!(
                        "the secret key file is readable by others (mode {:o}); make it 0600",
                        mode & 0o777
                    ),
                });
            }
            let bytes = Zeroizing::new(std::fs::read(path).map_err(io)?);
            if bytes.len() != KEY_LEN {
                return Err(KeyError::BadFile {
                    path: shown,
                    problem: format!(
                        "the secret key file must hold exactly {KEY_LEN} bytes, it holds {}",
                        bytes.len()
                    ),
                });
            }
            let mut key = Zeroizing::new([0u8; KEY_LEN]);
            key.copy_from_slice(&bytes);
            Ok(key)
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let key: Zeroizing<[u8; KEY_LEN]> =
                Zeroizing::new(XChaCha20Poly1305::generate_key(&mut OsRng).into());
            let mut file = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(path)
                .map_err(io)?;
            file.write_all(&key[..]).map_err(io)?;
            file.sync_all().map_err(io)?;
            Ok(key)
        }
        Err(e) => Err(io(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SLOT: Slot<'static> = Slot {
        namespace: "ns",
        secret: "db",
        key: "dsn",
    };

    #[test]
    fn sealed_values_open_only_with_their_key_and_slot() {
        let a = Cipher::new(&[7; KEY_LEN]);
        let sealed = a.seal(SLOT, b"hunter2");
        assert!(!sealed.windows(7).any(|w| w == b"hunter2"));
        assert_eq!(&a.open(SLOT, &sealed).unwrap()[..], b"hunter2");
        // A fresh nonce each time.
        assert_ne!(a.seal(SLOT, b"hunter2"), sealed);

        let b = Cipher::new(&[8; KEY_LEN]);
        assert!(b.open(SLOT, &sealed).is_err(), "wrong key");
        for other in [
            Slot {
                namespace: "other",
                ..SLOT
            },
            Slot {
                secret: "db2",
                ..SLOT
            },
            Slot {
                key: "dsn2",
                ..SLOT
            },
            // The length prefix keeps "ns"+"db" apart from "nsd"+"b".
            Slot {
                namespace: "nsd",
                secret: "b",
                key: "dsn",
            },
        ] {
            assert!(a.open(other, &sealed).is_err(), "swapped AAD {other:?}");
        }
        let mut tampered = sealed.clone();
        let last = tampered.len() - 1;
        tampered[last] ^= 1;
        assert!(a.open(SLOT, &tampered).is_err());
        assert!(a.open(SLOT, &sealed[..10]).is_err());
    }

    #[test]
    fn keys_parse_from_hex_and_base64_only() {
        let hex = "00".repeat(31) + "ff";
        assert_eq!(parse_key(&hex).unwrap()[31], 0xff);
        let b64 = base64::engine::general_purpose::STANDARD.encode([9u8; 32]);
        assert_eq!(*parse_key(&b64).unwrap(), [9u8; 32]);
        for bad in ["", "short", &"00".repeat(31), &"zz".repeat(32)] {
            let err = parse_key(bad).unwrap_err().to_string();
            assert!(err.contains("64 hex characters or as base64"), "{err}");
            assert!(
                !err.contains(bad) || bad.is_empty(),
                "echoes the key: {err}"
            );
        }
    }

    #[test]
    fn the_key_file_is_generated_private_and_checked() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(KEY_FILE);
        let a = Cipher::load(None, dir.path()).unwrap();
        let meta = std::fs::metadata(&path).unwrap();
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        assert_eq!(meta.len(), KEY_LEN as u64);
        // The same key on the next start.
        let b = Cipher::load(None, dir.path()).unwrap();
        assert_eq!(&b.open(SLOT, &a.seal(SLOT, b"v")).unwrap()[..], b"v");

        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o640)).unwrap();
        let err = Cipher::load(None, dir.path()).unwrap_err().to_string();
        assert!(err.contains("readable by others"), "{err}");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        std::fs::write(&path, b"short").unwrap();
        let err = Cipher::load(None, dir.path()).unwrap_err().to_string();
        assert!(err.contains("exactly 32 bytes"), "{err}");
        // The environment wins over the file.
        let env = "11".repeat(32);
        assert!(Cipher::load(Some(&env), dir.path()).is_ok());
    }
}
