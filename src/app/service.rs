//! `lockprobe service`: runs the reference service from the command line.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::listen::ListenArgs;
use super::store::{OpenStoreError, StoreArgs};
use crate::app::usage::UsageError;
use crate::clock::{Clock, SystemClock};
use crate::document::{FORMAT_1, NEWEST_FORMAT};
use crate::listener::tls::{server_config, ServerTlsFile, ServerTlsFiles};
use crate::service::admin_api::{check_principal_name, AdminPrincipal};
use crate::service::{start, ClockSkew, Fault, LockDesign, ServiceConfig};
use crate::store::counting::CountingStore;
use crate::store::faults::{FaultRule, FaultyStore};
use crate::store::LocationStore;
use tokio_rustls::rustls::ServerConfig;

/// Environment variable holding the lock API key (kept out of argv and process lists).
pub const API_KEY_ENV: &str = "LOCKPROBE_LOCK_API_KEY";

/// Flags of `lockprobe service`.
#[derive(Debug, Clone, clap::Args)]
pub struct ServiceArgs {
    /// Address of instance 0; instance i listens on this port + i (port 0: any free port).
    #[arg(long, default_value = "127.0.0.1:8080")]
    pub listen: SocketAddr,
    /// Number of instances (each with its own cache tiers) over one shared store.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=64))]
    pub instances: u16,
    /// Location where new resources are created.
    #[arg(long, default_value = "westeurope")]
    pub home_location: String,
    /// TTL of one cache tier; repeat the flag for several tiers, fastest first.
    #[arg(long = "cache-ttl", value_parser = crate::duration::parse_bounded_duration, default_values = ["2s"])]
    pub cache_ttls: Vec<Duration>,
    /// Replication bound of the routing store (the in-memory store's replicas lag by it).
    #[arg(long, value_parser = crate::duration::parse_bounded_duration, default_value = "1s")]
    pub replication_bound: Duration,
    /// Accept lock calls only for resource ids with this prefix.
    #[arg(long)]
    pub test_prefix: Option<String>,
    /// Longest pre-lock the service grants, renewals included.
    #[arg(long = "max-prelock", value_parser = crate::duration::parse_bounded_duration, default_value = "48h")]
    pub max_pre_lock: Duration,
    /// Largest accepted request body, in bytes.
    #[arg(long, default_value_t = 64 * 1024)]
    pub max_body_bytes: usize,
    /// Clock difference tolerated between instances and the store: restrictions start
    /// this much after convergence and end this much after the lease, by each clock.
    #[arg(long, value_parser = crate::duration::parse_bounded_duration, default_value = "500ms")]
    pub skew_margin: Duration,
    /// The oldest routing decision acted on: a store read slower than this is refused
    /// (503) rather than enforced, and a swap copies data only this long (plus the
    /// skew margin) after the write lock began.
    #[arg(long, value_parser = crate::duration::parse_bounded_duration, default_value = "1s")]
    pub max_decision_age: Duration,
    /// Deliberately break the contract, to test a probe (repeatable).
    #[arg(long = "fault", value_enum)]
    pub faults: Vec<Fault>,
    /// Set one instance's clock off by OFFSET (`INSTANCE=OFFSET`, e.g. `1=+2s`, `0=-500ms`;
    /// repeatable), to rehearse clock skew against --skew-margin.
    #[arg(long = "clock-skew", value_name = "INSTANCE=OFFSET")]
    pub clock_skews: Vec<ClockSkew>,
    /// Inject a routing-store fault, to rehearse a failure (repeatable), e.g.
    /// `replace:late-commit=3s,timeout=2s`, `writes:ambiguous@0.1`, `reads:delay=500ms x3`,
    /// `read_replica:replica-lag=5s`; the grammar is in `docs/faults.md`.
    #[arg(long = "store-fault", value_name = "RULE")]
    pub store_faults: Vec<FaultRule>,
    /// Seed of the store faults' probability draws (the same seed and call order give the
    /// same faults).
    #[arg(long, default_value_t = 0)]
    pub store_fault_seed: u64,
    /// Serve HTTPS with this PEM certificate chain (needs --tls-key).
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of --tls-cert.
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// Require every client to present a certificate chaining to this PEM CA bundle
    /// (mutual TLS; needs --tls-cert).
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    pub tls_client_ca: Option<PathBuf>,
    /// Where locks live: `embedded` in the routing document (cached with it), or
    /// `record`, a separate lock record per resource read from the write region on every
    /// user operation (the lock-table baseline `lockprobe bench` compares against).
    #[arg(long, value_enum, default_value_t = LockDesign::Embedded)]
    pub lock_design: LockDesign,
    /// The newest document format written: 1 is the expand step of a rollout while
    /// instances that read only format 1 remain (writes settled at their decision;
    /// docs/release-gate.md, "Rolling out a new document format").
    #[arg(long, value_name = "FORMAT", default_value_t = NEWEST_FORMAT,
          value_parser = clap::value_parser!(u64).range(FORMAT_1..=NEWEST_FORMAT))]
    pub write_format: u64,
    /// An admin principal who may request or approve force-releases, and the file holding
    /// its key (`NAME=PATH`, repeatable; one file per principal, a key of at least 16
    /// printable characters). Without any, the admin routes refuse everyone.
    #[arg(long = "admin-key-file", value_name = "NAME=PATH")]
    pub admin_key_files: Vec<String>,
    /// Scope an admin principal to resource ids starting with PREFIX (`NAME=PREFIX`,
    /// repeatable); a principal never named here may act on every resource.
    #[arg(long = "admin-prefix", value_name = "NAME=PREFIX")]
    pub admin_prefixes: Vec<String>,
    /// How long a force-release request waits for a second principal's approval.
    #[arg(long, value_parser = crate::duration::parse_bounded_duration, default_value = "1h")]
    pub force_release_window: Duration,
    /// Routing store selection (--store memory|cosmos and the --cosmos-* flags).
    #[command(flatten)]
    pub store: StoreArgs,
    /// Each instance's listener bounds (its body limit is --max-body-bytes).
    #[command(flatten)]
    pub bounds: ListenArgs,
}

impl ServiceArgs {
    /// The service settings these flags describe, with the key from the environment.
    pub fn to_config(&self, api_key: Option<String>) -> Result<ServiceConfig, UsageError> {
        let api_key = api_key
            .filter(|k| !k.is_empty())
            .ok_or_else(|| UsageError::new(format!("{API_KEY_ENV} is not set: the lock API needs a key")))?;
        let config = ServiceConfig {
            home_location: self.home_location.clone(),
            cache_ttls: self.cache_ttls.clone(),
            replication_bound: self.replication_bound,
            test_prefix: self.test_prefix.clone(),
            max_pre_lock: self.max_pre_lock,
            max_body_bytes: self.max_body_bytes,
            skew_margin: self.skew_margin,
            max_decision_age: self.max_decision_age,
            faults: self.faults.clone(),
            clock_skews: self.clock_skews.clone(),
            tls: self.tls()?,
            lock_design: self.lock_design,
            write_format: self.write_format,
            limits: self.bounds.limits()?,
            admin_principals: self.admin_principals()?,
            force_release_window: self.force_release_window,
            ..ServiceConfig::new(api_key)
        };
        if let Some(skew) = self.clock_skews.iter().find(|s| s.instance >= usize::from(self.instances)) {
            return Err(UsageError::new(format!("--clock-skew {skew}: --instances is {}", self.instances)));
        }
        config.validate().map_err(|e| UsageError::new(e.to_string()))?;
        Ok(config)
    }

    /// The admin principals `--admin-key-file` and `--admin-prefix` describe, each key
    /// read from its file (trailing whitespace dropped); a problem names the flag.
    fn admin_principals(&self) -> Result<Vec<AdminPrincipal>, UsageError> {
        let split = |flag: &str, text: &str| -> Result<(String, String), UsageError> {
            let (name, value) = text
                .split_once('=')
                .filter(|(name, value)| !name.is_empty() && !value.is_empty())
                .ok_or_else(|| UsageError::new(format!("{flag} {text:?}: expected NAME=VALUE")))?;
            check_principal_name(name).map_err(|e| UsageError::new(format!("{flag} {text:?}: {e}")))?;
            Ok((name.to_owned(), value.to_owned()))
        };
        let mut principals: Vec<AdminPrincipal> = Vec::new();
        for text in &self.admin_key_files {
            let (name, path) = split("--admin-key-file", text)?;
            let key = std::fs::read_to_string(&path)
                .map_err(|e| UsageError::new(format!("--admin-key-file {name}: cannot read {path}: {e}")))?;
            principals.push(AdminPrincipal { name, key: key.trim_end().to_owned(), prefixes: Vec::new() });
        }
        for text in &self.admin_prefixes {
            let (name, prefix) = split("--admin-prefix", text)?;
            let principal = principals.iter_mut().find(|p| p.name == name).ok_or_else(|| {
                UsageError::new(format!("--admin-prefix {text:?}: no --admin-key-file names principal {name:?}"))
            })?;
            principal.prefixes.push(prefix);
        }
        Ok(principals)
    }

    /// The HTTPS configuration the `--tls-*` flags describe, if any; a problem names the
    /// flag and the file.
    fn tls(&self) -> Result<Option<Arc<ServerConfig>>, UsageError> {
        let (Some(cert), Some(key)) = (&self.tls_cert, &self.tls_key) else {
            return match (&self.tls_cert, &self.tls_key, &self.tls_client_ca) {
                (None, None, None) => Ok(None),
                _ => Err(UsageError::new("--tls-cert and --tls-key go together (and --tls-client-ca needs them)")),
            };
        };
        let files = ServerTlsFiles::new(cert.clone(), key.clone(), self.tls_client_ca.clone());
        let config = server_config(&files).map_err(|e| {
            let flag = match e.file {
                ServerTlsFile::Cert => "--tls-cert",
                ServerTlsFile::Key => "--tls-key",
                ServerTlsFile::ClientCa => "--tls-client-ca",
            };
            UsageError::new(format!("{flag} {e}"))
        })?;
        Ok(Some(config))
    }

    /// Listen addresses, one per instance.
    pub fn listen_addrs(&self) -> Result<Vec<SocketAddr>, UsageError> {
        (0..self.instances)
            .map(|i| {
                if self.listen.port() == 0 {
                    return Ok(self.listen);
                }
                let port = self
                    .listen
                    .port()
                    .checked_add(i)
                    .ok_or_else(|| UsageError::new("--listen port + --instances exceeds 65535"))?;
                Ok(SocketAddr::new(self.listen.ip(), port))
            })
            .collect()
    }
}

/// `store` behind a [`FaultyStore`] when fault rules are given, announced loudly.
fn with_store_faults(
    store: Arc<dyn LocationStore>,
    clock: Arc<dyn Clock>,
    rules: &[FaultRule],
    seed: u64,
) -> Arc<dyn LocationStore> {
    if rules.is_empty() {
        return store;
    }
    let faulty = FaultyStore::new(store, clock, seed);
    for rule in rules {
        tracing::warn!(%rule, seed, "STORE FAULT INJECTION ON: the routing store misbehaves as this rule says");
        faulty.add_rule(rule.clone());
    }
    Arc::new(faulty)
}

/// Runs the service until `shutdown` fires.
pub async fn run(args: ServiceArgs, shutdown: CancellationToken) -> anyhow::Result<()> {
    let config = args.to_config(std::env::var(API_KEY_ENV).ok())?;
    let addrs = args.listen_addrs()?;
    let clock = Arc::new(SystemClock);
    // Validate every setting before connecting anywhere, so bad input exits 64 at once.
    args.store.validate().map_err(|e| UsageError::new(e.to_string()))?;
    let registry = prometheus::Registry::new();
    let store = args
        .store
        .open(clock.clone(), config.replication_bound, &registry)
        .await
        .map_err(OpenStoreError::into_anyhow)?;
    let store = with_store_faults(store, clock.clone(), &args.store_faults, args.store_fault_seed);
    // The store's own counts of calls per document kind, on /metrics: what each lock
    // design costs in reads.
    let counting = CountingStore::new(store);
    counting.register(&registry)?;
    let store: Arc<dyn LocationStore> = Arc::new(counting);
    let config = ServiceConfig { metrics: Some(registry), ..config };
    let declared = config.declared_convergence();
    let admins = config.admin_principals.iter().map(|p| p.name.as_str()).collect::<Vec<_>>().join(", ");
    let scheme = if config.tls.is_some() { "https" } else { "http" };
    let running = start(config, store, clock, addrs, shutdown).await?;
    for (i, addr) in running.addrs.iter().enumerate() {
        println!("lockprobe service: instance {i} listening on {scheme}://{addr}");
    }
    println!("lockprobe service: declared convergence delay {}", humantime::format_duration(declared));
    println!("lockprobe service: lock design {}", args.lock_design);
    match admins.as_str() {
        "" => println!("lockprobe service: admin routes off (no --admin-key-file)"),
        names => println!("lockprobe service: admin principals {names} (force-release needs two)"),
    }
    if args.write_format < NEWEST_FORMAT {
        println!(
            "lockprobe service: writing document format {} only (a rollout's expand step: locks take effect \
             from their decision, not their commit)",
            args.write_format
        );
    }
    running.wait().await;
    Ok(())
}
