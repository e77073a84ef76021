//! Where location documents live. The store knows documents and ETags, not lock rules.
//!
//! Every backend implements [`LocationStore`] and passes the same conformance suite
//! (`tests/store_conformance.rs`): point reads from the write region or a replica,
//! create-if-absent, replace-if-match, a pull-based stream of committed changes and a
//! paged scan of all documents.

pub mod cosmos;
// The wrappers that rehearse, count and slow a store are for the reference service,
// the release gate, the benchmarks and the tests, not for a service embedding the
// library: the crate uses them by these paths, and the tests through
// `lockprobe::testing`, which promises them no stability.
pub(crate) mod counting;
pub(crate) mod faults;
pub(crate) mod latency;
pub mod memory;

use std::fmt::{self, Debug};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};

use crate::document::{DocumentError, LocationDocument};

/// An opaque version of one stored document, new on every write.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct ETag(pub String);

impl Debug for ETag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ETag({})", self.0)
    }
}

/// A document together with the ETag it was read at and when the store committed it.
#[derive(Debug, Clone, PartialEq)]
pub struct Versioned {
    /// The document.
    pub doc: LocationDocument,
    /// Its version.
    pub etag: ETag,
    /// When the store committed this version, on the store's clock, as an upper bound
    /// (Cosmos DB's `_ts` has whole seconds: the end of that second). The routing library
    /// judges writes whose effect depends on when they landed (a late pre-lock, a renewal
    /// that landed after its lease) by this instant, so every reader judges alike.
    pub committed_at: DateTime<Utc>,
}

/// What a successful write reports: the new version and when it was committed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Committed {
    /// The new version.
    pub etag: ETag,
    /// When the store committed it (store clock, an upper bound; see [`Versioned::committed_at`]).
    pub committed_at: DateTime<Utc>,
}

/// The calls of a [`LocationStore`], for counters, fault injection and metrics labels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OpKind {
    /// `read(.., WriteRegion)`.
    ReadWriteRegion,
    /// `read(.., Replica)`.
    ReadReplica,
    /// `create`.
    Create,
    /// `replace`.
    Replace,
    /// `read_changes`.
    ReadChanges,
    /// `scan`.
    Scan,
}

impl OpKind {
    /// Every kind, in declaration order.
    pub const ALL: [OpKind; 6] = [
        OpKind::ReadWriteRegion,
        OpKind::ReadReplica,
        OpKind::Create,
        OpKind::Replace,
        OpKind::ReadChanges,
        OpKind::Scan,
    ];

    /// The kind of a point read from `from`.
    pub fn read_from(from: ReadFrom) -> Self {
        match from {
            ReadFrom::WriteRegion => OpKind::ReadWriteRegion,
            ReadFrom::Replica => OpKind::ReadReplica,
        }
    }

    /// Whether the call writes (and so may fail with an unknown outcome).
    pub fn is_write(self) -> bool {
        matches!(self, OpKind::Create | OpKind::Replace)
    }

    /// The name used as a metrics label.
    pub fn as_str(self) -> &'static str {
        match self {
            OpKind::ReadWriteRegion => "read_write_region",
            OpKind::ReadReplica => "read_replica",
            OpKind::Create => "create",
            OpKind::Replace => "replace",
            OpKind::ReadChanges => "read_changes",
            OpKind::Scan => "scan",
        }
    }
}

/// Which copy a point read goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadFrom {
    /// The single write region: authoritative, used for lock decisions.
    WriteRegion,
    /// The nearest replica: may lag the write region by up to the replication bound.
    Replica,
}

/// One committed write, as the change stream delivers it (`doc.committed_at` says when).
#[derive(Debug, Clone, PartialEq)]
pub struct Change {
    /// The document as written, shared with the store where it keeps it (the memory
    /// store): a change-stream reader only looks at it, so nothing is copied for it.
    pub doc: Arc<Versioned>,
}

/// Where a change-stream reader stands. Opaque; start from [`ChangeCursor::beginning`].
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ChangeCursor(pub String);

impl ChangeCursor {
    /// Reads every change the store still holds.
    pub fn beginning() -> Self {
        Self(String::new())
    }
}

/// A stored document this library cannot decode, as the change stream or a scan met it:
/// written in a newer library's format, or not a location document at all. Point reads
/// refuse such a document ([`StoreError::Document`]); the stream and the scan hand it
/// over apart from the readable ones, so that a reader following the whole fleet (the
/// monitor) skips and counts it instead of stopping at it.
#[derive(Debug, Clone, PartialEq)]
pub struct Unreadable {
    /// The stored id (empty when the stored JSON has none).
    pub id: String,
    /// When the store committed this version (upper bound, as [`Versioned::committed_at`]).
    pub committed_at: DateTime<Utc>,
    /// Why it cannot be read.
    pub reason: DocumentError,
}

/// A page of the change stream.
#[derive(Debug, Clone, Default)]
pub struct ChangeBatch {
    /// Changes in commit order (a backend may deliver only the latest version of a
    /// document, as Cosmos DB's change feed does).
    pub changes: Vec<Change>,
    /// Versions in the same page that this library cannot read, in commit order; the
    /// cursor is past them as it is past the changes.
    pub unreadable: Vec<Unreadable>,
    /// Where to continue from.
    pub next: ChangeCursor,
}

/// A page of a scan: the documents, and apart from them those this library cannot read.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ScanPage {
    /// Readable documents, in id order.
    pub documents: Vec<Versioned>,
    /// Unreadable documents of the same id range, in id order.
    pub unreadable: Vec<Unreadable>,
}

impl ScanPage {
    /// Documents in the page, readable or not (a full page is `limit` of them).
    pub fn len(&self) -> usize {
        self.documents.len() + self.unreadable.len()
    }

    /// Whether the page holds no document at all.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The greatest id in the page, readable or not: where the next page starts after.
    pub fn last_id(&self) -> Option<&str> {
        let readable = self.documents.last().map(|v| v.doc.id.as_str());
        let unreadable = self.unreadable.last().map(|u| u.id.as_str());
        readable.max(unreadable)
    }
}

/// Why a store call failed. Callers branch on these kinds.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum StoreError {
    /// No document with that id.
    #[error("document not found")]
    NotFound,
    /// The ETag presented is not the current one (HTTP 412).
    #[error("precondition failed: the document changed since it was read")]
    PreconditionFailed,
    /// Create of an id that already exists (HTTP 409).
    #[error("a document with that id already exists")]
    Conflict,
    /// The store could not be reached or failed; nothing was written by this call.
    #[error("store unavailable: {0}")]
    Unavailable(String),
    /// A write failed in a way that does not say whether the store applied it (a
    /// timeout after the request was sent, a connection lost mid-answer): it may be
    /// committed now, or later. Only writes fail this way; callers must find out.
    #[error("outcome of the write unknown: {0}")]
    OutcomeUnknown(String),
    /// The stored document cannot be used by this library version.
    #[error(transparent)]
    Document(#[from] DocumentError),
}

/// Storage of location documents.
#[async_trait]
pub trait LocationStore: Debug + Send + Sync + 'static {
    /// Point read of one document.
    async fn read(&self, id: &str, from: ReadFrom) -> Result<Versioned, StoreError>;

    /// [`Self::read`], the version shared rather than copied where the backend keeps
    /// it decoded (the memory store hands out its own, a few copies of the document
    /// fewer per lock call); a backend that decodes every answer anyway (Cosmos DB)
    /// keeps this default. Wrappers forward it, so their inner store's version is
    /// shared through them.
    async fn read_shared(&self, id: &str, from: ReadFrom) -> Result<Arc<Versioned>, StoreError> {
        self.read(id, from).await.map(Arc::new)
    }

    /// Creates `doc` if no document has its id; `Conflict` otherwise.
    async fn create(&self, doc: &LocationDocument) -> Result<Committed, StoreError>;

    /// Replaces the document if its current ETag is `if_match`; `PreconditionFailed`
    /// otherwise, and nothing is written.
    async fn replace(&self, doc: &LocationDocument, if_match: &ETag) -> Result<Committed, StoreError>;

    /// Up to `limit` committed changes after `cursor` (readable and unreadable together).
    async fn read_changes(&self, cursor: &ChangeCursor, limit: usize) -> Result<ChangeBatch, StoreError>;

    /// Up to `limit` documents with ids greater than `after` (all ids when `None`), in id
    /// order, read from the write region, those this library cannot read apart. For
    /// periodic full scans.
    async fn scan(&self, after: Option<&str>, limit: usize) -> Result<ScanPage, StoreError>;

    /// The region authoritative reads and writes go to now, for stores that have
    /// regions (Cosmos DB: the account's write region as last discovered, normalised like
    /// `westeurope`). The service shows it in `Server-Timing` so a client sees a failover.
    fn region(&self) -> Option<String> {
        None
    }
}

/// How long a change-stream consumer waits between empty polls.
pub const DEFAULT_CHANGE_POLL: Duration = Duration::from_millis(200);
