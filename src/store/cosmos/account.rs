//! The account document (`GET` at the endpoint root): where the store learns which
//! region takes writes now.
//!
//! The SDK reads the same document and follows it for writes, but keeps what it read to
//! itself (its account cache is a test-only API in 1.1.0-beta.1), so the store reads it
//! again with its own signed request: master-key HMAC (`type=master`) or an Entra token
//! (`type=aad`), the two ways the store authenticates. See `docs/cosmos-regions.md`.

use azure_core::http::Url;
use azure_data_cosmos::options::Region;
use chrono::Utc;
use serde_json::Value;

use super::config::{CosmosAuth, CosmosConfig};

/// The REST API version the account read asks for.
const API_VERSION: &str = "2018-12-31";
/// The scope of an Entra token for Cosmos DB data-plane calls.
const ENTRA_SCOPE: &str = "https://cosmos.azure.com/.default";

/// What the account document says about regions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AccountTopology {
    /// The region that takes writes now (the first writable location).
    pub write_region: Region,
    /// Every readable region, in the account's order.
    pub readable_regions: Vec<Region>,
    /// The document's `_etag`: it changes with the topology.
    pub etag: Option<String>,
}

/// Reads the account document of one endpoint.
#[derive(Debug, Clone)]
pub struct AccountReader {
    http: reqwest::Client,
    endpoint: Url,
    auth: CosmosAuth,
}

impl AccountReader {
    /// A reader for the account `config` names; each read is bounded by the request
    /// timeout, as every store call is.
    pub fn new(config: &CosmosConfig) -> Result<Self, String> {
        let mut http = reqwest::Client::builder().timeout(config.request_timeout);
        if config.is_local_emulator() {
            // As the SDK does for loopback hosts only: the local server's certificate is
            // self-signed.
            http = http.tls_danger_accept_invalid_certs(true);
        }
        let http = http.build().map_err(|e| format!("cannot build the account reader: {e}"))?;
        Ok(Self { http, endpoint: config.endpoint.clone(), auth: config.auth.clone() })
    }

    /// Reads the account document and returns its regions. A read that failed before
    /// an answer came is tried once more (it is an idempotent GET, and a pooled
    /// connection the server had just closed fails that way).
    pub async fn read(&self) -> Result<AccountTopology, String> {
        match self.read_once().await {
            Err(ReadError::Transport(_)) => {
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                self.read_once().await.map_err(ReadError::into_message)
            }
            other => other.map_err(ReadError::into_message),
        }
    }

    async fn read_once(&self) -> Result<AccountTopology, ReadError> {
        let date = Utc::now().format("%a, %d %b %Y %H:%M:%S GMT").to_string();
        let authorization = self.authorization(&date).await.map_err(ReadError::Other)?;
        let response = self
            .http
            .get(self.endpoint.clone())
            .header("x-ms-date", &date)
            .header("x-ms-version", API_VERSION)
            .header("authorization", authorization)
            .header("accept", "application/json")
            .send()
            .await
            .map_err(|e| ReadError::Transport(format!("account read failed: {}", error_chain(&e))))?;
        let status = response.status();
        if !status.is_success() {
            let sub = response.headers().get("x-ms-substatus").and_then(|v| v.to_str().ok()).unwrap_or("");
            let sub = if sub.is_empty() { String::new() } else { format!("/{sub}") };
            return Err(ReadError::Other(format!("account read answered {}{sub}", status.as_u16())));
        }
        let body: Value =
            response.json().await.map_err(|e| ReadError::Other(format!("account document is not JSON: {e}")))?;
        topology(&body).map_err(ReadError::Other)
    }

    async fn authorization(&self, date: &str) -> Result<String, String> {
        let token = match &self.auth {
            CosmosAuth::Key(key) => {
                let signature = azure_core::hmac::hmac_sha256(&string_to_sign(date), key)
                    .map_err(|e| format!("cannot sign the account read: {e}"))?;
                format!("type=master&ver=1.0&sig={signature}")
            }
            CosmosAuth::Entra(credential) => {
                let token = credential
                    .get_token(&[ENTRA_SCOPE], None)
                    .await
                    .map_err(|e| format!("cannot get an Entra token for the account read: {e}"))?;
                format!("type=aad&ver=1.0&sig={}", token.token.secret())
            }
        };
        Ok(form_encode(&token))
    }
}

enum ReadError {
    /// No answer came.
    Transport(String),
    /// An answer that is not an account document, or no request could be made.
    Other(String),
}

impl ReadError {
    fn into_message(self) -> String {
        match self {
            ReadError::Transport(m) | ReadError::Other(m) => m,
        }
    }
}

/// An error and its causes, `: `-separated (reqwest's own message hides the cause).
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        out.push_str(": ");
        out.push_str(&c.to_string());
        cause = c.source();
    }
    out
}

/// The master-key string to sign for a read of the account itself: verb, empty
/// resource type, empty resource link, lowercased date, and an empty line.
fn string_to_sign(date: &str) -> String {
    format!("get\n\n\n{}\n\n", date.to_ascii_lowercase())
}

/// `application/x-www-form-urlencoded` encoding, as the `authorization` header needs.
fn form_encode(value: &str) -> String {
    let mut out = String::with_capacity(value.len() + 16);
    for byte in value.bytes() {
        match byte {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'*' => out.push(char::from(byte)),
            b' ' => out.push('+'),
            other => out.push_str(&format!("%{other:02X}")),
        }
    }
    out
}

/// The regions an account document lists.
pub fn topology(body: &Value) -> Result<AccountTopology, String> {
    let names = |field: &str| -> Vec<Region> {
        body.get(field)
            .and_then(Value::as_array)
            .map(|locations| {
                locations
                    .iter()
                    .filter_map(|l| l.get("name").and_then(Value::as_str))
                    .map(|name| Region::new(name.to_owned()))
                    .collect()
            })
            .unwrap_or_default()
    };
    let write_region = names("writableLocations")
        .into_iter()
        .next()
        .ok_or_else(|| "the account document lists no writable location".to_owned())?;
    Ok(AccountTopology {
        write_region,
        readable_regions: names("readableLocations"),
        etag: body.get("_etag").and_then(Value::as_str).map(str::to_owned),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_first_writable_location_is_the_write_region() {
        let body = json!({
            "_etag": "\"7\"",
            "writableLocations": [{"name": "North Europe", "databaseAccountEndpoint": "https://n/"}],
            "readableLocations": [
                {"name": "North Europe", "databaseAccountEndpoint": "https://n/"},
                {"name": "West Europe", "databaseAccountEndpoint": "https://w/"}
            ],
            "enableMultipleWriteLocations": false
        });
        let topology = topology(&body).unwrap();
        assert_eq!(topology.write_region, Region::NORTH_EUROPE);
        assert_eq!(topology.readable_regions, [Region::NORTH_EUROPE, Region::WEST_EUROPE]);
        assert_eq!(topology.etag.as_deref(), Some("\"7\""));
        assert!(super::topology(&json!({"writableLocations": []})).is_err(), "no write region is an error");
        assert!(super::topology(&json!({})).is_err());
    }

    #[test]
    fn the_master_key_signature_covers_verb_and_lowercased_date() {
        assert_eq!(string_to_sign("Tue, 01 Dec 2026 19:00:00 GMT"), "get\n\n\ntue, 01 dec 2026 19:00:00 gmt\n\n");
        // The signature's base64 '+', '/' and '=' must survive the header.
        assert_eq!(form_encode("type=master&ver=1.0&sig=a+b/c="), "type%3Dmaster%26ver%3D1.0%26sig%3Da%2Bb%2Fc%3D");
    }

    #[test]
    fn the_signature_is_hmac_sha256_of_the_payload_under_the_decoded_key() {
        // RFC 4231 test case 2: key "Jefe", data "what do ya want for nothing?".
        let key = azure_core::credentials::Secret::new("SmVmZQ==");
        let signature = azure_core::hmac::hmac_sha256("what do ya want for nothing?", &key).unwrap();
        let expected = "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843";
        assert_eq!(signature, hex_to_base64(expected));
    }

    fn hex_to_base64(hex: &str) -> String {
        let bytes: Vec<u8> =
            (0..hex.len()).step_by(2).map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap()).collect();
        azure_core::base64::encode(bytes)
    }
}
