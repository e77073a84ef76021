//! Why an `https` instance refused the probe's connection, read off a connection of the
//! probe's own.
//!
//! In TLS 1.3 a server that requires a client certificate lets the client finish the
//! handshake and refuses only then, with an alert the client reads afterwards. The HTTP
//! client may have handed that connection its request before the alert arrived; it then
//! reports only that the connection closed before the request could be sent
//! (`connection was not ready`), and the alert, the one thing an operator needs, is lost.
//! Which of the two an operator sees would depend on timing. So after a transport error
//! on an `https` instance the probe opens one more connection, presents the same client
//! identity, sends nothing, and reads what the server says: a refusal then always
//! arrives as its alert.
//!
//! That connection does not verify the server's certificate: it carries no data (no key,
//! no request), and the HTTP client's own error already names any certificate of the
//! server it would not trust.

use std::sync::Arc;
use std::time::Duration;

use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;
use tokio_rustls::rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use tokio_rustls::rustls::crypto::{self, CryptoProvider};
use tokio_rustls::rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use tokio_rustls::rustls::{ClientConfig, DigitallySignedStruct, Error, SignatureScheme};
use tokio_rustls::TlsConnector;

use super::credentials::TargetTls;

/// How long connecting, the handshake and waiting for the server's verdict may each take.
const STEP_TIMEOUT: Duration = Duration::from_secs(2);

/// What the server of `url` (an `https` URL) says to a connection that presents `tls`'s
/// client identity: why it refused it, or `None` when it did not (or `url` is not
/// `https`, or the server could not be reached at all, which the caller knows already).
pub(crate) async fn refusal(url: &reqwest::Url, tls: &TargetTls) -> Option<String> {
    if url.scheme() != "https" {
        return None;
    }
    let host = url.host_str()?.trim_start_matches('[').trim_end_matches(']').to_owned();
    let port = url.port_or_known_default()?;
    let config = client_config(tls).ok()?;
    let name = ServerName::try_from(host.clone()).ok()?;
    let tcp = tokio::time::timeout(STEP_TIMEOUT, TcpStream::connect((host.as_str(), port))).await.ok()?.ok()?;
    let handshake = TlsConnector::from(Arc::new(config)).connect(name, tcp);
    let mut stream = match tokio::time::timeout(STEP_TIMEOUT, handshake).await {
        Err(_) => return Some(format!("the TLS handshake did not finish within {}s", STEP_TIMEOUT.as_secs())),
        Ok(Err(e)) => return Some(format!("the TLS handshake failed: {e}")),
        Ok(Ok(stream)) => stream,
    };
    // A server that accepts the connection waits for a request; one that refuses it
    // says why at once.
    let mut byte = [0u8; 1];
    match tokio::time::timeout(STEP_TIMEOUT, stream.read(&mut byte)).await {
        Ok(Err(e)) => Some(format!("the server refused the TLS connection: {e}")),
        Ok(Ok(0)) => Some("the server closed the TLS connection right after the handshake".into()),
        Ok(Ok(_)) | Err(_) => None,
    }
}

/// A client configuration presenting `tls`'s identity, if it has one.
fn client_config(tls: &TargetTls) -> Result<ClientConfig, Error> {
    let provider = Arc::new(crypto::aws_lc_rs::default_provider());
    let builder = ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AnyServer(provider)));
    match tls.identity_der() {
        Some((chain, key)) => builder.with_client_auth_cert(chain, key),
        None => Ok(builder.with_no_client_auth()),
    }
}

/// Accepts any server certificate, still checking the handshake's signatures: see the
/// module documentation for why that is right for this connection alone.
#[derive(Debug)]
struct AnyServer(Arc<CryptoProvider>);

impl ServerCertVerifier for AnyServer {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        crypto::verify_tls12_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        crypto::verify_tls13_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}
