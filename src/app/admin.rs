//! `lockprobe admin force-release request|approve|list`: an operator's side of the
//! force-release routes (docs/contract.md, version 1.4), over HTTP like any client.
//!
//! Every action first shows the lock as the service sees it (fingerprint, phase, owner,
//! age, lease end) and the requests the document keeps, so the operator judges what is
//! being removed; `request` names the lock it showed (its fingerprint and phase), so a
//! lock that changed in between is refused rather than released by mistake. The answer
//! is printed as the audit record. Exit 0 when the service did what was asked, 1 when it
//! refused (its problem type and detail printed), 64 on bad usage.

use std::path::PathBuf;
use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

use super::usage::UsageError;
use super::validate::TlsArgs;
use crate::probe::checks::credentials::read_admin_key;

/// `lockprobe admin ...`.
#[derive(Debug, clap::Args)]
pub struct AdminCommand {
    /// What to do.
    #[command(subcommand)]
    pub action: AdminAction,
}

/// The admin actions.
#[derive(Debug, clap::Subcommand)]
pub enum AdminAction {
    /// Remove a stuck lock: one admin principal requests, another approves.
    #[command(subcommand)]
    ForceRelease(ForceReleaseAction),
}

/// `lockprobe admin force-release ...`.
#[derive(Debug, clap::Subcommand)]
pub enum ForceReleaseAction {
    /// Show the resource's lock, then ask for it to be force-released.
    Request {
        /// Where and as whom.
        #[command(flatten)]
        target: AdminTarget,
        /// Why (recorded in the audit trail).
        #[arg(long)]
        reason: String,
    },
    /// Show the lock and the request, then approve it (as a different principal).
    Approve {
        /// Where and as whom.
        #[command(flatten)]
        target: AdminTarget,
        /// The request's id, as `request` or `list` printed it.
        #[arg(long = "request")]
        request: String,
    },
    /// Show the lock and every force-release request the resource keeps.
    List {
        /// Where and as whom.
        #[command(flatten)]
        target: AdminTarget,
    },
}

/// The service, the principal and the resource an admin action is about.
#[derive(Debug, Clone, clap::Args)]
pub struct AdminTarget {
    /// Base URL of one service instance, e.g. `https://service:8080`.
    #[arg(long)]
    pub endpoint: String,
    /// File holding this principal's admin key (never the lock API key).
    #[arg(long, value_name = "FILE")]
    pub admin_key_file: PathBuf,
    /// The resource whose lock is meant.
    #[arg(long)]
    pub resource: String,
    /// Give up on an answer after this long.
    #[arg(long, value_parser = crate::duration::parse_bounded_duration, default_value = "10s")]
    pub request_timeout: Duration,
    /// TLS to the endpoint.
    #[command(flatten)]
    pub tls: TlsArgs,
}

/// A client for one resource's admin routes.
struct Admin {
    http: reqwest::Client,
    base: String,
    key: String,
}

/// What a call answered: its status and body.
struct Answer {
    status: StatusCode,
    body: Value,
}

impl Admin {
    fn new(target: &AdminTarget) -> Result<Self, UsageError> {
        let endpoint = target.endpoint.trim_end_matches('/');
        let url = reqwest::Url::parse(endpoint)
            .map_err(|e| UsageError::new(format!("--endpoint {endpoint:?} is not a URL: {e}")))?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(UsageError::new(format!("--endpoint {endpoint:?}: expected http:// or https://")));
        }
        crate::service::input::check_name("resource id", &target.resource)
            .map_err(|e| UsageError::new(format!("--resource: {}", e.detail)))?;
        let key =
            read_admin_key(&target.admin_key_file).map_err(|e| UsageError::new(format!("--admin-key-file {e}")))?;
        let tls = target.tls.load()?;
        let http = tls
            .apply(reqwest::Client::builder().timeout(target.request_timeout))
            .and_then(|b| b.build())
            .map_err(|e| UsageError::new(format!("cannot build the HTTP client: {e}")))?;
        Ok(Self { http, base: format!("{endpoint}/v1/resources/{}/lock/force-release", target.resource), key })
    }

    async fn call(&self, method: Method, path: &str, body: Option<Value>) -> anyhow::Result<Answer> {
        let mut req = self.http.request(method, format!("{}{path}", self.base)).bearer_auth(&self.key);
        if let Some(body) = body {
            req = req.json(&body);
        }
        let resp = req.send().await.map_err(|e| anyhow::anyhow!("{}: {e}", self.base))?;
        let status = resp.status();
        let text = resp.text().await?;
        let body = serde_json::from_str(&text).unwrap_or(Value::String(text));
        Ok(Answer { status, body })
    }

    /// The lock and the requests, printed; `None` (printed as refused) when the service
    /// refused to show them.
    async fn show(&self) -> anyhow::Result<Option<Value>> {
        let view = self.call(Method::GET, "", None).await?;
        if view.status != StatusCode::OK {
            refused(&view);
            return Ok(None);
        }
        print_view(&view.body);
        Ok(Some(view.body))
    }
}

/// Runs an admin action; the exit code.
pub async fn run(command: AdminCommand, shutdown: CancellationToken) -> anyhow::Result<u8> {
    let AdminAction::ForceRelease(action) = command.action;
    tokio::select! {
        code = force_release(action) => code,
        () = shutdown.cancelled() => Ok(1),
    }
}

async fn force_release(action: ForceReleaseAction) -> anyhow::Result<u8> {
    match action {
        ForceReleaseAction::List { target } => {
            let admin = Admin::new(&target)?;
            Ok(if admin.show().await?.is_some() { 0 } else { 1 })
        }
        ForceReleaseAction::Request { target, reason } => {
            let admin = Admin::new(&target)?;
            let Some(view) = admin.show().await? else { return Ok(1) };
            let Some(lock) = view.get("lock").filter(|l| !l.is_null()) else {
                println!("no lock on {}: nothing to force-release", target.resource);
                return Ok(1);
            };
            let body = json!({"lockFingerprint": lock["fingerprint"], "phase": lock["phase"], "reason": reason});
            let answer = admin.call(Method::POST, "", Some(body)).await?;
            if answer.status != StatusCode::CREATED {
                refused(&answer);
                return Ok(1);
            }
            println!("requested:");
            print_request(&answer.body["request"]);
            println!(
                "a different admin principal approves it with: lockprobe admin force-release approve --request {}",
                text(&answer.body["request"]["id"])
            );
            Ok(0)
        }
        ForceReleaseAction::Approve { target, request } => {
            let admin = Admin::new(&target)?;
            let Some(_) = admin.show().await? else { return Ok(1) };
            let answer = admin.call(Method::POST, &format!("/{request}/approve"), None).await?;
            if answer.status != StatusCode::OK {
                refused(&answer);
                return Ok(1);
            }
            println!("released:");
            print_request(&answer.body["request"]);
            Ok(0)
        }
    }
}

fn text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => "-".into(),
        other => other.to_string(),
    }
}

fn print_view(view: &Value) {
    println!("location: {}", text(&view["location"]));
    match view.get("lock").filter(|l| !l.is_null()) {
        Some(l) => println!(
            "lock: {} phase {} owner {} age {}s expires {} (max {}) renewals {}{}",
            text(&l["fingerprint"]),
            text(&l["phase"]),
            text(&l["owner"]),
            text(&l["ageSeconds"]),
            text(&l["expiresAt"]),
            text(&l["maxExpiresAt"]),
            text(&l["renewals"]),
            if l["live"] == json!(true) { "" } else { " (lapsed)" }
        ),
        None => println!("lock: none"),
    }
    let requests = view["requests"].as_array().map(Vec::as_slice).unwrap_or_default();
    println!("force-release requests: {}", requests.len());
    for r in requests {
        print_request(r);
    }
}

fn print_request(r: &Value) {
    println!(
        "  {} {}: lock {} in {} (owner {}), requested by {} at {}, reason {:?}; approve by {}; approved by {} at {}",
        text(&r["id"]),
        text(&r["status"]),
        text(&r["lockFingerprint"]),
        text(&r["phase"]),
        text(&r["owner"]),
        text(&r["requestedBy"]),
        text(&r["requestedAt"]),
        text(&r["reason"]),
        text(&r["approveBy"]),
        text(&r["approvedBy"]),
        text(&r["approvedAt"]),
    );
}

/// Prints a refusal: status, problem type and detail.
fn refused(answer: &Answer) {
    let kind = answer.body["type"].as_str().map_or("-", |t| t.trim_start_matches("urn:lockprobe:error:"));
    let detail = answer.body.get("detail").map_or_else(|| answer.body.to_string(), text);
    println!("refused: {} {kind}: {detail}", answer.status.as_u16());
}
