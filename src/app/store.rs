//! `--store memory|cosmos`: the flags `lockprobe service`, `demo` and `monitor` flatten
//! to choose their routing store, and the one function that opens it. The store layer
//! knows no flags: [`cosmos::CosmosArgs`] turns into its validated `CosmosConfig` here.

pub mod cosmos;

use std::sync::Arc;
use std::time::Duration;

use prometheus::Registry;

pub use cosmos::{CosmosArgs, CosmosConfigError};

use crate::app::usage::UsageError;
use crate::clock::Clock;
use crate::store::cosmos::{CosmosConfig, CosmosStore, CosmosStoreError};
use crate::store::memory::{MemoryStore, MemoryStoreConfig};
use crate::store::LocationStore;

/// Which routing store to run on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum StoreKind {
    /// In process memory (the embedded default; replicas lag by the replication bound).
    Memory,
    /// Azure Cosmos DB (the `--cosmos-*` flags).
    Cosmos,
}

/// Store selection: the `--store` and `--cosmos-*` flags, or the `store` and
/// `cosmos_*` keys of a `[monitor]` table.
#[derive(Debug, Clone, PartialEq, clap::Args)]
pub struct StoreArgs {
    /// Routing store: memory (embedded) or cosmos (Azure Cosmos DB, see --cosmos-*).
    #[arg(long = "store", env = "LOCKPROBE_STORE", value_enum, default_value = "memory")]
    pub kind: StoreKind,
    /// Cosmos DB settings (used with --store cosmos).
    #[command(flatten)]
    pub cosmos: CosmosArgs,
}

/// Why the chosen store could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum OpenStoreError {
    /// A missing or bad setting (a usage error: exit 64).
    #[error(transparent)]
    Config(#[from] CosmosConfigError),
    /// The store could not be reached or set up.
    #[error(transparent)]
    Open(#[from] CosmosStoreError),
}

impl OpenStoreError {
    /// For `main`: configuration problems become [`UsageError`] (exit code 64).
    pub fn into_anyhow(self) -> anyhow::Error {
        match self {
            OpenStoreError::Config(e) => UsageError::new(e.to_string()).into(),
            other => other.into(),
        }
    }
}

impl StoreArgs {
    /// Validates the settings of the chosen store without connecting (for
    /// `check-config` and early exit-64 errors).
    pub fn validate(&self) -> Result<Option<CosmosConfig>, CosmosConfigError> {
        match self.kind {
            StoreKind::Memory => Ok(None),
            StoreKind::Cosmos => self.cosmos.to_config(|name| std::env::var(name).ok()).map(Some),
        }
    }

    /// Opens the chosen store. `replica_lag` is the in-memory store's simulated
    /// replication bound; the Cosmos store registers its metrics on `registry`.
    pub async fn open(
        &self,
        clock: Arc<dyn Clock>,
        replica_lag: Duration,
        registry: &Registry,
    ) -> Result<Arc<dyn LocationStore>, OpenStoreError> {
        match self.validate()? {
            None => {
                Ok(Arc::new(MemoryStore::new(clock, MemoryStoreConfig { replica_lag, ..MemoryStoreConfig::default() })))
            }
            Some(config) => Ok(Arc::new(CosmosStore::connect(config, registry).await?)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::SystemClock;

    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        store: StoreArgs,
    }

    fn parse(args: &[&str]) -> StoreArgs {
        let argv = std::iter::once("lockprobe").chain(args.iter().copied());
        <Cli as clap::Parser>::try_parse_from(argv).unwrap().store
    }

    #[tokio::test]
    async fn memory_needs_no_cosmos_settings() {
        let args = StoreArgs { kind: StoreKind::Memory, cosmos: CosmosArgs::default() };
        let store = args.open(Arc::new(SystemClock), Duration::ZERO, &Registry::new()).await.unwrap();
        assert!(format!("{store:?}").contains("MemoryStore"));
    }

    #[tokio::test]
    async fn cosmos_without_an_endpoint_is_a_usage_error_naming_the_flag() {
        let mut args = parse(&["--store", "cosmos"]);
        args.cosmos.endpoint = None; // in case the environment sets it
        let err = args.open(Arc::new(SystemClock), Duration::ZERO, &Registry::new()).await.unwrap_err();
        assert!(err.to_string().contains("--cosmos-endpoint"), "{err}");
        let err = err.into_anyhow();
        assert_eq!(crate::app::usage::exit_code(&err), crate::app::usage::EXIT_USAGE);
    }
}
