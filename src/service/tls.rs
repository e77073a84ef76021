//! HTTPS for the reference service (`lockprobe service --tls-cert --tls-key`), optionally
//! requiring client certificates signed by a given CA (`--tls-client-ca`): a reference
//! deployment behind TLS, and a real server for the probe's CA and client-certificate
//! settings to be tested against.
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

/// The server's TLS files.
#[derive(Debug, Clone)]
pub struct ServerTlsFiles {
    /// PEM certificate chain, leaf first.
    pub cert: PathBuf,
    /// PEM private key of the leaf.
    pub key: PathBuf,
    /// If set, every client must present a certificate chaining to one in this PEM bundle.
    pub client_ca: Option<PathBuf>,
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

/// Reads and checks the files into a server configuration (HTTP/1.1, TLS 1.2 and 1.3).
pub fn server_config(files: &ServerTlsFiles) -> Result<Arc<rustls::ServerConfig>, ServerTlsError> {
    // Named explicitly: the process-wide default is ambiguous when several are compiled in.
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let chain = certificates(ServerTlsFile::Cert, &files.cert)?;
    let key_bytes =
        std::fs::read(&files.key).map_err(|e| error(ServerTlsFile::Key, &files.key, format!("cannot read: {e}")))?;
    let key = PrivateKeyDer::from_pem_slice(&key_bytes).map_err(|e| {
        error(ServerTlsFile::Key, &files.key, format!("holds no PEM private key (PKCS#8, PKCS#1 or SEC1): {e}"))
    })?;
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| error(ServerTlsFile::Cert, &files.cert, e.to_string()))?;
    let builder = match &files.client_ca {
        None => builder.with_no_client_auth(),
        Some(path) => {
            let mut roots = rustls::RootCertStore::empty();
            for cert in certificates(ServerTlsFile::ClientCa, path)? {
                roots.add(cert).map_err(|e| error(ServerTlsFile::ClientCa, path, format!("unusable: {e}")))?;
            }
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .map_err(|e| error(ServerTlsFile::ClientCa, path, format!("unusable: {e}")))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config = builder.with_single_cert(chain, key).map_err(|e| {
        error(ServerTlsFile::Key, &files.key, format!("unusable with the certificate (not its key?): {e}"))
    })?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}
