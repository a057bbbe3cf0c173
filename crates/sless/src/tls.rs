//! TLS on the listener (`sless serve --tls-cert PATH --tls-key PATH`): the
//! certificate chain and private key, read from PEM files and checked to match at
//! start, and re-read on `SIGHUP` so a renewed certificate is served to new
//! connections without a restart. A pair that cannot be used on reload leaves the
//! one in force untouched.
//!
//! The provider is rustls's aws-lc-rs one, the one the HTTP client (reqwest) already
//! brings, so the binary carries one TLS stack. Connections speak HTTP/1.1 (ALPN
//! `http/1.1`); the handshake itself happens in the connection's task (see
//! [`crate::accept`]), bounded by the header timeout.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use anyhow::{Context, Result, anyhow};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use tokio_rustls::TlsAcceptor;

/// Where the certificate chain and its key are read from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// PEM certificate chain, the server's certificate first.
    pub cert: PathBuf,
    /// PEM private key (PKCS#8, PKCS#1 RSA or SEC1 EC) of the first certificate.
    pub key: PathBuf,
}

impl TlsFiles {
    /// Both paths or neither: one without the other is a configuration error.
    pub fn from_flags(cert: Option<PathBuf>, key: Option<PathBuf>) -> Result<Option<TlsFiles>> {
        match (cert, key) {
            (None, None) => Ok(None),
            (Some(cert), Some(key)) => Ok(Some(TlsFiles { cert, key })),
            (Some(_), None) => Err(anyhow!(
                "--tls-cert (SLESS_TLS_CERT) is set but --tls-key (SLESS_TLS_KEY) is not: \
                 TLS needs both the certificate chain and its private key"
            )),
            (None, Some(_)) => Err(anyhow!(
                "--tls-key (SLESS_TLS_KEY) is set but --tls-cert (SLESS_TLS_CERT) is not: \
                 TLS needs both the certificate chain and its private key"
            )),
        }
    }
}

/// The listener's TLS: an acceptor whose certificate can be swapped while serving.
pub struct Tls {
    files: TlsFiles,
    provider: Arc<CryptoProvider>,
    current: Arc<Current>,
    acceptor: TlsAcceptor,
}

/// The certificate and key new handshakes use.
#[derive(Debug)]
struct Current(RwLock<Arc<CertifiedKey>>);

impl ResolvesServerCert for Current {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.0.read().unwrap_or_else(|e| e.into_inner()).clone())
    }
}

impl Tls {
    /// Reads and checks the pair; every error names the flag (and file) at fault.
    pub fn load(files: TlsFiles) -> Result<Tls> {
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let key = certified_key(&files, &provider)?;
        let current = Arc::new(Current(RwLock::new(Arc::new(key))));
        let mut config = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .context("the TLS provider supports no safe protocol version")?
            .with_no_client_auth()
            .with_cert_resolver(current.clone());
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Tls {
            files,
            provider,
            current,
            acceptor: TlsAcceptor::from(Arc::new(config)),
        })
    }

    /// Re-reads the pair; on success new handshakes use it, on failure the pair in
    /// force stays and the error says why.
    pub fn reload(&self) -> Result<()> {
        let key = certified_key(&self.files, &self.provider)?;
        *self.current.0.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(key);
        Ok(())
    }

    /// The acceptor for new connections.
    pub fn acceptor(&self) -> &TlsAcceptor {
        &self.acceptor
    }

    /// Re-reads the pair at every `SIGHUP` until `stop` is cancelled. The handler is
    /// installed before this returns.
    pub fn reload_on_sighup(
        self: &Arc<Tls>,
        stop: tokio_util::sync::CancellationToken,
    ) -> Result<tokio::task::JoinHandle<()>> {
        use tokio::signal::unix::{SignalKind, signal};
        let mut hup = signal(SignalKind::hangup()).context("cannot handle SIGHUP")?;
        let tls = self.clone();
        Ok(tokio::spawn(async move {
            loop {
                tokio::select! {
                    got = hup.recv() => if got.is_none() { break },
                    () = stop.cancelled() => break,
                }
                match tls.reload() {
                    Ok(()) => tracing::info!(
                        cert = %tls.files.cert.display(),
                        "SIGHUP: reloaded the TLS certificate and key"
                    ),
                    Err(e) => tracing::error!(
                        error = format!("{e:#}"),
                        "SIGHUP: cannot reload the TLS certificate; keeping the one in use"
                    ),
                }
            }
        }))
    }
}

/// Reads the chain and key and checks that the key belongs to the first certificate.
fn certified_key(files: &TlsFiles, provider: &Arc<CryptoProvider>) -> Result<CertifiedKey> {
    let chain = read_chain(&files.cert)?;
    let key = read_key(&files.key)?;
    CertifiedKey::from_der(chain, key, provider).map_err(|e| match e {
        rustls::Error::InconsistentKeys(_) => anyhow!(
            "--tls-key {} does not match the certificate in --tls-cert {} (the key must be the \
             private key of the first certificate in the chain)",
            files.key.display(),
            files.cert.display()
        ),
        rustls::Error::General(_) => anyhow!(
            "--tls-key {}: the private key cannot be used ({e}); expected an RSA, ECDSA \
             (P-256/P-384) or Ed25519 key",
            files.key.display()
        ),
        other => anyhow!(
            "--tls-cert {} and --tls-key {} cannot be used together: {other}",
            files.cert.display(),
            files.key.display()
        ),
    })
}

fn read_chain(path: &Path) -> Result<Vec<CertificateDer<'static>>> {
    let pem = std::fs::read(path)
        .with_context(|| format!("--tls-cert: cannot read {}", path.display()))?;
    let chain = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| anyhow!("--tls-cert {} is not valid PEM: {e}", path.display()))?;
    if chain.is_empty() {
        return Err(anyhow!(
            "--tls-cert {} holds no certificate (expected PEM `-----BEGIN CERTIFICATE-----` blocks, \
             the server's certificate first)",
            path.display()
        ));
    }
    Ok(chain)
}

fn read_key(path: &Path) -> Result<PrivateKeyDer<'static>> {
    let pem = std::fs::read(path)
        .with_context(|| format!("--tls-key: cannot read {}", path.display()))?;
    PrivateKeyDer::from_pem_slice(&pem).map_err(|e| match e {
        rustls::pki_types::pem::Error::NoItemsFound => anyhow!(
            "--tls-key {} holds no private key (expected a PEM `PRIVATE KEY`, `RSA PRIVATE KEY` \
             or `EC PRIVATE KEY` block)",
            path.display()
        ),
        e => anyhow!("--tls-key {} is not valid PEM: {e}", path.display()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_flags_or_neither() {
        assert_eq!(TlsFiles::from_flags(None, None).unwrap(), None);
        let err = TlsFiles::from_flags(Some("c.pem".into()), None).unwrap_err();
        assert!(err.to_string().contains("--tls-key"), "{err}");
        let err = TlsFiles::from_flags(None, Some("k.pem".into())).unwrap_err();
        assert!(err.to_string().contains("--tls-cert"), "{err}");
    }

    #[test]
    fn missing_and_empty_files_name_the_flag() {
        let dir = tempfile::tempdir().unwrap();
        let empty = dir.path().join("empty.pem");
        std::fs::write(&empty, "").unwrap();
        let missing = dir.path().join("missing.pem");
        let load = |cert: &Path, key: &Path| {
            Tls::load(TlsFiles {
                cert: cert.into(),
                key: key.into(),
            })
            .err()
            .map(|e| format!("{e:#}"))
            .unwrap()
        };
        let err = load(&missing, &empty);
        assert!(err.starts_with("--tls-cert: cannot read"), "{err}");
        let err = load(&empty, &empty);
        assert!(
            err.contains("--tls-cert") && err.contains("no certificate"),
            "{err}"
        );
        let err = load(&missing, &empty);
        assert!(err.contains("missing.pem"), "{err}");
    }

    /// A self-signed certificate for `cert_key` and `key` as its key, written to `dir`.
    fn pair(dir: &Path, name: &str, key: &rcgen::KeyPair, cert_key: &rcgen::KeyPair) -> TlsFiles {
        let params = rcgen::CertificateParams::new(vec!["localhost".to_string()]).unwrap();
        let cert = params.self_signed(cert_key).unwrap();
        let files = TlsFiles {
            cert: dir.join(format!("{name}.crt")),
            key: dir.join(format!("{name}.key")),
        };
        std::fs::write(&files.cert, cert.pem()).unwrap();
        std::fs::write(&files.key, key.serialize_pem()).unwrap();
        files
    }

    #[test]
    fn rsa_ecdsa_and_ed25519_keys_load_and_a_foreign_key_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let keys = [
            rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap(),
            rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P384_SHA384).unwrap(),
            rcgen::KeyPair::generate_for(&rcgen::PKCS_ED25519).unwrap(),
            rcgen::KeyPair::generate_rsa_for(&rcgen::PKCS_RSA_SHA256, rcgen::RsaKeySize::_2048)
                .unwrap(),
        ];
        for (i, key) in keys.iter().enumerate() {
            let files = pair(dir.path(), &format!("k{i}"), key, key);
            let tls = Tls::load(files).unwrap_or_else(|e| panic!("key {i}: {e:#}"));
            tls.reload().unwrap();
        }
        let files = pair(dir.path(), "foreign", &keys[0], &keys[1]);
        let err = format!("{:#}", Tls::load(files).err().unwrap());
        assert!(err.contains("does not match"), "{err}");
    }

    #[test]
    fn a_failed_reload_keeps_the_pair_in_use() {
        let dir = tempfile::tempdir().unwrap();
        let key = rcgen::KeyPair::generate().unwrap();
        let files = pair(dir.path(), "a", &key, &key);
        let tls = Tls::load(files.clone()).unwrap();
        let before = tls.current.0.read().unwrap().cert.clone();
        std::fs::write(&files.key, "not a key").unwrap();
        let err = format!("{:#}", tls.reload().unwrap_err());
        assert!(err.contains("--tls-key"), "{err}");
        assert_eq!(tls.current.0.read().unwrap().cert, before);
    }
}
