//! Certificates made at test time: a CA, a server certificate for loopback signed by it,
//! a client certificate signed by a second CA (so the two trusts cannot be confused), and
//! a stranger CA that signed nothing the tests serve. Written as PEM files into a
//! temporary directory that lives as long as the [`Pki`].

#![allow(dead_code)]

use std::path::PathBuf;

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    KeyUsagePurpose,
};

/// The PEM files of one test PKI.
pub struct Pki {
    _dir: tempfile::TempDir,
    /// CA that signed the server certificate.
    pub server_ca: PathBuf,
    /// Server certificate for `127.0.0.1` and `localhost`.
    pub server_cert: PathBuf,
    /// Its key.
    pub server_key: PathBuf,
    /// CA that signed the client certificate.
    pub client_ca: PathBuf,
    /// Client certificate (clientAuth).
    pub client_cert: PathBuf,
    /// Its key.
    pub client_key: PathBuf,
    /// A CA that signed neither certificate.
    pub stranger_ca: PathBuf,
    /// A key that belongs to no certificate here.
    pub stranger_key: PathBuf,
    /// The directory, for more files.
    pub dir: PathBuf,
}

fn ca(name: &str) -> CertifiedIssuer<'static, KeyPair> {
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap()
}

fn leaf(names: &[&str], usage: ExtendedKeyUsagePurpose, issuer: &CertifiedIssuer<'_, KeyPair>) -> (String, String) {
    let mut params = CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>()).unwrap();
    params.distinguished_name.push(DnType::CommonName, names[0]);
    params.extended_key_usages = vec![usage];
    let key = KeyPair::generate().unwrap();
    let cert = params.signed_by(&key, issuer).unwrap();
    (cert.pem(), key.serialize_pem())
}

impl Pki {
    /// Generates every certificate and writes the files.
    pub fn generate() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let server_issuer = ca("lockprobe test server CA");
        let client_issuer = ca("lockprobe test client CA");
        let stranger = ca("lockprobe test stranger CA");
        let (server_cert, server_key) =
            leaf(&["127.0.0.1", "localhost"], ExtendedKeyUsagePurpose::ServerAuth, &server_issuer);
        let (client_cert, client_key) = leaf(&["lockprobe-probe"], ExtendedKeyUsagePurpose::ClientAuth, &client_issuer);
        let write = |name: &str, text: &str| {
            let path = dir.path().join(name);
            std::fs::write(&path, text).unwrap();
            path
        };
        Pki {
            server_ca: write("server-ca.pem", &server_issuer.pem()),
            server_cert: write("server.pem", &server_cert),
            server_key: write("server.key", &server_key),
            client_ca: write("client-ca.pem", &client_issuer.pem()),
            client_cert: write("client.pem", &client_cert),
            client_key: write("client.key", &client_key),
            stranger_ca: write("stranger-ca.pem", &stranger.pem()),
            stranger_key: write("stranger.key", &KeyPair::generate().unwrap().serialize_pem()),
            dir: dir.path().to_path_buf(),
            _dir: dir,
        }
    }

    /// Writes `text` to a file named `name` beside the others.
    pub fn write(&self, name: &str, text: &str) -> PathBuf {
        let path = self.dir.join(name);
        std::fs::write(&path, text).unwrap();
        path
    }
}
