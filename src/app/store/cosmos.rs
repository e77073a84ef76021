//! The Cosmos DB store's flags (`--cosmos-*`, each also read from `LOCKPROBE_COSMOS_*`)
//! and their conversion into the store's validated [`CosmosConfig`].
//!
//! The flags are all optional to clap, so `--store memory` needs none of them;
//! [`CosmosArgs::to_config`] then refuses a missing or bad one with an error that names
//! the flag and its environment variable.

use std::time::Duration;

use azure_core::credentials::Secret;
use azure_core::http::Url;

use crate::store::cosmos::{is_local_emulator, ChangeStreamMode, CosmosAuth, CosmosConfig};

/// The Cosmos store's settings: the `--cosmos-*` flags (each also read from a
/// `LOCKPROBE_COSMOS_*` variable) and the `cosmos_*` keys of a `[monitor]` table are two
/// views of this one type (a table is read through the flags: see
/// [`crate::app::monitor::MonitorSection::from_table`]); [`CosmosArgs::to_config`]
/// validates it into the store's [`CosmosConfig`].
#[derive(Debug, Clone, PartialEq, clap::Args)]
pub struct CosmosArgs {
    /// Account endpoint, e.g. `https://myaccount.documents.azure.com:443/` (required with
    /// `--store cosmos`).
    #[arg(long = "cosmos-endpoint", env = "LOCKPROBE_COSMOS_ENDPOINT", value_name = "URL")]
    pub endpoint: Option<String>,

    /// How to authenticate: `key` (account key from --cosmos-key-env) or `entra`.
    #[arg(long = "cosmos-auth", env = "LOCKPROBE_COSMOS_AUTH", value_enum, default_value = "key")]
    pub auth: AuthKind,

    /// Name of the environment variable that holds the account key (never the key);
    /// required with `--store cosmos` and `--cosmos-auth key`.
    #[arg(long = "cosmos-key-env", env = "LOCKPROBE_COSMOS_KEY_ENV", value_name = "VAR")]
    pub key_env: Option<String>,

    /// With `--cosmos-auth entra`: `managed-identity` (system-assigned, or user-assigned
    /// with --cosmos-entra-client-id) or `workload-identity` (Kubernetes workload
    /// identity: AZURE_TENANT_ID, AZURE_CLIENT_ID, AZURE_FEDERATED_TOKEN_FILE).
    #[arg(
        long = "cosmos-entra-credential",
        env = "LOCKPROBE_COSMOS_ENTRA_CREDENTIAL",
        value_enum,
        default_value = "managed-identity"
    )]
    pub entra_credential: EntraCredentialKind,

    /// Client id of a user-assigned managed identity (with `managed-identity`).
    #[arg(long = "cosmos-entra-client-id", env = "LOCKPROBE_COSMOS_ENTRA_CLIENT_ID", value_name = "ID")]
    pub entra_client_id: Option<String>,

    /// Database name (required with `--store cosmos`).
    #[arg(long = "cosmos-database", env = "LOCKPROBE_COSMOS_DATABASE", value_name = "NAME")]
    pub database: Option<String>,

    /// Container name, partition key `/id` (required with `--store cosmos`).
    #[arg(long = "cosmos-container", env = "LOCKPROBE_COSMOS_CONTAINER", value_name = "NAME")]
    pub container: Option<String>,

    /// Region for replica reads, nearest first; repeat the flag (comma-separated in the
    /// environment variable, a list in a file).
    #[arg(
        long = "cosmos-preferred-region",
        env = "LOCKPROBE_COSMOS_PREFERRED_REGIONS",
        value_name = "REGION",
        value_delimiter = ','
    )]
    pub preferred_regions: Vec<String>,

    /// The write region you expect the account to have. Optional: the store discovers
    /// the write region from the account (and follows a failover); a mismatch with this
    /// is logged and exported as `lockprobe_cosmos_write_region_mismatch`.
    #[arg(long = "cosmos-write-region", env = "LOCKPROBE_COSMOS_WRITE_REGION", value_name = "REGION")]
    pub write_region: Option<String>,

    /// Create the database and container when they do not exist.
    #[arg(long = "cosmos-create-if-missing", env = "LOCKPROBE_COSMOS_CREATE_IF_MISSING")]
    pub create_if_missing: bool,

    /// Change stream source: `auto` (poll on a local emulator, change feed otherwise),
    /// `change-feed` or `poll`.
    #[arg(long = "cosmos-change-stream", env = "LOCKPROBE_COSMOS_CHANGE_STREAM", value_enum, default_value = "auto")]
    pub change_stream: ChangeStreamChoice,

    /// How often change-stream consumers poll when they are caught up.
    #[arg(long = "cosmos-poll-interval", env = "LOCKPROBE_COSMOS_POLL_INTERVAL", value_name = "DURATION", default_value = "1s", value_parser = crate::duration::parse_bounded_duration)]
    pub poll_interval: Duration,

    /// How far back the `_ts` poll re-reads, to catch writes that became visible after
    /// a later second was already read (whole seconds; `_ts` has one-second resolution).
    #[arg(long = "cosmos-poll-overlap", env = "LOCKPROBE_COSMOS_POLL_OVERLAP", value_name = "DURATION", default_value = "2s", value_parser = crate::duration::parse_bounded_duration)]
    pub poll_overlap: Duration,

    /// Upper bound on one store call, retries included; past it the call fails as
    /// unavailable.
    #[arg(long = "cosmos-request-timeout", env = "LOCKPROBE_COSMOS_REQUEST_TIMEOUT", value_name = "DURATION", default_value = "10s", value_parser = crate::duration::parse_bounded_duration)]
    pub request_timeout: Duration,

    /// How often the account's write region is looked up when nothing suggested that it
    /// moved (a write refused by a read region, or committed elsewhere, triggers a
    /// lookup at once).
    #[arg(long = "cosmos-region-refresh-interval", env = "LOCKPROBE_COSMOS_REGION_REFRESH_INTERVAL", value_name = "DURATION", default_value = "30s", value_parser = crate::duration::parse_bounded_duration)]
    pub region_refresh_interval: Duration,
}

impl Default for CosmosArgs {
    /// What the flags default to.
    fn default() -> Self {
        Self {
            endpoint: None,
            auth: AuthKind::Key,
            key_env: None,
            entra_credential: EntraCredentialKind::ManagedIdentity,
            entra_client_id: None,
            database: None,
            container: None,
            preferred_regions: Vec::new(),
            write_region: None,
            create_if_missing: false,
            change_stream: ChangeStreamChoice::Auto,
            poll_interval: Duration::from_secs(1),
            poll_overlap: Duration::from_secs(2),
            request_timeout: Duration::from_secs(10),
            region_refresh_interval: Duration::from_secs(30),
        }
    }
}

/// `--cosmos-auth`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum AuthKind {
    /// The account key, from the variable `--cosmos-key-env` names.
    Key,
    /// A Microsoft Entra ID token (`--cosmos-entra-credential`).
    Entra,
}

/// `--cosmos-entra-credential`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum EntraCredentialKind {
    /// A system-assigned managed identity, or a user-assigned one with
    /// `--cosmos-entra-client-id`.
    ManagedIdentity,
    /// Kubernetes workload identity.
    WorkloadIdentity,
}

/// `--cosmos-change-stream`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ChangeStreamChoice {
    /// The `_ts` poll on a local emulator, the change feed otherwise.
    Auto,
    /// Cosmos DB's change feed.
    ChangeFeed,
    /// A query on `_ts`.
    Poll,
}

/// A missing or invalid Cosmos setting; the message names the flag and variable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CosmosConfigError {
    /// A required setting was not given (the first; `others` are every other one that
    /// is missing too, so that one run names them all).
    #[error("missing setting {flag} (or environment variable {env}){}", also_missing(others))]
    Missing {
        /// The flag.
        flag: &'static str,
        /// Its environment variable.
        env: &'static str,
        /// The other required settings missing too, as (flag, variable).
        others: Vec<(&'static str, &'static str)>,
    },
    /// A setting has a value that cannot be used.
    #[error("invalid {flag}: {reason}")]
    Invalid {
        /// The flag.
        flag: &'static str,
        /// Why.
        reason: String,
    },
}

impl CosmosConfigError {
    /// The flag of the setting at fault, e.g. `--cosmos-endpoint`.
    pub fn flag(&self) -> &'static str {
        match self {
            Self::Missing { flag, .. } | Self::Invalid { flag, .. } => flag,
        }
    }

    /// Its key in a `[monitor]` table, e.g. `cosmos_endpoint`.
    pub fn key(&self) -> String {
        self.flag().trim_start_matches("--").replace('-', "_")
    }
}

const ENDPOINT: (&str, &str) = ("--cosmos-endpoint", "LOCKPROBE_COSMOS_ENDPOINT");
const KEY_ENV: (&str, &str) = ("--cosmos-key-env", "LOCKPROBE_COSMOS_KEY_ENV");
const DATABASE: (&str, &str) = ("--cosmos-database", "LOCKPROBE_COSMOS_DATABASE");
const CONTAINER: (&str, &str) = ("--cosmos-container", "LOCKPROBE_COSMOS_CONTAINER");

fn required(value: &Option<String>, (flag, env): (&'static str, &'static str)) -> Result<String, CosmosConfigError> {
    match value.as_deref().map(str::trim) {
        Some(v) if !v.is_empty() => Ok(v.to_owned()),
        _ => Err(CosmosConfigError::Missing { flag, env, others: Vec::new() }),
    }
}

/// The rest of a [`CosmosConfigError::Missing`] message: the other settings missing.
fn also_missing(others: &[(&'static str, &'static str)]) -> String {
    others.iter().map(|(flag, env)| format!(", and {flag} (or {env})")).collect()
}

impl CosmosArgs {
    /// Every required setting that is not given, in the order the flags are documented:
    /// the endpoint, the key variable (with `--cosmos-auth key`), the database and the
    /// container.
    fn missing(&self) -> Vec<(&'static str, &'static str)> {
        let given = |v: &Option<String>| v.as_deref().is_some_and(|v| !v.trim().is_empty());
        let mut missing = Vec::new();
        for (value, setting, needed) in [
            (&self.endpoint, ENDPOINT, true),
            (&self.key_env, KEY_ENV, self.auth == AuthKind::Key),
            (&self.database, DATABASE, true),
            (&self.container, CONTAINER, true),
        ] {
            if needed && !given(value) {
                missing.push(setting);
            }
        }
        missing
    }
}

/// The Entra ID token credential `--cosmos-entra-credential` names. Building it does no
/// I/O; tokens are fetched on the first store call.
fn entra_credential(
    args: &CosmosArgs,
) -> Result<std::sync::Arc<dyn azure_core::credentials::TokenCredential>, CosmosConfigError> {
    use azure_identity::{
        ManagedIdentityCredential, ManagedIdentityCredentialOptions, UserAssignedId, WorkloadIdentityCredential,
    };
    const FLAG: &str = "--cosmos-entra-credential";
    match args.entra_credential {
        EntraCredentialKind::ManagedIdentity => {
            let options = ManagedIdentityCredentialOptions {
                user_assigned_id: args
                    .entra_client_id
                    .clone()
                    .filter(|id| !id.is_empty())
                    .map(UserAssignedId::ClientId),
                ..Default::default()
            };
            let credential = ManagedIdentityCredential::new(Some(options))
                .map_err(|e| CosmosConfigError::Invalid { flag: FLAG, reason: format!("managed identity: {e}") })?;
            Ok(credential)
        }
        EntraCredentialKind::WorkloadIdentity => {
            let credential = WorkloadIdentityCredential::new(None).map_err(|e| CosmosConfigError::Invalid {
                flag: FLAG,
                reason: format!(
                    "workload identity needs AZURE_TENANT_ID, AZURE_CLIENT_ID and AZURE_FEDERATED_TOKEN_FILE \
                     (set by the Kubernetes workload identity webhook): {e}"
                ),
            })?;
            Ok(credential)
        }
    }
}

/// Account keys are base64; anything else fails later, at the first request, with an
/// obscure signing error.
fn looks_like_base64(key: &str) -> bool {
    let body = key.trim_end_matches('=');
    key.len().is_multiple_of(4)
        && key.len() - body.len() <= 2
        && body.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'+' || b == b'/')
}

impl CosmosArgs {
    /// The store's configuration, validated: the account key is read from the variable
    /// `--cosmos-key-env` names through `lookup_env` (so tests need not touch the process
    /// environment); a missing or bad setting is named with its flag and variable.
    pub fn to_config(&self, lookup_env: impl Fn(&str) -> Option<String>) -> Result<CosmosConfig, CosmosConfigError> {
        let args = self;
        let mut missing = args.missing().into_iter();
        if let Some((flag, env)) = missing.next() {
            return Err(CosmosConfigError::Missing { flag, env, others: missing.collect() });
        }
        let raw_endpoint = required(&args.endpoint, ENDPOINT)?;
        let endpoint = Url::parse(&raw_endpoint)
            .map_err(|e| CosmosConfigError::Invalid { flag: ENDPOINT.0, reason: format!("{raw_endpoint:?}: {e}") })?;
        match endpoint.scheme() {
            "https" => {}
            "http" if is_local_emulator(&endpoint) => {}
            other => {
                return Err(CosmosConfigError::Invalid {
                    flag: ENDPOINT.0,
                    reason: format!("scheme {other:?}: use https (http only for a local emulator on localhost)"),
                })
            }
        }
        let auth = match args.auth {
            AuthKind::Key => {
                let var = required(&args.key_env, KEY_ENV)?;
                let key = lookup_env(&var).filter(|k| !k.is_empty()).ok_or_else(|| CosmosConfigError::Invalid {
                    flag: KEY_ENV.0,
                    reason: format!("environment variable {var} is not set or empty"),
                })?;
                if !looks_like_base64(&key) {
                    return Err(CosmosConfigError::Invalid {
                        flag: KEY_ENV.0,
                        reason: format!("environment variable {var} does not hold a base64 account key"),
                    });
                }
                CosmosAuth::Key(Secret::new(key))
            }
            AuthKind::Entra => CosmosAuth::Entra(entra_credential(args)?),
        };
        let database = required(&args.database, DATABASE)?;
        let container = required(&args.container, CONTAINER)?;
        let write_region = args.write_region.as_deref().map(str::trim).filter(|r| !r.is_empty()).map(str::to_owned);
        let preferred_regions: Vec<String> =
            args.preferred_regions.iter().map(|r| r.trim().to_owned()).filter(|r| !r.is_empty()).collect();
        let change_stream = match args.change_stream {
            ChangeStreamChoice::Auto if is_local_emulator(&endpoint) => ChangeStreamMode::Poll,
            ChangeStreamChoice::Auto | ChangeStreamChoice::ChangeFeed => ChangeStreamMode::ChangeFeed,
            ChangeStreamChoice::Poll => ChangeStreamMode::Poll,
        };
        let (poll_interval, poll_overlap, request_timeout) =
            (args.poll_interval, args.poll_overlap, args.request_timeout);
        if poll_interval.is_zero() {
            return Err(CosmosConfigError::Invalid {
                flag: "--cosmos-poll-interval",
                reason: "must be positive".into(),
            });
        }
        if args.region_refresh_interval < Duration::from_secs(1) {
            return Err(CosmosConfigError::Invalid {
                flag: "--cosmos-region-refresh-interval",
                reason: "must be at least 1s".into(),
            });
        }
        if request_timeout < Duration::from_secs(1) {
            return Err(CosmosConfigError::Invalid {
                flag: "--cosmos-request-timeout",
                reason: "must be at least 1s (the SDK's smallest end-to-end timeout)".into(),
            });
        }
        Ok(CosmosConfig {
            endpoint,
            auth,
            database,
            container,
            preferred_regions,
            write_region,
            create_if_missing: args.create_if_missing,
            change_stream,
            poll_interval,
            poll_overlap,
            request_timeout,
            region_refresh_interval: args.region_refresh_interval,
            legacy_static_write_region: false,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args() -> CosmosArgs {
        CosmosArgs {
            endpoint: Some("https://acct.documents.azure.com:443/".into()),
            auth: AuthKind::Key,
            key_env: Some("MY_COSMOS_KEY".into()),
            entra_credential: EntraCredentialKind::ManagedIdentity,
            entra_client_id: None,
            database: Some("lockprobe".into()),
            container: Some("locations".into()),
            preferred_regions: vec!["North Europe".into(), " West Europe ".into()],
            write_region: Some("West Europe".into()),
            create_if_missing: false,
            change_stream: ChangeStreamChoice::Auto,
            poll_interval: Duration::from_secs(1),
            poll_overlap: Duration::from_secs(2),
            request_timeout: Duration::from_secs(10),
            region_refresh_interval: Duration::from_secs(30),
        }
    }

    fn env(name: &str) -> Option<String> {
        (name == "MY_COSMOS_KEY").then(|| "c2VjcmV0".to_owned())
    }

    #[test]
    fn a_full_configuration_validates() {
        let config = args().to_config(env).unwrap();
        assert_eq!(config.preferred_regions, ["North Europe", "West Europe"]);
        assert_eq!(config.change_stream, ChangeStreamMode::ChangeFeed);
        assert_eq!(config.request_timeout, Duration::from_secs(10));
        assert!(!format!("{config:?}").contains("c2VjcmV0"), "the key must not appear in Debug output");
    }

    #[test]
    fn each_missing_setting_is_named() {
        type Unset = fn(&mut CosmosArgs);
        let cases: [(Unset, &str); 4] = [
            (|a| a.endpoint = None, "--cosmos-endpoint"),
            (|a| a.key_env = None, "--cosmos-key-env"),
            (|a| a.database = Some(" ".into()), "--cosmos-database"),
            (|a| a.container = None, "--cosmos-container"),
        ];
        for (unset, flag) in cases {
            let mut a = args();
            unset(&mut a);
            let err = a.to_config(env).unwrap_err();
            assert!(err.to_string().contains(flag), "{err} should name {flag}");
            assert!(err.to_string().contains("LOCKPROBE_COSMOS_"), "{err} should name the variable");
        }
    }

    /// One run names every required setting that is missing, not one per attempt.
    #[test]
    fn every_missing_setting_is_named_at_once() {
        let none = CosmosArgs { endpoint: None, key_env: None, database: None, container: None, ..args() };
        let err = none.to_config(env).unwrap_err();
        assert_eq!(
            err.to_string(),
            "missing setting --cosmos-endpoint (or environment variable LOCKPROBE_COSMOS_ENDPOINT), \
             and --cosmos-key-env (or LOCKPROBE_COSMOS_KEY_ENV), and --cosmos-database (or LOCKPROBE_COSMOS_DATABASE), \
             and --cosmos-container (or LOCKPROBE_COSMOS_CONTAINER)"
        );
        assert_eq!((err.flag(), err.key()), ("--cosmos-endpoint", "cosmos_endpoint".to_owned()));
        // With Entra ID there is no key variable to name.
        let entra = CosmosArgs { auth: AuthKind::Entra, ..none };
        assert!(!entra.to_config(env).unwrap_err().to_string().contains("--cosmos-key-env"));
    }

    #[test]
    fn the_write_region_is_an_optional_expectation() {
        let mut a = args();
        a.write_region = None;
        assert_eq!(a.to_config(env).unwrap().write_region, None, "the store discovers it");
        a.write_region = Some(" ".into());
        assert_eq!(a.to_config(env).unwrap().write_region, None);
        assert_eq!(args().to_config(env).unwrap().write_region.as_deref(), Some("West Europe"));
        a.region_refresh_interval = Duration::from_millis(500);
        let err = a.to_config(env).unwrap_err().to_string();
        assert!(err.contains("--cosmos-region-refresh-interval"), "{err}");
    }

    #[test]
    fn an_unset_key_variable_is_named() {
        let err = args().to_config(|_| None).unwrap_err();
        assert!(err.to_string().contains("MY_COSMOS_KEY"), "{err}");
    }

    #[test]
    fn a_key_that_is_not_base64_is_refused_without_showing_it() {
        let err = args().to_config(|_| Some("not a key!".into())).unwrap_err();
        let message = err.to_string();
        assert!(message.contains("MY_COSMOS_KEY") && message.contains("base64"), "{message}");
        assert!(!message.contains("not a key!"), "the key must not be echoed: {message}");
        assert!(looks_like_base64(
            "C2y6yDjf5/R+ob0N8A7Cgv30VRDJIWEHLM+4QDU5DE2nQ9nDuVTqobD4b8mGGyPMbIZnqyMsEcaGQy67XIw/Jw=="
        ));
    }

    #[test]
    fn entra_builds_a_token_credential_and_names_bad_settings() {
        let mut a = args();
        a.auth = AuthKind::Entra;
        a.entra_credential = EntraCredentialKind::ManagedIdentity;
        let config = a.to_config(env).unwrap();
        assert!(matches!(config.auth, CosmosAuth::Entra(_)));
        assert_eq!(format!("{:?}", config.auth), "Entra(<token credential>)");
        a.entra_client_id = Some("00000000-0000-0000-0000-000000000001".into());
        assert!(matches!(a.to_config(env).unwrap().auth, CosmosAuth::Entra(_)));
        a.entra_credential = EntraCredentialKind::WorkloadIdentity;
        // Without the workload identity webhook's variables the credential cannot be built.
        if std::env::var_os("AZURE_FEDERATED_TOKEN_FILE").is_none() {
            let err = a.to_config(env).unwrap_err().to_string();
            assert!(err.contains("--cosmos-entra-credential") && err.contains("AZURE_FEDERATED_TOKEN_FILE"), "{err}");
        }
    }

    #[test]
    fn plain_http_is_refused_except_on_loopback_where_auto_means_poll() {
        let mut a = args();
        a.endpoint = Some("http://acct.documents.azure.com/".into());
        assert!(a.to_config(env).unwrap_err().to_string().contains("--cosmos-endpoint"));
        a.endpoint = Some("http://127.0.0.1:8081/".into());
        let config = a.to_config(env).unwrap();
        assert_eq!(config.change_stream, ChangeStreamMode::Poll);
        a.change_stream = ChangeStreamChoice::ChangeFeed;
        assert_eq!(a.to_config(env).unwrap().change_stream, ChangeStreamMode::ChangeFeed);
    }

    #[test]
    fn bad_durations_name_their_flag() {
        let mut a = args();
        a.request_timeout = Duration::from_millis(500);
        assert!(a.to_config(env).unwrap_err().to_string().contains("--cosmos-request-timeout"));
        a.request_timeout = Duration::from_secs(10);
        a.poll_interval = Duration::ZERO;
        assert!(a.to_config(env).unwrap_err().to_string().contains("--cosmos-poll-interval"));
        #[derive(Debug, clap::Parser)]
        struct Cli {
            #[command(flatten)]
            cosmos: CosmosArgs,
        }
        let err = <Cli as clap::Parser>::try_parse_from(["lockprobe", "--cosmos-request-timeout", "500000years"])
            .unwrap_err();
        assert!(err.to_string().contains("--cosmos-request-timeout") && err.to_string().contains("10years"), "{err}");
        let err =
            <Cli as clap::Parser>::try_parse_from(["lockprobe", "--cosmos-entra-credential", "password"]).unwrap_err();
        assert!(err.to_string().contains("--cosmos-entra-credential") && err.to_string().contains("password"), "{err}");
    }

    /// The refusals name flags and variables as text; each must be a real one, so a
    /// renamed flag cannot leave its error naming the old one.
    #[test]
    fn refusals_name_real_flags_and_their_variables() {
        let command = <CosmosArgs as clap::Args>::augment_args(clap::Command::new("cosmos"));
        let variable_of = |flag: &str| {
            let arg = command
                .get_arguments()
                .find(|a| a.get_long() == Some(flag.trim_start_matches("--")))
                .unwrap_or_else(|| panic!("{flag} is not a flag"));
            arg.get_env().map(|v| v.to_string_lossy().into_owned())
        };
        for (flag, env) in [ENDPOINT, KEY_ENV, DATABASE, CONTAINER] {
            assert_eq!(variable_of(flag).as_deref(), Some(env), "{flag}");
        }
        let source = include_str!("cosmos.rs");
        let named: std::collections::BTreeSet<&str> = source
            .split("flag: \"")
            .skip(1)
            .chain(source.split("const FLAG: &str = \"").skip(1))
            .filter_map(|rest| rest.split('"').next())
            .collect();
        assert!(named.len() >= 4, "{named:?}");
        for flag in named {
            variable_of(flag);
        }
    }

    /// What code builds with `CosmosArgs::default()` is what the flags default to.
    #[test]
    fn the_flags_default_to_the_defaults() {
        // No test sets a LOCKPROBE_COSMOS_* variable in this process.
        let command = <CosmosArgs as clap::Args>::augment_args(clap::Command::new("cosmos").no_binary_name(true));
        let matches = command.try_get_matches_from(Vec::<String>::new()).unwrap();
        let parsed = <CosmosArgs as clap::FromArgMatches>::from_arg_matches(&matches).unwrap();
        assert_eq!(parsed, CosmosArgs::default());
    }

    #[test]
    fn flags_parse_with_clap() {
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            cosmos: CosmosArgs,
        }
        let cli = <Cli as clap::Parser>::try_parse_from([
            "lockprobe",
            "--cosmos-endpoint",
            "https://a.documents.azure.com/",
            "--cosmos-preferred-region",
            "North Europe",
            "--cosmos-preferred-region",
            "West Europe",
            "--cosmos-create-if-missing",
        ])
        .unwrap();
        assert_eq!(cli.cosmos.preferred_regions, ["North Europe", "West Europe"]);
        assert!(cli.cosmos.create_if_missing);
    }
}
