//! Starts the real reference service in-process on loopback for probe tests.

#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use lockprobe::clock::{Clock, SystemClock};
use lockprobe::probe::{Leases, ProbeSettings};
use lockprobe::service::AdminPrincipal;
use lockprobe::service::{start, Fault, LockDesign, ServiceConfig};
use lockprobe::store::memory::{MemoryStore, MemoryStoreConfig};
use lockprobe::store::LocationStore;
use lockprobe::testing::FaultyStore;
use tokio_util::sync::CancellationToken;

/// A running two-instance reference service; stops when dropped.
pub struct TestService {
    /// Base URLs of the instances.
    pub urls: Vec<String>,
    /// Lock API key.
    pub key: String,
    /// The service's cache TTL (one tier).
    pub cache_ttl: Duration,
    /// Its store's replication bound.
    pub replication_bound: Duration,
    /// The key files of its two admin principals (`probe-requester`, then
    /// `probe-approver`), both scoped to the test prefix.
    pub admin_key_files: [std::path::PathBuf; 2],
    /// Holds the key files.
    _admin_dir: Arc<tempfile::TempDir>,
    stop: CancellationToken,
}

impl TestService {
    /// Both admin principals' keys, as a probe target's settings take them.
    pub fn admin_keys(&self) -> lockprobe::probe::AdminKeys {
        let [requester, approver] =
            self.admin_key_files.clone().map(|f| std::fs::read_to_string(f).unwrap().trim().to_owned());
        lockprobe::probe::AdminKeys { requester, approver }
    }

    /// `GET .../lock/force-release` on instance 0 as the requesting principal: the lock
    /// as the store has it (not a cache), and the requests kept.
    pub async fn admin_view(&self, resource: &str) -> serde_json::Value {
        reqwest::Client::new()
            .get(format!("{}/v1/resources/{resource}/lock/force-release", self.urls[0]))
            .bearer_auth(self.admin_keys().requester)
            .send()
            .await
            .expect("the admin view is reachable")
            .json()
            .await
            .expect("the admin view is JSON")
    }

    /// The `validate` flags that give it both admin principals' keys.
    pub fn admin_flags(&self) -> Vec<String> {
        self.admin_key_files.iter().flat_map(|f| ["--admin-key-file".to_owned(), f.display().to_string()]).collect()
    }

    /// Probe settings for a target `name` (locking as `owner`) against this service: its
    /// declared convergence (cache TTL + replication bound), a 300 ms buffer, leases long enough for a seconds-scale
    /// cycle and a 1 s short write lease for the lease-lapse check.
    pub fn probe_settings(&self, name: &str, owner: &str) -> ProbeSettings {
        ProbeSettings {
            name: name.into(),
            instances: self.urls.clone(),
            api_key: self.key.clone(),
            tls: Default::default(),
            test_prefix: "probe-".into(),
            locations: ["westeurope".into(), "northeurope".into()],
            expected_convergence: Some(self.cache_ttl + self.replication_bound),
            replication_bound: self.replication_bound,
            buffer: Duration::from_millis(300),
            leases: Leases {
                pre_lock: Duration::from_secs(120),
                hard_delete: Duration::from_secs(60),
                write: Duration::from_secs(60),
                short_write: Duration::from_secs(1),
            },
            request_timeout: Duration::from_secs(5),
            poll_interval: Duration::from_millis(50),
            concurrent_pre_locks: 3,
            owner: owner.into(),
            eager: false,
            force_release: None,
            max_inconclusive: lockprobe::probe::DEFAULT_MAX_INCONCLUSIVE,
            clock: std::sync::Arc::new(lockprobe::clock::SystemClock),
        }
    }
}

impl Drop for TestService {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// Starts the service with `faults`, one cache tier of `cache_ttl` and a store whose
/// replicas lag by `replication_bound`.
pub async fn start_service(faults: Vec<Fault>, cache_ttl: Duration, replication_bound: Duration) -> TestService {
    start_service_with_store_faults(faults, cache_ttl, replication_bound, &[]).await.0
}

/// [`start_service`] over a store behind the given store-fault rules (the grammar of
/// `lockprobe service --store-fault`), also returning that store so a test can tell
/// when a fault has struck.
pub async fn start_service_with_store_faults(
    faults: Vec<Fault>,
    cache_ttl: Duration,
    replication_bound: Duration,
    store_faults: &[&str],
) -> (TestService, Arc<FaultyStore>) {
    let (service, _, faulty) =
        start_service_with(LockDesign::Embedded, faults, cache_ttl, replication_bound, store_faults, system()).await;
    (service, faulty)
}

/// [`start_service`] on `clock`: every instance and the store read it (a test moves it).
pub async fn start_service_on_clock(
    clock: Arc<dyn Clock>,
    cache_ttl: Duration,
    replication_bound: Duration,
) -> TestService {
    start_service_with(LockDesign::Embedded, Vec::new(), cache_ttl, replication_bound, &[], clock).await.0
}

fn system() -> Arc<dyn Clock> {
    Arc::new(SystemClock)
}

/// [`start_service_with_store_faults`], also returning the memory store under the
/// service, for tests that count what the service committed (its change stream).
pub async fn start_service_keeping_store(
    faults: Vec<Fault>,
    cache_ttl: Duration,
    replication_bound: Duration,
    store_faults: &[&str],
) -> (TestService, Arc<MemoryStore>) {
    let (service, kept, _) =
        start_service_with(LockDesign::Embedded, faults, cache_ttl, replication_bound, store_faults, system()).await;
    (service, kept)
}

/// [`start_service`] with locks where `design` keeps them.
pub async fn start_service_with_design(
    design: LockDesign,
    cache_ttl: Duration,
    replication_bound: Duration,
) -> TestService {
    start_service_with(design, Vec::new(), cache_ttl, replication_bound, &[], system()).await.0
}

async fn start_service_with(
    design: LockDesign,
    faults: Vec<Fault>,
    cache_ttl: Duration,
    replication_bound: Duration,
    store_faults: &[&str],
    clock: Arc<dyn Clock>,
) -> (TestService, Arc<MemoryStore>, Arc<FaultyStore>) {
    let key = format!("test-key-{}", std::process::id());
    let kept = Arc::new(MemoryStore::new(
        clock.clone(),
        MemoryStoreConfig { replica_lag: replication_bound, ..MemoryStoreConfig::default() },
    ));
    let memory: Arc<dyn LocationStore> = kept.clone();
    let faulty = Arc::new(FaultyStore::new(memory, clock.clone(), 0));
    for rule in store_faults {
        faulty.add_rule(rule.parse().expect("a valid store-fault rule"));
    }
    let store: Arc<dyn LocationStore> = faulty.clone();
    let admin_dir = Arc::new(tempfile::tempdir().expect("a temporary directory"));
    let mut admin_principals = Vec::new();
    let mut admin_key_files = Vec::new();
    for name in ["probe-requester", "probe-approver"] {
        let admin_key = format!("{name}-key-{}-{}", std::process::id(), rand_suffix());
        let file = admin_dir.path().join(name);
        std::fs::write(&file, format!("{admin_key}\n")).expect("the key file is written");
        admin_principals.push(AdminPrincipal { name: name.into(), key: admin_key, prefixes: vec!["probe-".into()] });
        admin_key_files.push(file);
    }
    let admin_key_files: [std::path::PathBuf; 2] = admin_key_files.try_into().expect("two key files");
    let config = ServiceConfig {
        admin_principals,
        cache_ttls: vec![cache_ttl],
        replication_bound,
        test_prefix: Some("probe-".into()),
        faults,
        lock_design: design,
        ..ServiceConfig::new(key.clone())
    };
    let stop = CancellationToken::new();
    let any = SocketAddr::from(([127, 0, 0, 1], 0));
    let running = start(config, store, clock, vec![any, any], stop.clone()).await.expect("service starts");
    let urls = running.addrs.iter().map(|a| format!("http://{a}")).collect();
    // The service tasks stop when `stop` fires; nothing needs to wait for them here.
    std::mem::forget(running);
    (
        TestService { urls, key, cache_ttl, replication_bound, admin_key_files, _admin_dir: admin_dir, stop },
        kept,
        faulty,
    )
}

/// A few random digits, so two services' admin keys never match.
fn rand_suffix() -> u32 {
    rand::random()
}

/// The route view of `resource` on `url`.
pub async fn route(url: &str, resource: &str) -> serde_json::Value {
    reqwest::get(format!("{url}/v1/resources/{resource}/route"))
        .await
        .expect("route view reachable")
        .json()
        .await
        .expect("route view is JSON")
}
