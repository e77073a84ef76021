//! Starts the local Cosmos DB-compatible test server (`scripts/cosmos/launcher.js`
//! around the pinned `@vercel/cosmosdb-server`) on a free loopback port, and builds
//! Cosmos stores against it. The server is killed when its guard drops; it also exits
//! by itself when the test process goes away (it watches its stdin).
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
    child: Option<Child>,
    _stdin: Option<ChildStdin>,
    port: u16,
}

fn scripts_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("scripts").join("cosmos")
}

impl CosmosServer {
    /// Starts a server on a free loopback port: the server binds port 0 and reports
    /// the port it got, so no other process can take it in between.
    pub fn start() -> Self {
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
            .args(["--host", "127.0.0.1", "--port", "0"])
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
        let port = line
            .strip_prefix("LISTENING ")
            .and_then(|p| p.trim().parse().ok())
            .unwrap_or_else(|| {
                let status = child.wait().ok();
                panic!("the local Cosmos test server failed to start (said {line:?}, exit {status:?})")
            });
        let stdin = child.stdin.take();
        Self { child: Some(child), _stdin: stdin, port }
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
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for CosmosServer {
    fn drop(&mut self) {
        self.stop();
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
    }
}

/// Validates `args` the way `lockprobe` does, with a dummy key (the server checks none).
pub fn config_from(args: &CosmosArgs) -> CosmosConfig {
    args.to_config(|name| (name == KEY_ENV).then(|| "bG9ja3Byb2Jl".to_owned()))
        .expect("test cosmos settings are valid")
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
