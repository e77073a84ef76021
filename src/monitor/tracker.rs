//! Infers migration timelines from observed document versions.
//!
//! Observations come from the change stream (at the version's commit time) and from
//! scans of the write region (at the scan's time). A backend may deliver only the
//! latest version of a document, so consecutive observations can skip states: a
//! pre-lock and its escalation may arrive as one version, a swap may arrive together
//! with the next pre-lock. Every rule here therefore compares the previous observed
//! state with the current one, and where a time is not observed exactly it uses a
//! bound that can only make a judgement more lenient (never a false alarm).
//!
//! Pure and synchronous: the caller supplies time and turns [`Event`]s into metrics.

use std::hash::BuildHasher;
use std::time::Duration;

use chrono::{DateTime, Utc};

use super::table::TimelineTable;
use super::timeline::{ms, Timeline, EARLY_JUDGED, ENDED, LAPSED, PARTIAL_COUNTED, PROBE};
use crate::document::{ForceOutcome, ForceRelease, LocationDocument, LockInfo, Phase};

/// How a migration ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// Location switched and lock cleared in one write.
    Swapped,
    /// Lock released by its holder; location unchanged.
    Released,
    /// The lease ran out first.
    Lapsed,
    /// Removed by an approved force-release (two admin principals), its holder lost.
    ForceReleased,
}

impl Outcome {
    /// Label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Swapped => "swapped",
            Outcome::Released => "released",
            Outcome::Lapsed => "lapsed",
            Outcome::ForceReleased => "forceReleased",
        }
    }

    /// Every outcome, for pre-registering label values.
    pub const ALL: [Outcome; 4] = [Outcome::Swapped, Outcome::Released, Outcome::Lapsed, Outcome::ForceReleased];
}

/// Whose lock a migration is: lockprobe's own probe or the fleet's orchestrators. A
/// bounded label value on every per-migration metric.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Source {
    /// Any other owner: the migrations the fleet alerts are about.
    Fleet,
    /// The probe's: its owner is [`PROBE_OWNER_PREFIX`] followed by the target's name.
    Probe,
}

/// How the probe names itself as a lock's owner (`lockprobe/<target>`, with `#k` on the
/// concurrent pre-locks of one check). The probe and the monitor share no code, so this
/// string is the contract between them (docs/probe.md, "Probe and monitor").
pub const PROBE_OWNER_PREFIX: &str = "lockprobe/";

impl Source {
    /// Label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Source::Fleet => "fleet",
            Source::Probe => "probe",
        }
    }

    /// Every source, for pre-registering label values.
    pub const ALL: [Source; 2] = [Source::Fleet, Source::Probe];

    /// The source of a lock held by `owner`.
    pub fn of_owner(owner: &str) -> Self {
        if owner.starts_with(PROBE_OWNER_PREFIX) {
            Source::Probe
        } else {
            Source::Fleet
        }
    }

    fn index(self) -> usize {
        self as usize
    }

    fn of_flags(flags: u8) -> Self {
        if flags & PROBE != 0 {
            Source::Probe
        } else {
            Source::Fleet
        }
    }
}

/// Where an observation came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Seen {
    /// The change stream; `at` is the version's commit time, so a transition seen on it
    /// is timed when the version is the transition's own commit (always with a full
    /// log; with latest-only delivery, when no later change was collapsed into it).
    Stream,
    /// A scan of the write region; `at` is the scan time, which times nothing exactly.
    Scan,
}

/// Something the monitor learned from one observation.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// A migration the monitor had not seen before is in flight.
    Started,
    /// A phase was held this long (from its start to the next phase or the end).
    PhaseHeld {
        /// The phase.
        phase: Phase,
        /// How long.
        held: Duration,
    },
    /// The escalation to hardDelete was judged against declared delay + buffer.
    Escalation {
        /// pre-lock -> hardDelete, when timed (`None` when only bounded).
        interval: Option<Duration>,
        /// declared delay + buffer.
        required: Duration,
        /// It came before `required`: a safety risk.
        early: bool,
    },
    /// This many lease renewals were observed.
    Renewed(u32),
    /// The migration ended.
    Ended(Outcome),
    /// The migration's lock was removed by an approved force-release: who asked, who
    /// approved and why, as the document's audit record says.
    ForceReleased {
        /// The request's id.
        request: String,
        /// Who asked.
        requested_by: String,
        /// Who approved.
        approved_by: String,
        /// Why.
        reason: String,
    },
    /// Location and lock disagree: the lock remains although the location changed, or
    /// the location already is the declared target.
    PartialCutover,
    /// An expired lock sits in the document, never released or swapped.
    OrphanFound,
    /// A previously orphaned lock is gone (replaced or cleared).
    OrphanCleared,
    /// The migration could not be followed: the table of timelines is full (see
    /// `TableFull`, in the private `table` module). Nothing else is learned about it.
    Untracked,
}

/// What the tracker needs to judge escalations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rules {
    /// The orchestrator's buffer after the convergence delay.
    pub escalation_buffer: Duration,
    /// The service's declared delay, when the monitor is told one (a floor under each
    /// lock's own declaration).
    pub declared_delay: Option<Duration>,
    /// How long past a lease's end a lock still present counts as live: the stream may
    /// deliver a swap or release late, and a service whose clock lags the monitor's
    /// (within the routing library's skew margin) may still swap under that lease.
    pub lapse_grace: Duration,
}

/// The timelines of every in-flight (or orphaned) migration, by resource id.
#[derive(Debug)]
pub struct Tracker {
    timelines: TimelineTable,
    rules: Rules,
    /// Keyed with a per-process random key, so a token hash says nothing outside it.
    hasher: std::collections::hash_map::RandomState,
    /// Orphaned locks, by [`Source::index`].
    orphans: [usize; 2],
    /// Ended migrations remembered briefly (see [`Tracker::observe`]).
    ended: usize,
    /// The probe's live timelines (neither lapsed nor ended), to split `in_flight`.
    probe_live: usize,
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

fn dur(from_ms: i64, to_ms: i64) -> Duration {
    Duration::from_millis(u64::try_from(to_ms - from_ms).unwrap_or(0))
}

impl Tracker {
    /// An empty tracker judging escalations by `rules`.
    pub fn new(rules: Rules) -> Self {
        Self {
            timelines: TimelineTable::new(),
            rules,
            hasher: Default::default(),
            orphans: [0; 2],
            ended: 0,
            probe_live: 0,
        }
    }

    /// A tracker over `table` (tests of a full table).
    #[cfg(test)]
    pub(crate) fn with_table(rules: Rules, table: TimelineTable) -> Self {
        Self { timelines: table, ..Self::new(rules) }
    }

    /// Migrations in flight (tracked and not lapsed), the probe's included.
    pub fn in_flight(&self) -> usize {
        self.timelines.len() - self.orphans.iter().sum::<usize>() - self.ended
    }

    /// Migrations of `source` in flight.
    pub fn in_flight_of(&self, source: Source) -> usize {
        match source {
            Source::Probe => self.probe_live,
            Source::Fleet => self.in_flight() - self.probe_live,
        }
    }

    /// The fleet's documents holding an expired lock that was never released or
    /// swapped. The probe's lease-lapse check leaves such a lock by design: those are
    /// counted apart, in [`Tracker::orphans_of`]`(Source::Probe)`.
    pub fn orphans(&self) -> usize {
        self.orphans_of(Source::Fleet)
    }

    /// Orphaned locks of `source`.
    pub fn orphans_of(&self, source: Source) -> usize {
        self.orphans[source.index()]
    }

    /// Ids of the fleet's orphaned locks, at most `limit` (the longest lapsed), in no
    /// particular order.
    pub fn orphan_ids(&self, limit: usize) -> Vec<String> {
        self.orphans_with_lease_end(limit).into_iter().map(|(id, _)| id).collect()
    }

    /// Live migrations (neither lapsed nor ended) in each phase, `preLock`, `hardDelete`,
    /// `write`: the fleet's, then the probe's. Walks every timeline once, so it is for
    /// status pages, not for every event.
    pub fn in_flight_by_phase(&self) -> ([usize; 3], [usize; 3]) {
        let mut counts = [[0; 3]; 2];
        for t in self.timelines.values() {
            if !t.has(LAPSED) && !t.has(ENDED) {
                counts[Source::of_flags(t.flags).index()][match t.phase {
                    Phase::PreLock => 0,
                    Phase::HardDelete => 1,
                    Phase::Write => 2,
                }] += 1;
            }
        }
        let [fleet, probe] = counts;
        (fleet, probe)
    }

    /// The fleet's orphaned locks with the end of their lease, longest lapsed first, at
    /// most `limit` (walks every timeline).
    pub fn orphans_with_lease_end(&self, limit: usize) -> Vec<(String, DateTime<Utc>)> {
        let mut found: Vec<(String, i64)> = self
            .timelines
            .iter()
            .filter(|(_, t)| t.has(LAPSED) && !t.has(PROBE))
            .map(|(id, t)| (id.to_string(), t.expires_ms))
            .collect();
        let longest_lapsed = |a: &(String, i64), b: &(String, i64)| a.1.cmp(&b.1).then_with(|| a.0.cmp(&b.0));
        // Only the `limit` longest lapsed need sorting: select them first (linear).
        if limit < found.len() {
            found.select_nth_unstable_by(limit, longest_lapsed);
            found.truncate(limit);
        }
        found.sort_by(longest_lapsed);
        found
            .into_iter()
            .map(|(id, ms)| (id, DateTime::from_timestamp_millis(ms).unwrap_or(DateTime::<Utc>::MIN_UTC)))
            .collect()
    }

    /// Whose migration the document `id` holds (or last held, while remembered).
    pub fn source_of(&self, id: &str) -> Source {
        self.timelines.get(id).map_or(Source::Fleet, |t| Source::of_flags(t.flags))
    }

    /// Timelines held: in flight, orphaned and ended ones remembered for the grace.
    pub fn retained(&self) -> usize {
        self.timelines.len()
    }

    /// The heap the timelines take: the table's slots and index, spare capacity
    /// included, and the chunks holding the ids.
    pub fn retained_bytes(&self) -> usize {
        self.timelines.heap_bytes()
    }

    /// Reserves room for `n` more timelines (for bulk loads).
    pub fn reserve(&mut self, n: usize) {
        self.timelines.reserve(n);
    }

    /// Stops following `id` without deciding how its migration ended: the document can
    /// no longer be read (a newer library's format, say), so neither a swap nor a
    /// release would be seen, and the sweep would count a lapse that may be none.
    /// Returns whether a timeline was held.
    pub fn forget(&mut self, id: &str) -> bool {
        let Some(tl) = self.timelines.remove(id) else {
            return false;
        };
        let source = Source::of_flags(tl.flags);
        if tl.has(ENDED) {
            self.ended -= 1;
        } else if tl.has(LAPSED) {
            self.orphans[source.index()] -= 1;
        } else if source == Source::Probe {
            self.probe_live -= 1;
        }
        true
    }

    fn hash32(&self, s: &str) -> u32 {
        // Truncation is the point: a short hash tells two migrations apart and no more.
        self.hasher.hash_one(s) as u32
    }

    /// Applies one observed version of `doc`, seen at `at`, pushing what was learned;
    /// returns whose migration the events are about: the lock's owner, or when the
    /// version holds none, the owner of the migration it ended. (A probe lock replaced
    /// by another owner's at once would attribute its end to the new owner; the probe
    /// locks only under its own test prefix, so that does not happen.)
    pub fn observe(&mut self, doc: &LocationDocument, at: DateTime<Utc>, seen: Seen, out: &mut Vec<Event>) -> Source {
        let source = match &doc.primary.lock {
            Some(lock) => Source::of_owner(&lock.owner),
            None => self.source_of(&doc.id),
        };
        self.observe_as(doc, at, seen, source, out);
        source
    }

    fn observe_as(
        &mut self,
        doc: &LocationDocument,
        at: DateTime<Utc>,
        seen: Seen,
        source: Source,
        out: &mut Vec<Event>,
    ) {
        let at_ms = ms(at);
        let location_hash = self.hash32(&doc.primary.location);
        let current = doc.primary.lock.as_ref().map(|l| (l, ms(l.acquired_at), self.hash32(l.token.expose())));
        // The newest approved force-release the document records: it may be what ended
        // the migration this version no longer holds.
        let forced = doc
            .force_releases
            .iter()
            .filter(|r| r.outcome == ForceOutcome::Released && r.approved_at.is_some())
            .max_by_key(|r| r.approved_at);
        if !self.close_previous(&doc.id, current, location_hash, forced, at_ms, out) {
            return;
        }
        let Some((lock, acquired_ms, token_hash)) = current else {
            return;
        };
        let rules = self.rules;
        let made = self.timelines.get_or_insert_with(&doc.id, || {
            Timeline::new(
                acquired_ms,
                // The declared delay, not effectiveAt: that also holds the skew
                // margin and, once settled, the store's commit delay.
                acquired_ms.saturating_add(lock.convergence_delay().num_milliseconds()),
                ms(lock.expires_at),
                token_hash,
                location_hash,
                Phase::PreLock,
                lock.renewals,
            )
        });
        let Ok((tl, created)) = made else {
            out.push(Event::Untracked);
            return;
        };
        if created {
            if source == Source::Probe {
                tl.set(PROBE);
                self.probe_live += 1;
            }
            out.push(Event::Started);
        }
        if tl.has(LAPSED) {
            tl.last_seen_ms = at_ms;
            return; // outcome already counted; the orphan stays until the lock goes
        }
        Self::escalations(tl, lock, at_ms, seen, created, &rules, out);
        Self::renewals_and_cutover(tl, doc, lock, location_hash, at_ms, out);
        if tl.expires_ms.saturating_add(millis(rules.lapse_grace)) <= at_ms {
            // The version as of `at` still carries a lock whose lease ended more than
            // the grace before: nobody can use it any more.
            let source = Source::of_flags(tl.flags);
            Self::lapse(tl, out);
            self.orphans[source.index()] += 1;
            if source == Source::Probe {
                self.probe_live -= 1;
            }
        }
    }

    /// Settles the timeline a document had before this observation: returns false when
    /// the observation changes nothing (an older version than one already applied, or
    /// a late version of a migration already ended); ends the previous migration when
    /// this version holds another lock or none.
    fn close_previous(
        &mut self,
        id: &str,
        current: Option<(&LockInfo, i64, u32)>,
        location_hash: u32,
        forced: Option<&ForceRelease>,
        at_ms: i64,
        out: &mut Vec<Event>,
    ) -> bool {
        let Some(prev) = self.timelines.get(id) else {
            return true;
        };
        if at_ms < prev.last_seen_ms {
            return false; // an older version than one already applied
        }
        let same = current.is_some_and(|(_, acq, th)| prev.is(acq, th));
        if prev.has(ENDED) {
            if same || current.is_none() {
                return false; // the ended migration's own late versions, or still unlocked
            }
            self.timelines.remove(id);
            self.ended -= 1;
        } else if !same {
            let prev = prev.clone();
            self.end_previous(&prev, location_hash, current.map(|(l, _, _)| l), forced, at_ms, out);
            match self.timelines.get_mut(id) {
                Some(ended) if current.is_none() => {
                    // Remember the end for a while: a lagging stream may still deliver
                    // this migration's older versions after a scan saw it end, and they
                    // must not start it again.
                    ended.flags = ENDED | (prev.flags & PROBE);
                    ended.last_seen_ms = at_ms;
                    self.ended += 1;
                }
                _ => {
                    self.timelines.remove(id);
                }
            }
        }
        true
    }

    /// Escalations since the last observation (a timeline starts at preLock, so a lock
    /// first seen escalated lands here too), timed at `at` only when this version is the
    /// escalation's own commit. Escalation keeps the renewal count and only a renewal
    /// raises it, so a version with more renewals than the monitor knew of (a first
    /// sighting knows of none) may be a later renewal, committed after the escalation:
    /// its time would pass a bound off as a measurement.
    fn escalations(
        tl: &mut Timeline,
        lock: &LockInfo,
        at_ms: i64,
        seen: Seen,
        created: bool,
        rules: &Rules,
        out: &mut Vec<Event>,
    ) {
        let renewed_since = lock.renewals > if created { 0 } else { tl.renewals };
        if lock.phase <= tl.phase {
            return;
        }
        let timed = seen == Seen::Stream && !renewed_since;
        // A two-step jump (preLock straight to write) times neither step.
        let one_step =
            matches!((tl.phase, lock.phase), (Phase::PreLock, Phase::HardDelete) | (Phase::HardDelete, Phase::Write));
        if timed && one_step {
            if let Some(start) = tl.phase_start_ms(tl.phase) {
                out.push(Event::PhaseHeld { phase: tl.phase, held: dur(start, at_ms) });
            }
        }
        if tl.phase == Phase::PreLock && !tl.has(EARLY_JUDGED) {
            tl.set(EARLY_JUDGED);
            let declared = Duration::from_millis(u64::from(tl.delay_ms)).max(rules.declared_delay.unwrap_or_default());
            let required = declared + rules.escalation_buffer;
            // hardDelete happened at or before `at`: if even `at` is too early, it was.
            let bound = dur(tl.acquired_ms, at_ms);
            let interval = (timed && one_step).then_some(bound);
            out.push(Event::Escalation { interval, required, early: bound < required });
        }
        if timed {
            tl.mark_phase_start(lock.phase, at_ms);
        }
        tl.phase = lock.phase;
    }

    /// Renewals since the last observation, the new expiry, and a partial cutover: the
    /// location moved under the lock, or the lock stayed with the location already at
    /// its target.
    fn renewals_and_cutover(
        tl: &mut Timeline,
        doc: &LocationDocument,
        lock: &LockInfo,
        location_hash: u32,
        at_ms: i64,
        out: &mut Vec<Event>,
    ) {
        if lock.renewals > tl.renewals {
            out.push(Event::Renewed(lock.renewals - tl.renewals));
            tl.renewals = lock.renewals;
        }
        tl.expires_ms = ms(lock.expires_at);
        let moved_under_lock = tl.location_hash != location_hash;
        let at_target = doc.secondary.as_ref().is_some_and(|s| s.location == doc.primary.location);
        if (moved_under_lock || at_target) && !tl.has(PARTIAL_COUNTED) {
            tl.set(PARTIAL_COUNTED);
            out.push(Event::PartialCutover);
        }
        tl.location_hash = location_hash;
        tl.last_seen_ms = at_ms;
    }

    /// Ends every timeline whose lease ended more than the grace before `now` with no
    /// event since: the lock lapsed in place, an orphan. Forgets ended migrations
    /// observed more than the grace ago.
    pub fn sweep(&mut self, now: DateTime<Utc>, out: &mut Vec<(String, Event)>) {
        let cutoff = ms(now).saturating_sub(millis(self.rules.lapse_grace));
        self.ended -= self.timelines.retain(|t| !(t.has(ENDED) && t.last_seen_ms <= cutoff));
        let mut events = Vec::new();
        for (id, tl) in
            self.timelines.iter_mut().filter(|(_, t)| !t.has(LAPSED) && !t.has(ENDED) && t.expires_ms <= cutoff)
        {
            Self::lapse(tl, &mut events);
            let source = Source::of_flags(tl.flags);
            self.orphans[source.index()] += 1;
            if source == Source::Probe {
                self.probe_live -= 1;
            }
            out.extend(events.drain(..).map(|e| (id.to_string(), e)));
        }
    }

    fn lapse(tl: &mut Timeline, out: &mut Vec<Event>) {
        Self::finish(tl, Outcome::Lapsed, tl.expires_ms, out);
        tl.set(LAPSED);
        out.push(Event::OrphanFound);
    }

    fn finish(tl: &Timeline, outcome: Outcome, end_ms: i64, out: &mut Vec<Event>) {
        if let Some(start) = tl.phase_start_ms(tl.phase) {
            out.push(Event::PhaseHeld { phase: tl.phase, held: dur(start, end_ms) });
        }
        out.push(Event::Ended(outcome));
    }

    /// The migration `prev` is no longer the document's lock: decide how it ended.
    fn end_previous(
        &mut self,
        prev: &Timeline,
        location_hash: u32,
        next: Option<&LockInfo>,
        forced: Option<&ForceRelease>,
        at_ms: i64,
        out: &mut Vec<Event>,
    ) {
        let source = Source::of_flags(prev.flags);
        if prev.has(LAPSED) {
            self.orphans[source.index()] -= 1;
            out.push(Event::OrphanCleared);
            return;
        }
        if source == Source::Probe {
            self.probe_live -= 1;
        }
        // An approval recorded after this migration began, and before any next lock was
        // taken, removed it (the location never moves with a force-release). The record
        // names the lock by a digest the timeline does not keep, so it is matched by time;
        // a force-release is never counted for a migration that ended otherwise before it.
        let approved_ms = forced.and_then(|r| r.approved_at).map(ms);
        let force_released = approved_ms.filter(|t| {
            location_hash == prev.location_hash
                && *t >= prev.acquired_ms
                && *t < prev.expires_ms.saturating_add(millis(self.rules.lapse_grace))
                && next.is_none_or(|n| ms(n.acquired_at) >= *t)
        });
        if let (Some(end_ms), Some(record)) = (force_released, forced) {
            out.push(Event::ForceReleased {
                request: record.id.clone(),
                requested_by: record.requested_by.clone(),
                approved_by: record.approved_by.clone().unwrap_or_default(),
                reason: record.reason.clone(),
            });
            Self::finish(prev, Outcome::ForceReleased, end_ms.min(prev.expires_ms), out);
            return;
        }
        let (outcome, end_ms) = if location_hash != prev.location_hash {
            // Only a swap moves the location, and no swap happens after the lease.
            (Outcome::Swapped, at_ms.min(prev.expires_ms))
        } else if let Some(next) = next {
            // A new pre-lock is refused while the old lease is live: if it came before
            // the old lease's end, the old lock was released.
            let next_ms = ms(next.acquired_at);
            if next_ms < prev.expires_ms {
                (Outcome::Released, next_ms)
            } else {
                (Outcome::Lapsed, prev.expires_ms)
            }
        } else if at_ms < prev.expires_ms.saturating_add(millis(self.rules.lapse_grace)) {
            // Gone within the grace of its end: released by a holder whose clock still
            // saw the lease live (as a swap may be), not lapsed.
            (Outcome::Released, at_ms.min(prev.expires_ms))
        } else {
            (Outcome::Lapsed, prev.expires_ms)
        };
        if outcome == Outcome::Swapped && prev.phase != Phase::Write {
            // A swap is made only from the write phase: the escalations before it went
            // unseen (latest-only delivery), so when the known phase ended is unknown.
            out.push(Event::Ended(outcome));
        } else {
            Self::finish(prev, outcome, end_ms, out);
        }
    }
}

#[cfg(test)]
#[path = "tracker_tests.rs"]
mod tests;
