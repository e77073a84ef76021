//! What the probe presents to a target besides its requests: the lock API key read from a
//! file (a mounted secret) and the TLS material for `https` instances (a private CA to
//! trust, a client certificate for services that require mutual TLS). Everything is read
//! and checked up front, so a bad file is a configuration error naming it rather than a
//! failed cycle hours later. No key, file content or PEM block ever reaches a message.

use std::path::{Path, PathBuf};

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

/// Which credential file a problem is about; callers name it as a config field
/// (`ca_file`) or a flag (`--ca-file`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CredentialFile {
    /// The lock API key.
    ApiKey,
    /// An admin principal's key, for the force-release check.
    AdminKey,
    /// PEM bundle of CA certificates trusted for the target's instances.
    CaFile,
    /// PEM certificate chain the probe presents (mutual TLS).
    ClientCert,
    /// PEM private key of that certificate.
    ClientKey,
}

/// A credential file that cannot be used: which one, where, and why (never its content).
#[derive(Debug, Clone, thiserror::Error)]
#[error("{}: {message}", path.display())]
pub struct CredentialError {
    /// Which file.
    pub file: CredentialFile,
    /// Its path as configured.
    pub path: PathBuf,
    /// What is wrong with it.
    pub message: String,
}

impl CredentialError {
    fn new(file: CredentialFile, path: &Path, message: impl Into<String>) -> Self {
        Self { file, path: path.to_path_buf(), message: message.into() }
    }
}

fn read(file: CredentialFile, path: &Path) -> Result<Vec<u8>, CredentialError> {
    std::fs::read(path).map_err(|e| CredentialError::new(file, path, format!("cannot read: {e}")))
}

/// Reads a lock API key from `path`: the file's text without its trailing newline (secret
/// stores and `echo` add one). An empty key, a key of several lines or one with control
/// characters is refused: none can be sent as a bearer token.
pub fn read_api_key(path: &Path) -> Result<String, CredentialError> {
    read_key(CredentialFile::ApiKey, path, "the lock API key")
}

/// The shortest admin key a service accepts (contract 1.4): a shorter one is refused
/// here, at load, rather than by every force-release check.
pub const MIN_ADMIN_KEY_BYTES: usize = 16;

/// Reads an admin principal's key from `path`, as [`read_api_key`] reads the lock API
/// key, and refuses one shorter than [`MIN_ADMIN_KEY_BYTES`].
pub fn read_admin_key(path: &Path) -> Result<String, CredentialError> {
    let key = read_key(CredentialFile::AdminKey, path, "an admin principal's key")?;
    if key.len() < MIN_ADMIN_KEY_BYTES {
        return Err(CredentialError::new(
            CredentialFile::AdminKey,
            path,
            format!(
                "the key is shorter than {MIN_ADMIN_KEY_BYTES} characters, which no service of contract 1.4 accepts"
            ),
        ));
    }
    Ok(key)
}

fn read_key(file: CredentialFile, path: &Path, what: &str) -> Result<String, CredentialError> {
    let bytes = read(file, path)?;
    let refuse = |m: &str| Err(CredentialError::new(file, path, m));
    let Ok(text) = String::from_utf8(bytes) else {
        return refuse("the key is not UTF-8 text");
    };
    let key = text.trim_end_matches(['\n', '\r']);
    if key.trim().is_empty() {
        return refuse(&format!("the file is empty: it must hold {what}"));
    }
    if key.chars().any(char::is_control) {
        return refuse("the key holds a line break or control character (one line expected)");
    }
    Ok(key.to_owned())
}

/// Paths of a target's TLS files, from the config or the flags.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TlsFiles {
    /// PEM bundle of CA certificates to trust besides the system's roots.
    pub ca_file: Option<PathBuf>,
    /// PEM certificate chain to present (needs `client_key`).
    pub client_cert: Option<PathBuf>,
    /// PEM private key of `client_cert` (needs `client_cert`).
    pub client_key: Option<PathBuf>,
}

/// The TLS material of one target, loaded and checked: extra roots and an optional
/// client identity. The default trusts the system's roots only and presents nothing.
/// Kept as bytes so settings compare by content (a reload can tell a changed CA).
#[derive(Clone, Default, PartialEq, Eq, Hash)]
pub struct TargetTls {
    /// DER certificates added to the system's roots.
    roots: Vec<Vec<u8>>,
    /// Certificate chain and key as one PEM text (reqwest's identity format).
    identity_pem: Option<Vec<u8>>,
}

impl std::fmt::Debug for TargetTls {
    // The identity holds a private key: only say whether there is one.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TargetTls")
            .field("extra_roots", &self.roots.len())
            .field("client_identity", &self.identity_pem.is_some())
            .finish()
    }
}

impl TargetTls {
    /// Reads and checks the files: every one must parse, the key must match the
    /// certificate, and a certificate needs its key (and the other way round).
    pub fn load(files: &TlsFiles) -> Result<Self, CredentialError> {
        let mut tls = Self::default();
        if let Some(path) = &files.ca_file {
            tls.roots = certificates(CredentialFile::CaFile, path)?;
        }
        match (&files.client_cert, &files.client_key) {
            (None, None) => {}
            (Some(cert), None) => {
                return Err(CredentialError::new(
                    CredentialFile::ClientKey,
                    cert,
                    "a client certificate needs its private key file too",
                ))
            }
            (None, Some(key)) => {
                return Err(CredentialError::new(
                    CredentialFile::ClientCert,
                    key,
                    "a client key needs its certificate file too",
                ))
            }
            (Some(cert), Some(key)) => tls.identity_pem = Some(identity_pem(cert, key)?),
        }
        tls.check(files)?;
        Ok(tls)
    }

    /// The client identity as DER, for a TLS connection the probe makes itself
    /// ([`super::tls_refusal`]); `None` without one (or, which [`Self::load`] rules out,
    /// one that does not parse).
    pub(crate) fn identity_der(&self) -> Option<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>)> {
        let pem = self.identity_pem.as_deref()?;
        let chain = CertificateDer::pem_slice_iter(pem).collect::<Result<Vec<_>, _>>().ok()?;
        let key = PrivateKeyDer::from_pem_slice(pem).ok()?;
        Some((chain, key))
    }

    /// Whether anything is configured beyond the defaults.
    pub fn is_default(&self) -> bool {
        self.roots.is_empty() && self.identity_pem.is_none()
    }

    /// `builder` trusting the extra roots besides the system's and presenting the identity.
    pub fn apply(&self, builder: reqwest::ClientBuilder) -> reqwest::Result<reqwest::ClientBuilder> {
        let roots = self.roots.iter().map(|der| reqwest::Certificate::from_der(der)).collect::<Result<Vec<_>, _>>()?;
        let mut builder = if roots.is_empty() { builder } else { builder.tls_certs_merge(roots) };
        if let Some(pem) = &self.identity_pem {
            builder = builder.identity(reqwest::Identity::from_pem(pem)?);
        }
        Ok(builder)
    }

    /// Builds a client once, so what only the TLS stack can tell (a root it cannot parse,
    /// a key that does not match its certificate or that it cannot sign with) is found
    /// now, and blamed on the right file.
    fn check(&self, files: &TlsFiles) -> Result<(), CredentialError> {
        if self.is_default() {
            return Ok(());
        }
        let roots_only = Self { roots: self.roots.clone(), identity_pem: None };
        if let Err(e) = roots_only.apply(reqwest::Client::builder()).and_then(|b| b.build()) {
            let path = files.ca_file.as_deref().unwrap_or(Path::new("-"));
            return Err(CredentialError::new(CredentialFile::CaFile, path, format!("unusable: {}", chain(&e))));
        }
        if let Err(e) = self.apply(reqwest::Client::builder()).and_then(|b| b.build()) {
            let path = files.client_key.as_deref().unwrap_or(Path::new("-"));
            return Err(CredentialError::new(
                CredentialFile::ClientKey,
                path,
                format!("unusable with the client certificate (not its key, or an unsupported key): {}", chain(&e)),
            ));
        }
        Ok(())
    }
}

/// The certificates of a PEM file: at least one, and nothing unreadable.
fn certificates(file: CredentialFile, path: &Path) -> Result<Vec<Vec<u8>>, CredentialError> {
    let bytes = read(file, path)?;
    let certs = CertificateDer::pem_slice_iter(&bytes)
        .map(|c| c.map(|c| c.as_ref().to_vec()))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| CredentialError::new(file, path, format!("not a PEM certificate file: {e}")))?;
    if certs.is_empty() {
        return Err(CredentialError::new(file, path, "holds no PEM certificate (-----BEGIN CERTIFICATE-----)"));
    }
    Ok(certs)
}

/// The client certificate chain and its key as one PEM text, each file checked on its own.
fn identity_pem(cert: &Path, key: &Path) -> Result<Vec<u8>, CredentialError> {
    certificates(CredentialFile::ClientCert, cert)?;
    let key_bytes = read(CredentialFile::ClientKey, key)?;
    // Parsed only to be checked: the message says what kind of block is missing.
    PrivateKeyDer::from_pem_slice(&key_bytes).map_err(|e| {
        CredentialError::new(
            CredentialFile::ClientKey,
            key,
            format!("holds no PEM private key (PKCS#8, PKCS#1 or SEC1): {e}"),
        )
    })?;
    let mut pem = read(CredentialFile::ClientCert, cert)?;
    pem.push(b'\n');
    pem.extend_from_slice(&key_bytes);
    Ok(pem)
}

/// An error with its sources, one after the other (reqwest's own says only "builder error").
fn chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key_file(text: &str) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("key");
        std::fs::write(&path, text).unwrap();
        (dir, path)
    }

    #[test]
    fn a_key_file_loses_its_trailing_newline_and_nothing_else() {
        for (text, key) in [("k1\n", "k1"), ("k2\r\n", "k2"), ("k3", "k3"), (" spaced key \n", " spaced key ")] {
            let (_dir, path) = key_file(text);
            assert_eq!(read_api_key(&path).unwrap(), key, "{text:?}");
        }
    }

    #[test]
    fn an_empty_or_multi_line_key_file_is_refused_without_showing_it() {
        for text in ["", "\n", "  \n", "first\nsecond\n", "tab\there"] {
            let (_dir, path) = key_file(text);
            let e = read_api_key(&path).unwrap_err();
            assert_eq!(e.file, CredentialFile::ApiKey);
            assert!(e.to_string().starts_with(&path.display().to_string()), "{e}");
            assert!(!e.to_string().contains("second") && !e.to_string().contains("tab"), "{e}");
        }
        let e = read_api_key(Path::new("/nonexistent/lockprobe-key")).unwrap_err();
        assert!(e.to_string().contains("/nonexistent/lockprobe-key") && e.to_string().contains("cannot read"), "{e}");
    }

    #[test]
    fn one_half_of_a_client_identity_is_refused_naming_the_missing_half() {
        let (_dir, path) = key_file("not read");
        let only_cert = TlsFiles { client_cert: Some(path.clone()), ..TlsFiles::default() };
        assert_eq!(TargetTls::load(&only_cert).unwrap_err().file, CredentialFile::ClientKey);
        let only_key = TlsFiles { client_key: Some(path), ..TlsFiles::default() };
        assert_eq!(TargetTls::load(&only_key).unwrap_err().file, CredentialFile::ClientCert);
        assert!(TargetTls::load(&TlsFiles::default()).unwrap().is_default());
    }

    #[test]
    fn debug_never_shows_the_identity() {
        let tls = TargetTls { roots: vec![vec![1]], identity_pem: Some(b"-----BEGIN PRIVATE KEY-----secret".to_vec()) };
        let shown = format!("{tls:?}");
        assert_eq!(shown, "TargetTls { extra_roots: 1, client_identity: true }");
    }
}
