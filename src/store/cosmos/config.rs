//! Settings of the Cosmos DB store: the validated [`CosmosConfig`] the store is opened
//! with. The command line and configuration files that produce it live with the wiring
//! (`app::store`), so the store knows no flags.

use std::fmt;
use std::time::Duration;

use azure_core::credentials::Secret;
use azure_core::http::Url;

/// Where the change stream comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChangeStreamMode {
    /// Cosmos DB's change feed (latest version of each document), resumed from a
    /// continuation token.
    ChangeFeed,
    /// A cross-partition query on `_ts` (id as tiebreak): for servers whose change
    /// feed is missing or a stub, such as the local test server.
    Poll,
}

/// How the store authenticates.
#[derive(Clone)]
pub enum CosmosAuth {
    /// An account key.
    Key(Secret),
    /// A Microsoft Entra ID token credential, supplied by the embedding program.
    Entra(std::sync::Arc<dyn azure_core::credentials::TokenCredential>),
}

impl fmt::Debug for CosmosAuth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CosmosAuth::Key(_) => f.write_str("Key(<redacted>)"),
            CosmosAuth::Entra(_) => f.write_str("Entra(<token credential>)"),
        }
    }
}

/// A validated Cosmos store configuration.
#[derive(Debug, Clone)]
pub struct CosmosConfig {
    /// Account endpoint.
    pub endpoint: Url,
    /// Credentials.
    pub auth: CosmosAuth,
    /// Database name.
    pub database: String,
    /// Container name (partition key `/id`).
    pub container: String,
    /// Regions for replica reads, nearest first (the write region is used when empty).
    pub preferred_regions: Vec<String>,
    /// The write region the operator expects. Not the source of truth: the store
    /// discovers the write region from the account and reports a mismatch.
    pub write_region: Option<String>,
    /// Create the database and container when missing.
    pub create_if_missing: bool,
    /// Change stream source.
    pub change_stream: ChangeStreamMode,
    /// Poll interval for change-stream consumers.
    pub poll_interval: Duration,
    /// How far back the `_ts` poll re-reads.
    pub poll_overlap: Duration,
    /// Upper bound on one store call, retries included.
    pub request_timeout: Duration,
    /// How often the account's write region is looked up again when nothing suggested
    /// that it moved.
    pub region_refresh_interval: Duration,
    /// The behaviour before the write region was discovered, kept so tests can show
    /// what discovery fixes: the write region is `write_region` (then required), never
    /// looked up, never followed across a failover. Not reachable from the flags.
    pub legacy_static_write_region: bool,
}

/// True for hosts the SDK treats as a local emulator (and the test server runs on).
pub fn is_local_emulator(endpoint: &Url) -> bool {
    matches!(endpoint.host_str(), Some("localhost" | "127.0.0.1" | "[::1]" | "::1"))
}

impl CosmosConfig {
    /// Whether the endpoint is a local emulator (loopback host): the SDK then needs
    /// HTTP/1.1 and text JSON, see `docs/cosmos.md`.
    pub fn is_local_emulator(&self) -> bool {
        is_local_emulator(&self.endpoint)
    }
}
