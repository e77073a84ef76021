//! A server's TLS from its files: the reference service's (`lockprobe service --tls-cert
//! --tls-key --tls-client-ca`) and the web configuration's (`--web.config.file` of `serve`
//! and `monitor`), one builder so both refuse a bad file the same way.
//!
//! Handshakes run in each connection's own task, inside its slot and under a timeout
//! ([`crate::listener`]), so a slow or refused client never holds up the next
//! connection; a refused handshake is logged and never reaches the router.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::rustls;

/// Which file a TLS setting problem is about; the wiring names it as its flag.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServerTlsFile {
    /// The server's certificate chain.
    Cert,
    /// The server's private key.
    Key,
    /// The CA bundle client certificates must chain to.
    ClientCa,
}

/// A TLS file that cannot be used: which, where, why (never its content).
#[derive(Debug, thiserror::Error)]
#[error("{}: {message}", path.display())]
pub struct ServerTlsError {
    /// Which file.
    pub file: ServerTlsFile,
    /// Its path.
    pub path: PathBuf,
    /// What is wrong with it.
    pub message: String,
}

fn error(file: ServerTlsFile, path: &Path, message: impl Into<String>) -> ServerTlsError {
    ServerTlsError { file, path: path.to_path_buf(), message: message.into() }
}

/// The server's TLS files and what it asks of clients.
#[derive(Debug, Clone)]
pub struct ServerTlsFiles {
    /// PEM certificate chain, leaf first.
    pub cert: PathBuf,
    /// PEM private key of the leaf.
    pub key: PathBuf,
    /// The PEM bundle client certificates must chain to; `client_auth` says whether a
    /// client must present one.
    pub client_ca: Option<PathBuf>,
    /// Whether a client certificate is required (with `client_ca`).
    pub client_auth: ClientAuth,
    /// The oldest TLS version accepted.
    pub min_version: TlsVersion,
    /// The newest TLS version accepted.
    pub max_version: TlsVersion,
}

impl ServerTlsFiles {
    /// A certificate and key, TLS 1.2 and 1.3, every client certificate verified against
    /// `client_ca` and required when it is given (the reference service's flags).
    pub fn new(cert: PathBuf, key: PathBuf, client_ca: Option<PathBuf>) -> Self {
        let client_auth = if client_ca.is_some() { ClientAuth::RequireAndVerify } else { ClientAuth::None };
        Self { cert, key, client_ca, client_auth, min_version: TlsVersion::Tls12, max_version: TlsVersion::Tls13 }
    }
}

/// What a server asks of a client's certificate. Every certificate a client presents is
/// verified: one that is not authenticates nobody.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientAuth {
    /// None is asked for.
    None,
    /// One is asked for and verified against the client CA when given; a client may
    /// present none.
    VerifyIfGiven,
    /// One is required and verified against the client CA.
    RequireAndVerify,
}

/// A TLS protocol version this server can speak.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum TlsVersion {
    /// TLS 1.2.
    Tls12,
    /// TLS 1.3.
    Tls13,
}

fn certificates(file: ServerTlsFile, path: &Path) -> Result<Vec<CertificateDer<'static>>, ServerTlsError> {
    let bytes = std::fs::read(path).map_err(|e| error(file, path, format!("cannot read: {e}")))?;
    let certs = CertificateDer::pem_slice_iter(&bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| error(file, path, format!("not a PEM certificate file: {e}")))?;
    if certs.is_empty() {
        return Err(error(file, path, "holds no PEM certificate (-----BEGIN CERTIFICATE-----)"));
    }
    Ok(certs)
}

/// Reads and checks the files into a server configuration (HTTP/1.1).
pub fn server_config(files: &ServerTlsFiles) -> Result<Arc<rustls::ServerConfig>, ServerTlsError> {
    // Named explicitly: the process-wide default is ambiguous when several are compiled in.
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let chain = certificates(ServerTlsFile::Cert, &files.cert)?;
    let key_bytes =
        std::fs::read(&files.key).map_err(|e| error(ServerTlsFile::Key, &files.key, format!("cannot read: {e}")))?;
    let key = PrivateKeyDer::from_pem_slice(&key_bytes).map_err(|e| {
        error(ServerTlsFile::Key, &files.key, format!("holds no PEM private key (PKCS#8, PKCS#1 or SEC1): {e}"))
    })?;
    let versions: Vec<&'static rustls::SupportedProtocolVersion> =
        [(TlsVersion::Tls12, &rustls::version::TLS12), (TlsVersion::Tls13, &rustls::version::TLS13)]
            .into_iter()
            .filter(|(v, _)| (files.min_version..=files.max_version).contains(v))
            .map(|(_, v)| v)
            .collect();
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&versions)
        .map_err(|e| error(ServerTlsFile::Cert, &files.cert, e.to_string()))?;
    let builder = match (&files.client_ca, files.client_auth) {
        (_, ClientAuth::None) => builder.with_no_client_auth(),
        (None, _) => {
            return Err(error(
                ServerTlsFile::ClientCa,
                &files.cert,
                "client certificates are asked for but no client CA is given",
            ))
        }
        (Some(path), auth) => {
            let mut roots = rustls::RootCertStore::empty();
            for cert in certificates(ServerTlsFile::ClientCa, path)? {
                roots.add(cert).map_err(|e| error(ServerTlsFile::ClientCa, path, format!("unusable: {e}")))?;
            }
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider);
            let verifier = if auth == ClientAuth::VerifyIfGiven { verifier.allow_unauthenticated() } else { verifier };
            let verifier =
                verifier.build().map_err(|e| error(ServerTlsFile::ClientCa, path, format!("unusable: {e}")))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config = builder.with_single_cert(chain, key).map_err(|e| {
        error(ServerTlsFile::Key, &files.key, format!("unusable with the certificate (not its key?): {e}"))
    })?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}
