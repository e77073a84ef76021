//! `--web.config.file`: TLS and basic authentication for the package's own endpoints
//! (`serve`, `monitor`), in the format of the Prometheus exporter toolkit, so one file
//! and one habit serve Prometheus, its exporters and lockprobe alike
//! (docs/security.md, "The package's own endpoints").
//!
//! ```yaml
//! tls_server_config:
//!   cert_file: server.crt          # relative paths are from this file's directory
//!   key_file: server.key
//!   client_auth_type: RequireAndVerifyClientCert
//!   client_ca_file: clients-ca.crt
//!   min_version: TLS12
//! http_server_config:
//!   headers:
//!     Strict-Transport-Security: max-age=31536000
//! basic_auth_users:
//!   prometheus: $2y$10$...         # htpasswd -nBC 10 prometheus
//! ```
//!
//! Where lockprobe differs from the toolkit, it refuses rather than ignore a setting
//! (a security setting silently dropped is worse than a start that fails): the
//! `client_auth_type`s that accept a certificate without verifying it
//! (`RequestClientCert`, `RequireAnyClientCert`), `client_allowed_sans`, `cipher_suites`,
//! `curve_preferences` and TLS versions below 1.2 (rustls's safe defaults apply).
//! `http2` and `prefer_server_cipher_suites` are accepted and have no effect: the
//! listener speaks HTTP/1.1 and rustls chooses cipher suites by the server's order.
//!
//! The file and every file it names are re-read when any of them changes
//! ([`WebConfigWatch`]); a change that does not load keeps the configuration in force,
//! and says why in the log and in `lockprobe_web_config_last_reload_successful`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use axum::http::{HeaderName, HeaderValue};
use serde::Deserialize;
use sha2::{Digest, Sha256};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::basic_auth::BasicAuthUsers;
use super::tls::{server_config, ClientAuth, ServerTlsFiles, TlsVersion};
use super::{Guard, Guards};

/// How often the file and the files it names are looked at for a change.
pub const POLL_INTERVAL: Duration = Duration::from_secs(1);

/// The largest web configuration file read (it names files; it does not hold them).
const MAX_FILE_BYTES: u64 = 1024 * 1024;

/// The response headers a web configuration may set (the toolkit's list).
const SETTABLE_HEADERS: [&str; 5] = [
    "Strict-Transport-Security",
    "X-Content-Type-Options",
    "X-Frame-Options",
    "X-XSS-Protection",
    "Content-Security-Policy",
];

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct WebConfigFile {
    #[serde(default)]
    tls_server_config: Option<TlsServerConfig>,
    #[serde(default)]
    http_server_config: Option<HttpServerConfig>,
    #[serde(default)]
    basic_auth_users: Option<BTreeMap<String, String>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct TlsServerConfig {
    cert_file: Option<PathBuf>,
    key_file: Option<PathBuf>,
    client_auth_type: Option<String>,
    client_ca_file: Option<PathBuf>,
    min_version: Option<String>,
    max_version: Option<String>,
    // Refused when set (see the module's documentation): named so the refusal says why
    // instead of "unknown field".
    cipher_suites: Option<serde_yaml_ng::Value>,
    curve_preferences: Option<serde_yaml_ng::Value>,
    client_allowed_sans: Option<serde_yaml_ng::Value>,
    // Accepted, no effect.
    #[allow(dead_code)]
    prefer_server_cipher_suites: Option<bool>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct HttpServerConfig {
    // Accepted, no effect: HTTP/1.1 only.
    #[allow(dead_code)]
    http2: Option<bool>,
    #[serde(default)]
    headers: BTreeMap<String, String>,
}

/// A web configuration that cannot be used: the file and, when it is about one, the
/// field (`tls_server_config.cert_file`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}: {}{message}", file.display(), field.map(|f| format!("{f}: ")).unwrap_or_default())]
pub struct WebConfigError {
    /// The web configuration file.
    pub file: PathBuf,
    /// The field at fault, if one is.
    pub field: Option<&'static str>,
    /// What is wrong.
    pub message: String,
}

/// A web configuration, loaded: what connections must pass, and the files it was read
/// from (to notice when one changes).
pub struct LoadedWebConfig {
    /// The TLS, users and headers it sets.
    pub guard: Guard,
    /// The file and every file it names.
    files: Vec<PathBuf>,
    /// What they held.
    fingerprint: [u8; 32],
}

impl std::fmt::Debug for LoadedWebConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoadedWebConfig").field("files", &self.files).finish_non_exhaustive()
    }
}

impl LoadedWebConfig {
    /// What this configuration turns on, for the start-up line and `check-web-config`.
    pub fn summary(&self) -> String {
        let mut parts = Vec::new();
        if self.guard.tls.is_some() {
            parts.push("TLS".to_owned());
        }
        if let Some(users) = &self.guard.users {
            parts.push(format!(
                "basic authentication ({} user{})",
                users.len(),
                if users.len() == 1 { "" } else { "s" }
            ));
        }
        if !self.guard.headers.is_empty() {
            parts.push(format!(
                "{} response header{}",
                self.guard.headers.len(),
                if self.guard.headers.len() == 1 { "" } else { "s" }
            ));
        }
        if parts.is_empty() {
            "nothing (plain HTTP, no authentication)".to_owned()
        } else {
            parts.join(", ")
        }
    }
}

/// Reads `path` and every file it names, and builds what it describes.
pub fn load(path: &Path) -> Result<LoadedWebConfig, WebConfigError> {
    let refuse =
        |field: Option<&'static str>, message: String| WebConfigError { file: path.to_path_buf(), field, message };
    let text = read_small(path).map_err(|e| refuse(None, e))?;
    let file: WebConfigFile = if text.trim().is_empty() {
        WebConfigFile::default()
    } else {
        serde_yaml_ng::from_str(&text).map_err(|e| refuse(None, e.to_string()))?
    };
    let base = path.parent().unwrap_or(Path::new("."));
    let mut files = vec![path.to_path_buf()];
    let mut guard = Guard::default();
    let tls_files = match file.tls_server_config {
        Some(tls) => Some(tls_files(tls, base).map_err(|(field, message)| refuse(Some(field), message))?),
        None => None,
    };
    if let Some(tls) = &tls_files {
        files.push(tls.cert.clone());
        files.push(tls.key.clone());
        files.extend(tls.client_ca.clone());
    }
    // What the files held when they were read: the configuration's own text as read
    // above, the others now, before they are read again to be used. A change after
    // this shows at the next look (at worst one load too many), never goes unseen.
    let others: Vec<Result<Vec<u8>, std::io::ErrorKind>> =
        files[1..].iter().map(|f| std::fs::read(f).map_err(|e| e.kind())).collect();
    let fingerprint =
        digest(std::iter::once(Ok(text.as_bytes())).chain(others.iter().map(|c| c.as_deref().map_err(|k| *k))));
    if let Some(tls_files) = tls_files {
        let config = server_config(&tls_files).map_err(|e| {
            let field = match e.file {
                super::tls::ServerTlsFile::Cert => "tls_server_config.cert_file",
                super::tls::ServerTlsFile::Key => "tls_server_config.key_file",
                super::tls::ServerTlsFile::ClientCa => "tls_server_config.client_ca_file",
            };
            refuse(Some(field), e.to_string())
        })?;
        guard.tls = Some(tokio_rustls::TlsAcceptor::from(config));
    }
    if let Some(http) = file.http_server_config {
        for (name, value) in http.headers {
            let Some(settable) = SETTABLE_HEADERS.iter().find(|h| h.eq_ignore_ascii_case(&name)) else {
                return Err(refuse(
                    Some("http_server_config.headers"),
                    format!("{name:?} cannot be set (only {})", SETTABLE_HEADERS.join(", ")),
                ));
            };
            let value = HeaderValue::from_str(&value)
                .map_err(|_| refuse(Some("http_server_config.headers"), format!("{name}: not a valid header value")))?;
            let name = HeaderName::from_bytes(settable.as_bytes())
                .map_err(|_| refuse(Some("http_server_config.headers"), format!("{name}: not a valid header name")))?;
            guard.headers.push((name, value));
        }
    }
    if let Some(users) = file.basic_auth_users {
        let users = BasicAuthUsers::new(users).map_err(|e| refuse(None, e.to_string()))?;
        guard.users = Some(Arc::new(users));
    }
    Ok(LoadedWebConfig { guard, files, fingerprint })
}

fn tls_files(tls: TlsServerConfig, base: &Path) -> Result<ServerTlsFiles, (&'static str, String)> {
    let unsupported = "is not supported by lockprobe (rustls's safe defaults apply); remove it";
    if tls.cipher_suites.is_some() {
        return Err(("tls_server_config.cipher_suites", unsupported.to_owned()));
    }
    if tls.curve_preferences.is_some() {
        return Err(("tls_server_config.curve_preferences", unsupported.to_owned()));
    }
    if tls.client_allowed_sans.is_some() {
        return Err((
            "tls_server_config.client_allowed_sans",
            "is not supported by lockprobe; give client certificates their own CA (client_ca_file) instead".to_owned(),
        ));
    }
    let resolve = |p: PathBuf| if p.is_relative() { base.join(p) } else { p };
    let cert = tls.cert_file.filter(|p| !p.as_os_str().is_empty()).map(resolve);
    let key = tls.key_file.filter(|p| !p.as_os_str().is_empty()).map(resolve);
    let (cert, key) = match (cert, key) {
        (Some(cert), Some(key)) => (cert, key),
        (None, _) => return Err(("tls_server_config.cert_file", "is required (with key_file)".to_owned())),
        (_, None) => return Err(("tls_server_config.key_file", "is required (with cert_file)".to_owned())),
    };
    let client_auth = match tls.client_auth_type.as_deref().unwrap_or("NoClientCert") {
        "NoClientCert" => ClientAuth::None,
        "VerifyClientCertIfGiven" => ClientAuth::VerifyIfGiven,
        "RequireAndVerifyClientCert" => ClientAuth::RequireAndVerify,
        "RequestClientCert" | "RequireAnyClientCert" => {
            return Err((
                "tls_server_config.client_auth_type",
                "accepts client certificates without verifying them, which authenticates nobody; use \
                 VerifyClientCertIfGiven or RequireAndVerifyClientCert with client_ca_file"
                    .to_owned(),
            ))
        }
        other => {
            return Err((
                "tls_server_config.client_auth_type",
                format!("{other:?} is not one of NoClientCert, VerifyClientCertIfGiven, RequireAndVerifyClientCert"),
            ))
        }
    };
    let client_ca = tls.client_ca_file.filter(|p| !p.as_os_str().is_empty()).map(resolve);
    match (client_auth, &client_ca) {
        (ClientAuth::None, Some(_)) => {
            return Err((
                "tls_server_config.client_ca_file",
                "is set but client_auth_type asks for no client certificate".to_owned(),
            ))
        }
        (ClientAuth::VerifyIfGiven | ClientAuth::RequireAndVerify, None) => {
            return Err(("tls_server_config.client_ca_file", "is required to verify client certificates".to_owned()))
        }
        _ => {}
    }
    let version = |field: &'static str, value: Option<String>, default: TlsVersion| match value.as_deref() {
        None | Some("") => Ok(default),
        Some("TLS12") => Ok(TlsVersion::Tls12),
        Some("TLS13") => Ok(TlsVersion::Tls13),
        Some("TLS10" | "TLS11") => Err((field, "TLS 1.0 and 1.1 are not offered (TLS12 or TLS13)".to_owned())),
        Some(other) => Err((field, format!("{other:?} is not one of TLS12, TLS13"))),
    };
    let min_version = version("tls_server_config.min_version", tls.min_version, TlsVersion::Tls12)?;
    let max_version = version("tls_server_config.max_version", tls.max_version, TlsVersion::Tls13)?;
    if min_version > max_version {
        return Err(("tls_server_config.min_version", "is above max_version".to_owned()));
    }
    Ok(ServerTlsFiles { cert, key, client_ca, client_auth, min_version, max_version })
}

fn read_small(path: &Path) -> Result<String, String> {
    use std::io::Read as _;
    let file = std::fs::File::open(path).map_err(|e| format!("cannot read: {e}"))?;
    let mut text = String::new();
    file.take(MAX_FILE_BYTES + 1).read_to_string(&mut text).map_err(|e| format!("cannot read: {e}"))?;
    if text.len() as u64 > MAX_FILE_BYTES {
        return Err(format!("is larger than {MAX_FILE_BYTES} bytes"));
    }
    Ok(text)
}

/// A digest of what `files` hold now (a file that cannot be read counts as its error).
fn fingerprint(files: &[PathBuf]) -> [u8; 32] {
    let contents: Vec<Result<Vec<u8>, std::io::ErrorKind>> =
        files.iter().map(|f| std::fs::read(f).map_err(|e| e.kind())).collect();
    digest(contents.iter().map(|c| c.as_deref().map_err(|k| *k)))
}

/// A digest of files' contents, in order.
fn digest<'a>(contents: impl Iterator<Item = Result<&'a [u8], std::io::ErrorKind>>) -> [u8; 32] {
    let mut sha = Sha256::new();
    for content in contents {
        match content {
            Ok(bytes) => {
                sha.update([1]);
                sha.update((bytes.len() as u64).to_be_bytes());
                sha.update(bytes);
            }
            Err(kind) => {
                sha.update([0]);
                sha.update(kind.to_string().as_bytes());
            }
        }
    }
    sha.finalize().into()
}

/// The outcome of the last look at a changed web configuration, for the metrics.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ReloadOutcome {
    /// Whether the last change loaded (true before any change).
    pub successful: bool,
    /// When the configuration in force was loaded (Unix seconds).
    pub loaded_at: f64,
}

/// A web configuration in force, re-read when it or a file it names changes.
#[derive(Debug)]
pub struct WebConfigWatch {
    guards: watch::Receiver<Arc<Guard>>,
    outcome: watch::Receiver<ReloadOutcome>,
}

impl WebConfigWatch {
    /// Loads `path` (a problem refuses the start) and re-reads it every
    /// [`POLL_INTERVAL`] on a task until `shutdown`.
    pub fn start(path: &Path, shutdown: CancellationToken) -> Result<(Self, LoadedWebConfig), WebConfigError> {
        Self::start_every(path, POLL_INTERVAL, shutdown)
    }

    /// [`start`](Self::start) with another interval.
    pub fn start_every(
        path: &Path,
        interval: Duration,
        shutdown: CancellationToken,
    ) -> Result<(Self, LoadedWebConfig), WebConfigError> {
        let loaded = load(path)?;
        let (guard_tx, guards) = watch::channel(Arc::new(loaded.guard.clone()));
        let (outcome_tx, outcome) = watch::channel(ReloadOutcome { successful: true, loaded_at: unix_now() });
        let path = path.to_path_buf();
        let mut files = loaded.files.clone();
        let mut seen = loaded.fingerprint;
        let mut failed: Option<String> = None;
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(interval);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    () = shutdown.cancelled() => return,
                    _ = tick.tick() => {}
                }
                let watched = files.clone();
                let Ok(current) = tokio::task::spawn_blocking(move || fingerprint(&watched)).await else { continue };
                if current == seen {
                    if failed.take().is_some() {
                        // Put back as it was: what is in force is what the files say again.
                        tracing::info!(file = %path.display(), "web configuration files are back to the ones in force");
                        outcome_tx.send_modify(|o| o.successful = true);
                    }
                    continue;
                }
                let reading = path.clone();
                let Ok(reloaded) = tokio::task::spawn_blocking(move || load(&reading)).await else { continue };
                match reloaded {
                    Ok(next) => {
                        tracing::info!(file = %path.display(), in_force = %next.summary(), "web configuration reloaded");
                        files = next.files.clone();
                        seen = next.fingerprint;
                        failed = None;
                        guard_tx.send_replace(Arc::new(next.guard));
                        outcome_tx.send_replace(ReloadOutcome { successful: true, loaded_at: unix_now() });
                    }
                    Err(e) => {
                        // Tried again at every look (a file it names may appear), logged
                        // once per problem.
                        let message = e.to_string();
                        if failed.as_deref() != Some(message.as_str()) {
                            tracing::error!(error = %message, "web configuration not reloaded: the one in force is kept");
                            outcome_tx.send_modify(|o| o.successful = false);
                            failed = Some(message);
                        }
                    }
                }
            }
        });
        Ok((Self { guards, outcome }, loaded))
    }

    /// What the listener serves with: always the configuration in force.
    pub fn guards(&self) -> Guards {
        Guards::watching(self.guards.clone())
    }

    /// The outcome of the last reload, changed at each one.
    pub fn outcomes(&self) -> watch::Receiver<ReloadOutcome> {
        self.outcome.clone()
    }
}

fn unix_now() -> f64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The watcher compares what the files hold with what a load saw: the two digests
    /// must agree while nothing changes, or it would reload (and log) at every look.
    #[test]
    fn a_loaded_configuration_matches_its_unchanged_files() {
        let dir = tempfile::tempdir().unwrap();
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec!["localhost".to_owned()]).unwrap().self_signed(&key).unwrap();
        std::fs::write(dir.path().join("server.pem"), cert.pem()).unwrap();
        std::fs::write(dir.path().join("server.key"), key.serialize_pem()).unwrap();
        let hash = bcrypt::hash("x", 4).unwrap();
        let path = dir.path().join("web.yml");
        std::fs::write(
            &path,
            format!("tls_server_config:\n  cert_file: server.pem\n  key_file: server.key\nbasic_auth_users:\n  a: '{hash}'\n"),
        )
        .unwrap();
        let loaded = load(&path).unwrap();
        assert_eq!(loaded.files.len(), 3, "{:?}", loaded.files);
        assert_eq!(fingerprint(&loaded.files), loaded.fingerprint);
        assert_eq!(loaded.summary(), "TLS, basic authentication (1 user)");
        // A certificate rewritten: the digest moves.
        std::fs::write(dir.path().join("server.pem"), format!("{}\n", cert.pem())).unwrap();
        assert_ne!(fingerprint(&loaded.files), loaded.fingerprint);
    }

    #[test]
    fn a_refusal_names_the_file_and_the_field() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("web.yml");
        std::fs::write(&path, "tls_server_config:\n  key_file: k.pem\n").unwrap();
        let e = load(&path).unwrap_err();
        assert_eq!(e.field, Some("tls_server_config.cert_file"));
        assert!(e.to_string().starts_with(&format!("{}: tls_server_config.cert_file: ", path.display())), "{e}");
    }
}
