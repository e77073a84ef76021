//! Starts the local Cosmos DB-compatible test server (`scripts/cosmos/launcher.js`
//! around the pinned `@vercel/cosmosdb-server`) on a free loopback port, and builds
//! Cosmos stores against it. The server is killed when its guard drops; it also exits
//! by itself when the test process goes away (it watches its stdin).
//!
//! [`CosmosServer::start`] serves one region; [`CosmosServer::start_two_regions`] serves
//! one account in two regions, with a replication lag and failovers the test controls
//! ([`CosmosRegions`], docs/cosmos-regions.md).
//!
//! Missing node or a missing `npm ci` is a test failure with the command to run, never
//! a skip: `scripts/setup-cosmos.sh` installs the server.

#![allow(dead_code)] // each test crate uses a different part of this module

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::time::Duration;

use lockprobe::app::store::cosmos::{AuthKind, ChangeStreamChoice, EntraCredentialKind};
use lockprobe::app::store::CosmosArgs;
use lockprobe::store::cosmos::{CosmosConfig, CosmosStore};
use prometheus::Registry;

const KEY_ENV: &str = "LOCKPROBE_TEST_COSMOS_KEY";

/// A running test server; killed on drop.
#[derive(Debug)]
pub struct CosmosServer {
    process: Launcher,
    port: u16,
}

fn scripts_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("scripts").join("cosmos")
}

/// The launcher's node process: killed (and waited for) on drop. It also exits by
/// itself when its stdin closes, that is when the test process goes away.
#[derive(Debug)]
struct Launcher {
    child: Option<Child>,
    _stdin: Option<ChildStdin>,
}

impl Launcher {
    /// Runs `launcher.js` with `args` and returns it with the first line it printed
    /// (its readiness report).
    fn spawn(args: &[&str]) -> (Self, String) {
        let dir = scripts_dir();
        let package = dir.join("node_modules").join("@vercel").join("cosmosdb-server");
        assert!(
            package.is_dir(),
            "the local Cosmos test server is not installed ({} is missing): run scripts/setup-cosmos.sh",
            package.display()
        );
        let node = std::env::var("LOCKPROBE_NODE").unwrap_or_else(|_| "node".into());
        let mut child = Command::new(&node)
            .arg(dir.join("launcher.js"))
            .args(args)
            .current_dir(&dir)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|e| {
                panic!("cannot run {node:?} for the local Cosmos test server ({e}): install Node.js 18+ and run scripts/setup-cosmos.sh")
            });
        let stdout = child.stdout.take().expect("stdout is piped");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = BufReader::new(stdout).read_line(&mut line);
            let _ = tx.send(line);
        });
        let line = match rx.recv_timeout(Duration::from_secs(20)) {
            Ok(line) => line,
            Err(_) => {
                let _ = child.kill();
                panic!("the local Cosmos test server did not report its port within 20s");
            }
        };
        let stdin = child.stdin.take();
        (Self { child: Some(child), _stdin: stdin }, line)
    }

    /// Panics with what the launcher said and how it exited.
    fn failed(&mut self, line: &str) -> ! {
        let status = self.child.as_mut().and_then(|c| c.wait().ok());
        panic!("the local Cosmos test server failed to start (said {line:?}, exit {status:?})")
    }

    fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Launcher {
    fn drop(&mut self) {
        self.stop();
    }
}

impl CosmosServer {
    /// Starts a server on a free loopback port: the server binds port 0 and reports
    /// the port it got, so no other process can take it in between.
    pub fn start() -> Self {
        let (mut process, line) = Launcher::spawn(&["--host", "127.0.0.1", "--port", "0"]);
        let Some(port) = line.strip_prefix("LISTENING ").and_then(|p| p.trim().parse().ok()) else {
            process.failed(&line)
        };
        Self { process, port }
    }

    /// Starts the two-region launcher: one account whose write region is
    /// [`WRITE_REGION`] and whose read region is [`READ_REGION`], each on its own free
    /// loopback port, the read region `lag` behind. See [`CosmosRegions`].
    pub fn start_two_regions(lag: Duration) -> CosmosRegions {
        CosmosRegions::start(&[WRITE_REGION, READ_REGION], lag)
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The account endpoint.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}/", self.port)
    }

    /// Kills the server and waits for it to exit. Idempotent.
    pub fn stop(&mut self) {
        self.process.stop();
    }

    /// Writes `doc` exactly as given (create or replace; no SDK and no checks, the
    /// server checks no auth) into `container` of `database`: for documents this
    /// library would never write. Panics unless the server took it.
    pub async fn upsert_raw(&self, database: &str, container: &str, doc: &serde_json::Value) {
        let id = doc["id"].as_str().expect("a document has a string id");
        let url = format!("{}dbs/{database}/colls/{container}/docs", self.endpoint());
        let answer = reqwest::Client::new()
            .post(&url)
            .header("x-ms-documentdb-is-upsert", "true")
            .header("x-ms-documentdb-partitionkey", serde_json::json!([id]).to_string())
            .header("content-type", "application/json")
            .body(doc.to_string())
            .send()
            .await
            .unwrap_or_else(|e| panic!("{url}: {e}"));
        assert!(answer.status().is_success(), "upsert of {id}: {}", answer.status());
    }
}

/// A fresh database name, so tests sharing a server do not see each other's documents.
pub fn unique_database(prefix: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!("{prefix}-{}-{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed))
}

/// Flags as an operator would pass them, for a store on `endpoint`.
pub fn test_args(endpoint: &str, database: &str) -> CosmosArgs {
    CosmosArgs {
        endpoint: Some(endpoint.to_owned()),
        auth: AuthKind::Key,
        key_env: Some(KEY_ENV.into()),
        entra_credential: EntraCredentialKind::ManagedIdentity,
        entra_client_id: None,
        database: Some(database.to_owned()),
        container: Some("locations".into()),
        // The local server's only region.
        preferred_regions: vec!["South Central US".into()],
        write_region: Some("South Central US".into()),
        create_if_missing: true,
        change_stream: ChangeStreamChoice::Auto,
        poll_interval: Duration::from_millis(100),
        poll_overlap: Duration::from_secs(2),
        request_timeout: Duration::from_secs(3),
        region_refresh_interval: Duration::from_secs(30),
    }
}

/// [`test_args`] as command-line flags (`--store cosmos` and the `--cosmos-*` flags a
/// fresh database on `endpoint` needs), the account key read from `key_env`.
pub fn cli_args(endpoint: &str, database: &str, key_env: &str) -> Vec<String> {
    [
        "--store",
        "cosmos",
        "--cosmos-endpoint",
        endpoint,
        "--cosmos-key-env",
        key_env,
        "--cosmos-database",
        database,
        "--cosmos-container",
        "locations",
        "--cosmos-create-if-missing",
        // The local server's only region.
        "--cosmos-write-region",
        "South Central US",
        "--cosmos-preferred-region",
        "South Central US",
    ]
    .map(str::to_owned)
    .to_vec()
}

/// Validates `args` the way `lockprobe` does, with a dummy key (the server checks none).
pub fn config_from(args: &CosmosArgs) -> CosmosConfig {
    args.to_config(|name| (name == KEY_ENV).then(|| "bG9ja3Byb2Jl".to_owned())).expect("test cosmos settings are valid")
}

/// Connects a store to a fresh database on `endpoint` (change stream: `auto`, which is
/// the `_ts` poll on loopback).
pub async fn connect(endpoint: &str, registry: &Registry) -> CosmosStore {
    connect_with(endpoint, registry, |_| {}).await
}

/// Like [`connect`], after `adjust` has changed the flags.
pub async fn connect_with(endpoint: &str, registry: &Registry, adjust: impl FnOnce(&mut CosmosArgs)) -> CosmosStore {
    let mut args = test_args(endpoint, &unique_database("lockprobe"));
    adjust(&mut args);
    CosmosStore::connect(config_from(&args), registry).await.expect("connects to the local cosmos server")
}

// --- two regions ---------------------------------------------------------------------

/// The write region [`CosmosServer::start_two_regions`] starts with.
pub const WRITE_REGION: &str = "West Europe";
/// The read region [`CosmosServer::start_two_regions`] starts with.
pub const READ_REGION: &str = "North Europe";

/// How a failover is made (see docs/cosmos-regions.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failover {
    /// The old write region stops taking writes at once; the switch waits until the
    /// new write region has applied every pending write. Nothing is lost.
    Planned,
    /// The switch happens at once; writes the new write region had not applied are
    /// lost, and every other region is re-seeded from the new write region.
    Forced,
}

impl Failover {
    fn as_str(self) -> &'static str {
        match self {
            Failover::Planned => "planned",
            Failover::Forced => "forced",
        }
    }
}

/// The two-region launcher's `GET /_lockprobe/status`.
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RegionsStatus {
    /// The current write region.
    pub write_region: String,
    /// A planned failover still waiting for replication (`{mode, from, to, startedAt}`).
    pub switching: Option<serde_json::Value>,
    /// The replication lag now in force.
    pub replication_lag_ms: u64,
    /// How many document writes the write regions have committed so far.
    pub committed_seq: u64,
    /// Every region, in the order given at start.
    pub regions: Vec<RegionStatus>,
    /// Document writes not yet applied in some region (at most 200 listed).
    pub pending: Vec<ReplicatedWrite>,
    /// Every failover made, oldest first.
    pub failovers: Vec<FailoverRecord>,
    /// Writes lost by forced failovers (committed in the old write region, never
    /// applied in the new one).
    pub lost_writes: Vec<ReplicatedWrite>,
    /// Writes the launcher committed but does not replicate (user-defined functions).
    pub not_replicated: u64,
}

impl RegionsStatus {
    /// The status of region `name`.
    pub fn region(&self, name: &str) -> &RegionStatus {
        self.regions.iter().find(|r| r.name == name).unwrap_or_else(|| panic!("no region {name} in {self:?}"))
    }
}

/// One region in [`RegionsStatus`].
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RegionStatus {
    /// Its name, as given at start.
    pub name: String,
    /// Its endpoint.
    pub endpoint: String,
    /// `write` or `read`.
    pub role: String,
    /// Whether a write sent there now would be taken (false in every region while a
    /// planned failover waits).
    pub accepts_writes: bool,
    /// Document writes waiting to be applied there.
    pub pending: usize,
    /// Document writes applied there by the replicator.
    pub applied: u64,
    /// The commit sequence number of the last write applied there.
    pub applied_seq: u64,
    /// Replicated writes dropped because their container was gone.
    pub skipped: u64,
}

/// A document write on its way to a region (pending), or lost.
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReplicatedWrite {
    /// Commit sequence number (account-wide, in commit order).
    pub seq: u64,
    /// `create`, `upsert`, `replace`, `patch` or `delete`.
    pub op: String,
    /// The write region that committed it.
    pub from: String,
    /// The region it is (or was) on its way to.
    pub to: String,
    /// Database id.
    pub db: String,
    /// Container id.
    pub coll: String,
    /// Document id.
    pub id: String,
    /// The `_etag` it committed with (none for a delete).
    pub etag: Option<String>,
    /// The `_ts` it committed with (none for a delete).
    pub ts: Option<i64>,
    /// When it committed (RFC 3339).
    pub committed_at: String,
    /// When it is applied at the lag now in force (RFC 3339).
    pub due_at: String,
}

/// One failover, as the launcher made it.
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FailoverRecord {
    /// `planned` or `forced`.
    pub mode: String,
    /// The old write region.
    pub from: String,
    /// The new write region.
    pub to: String,
    /// How long the switch took (a planned failover waits for replication).
    pub took_ms: u64,
    /// How many committed writes it lost (always 0 for a planned failover).
    pub lost_writes: usize,
}

#[derive(serde::Deserialize)]
struct FailoverAnswer {
    failover: FailoverRecord,
}

/// A raw answer of one region, for tests that talk HTTP to a region directly.
#[derive(Debug, Clone)]
pub struct RawResponse {
    /// HTTP status.
    pub status: u16,
    /// `x-ms-substatus`, if any.
    pub sub_status: Option<u16>,
    /// The JSON body (`Null` if there was none or it was not JSON).
    pub body: serde_json::Value,
}

/// A running two-region test account (`launcher.js --regions ...`): one Cosmos
/// account, one loopback endpoint per region, each region with its own copy of the
/// data, and a control endpoint that sets the replication lag and makes failovers.
/// Killed on drop.
#[derive(Debug)]
pub struct CosmosRegions {
    process: Launcher,
    regions: Vec<(String, u16)>,
    control: u16,
    http: reqwest::Client,
}

#[derive(serde::Deserialize)]
struct Ready {
    control: u16,
    regions: Vec<ReadyRegion>,
}

#[derive(serde::Deserialize)]
struct ReadyRegion {
    name: String,
    port: u16,
}

impl CosmosRegions {
    /// Starts one account over `regions` (the first is the write region), each on a
    /// free loopback port, replicas `lag` behind.
    pub fn start(regions: &[&str], lag: Duration) -> Self {
        let names = regions.join(",");
        let lag = format!("{}ms", lag.as_millis());
        let (mut process, line) =
            Launcher::spawn(&["--host", "127.0.0.1", "--regions", &names, "--replication-lag", &lag]);
        let Some(ready) = line.strip_prefix("READY ").and_then(|json| serde_json::from_str::<Ready>(json).ok()) else {
            process.failed(&line)
        };
        Self {
            process,
            regions: ready.regions.into_iter().map(|r| (r.name, r.port)).collect(),
            control: ready.control,
            http: reqwest::Client::new(),
        }
    }

    /// The region names, in the order given at start.
    pub fn regions(&self) -> Vec<&str> {
        self.regions.iter().map(|(name, _)| name.as_str()).collect()
    }

    /// The port region `name` listens on.
    pub fn port(&self, region: &str) -> u16 {
        self.regions
            .iter()
            .find(|(name, _)| name == region)
            .map(|(_, port)| *port)
            .unwrap_or_else(|| panic!("no region {region:?}; regions: {:?}", self.regions()))
    }

    /// The endpoint of region `name`.
    pub fn endpoint(&self, region: &str) -> String {
        format!("http://127.0.0.1:{}/", self.port(region))
    }

    /// The control port (never called by the SDK).
    pub fn control_port(&self) -> u16 {
        self.control
    }

    async fn control(&self, method: reqwest::Method, path_and_query: &str) -> serde_json::Value {
        let url = format!("http://127.0.0.1:{}/_lockprobe/{path_and_query}", self.control);
        let response = self.http.request(method, &url).send().await.unwrap_or_else(|e| panic!("{url}: {e}"));
        let status = response.status();
        let body: serde_json::Value = response.json().await.unwrap_or_else(|e| panic!("{url}: {e}"));
        assert!(status.is_success(), "{url} answered {status}: {body}");
        body
    }

    /// The launcher's status: write region, lag, pending writes, failovers, lost writes.
    pub async fn status(&self) -> RegionsStatus {
        serde_json::from_value(self.control(reqwest::Method::GET, "status").await).expect("status parses")
    }

    /// Sets the replication lag, at once: every pending write is then due at its
    /// commit time + `lag`.
    pub async fn set_lag(&self, lag: Duration) -> RegionsStatus {
        let body = self.control(reqwest::Method::POST, &format!("lag?ms={}", lag.as_millis())).await;
        serde_json::from_value(body).expect("status parses")
    }

    /// Fails over to the next region (of two: the other one). Returns once the new
    /// write region takes writes.
    pub async fn failover(&self, mode: Failover) -> FailoverRecord {
        let body = self.control(reqwest::Method::POST, &format!("failover?mode={}", mode.as_str())).await;
        serde_json::from_value::<FailoverAnswer>(body).expect("failover answer parses").failover
    }

    /// Fails over to region `to`.
    pub async fn failover_to(&self, mode: Failover, to: &str) -> FailoverRecord {
        let to: String = to
            .bytes()
            .map(|b| if b.is_ascii_alphanumeric() { (b as char).to_string() } else { format!("%{b:02X}") })
            .collect();
        let body = self.control(reqwest::Method::POST, &format!("failover?mode={}&to={to}", mode.as_str())).await;
        serde_json::from_value::<FailoverAnswer>(body).expect("failover answer parses").failover
    }

    /// Waits until no region has a pending write (or panics after `timeout`).
    pub async fn wait_replicated(&self, timeout: Duration) -> RegionsStatus {
        let started = std::time::Instant::now();
        loop {
            let status = self.status().await;
            if status.regions.iter().all(|r| r.pending == 0) {
                return status;
            }
            assert!(started.elapsed() < timeout, "replication did not catch up within {timeout:?}: {status:?}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Sends one raw request to region `region` (no SDK, no auth: the server checks
    /// none). `path` is like `dbs/d/colls/c/docs/id`; `partition_key` becomes the
    /// `x-ms-documentdb-partitionkey` header.
    pub async fn raw(
        &self,
        region: &str,
        method: reqwest::Method,
        path: &str,
        partition_key: Option<&str>,
        body: Option<&serde_json::Value>,
    ) -> RawResponse {
        self.raw_with(region, method, path, partition_key, body, &[]).await
    }

    /// Like [`CosmosRegions::raw`], with extra request headers.
    pub async fn raw_with(
        &self,
        region: &str,
        method: reqwest::Method,
        path: &str,
        partition_key: Option<&str>,
        body: Option<&serde_json::Value>,
        headers: &[(&str, &str)],
    ) -> RawResponse {
        let url = format!("{}{path}", self.endpoint(region));
        let mut request = self.http.request(method, &url);
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        if let Some(key) = partition_key {
            request = request.header("x-ms-documentdb-partitionkey", serde_json::json!([key]).to_string());
        }
        if let Some(body) = body {
            if !headers.iter().any(|(name, _)| name.eq_ignore_ascii_case("content-type")) {
                request = request.header("content-type", "application/json");
            }
            request = request.body(body.to_string());
        }
        let response = request.send().await.unwrap_or_else(|e| panic!("{url}: {e}"));
        let status = response.status().as_u16();
        let sub_status =
            response.headers().get("x-ms-substatus").and_then(|v| v.to_str().ok()).and_then(|v| v.parse().ok());
        let text = response.text().await.unwrap_or_default();
        RawResponse { status, sub_status, body: serde_json::from_str(&text).unwrap_or(serde_json::Value::Null) }
    }

    /// The account document (`GET /`) as region `region` serves it.
    pub async fn account_document(&self, region: &str) -> serde_json::Value {
        let answer = self.raw(region, reqwest::Method::GET, "", None, None).await;
        assert_eq!(answer.status, 200, "GET / on {region}: {answer:?}");
        answer.body
    }

    /// Reads document `id` (partition key `/id`) from region `region`.
    pub async fn read_document(&self, region: &str, database: &str, container: &str, id: &str) -> RawResponse {
        self.raw(region, reqwest::Method::GET, &format!("dbs/{database}/colls/{container}/docs/{id}"), Some(id), None)
            .await
    }

    /// Creates document `doc` (partition key `/id`) through region `region`.
    pub async fn create_document(
        &self,
        region: &str,
        database: &str,
        container: &str,
        doc: &serde_json::Value,
    ) -> RawResponse {
        let id = doc["id"].as_str().expect("a document has a string id");
        self.raw(region, reqwest::Method::POST, &format!("dbs/{database}/colls/{container}/docs"), Some(id), Some(doc))
            .await
    }

    /// Upserts document `doc` (partition key `/id`) through region `region`.
    pub async fn upsert_document(
        &self,
        region: &str,
        database: &str,
        container: &str,
        doc: &serde_json::Value,
    ) -> RawResponse {
        let id = doc["id"].as_str().expect("a document has a string id");
        let path = format!("dbs/{database}/colls/{container}/docs");
        self.raw_with(
            region,
            reqwest::Method::POST,
            &path,
            Some(id),
            Some(doc),
            &[("x-ms-documentdb-is-upsert", "true")],
        )
        .await
    }

    /// Runs a cross-partition query in region `region`; the rows are in
    /// `body["Documents"]`.
    pub async fn query_documents(&self, region: &str, database: &str, container: &str, query: &str) -> RawResponse {
        let path = format!("dbs/{database}/colls/{container}/docs");
        let body = serde_json::json!({"query": query, "parameters": []});
        let headers = [("x-ms-documentdb-isquery", "true"), ("content-type", "application/query+json")];
        self.raw_with(region, reqwest::Method::POST, &path, None, Some(&body), &headers).await
    }

    /// Creates database `database` and container `container` (partition key `/id`)
    /// through region `region`, panicking unless both were created.
    pub async fn create_container(&self, region: &str, database: &str, container: &str) {
        let db = self.raw(region, reqwest::Method::POST, "dbs", None, Some(&serde_json::json!({"id": database}))).await;
        assert_eq!(db.status, 201, "create database {database} in {region}: {db:?}");
        let body = serde_json::json!({"id": container, "partitionKey": {"paths": ["/id"], "kind": "Hash"}});
        let coll = self.raw(region, reqwest::Method::POST, &format!("dbs/{database}/colls"), None, Some(&body)).await;
        assert_eq!(coll.status, 201, "create container {database}/{container} in {region}: {coll:?}");
    }

    /// Kills the launcher and waits for it to exit. Idempotent.
    pub fn stop(&mut self) {
        self.process.stop();
    }
}

/// Flags for a store on the two-region account as a service in the read region
/// would run it: the account endpoint is the write region's, `--cosmos-write-region`
/// names the write region at start (a static setting: see
/// `tests/cosmos_regions.rs` for what that does after a failover), and replica reads
/// prefer the read region.
pub fn two_region_args(regions: &CosmosRegions, database: &str) -> CosmosArgs {
    let names = regions.regions();
    let mut args = test_args(&regions.endpoint(names[0]), database);
    args.write_region = Some(names[0].to_owned());
    args.preferred_regions = names.iter().skip(1).chain(names.first()).map(|r| r.to_string()).collect();
    args
}
