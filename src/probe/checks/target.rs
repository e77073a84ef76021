//! HTTP client for the probe contract (see `docs/architecture.md`). The probe's only way to
//! reach a service: it shares no code with the routing library it judges.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::credentials::TargetTls;
use super::vocabulary::Outcome;

/// A request that never produced an HTTP status, or one the probe refused to send.
#[derive(Debug, thiserror::Error)]
pub enum TargetError {
    /// Connection refused, timeout, unreadable body.
    #[error("transport error: {0}")]
    Transport(String),
    /// The probe refuses to lock anything outside the target's test prefix.
    #[error("refusing to lock {resource:?}: outside the test prefix {prefix:?}")]
    OutsidePrefix {
        /// The resource that was asked for.
        resource: String,
        /// The configured prefix.
        prefix: String,
    },
}

/// Checks an instance's base URL (from a config file or a flag): an `http` or `https`
/// URL; the message says what is wrong with it.
pub fn check_instance_url(url: &str) -> Result<(), String> {
    match reqwest::Url::parse(url) {
        Ok(u) if u.scheme() == "http" || u.scheme() == "https" => Ok(()),
        Ok(u) => Err(format!("{url:?} is not an http or https URL (scheme {:?})", u.scheme())),
        Err(e) => Err(format!("{url:?} is not an http or https URL: {e}")),
    }
}

/// Which way the routing path went and what it cost, from `Server-Timing`.
#[derive(Debug, Clone, PartialEq)]
pub struct ServerTiming {
    /// `cache`, `read-through` or `store`.
    pub source: String,
    /// Duration the service reported.
    pub duration: Duration,
}

/// Parses `Server-Timing: route;desc="read-through";dur=1.25` (other metrics ignored).
pub fn parse_server_timing(header: &str) -> Option<ServerTiming> {
    for metric in header.split(',') {
        let mut parts = metric.split(';').map(str::trim);
        if parts.next() != Some("route") {
            continue;
        }
        let mut source = None;
        let mut dur = None;
        for param in parts {
            let Some((k, v)) = param.split_once('=') else {
                continue;
            };
            let v = v.trim().trim_matches('"');
            match k.trim() {
                "desc" => source = Some(v.to_string()),
                "dur" => dur = v.parse::<f64>().ok().filter(|d| d.is_finite() && *d >= 0.0),
                _ => {}
            }
        }
        return Some(ServerTiming { source: source?, duration: Duration::from_secs_f64(dur? / 1000.0) });
    }
    None
}

/// The region the service's store reads lock decisions from, from
/// `Server-Timing: store;desc="westeurope"` (absent for stores without regions).
pub fn parse_store_region(header: &str) -> Option<String> {
    header.split(',').find_map(|metric| {
        let mut parts = metric.split(';').map(str::trim);
        (parts.next() == Some("store")).then_some(())?;
        parts.find_map(|param| {
            let (k, v) = param.split_once('=')?;
            let v = v.trim().trim_matches('"');
            (k.trim() == "desc" && !v.is_empty()).then(|| v.to_string())
        })
    })
}

/// One HTTP answer, reduced to what assertions look at.
#[derive(Debug, Clone)]
pub struct Reply {
    /// HTTP status code.
    pub status: u16,
    /// Parsed JSON body (`Null` when empty or not JSON).
    pub body: Value,
    /// Problem type without the `urn:lockprobe:error:` prefix.
    pub problem: Option<String>,
    /// `Retry-After` header, if present.
    pub retry_after: Option<String>,
    /// `Server-Timing` route metric, if present.
    pub timing: Option<ServerTiming>,
    /// `Server-Timing` store region, if the service reports one.
    pub store_region: Option<String>,
    /// Wall time the request took.
    pub elapsed: Duration,
}

impl Reply {
    /// `201` for success, `423 lock-held` for a problem: the observed outcome of a lock call.
    pub fn outcome(&self) -> Outcome {
        Outcome::reply(self.status, self.problem.as_deref())
    }

    /// A string field of the body.
    pub fn str_field(&self, name: &str) -> Option<&str> {
        self.body.get(name).and_then(Value::as_str)
    }
}

/// The `Idempotency-Key` of one logical lock call (contract 1.1): sent with every
/// attempt of the call, so a repeat after an unknown outcome returns the first
/// attempt's result (a pre-lock's token included) instead of acting again. The probe
/// journals a pre-lock's key before sending it, so even a probe killed mid-call can
/// learn the token and release. Keys are not secrets, but they are not logged either.
#[derive(Clone, PartialEq, Eq)]
pub struct CallKey(String);

impl CallKey {
    /// A new random key (128 bits, printable ASCII as the contract requires).
    pub fn fresh() -> Self {
        Self(format!("lockprobe-{}", hex::encode(rand::random::<[u8; 16]>())))
    }

    /// A key journaled earlier.
    pub fn from_journal(key: impl Into<String>) -> Self {
        Self(key.into())
    }

    /// The header value.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for CallKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CallKey(..)")
    }
}

/// How many times a lock call is sent while its outcome stays unknown.
pub const UNKNOWN_OUTCOME_ATTEMPTS: u32 = 4;

/// The longest the probe waits between repeats of a call whose outcome is unknown,
/// whatever `Retry-After` says.
const MAX_UNKNOWN_WAIT: Duration = Duration::from_secs(2);

/// Whether an answer leaves the call's outcome unknown: `503 outcome-unknown`.
pub fn outcome_unknown(r: &Reply) -> bool {
    r.status == 503 && r.problem.as_deref() == Some("outcome-unknown")
}

/// The HTTP clients of one probe process: one per distinct TLS configuration, shared
/// by every target that has it. A client holds a connection pool and a TLS
/// configuration with the system's root certificates, about 2.5 MiB: one per target
/// cost 2.5 GiB at 1,000 targets (BENCHMARKS.md). Clients are kept by the content of
/// the TLS files, so a target whose `ca_file` or client certificate changed (a reload)
/// gets a client with the new material, and a client no target uses any more is freed.
#[derive(Default)]
pub struct HttpClients(Mutex<HashMap<TargetTls, Weak<reqwest::Client>>>);

impl std::fmt::Debug for HttpClients {
    // The keys hold client identities: only say how many clients there are.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpClients").field("live", &self.live()).finish()
    }
}

impl HttpClients {
    /// The client for `tls`, built on first use.
    pub fn client(&self, tls: &TargetTls) -> Result<Arc<reqwest::Client>, TargetError> {
        let mut clients = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(client) = clients.get(tls).and_then(Weak::upgrade) {
            return Ok(client);
        }
        clients.retain(|_, client| client.strong_count() > 0);
        let client = Arc::new(build_client(tls)?);
        clients.insert(tls.clone(), Arc::downgrade(&client));
        Ok(client)
    }

    /// Clients some target still uses.
    pub fn live(&self) -> usize {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).values().filter(|c| c.strong_count() > 0).count()
    }
}

/// A client trusting the system's roots and `tls`'s extra ones, presenting its identity.
/// No client-wide timeout: each request carries its target's own.
///
/// Idle connections are dropped after [`POOL_IDLE`]: a server closes its idle ones too
/// (Node's default after 5 s, this package's own listener after its 10 s
/// `--header-read-timeout`), and a request sent on a connection the server is closing at
/// that moment fails for no fault of the lock: a false alarm the probe must not raise.
fn build_client(tls: &TargetTls) -> Result<reqwest::Client, TargetError> {
    tls.apply(reqwest::Client::builder().pool_idle_timeout(POOL_IDLE))
        .and_then(reqwest::ClientBuilder::build)
        .map_err(|e| TargetError::Transport(e.to_string()))
}

/// How long the probe keeps an idle connection: below the servers' idle timeouts.
const POOL_IDLE: Duration = Duration::from_secs(4);

/// Contract client for all instances of one target.
#[derive(Clone)]
pub struct TargetClient {
    http: Arc<reqwest::Client>,
    /// The TLS material `http` was built with: the identity a refused connection is
    /// diagnosed with ([`super::tls_refusal`]).
    tls: TargetTls,
    request_timeout: Duration,
    instances: Vec<String>,
    api_key: String,
    prefix: String,
    /// The store region each instance (by origin) last reported.
    regions: Arc<Mutex<HashMap<String, String>>>,
    region_changes: Arc<AtomicU64>,
    /// Changes not yet taken into a report.
    region_events: Arc<Mutex<Vec<RegionChange>>>,
    /// What each instance (by origin) declared in its last answer.
    declared: Arc<Mutex<BTreeMap<String, Declared>>>,
}

/// The header a service of contract 1.2 or later names its contract version in.
pub const CONTRACT_HEADER: &str = "lockprobe-contract";
/// The header a service of contract 1.2 or later names its library version in.
pub const LIBRARY_HEADER: &str = "lockprobe-library";

/// The versions one instance named in its last answer (contract 1.2's headers).
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct Declared {
    /// `Lockprobe-Contract`, e.g. `1.2`; `None` from a service of contract 1.1 or
    /// earlier.
    pub contract: Option<String>,
    /// `Lockprobe-Library`, e.g. `0.1.0`.
    pub library: Option<String>,
}

impl Declared {
    /// Whether the declared contract is at least `major.minor`: `None` when nothing
    /// (or nothing readable) was declared, which means contract 1.1 or earlier.
    pub fn at_least(&self, major: u32, minor: u32) -> Option<bool> {
        let (ma, mi) = self.contract.as_deref()?.split_once('.')?;
        let version: (u32, u32) = (ma.trim().parse().ok()?, mi.trim().parse().ok()?);
        Some(version >= (major, minor))
    }
}

impl std::fmt::Display for Declared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (&self.contract, &self.library) {
            (Some(c), Some(l)) => write!(f, "contract {c}, library {l}"),
            (Some(c), None) => write!(f, "contract {c}"),
            (None, _) => f.write_str("no contract version (1.1 or earlier)"),
        }
    }
}

/// An instance's store region changed between two of its answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegionChange {
    /// The instance (its origin, `http://host:port`).
    pub instance: String,
    /// The region it reported before.
    pub from: String,
    /// The region it reports now.
    pub to: String,
}

impl std::fmt::Display for RegionChange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {} -> {}", self.instance, self.from, self.to)
    }
}

const PROBLEM_PREFIX: &str = "urn:lockprobe:error:";

impl TargetClient {
    /// A client for `instances` (base URLs) whose lock calls carry `api_key`, trusting
    /// the system's CA roots.
    pub fn new(
        instances: &[String],
        api_key: &str,
        prefix: &str,
        request_timeout: Duration,
    ) -> Result<Self, TargetError> {
        Self::with_tls(instances, api_key, prefix, request_timeout, &TargetTls::default())
    }

    /// [`TargetClient::new`] with extra CA roots and a client certificate for `https`
    /// instances (`tls` was checked when it was loaded).
    pub fn with_tls(
        instances: &[String],
        api_key: &str,
        prefix: &str,
        request_timeout: Duration,
        tls: &TargetTls,
    ) -> Result<Self, TargetError> {
        Ok(Self::sharing(Arc::new(build_client(tls)?), tls, instances, api_key, prefix, request_timeout))
    }

    /// [`TargetClient::new`] on an HTTP client shared with other targets (see
    /// `HttpClients`), built with `tls`; every request still times out after
    /// `request_timeout`.
    pub fn sharing(
        http: Arc<reqwest::Client>,
        tls: &TargetTls,
        instances: &[String],
        api_key: &str,
        prefix: &str,
        request_timeout: Duration,
    ) -> Self {
        Self {
            http,
            tls: tls.clone(),
            request_timeout,
            instances: instances.iter().map(|s| s.trim_end_matches('/').to_string()).collect(),
            api_key: api_key.to_string(),
            prefix: prefix.to_string(),
            regions: Arc::default(),
            region_changes: Arc::default(),
            region_events: Arc::default(),
            declared: Arc::default(),
        }
    }

    /// What each instance (by origin, `http://host:port`) declared in its last answer.
    pub fn declared_versions(&self) -> BTreeMap<String, Declared> {
        self.declared.lock().expect("declared versions lock").clone()
    }

    /// What instance `instance` (an index into [`Self::instances`]) last declared; the
    /// default (nothing declared) before it answered.
    pub fn declared_by(&self, instance: usize) -> Declared {
        let base = self.instances.get(instance).map(String::as_str).unwrap_or_default();
        let origin = reqwest::Url::parse(base).map(|u| u.origin().ascii_serialization()).unwrap_or_default();
        self.declared.lock().expect("declared versions lock").get(&origin).cloned().unwrap_or_default()
    }

    /// How many times an instance's store region changed between two of its answers
    /// (a Cosmos DB failover the service followed).
    pub fn store_region_changes(&self) -> u64 {
        self.region_changes.load(Ordering::Relaxed)
    }

    /// The region changes seen since the last call.
    pub fn take_store_region_changes(&self) -> Vec<RegionChange> {
        std::mem::take(&mut *self.region_events.lock().expect("region events lock"))
    }

    /// The store region each instance (by origin) last reported.
    pub fn store_regions(&self) -> HashMap<String, String> {
        self.regions.lock().expect("regions lock").clone()
    }

    /// Notes the region an instance reported; a change is logged and counted, so a
    /// failover shows up as what it is rather than as the odd failures around it.
    fn note_region(&self, origin: String, region: &str) {
        let mut regions = self.regions.lock().expect("regions lock");
        match regions.insert(origin.clone(), region.to_string()) {
            Some(before) if before != region => {
                self.region_changes.fetch_add(1, Ordering::Relaxed);
                self.region_events.lock().expect("region events lock").push(RegionChange {
                    instance: origin.clone(),
                    from: before.clone(),
                    to: region.to_string(),
                });
                tracing::warn!(
                    instance = %origin,
                    from = %before,
                    to = %region,
                    "the service's store region changed: a failover; failures around it may be the failover's"
                );
            }
            _ => {}
        }
    }

    /// Base URLs of the instances.
    pub fn instances(&self) -> &[String] {
        &self.instances
    }

    fn url(&self, instance: usize, resource: &str, tail: &str) -> String {
        format!("{}/v1/resources/{}{}", self.instances[instance], resource, tail)
    }

    fn item_url(&self, instance: usize, resource: &str, key: &str) -> String {
        self.url(instance, resource, &format!("/items/{key}"))
    }

    fn guard(&self, resource: &str) -> Result<(), TargetError> {
        if resource.starts_with(&self.prefix) {
            Ok(())
        } else {
            Err(TargetError::OutsidePrefix { resource: resource.to_string(), prefix: self.prefix.clone() })
        }
    }

    async fn send(&self, req: reqwest::RequestBuilder) -> Result<Reply, TargetError> {
        let started = Instant::now();
        let request = req.timeout(self.request_timeout).build().map_err(|e| TargetError::Transport(error_chain(&e)))?;
        let url = request.url().clone();
        let resp = match self.http.execute(request).await {
            Ok(resp) => resp,
            Err(e) => return Err(TargetError::Transport(self.explained(&url, error_chain(&e)).await)),
        };
        let status = resp.status().as_u16();
        let header = |name: &str| resp.headers().get(name).and_then(|v| v.to_str().ok()).map(str::to_string);
        let retry_after = header("retry-after");
        let server_timing = header("server-timing");
        let timing = server_timing.as_deref().and_then(parse_server_timing);
        let store_region = server_timing.as_deref().and_then(parse_store_region);
        let origin = resp.url().origin().ascii_serialization();
        if let Some(region) = &store_region {
            self.note_region(origin.clone(), region);
        }
        let declared = Declared { contract: header(CONTRACT_HEADER), library: header(LIBRARY_HEADER) };
        self.declared.lock().expect("declared versions lock").insert(origin, declared);
        let bytes = resp.bytes().await.map_err(|e| TargetError::Transport(error_chain(&e)))?;
        let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        let problem = if status >= 400 {
            Some(
                body.get("type")
                    .and_then(Value::as_str)
                    .map(|t| t.strip_prefix(PROBLEM_PREFIX).unwrap_or(t).to_string())
                    .unwrap_or_else(|| "no-problem-type".to_string()),
            )
        } else {
            None
        };
        Ok(Reply { status, body, problem, retry_after, timing, store_region, elapsed: started.elapsed() })
    }

    /// A transport error on an `https` instance, with why the server refused the TLS
    /// connection when the error does not say ([`super::tls_refusal`]): the refusal
    /// reads the same whatever the timing.
    async fn explained(&self, url: &reqwest::Url, chain: String) -> String {
        if url.scheme() != "https" || chain.contains("alert") {
            return chain;
        }
        match super::tls_refusal::refusal(url, &self.tls).await {
            Some(why) => format!("{chain}; on a connection of the probe's own, {why}"),
            None => chain,
        }
    }

    fn lock_call(&self, method: reqwest::Method, url: String, key: &CallKey) -> reqwest::RequestBuilder {
        self.keyed_call(method, url, &self.api_key, key)
    }

    /// A request under `key`, presenting `bearer`: the lock API's key, or an admin
    /// principal's on the admin routes.
    fn keyed_call(&self, method: reqwest::Method, url: String, bearer: &str, key: &CallKey) -> reqwest::RequestBuilder {
        self.http.request(method, url).bearer_auth(bearer).header("Idempotency-Key", key.as_str())
    }

    /// A `POST` to the lock API under `/v1/resources/{id}{path}`, refused before sending
    /// when the resource is outside the test prefix.
    async fn post_lock(
        &self,
        instance: usize,
        resource: &str,
        path: &str,
        body: Value,
        key: CallKey,
    ) -> Result<Reply, TargetError> {
        self.guard(resource)?;
        let req = self.lock_call(reqwest::Method::POST, self.url(instance, resource, path), &key).json(&body);
        self.send(req).await
    }

    /// Sends a lock call with `send(key)` and repeats it under the same key while its
    /// outcome is unknown: a `503 outcome-unknown` (after its `Retry-After`, capped) or
    /// no answer at all (the request may have been applied). At most
    /// `UNKNOWN_OUTCOME_ATTEMPTS` sends; the last answer or error is returned. Against
    /// a service that ignores the key (contract 1.0) a repeat is a new call, which the
    /// lock itself refuses (a second pre-lock gets 423) rather than doubles.
    pub async fn until_known<F, Fut>(&self, key: &CallKey, send: F) -> Result<Reply, TargetError>
    where
        F: Fn(CallKey) -> Fut,
        Fut: std::future::Future<Output = Result<Reply, TargetError>>,
    {
        let mut attempt = 1;
        // Once an outcome was unknown, only a decision settles it: a later "nothing was
        // applied" (503 store-unavailable) speaks for that attempt, not for the one that
        // may still land.
        let mut unknown = false;
        loop {
            let answer = send(key.clone()).await;
            let wait = match &answer {
                Ok(r) if outcome_unknown(r) => {
                    unknown = true;
                    retry_after(r).unwrap_or(Duration::from_secs(1))
                }
                Ok(r) if unknown && r.status == 503 => retry_after(r).unwrap_or(Duration::from_secs(1)),
                Err(TargetError::Transport(_)) => {
                    unknown = true;
                    Duration::from_millis(200)
                }
                _ => return answer,
            };
            if attempt >= UNKNOWN_OUTCOME_ATTEMPTS {
                return answer;
            }
            attempt += 1;
            tokio::time::sleep(wait.min(MAX_UNKNOWN_WAIT)).await;
        }
    }

    /// `POST /lock`: pre-lock.
    pub async fn pre_lock(
        &self,
        instance: usize,
        resource: &str,
        owner: &str,
        lease: Duration,
        target_location: Option<&str>,
        key: CallKey,
    ) -> Result<Reply, TargetError> {
        let mut body = json!({"owner": owner, "durationSeconds": lease.as_secs_f64()});
        if let Some(t) = target_location {
            body["targetLocation"] = json!(t);
        }
        self.post_lock(instance, resource, "/lock", body, key).await
    }

    /// `POST /lock/escalate` to `hardDelete` or `write`.
    pub async fn escalate(
        &self,
        instance: usize,
        resource: &str,
        token: &str,
        phase: &str,
        lease: Duration,
        key: CallKey,
    ) -> Result<Reply, TargetError> {
        let body = json!({"token": token, "phase": phase, "durationSeconds": lease.as_secs_f64()});
        self.post_lock(instance, resource, "/lock/escalate", body, key).await
    }

    /// `POST /lock/renew`.
    pub async fn renew(
        &self,
        instance: usize,
        resource: &str,
        token: &str,
        lease: Duration,
        key: CallKey,
    ) -> Result<Reply, TargetError> {
        let body = json!({"token": token, "durationSeconds": lease.as_secs_f64()});
        self.post_lock(instance, resource, "/lock/renew", body, key).await
    }

    /// `POST /lock/swap` to `target_location`.
    pub async fn swap(
        &self,
        instance: usize,
        resource: &str,
        token: &str,
        target_location: &str,
        key: CallKey,
    ) -> Result<Reply, TargetError> {
        let body = json!({"token": token, "targetLocation": target_location});
        self.post_lock(instance, resource, "/lock/swap", body, key).await
    }

    /// `DELETE /lock` with the `Lock-Token` header.
    pub async fn release(
        &self,
        instance: usize,
        resource: &str,
        token: &str,
        key: CallKey,
    ) -> Result<Reply, TargetError> {
        self.guard(resource)?;
        let req = self
            .lock_call(reqwest::Method::DELETE, self.url(instance, resource, "/lock"), &key)
            .header("Lock-Token", token);
        self.send(req).await
    }

    /// `GET /lock/force-release` as the admin principal whose key is `admin_key`: the
    /// lock as an operator sees it (its fingerprint, never its token) and the requests.
    pub async fn force_release_view(
        &self,
        instance: usize,
        resource: &str,
        admin_key: &str,
    ) -> Result<Reply, TargetError> {
        self.guard(resource)?;
        let req = self.http.get(self.url(instance, resource, "/lock/force-release")).bearer_auth(admin_key);
        self.send(req).await
    }

    /// `POST /lock/force-release` as the admin principal whose key is `admin_key`: asks
    /// for the lock named by `fingerprint` in `phase` to be removed, for `reason`.
    #[allow(clippy::too_many_arguments)] // one per field of the request, as the contract names them
    pub async fn request_force_release(
        &self,
        instance: usize,
        resource: &str,
        admin_key: &str,
        fingerprint: &str,
        phase: &str,
        reason: &str,
        key: CallKey,
    ) -> Result<Reply, TargetError> {
        self.guard(resource)?;
        let body = json!({"lockFingerprint": fingerprint, "phase": phase, "reason": reason});
        let url = self.url(instance, resource, "/lock/force-release");
        let req = self.keyed_call(reqwest::Method::POST, url, admin_key, &key).json(&body);
        self.send(req).await
    }

    /// `POST /lock/force-release/{request}/approve` as the admin principal whose key is
    /// `admin_key` (a repeat by the same principal answers as the first time did).
    pub async fn approve_force_release(
        &self,
        instance: usize,
        resource: &str,
        admin_key: &str,
        request: &str,
        key: CallKey,
    ) -> Result<Reply, TargetError> {
        self.guard(resource)?;
        let tail = format!("/lock/force-release/{request}/approve");
        let req = self.keyed_call(reqwest::Method::POST, self.url(instance, resource, &tail), admin_key, &key);
        self.send(req).await
    }

    /// `GET /route`: what the routing path of `instance` resolves now.
    pub async fn route(&self, instance: usize, resource: &str) -> Result<Reply, TargetError> {
        self.send(self.http.get(self.url(instance, resource, "/route"))).await
    }

    /// `GET /items/{key}`.
    pub async fn read(&self, instance: usize, resource: &str, key: &str) -> Result<Reply, TargetError> {
        self.send(self.http.get(self.item_url(instance, resource, key))).await
    }

    /// `PUT /items/{key}`.
    pub async fn write(&self, instance: usize, resource: &str, key: &str, value: &Value) -> Result<Reply, TargetError> {
        let req = self.http.put(self.item_url(instance, resource, key)).json(&json!({ "value": value }));
        self.send(req).await
    }

    /// `DELETE /items/{key}`.
    pub async fn delete(&self, instance: usize, resource: &str, key: &str) -> Result<Reply, TargetError> {
        self.send(self.http.delete(self.item_url(instance, resource, key))).await
    }
}

/// `Retry-After` in whole seconds, when present and numeric.
fn retry_after(r: &Reply) -> Option<Duration> {
    r.retry_after.as_deref()?.trim().parse().ok().map(Duration::from_secs)
}

/// reqwest hides the useful part (e.g. "connection refused") in the source chain.
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(inner) = cur {
        s.push_str(": ");
        s.push_str(&inner.to_string());
        cur = inner.source();
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_timing_read_through() {
        let t = parse_server_timing(r#"route;desc="read-through";dur=1.5"#).unwrap();
        assert_eq!(t.source, "read-through");
        assert_eq!(t.duration, Duration::from_micros(1500));
    }

    #[test]
    fn server_timing_among_other_metrics_and_unquoted() {
        let t = parse_server_timing("db;dur=3, route;dur=0.25;desc=cache").unwrap();
        assert_eq!(t.source, "cache");
        assert_eq!(t.duration, Duration::from_micros(250));
    }

    #[test]
    fn the_store_region_is_read_beside_the_route_metric() {
        let header = r#"route;desc="store";dur=2.000, store;desc="northeurope""#;
        assert_eq!(parse_store_region(header).as_deref(), Some("northeurope"));
        assert_eq!(parse_server_timing(header).unwrap().source, "store", "the route metric is unaffected");
        assert_eq!(parse_store_region(r#"route;desc="cache";dur=0.1"#), None, "a store without regions");
        assert_eq!(parse_store_region(r#"store;dur=1"#), None);
    }

    #[test]
    fn a_declared_contract_is_compared_as_major_and_minor() {
        let declared = |c: Option<&str>| Declared { contract: c.map(str::to_owned), library: None };
        assert_eq!(declared(Some("1.2")).at_least(1, 1), Some(true));
        assert_eq!(declared(Some("1.10")).at_least(1, 2), Some(true), "1.10 is newer than 1.2");
        assert_eq!(declared(Some("1.0")).at_least(1, 1), Some(false));
        assert_eq!(declared(Some("2.0")).at_least(1, 9), Some(true));
        assert_eq!(declared(None).at_least(1, 0), None, "nothing declared: 1.1 or earlier");
        assert_eq!(declared(Some("one.two")).at_least(1, 0), None, "unreadable is undeclared");
        assert_eq!(declared(Some("1")).at_least(1, 0), None);
        assert_eq!(declared(None).to_string(), "no contract version (1.1 or earlier)");
        let full = Declared { contract: Some("1.2".into()), library: Some("0.1.0".into()) };
        assert_eq!(full.to_string(), "contract 1.2, library 0.1.0");
    }

    #[test]
    fn server_timing_rejects_garbage() {
        assert!(parse_server_timing("route;desc=\"cache\"").is_none());
        assert!(parse_server_timing("route;desc=\"cache\";dur=-1").is_none());
        assert!(parse_server_timing("other;desc=x;dur=1").is_none());
        assert!(parse_server_timing("").is_none());
    }

    #[test]
    fn targets_with_the_same_tls_share_one_client_until_none_uses_it() {
        let clients = HttpClients::default();
        let a = clients.client(&TargetTls::default()).unwrap();
        let b = clients.client(&TargetTls::default()).unwrap();
        assert!(Arc::ptr_eq(&a, &b), "one client for one TLS configuration");
        assert_eq!(clients.live(), 1);
        drop((a, b));
        assert_eq!(clients.live(), 0, "freed with its last target");
        let c = clients.client(&TargetTls::default()).unwrap();
        assert_eq!(clients.live(), 1, "built again on the next use");
        drop(c);
    }

    #[tokio::test]
    async fn lock_outside_prefix_is_refused_without_a_request() {
        // Port 9 (discard) is never contacted: the guard fires first.
        let c = TargetClient::new(&["http://127.0.0.1:9".into()], "k", "probe-", Duration::from_secs(1)).unwrap();
        let key = CallKey::fresh();
        let e = c.pre_lock(0, "customer-42", "me", Duration::from_secs(1), None, key.clone()).await.unwrap_err();
        assert!(matches!(e, TargetError::OutsidePrefix { .. }), "{e}");
        assert!(matches!(c.release(0, "prod-1", "t", key).await.unwrap_err(), TargetError::OutsidePrefix { .. }));
    }
}
