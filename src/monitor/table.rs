//! The monitor's timelines by resource id, packed so a million in flight fit in
//! 128 MB (BENCHMARKS.md, "Monitor memory").
//!
//! A `HashMap<Box<str>, Timeline>` paid for its spare capacity in whole entries (a
//! 16-byte boxed id and a 56-byte timeline per slot, half the slots empty just after
//! the table doubles) and for one heap allocation per id. Here:
//!
//! - the timelines sit densely in one vector that grows by an eighth at a time, and a
//!   removal moves the last timeline into the hole, so spare capacity is bounded by
//!   the growth step;
//! - the hash index holds the 4-byte slot number and 32 bits of the id's hash, so its
//!   spare capacity costs 9 bytes a bucket (with the control byte) rather than 73, and
//!   growing it rehashes from the buckets alone, touching neither timelines nor ids;
//! - every id's bytes are interned in an arena, 64 KiB chunks with a length prefix,
//!   referred to from the timeline by a 4-byte address that fits in the timeline's
//!   padding; ids of removed timelines are reclaimed by compacting the arena once they
//!   are more than half of it.

use hashbrown::HashTable;

use super::timeline::Timeline;

/// The table cannot hold another id: its arena addresses at most 65,536
/// chunks (4 GiB of ids, a hundred million GUID-sized ones) even after compaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TableFull;

/// Timelines by resource id. Ids are compared byte for byte, as a `HashMap` would.
#[derive(Debug)]
pub struct TimelineTable {
    /// The timelines, dense; `Timeline::id_at` names each one's id in `ids`.
    slots: Vec<Timeline>,
    /// Slot numbers with their id's hash.
    index: HashTable<Bucket>,
    ids: IdArena,
    /// Randomly keyed per process, so nobody outside can aim ids at one bucket.
    hasher: ahash::RandomState,
}

/// One entry of the index: a slot, and the 32 bits of its id's hash that every hash the
/// table uses is made from (see [`spread`]).
#[derive(Debug, Clone, Copy)]
struct Bucket {
    slot: u32,
    hash: u32,
}

/// The table's hash of an entry, from its 32 bits: multiplied by an odd constant so the
/// bits the index takes its bucket from (low) and its tag from (high) both vary.
fn spread(hash: u32) -> u64 {
    u64::from(hash).wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

fn rehash(b: &Bucket) -> u64 {
    spread(b.hash)
}

impl Default for TimelineTable {
    fn default() -> Self {
        Self::with_arena(IdArena::new(IdArena::MAX_CHUNKS))
    }
}

/// How many timelines the slot vector grows by at least: small tables do not reallocate
/// on every insertion.
const MIN_GROWTH: usize = 1024;

impl TimelineTable {
    /// An empty table.
    pub fn new() -> Self {
        Self::default()
    }

    /// A table whose arena holds at most `max_chunks` chunks of 64 KiB: for tests of a
    /// full table.
    #[cfg(test)]
    pub(crate) fn with_max_chunks(max_chunks: usize) -> Self {
        Self::with_arena(IdArena::new(max_chunks))
    }

    fn with_arena(ids: IdArena) -> Self {
        Self { slots: Vec::new(), index: HashTable::new(), ids, hasher: ahash::RandomState::new() }
    }

    /// Timelines held.
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// 32 bits of `id`'s keyed hash (truncated on purpose).
    fn hash32(&self, id: &[u8]) -> u32 {
        self.hasher.hash_one(id) as u32
    }

    fn slot_of(&self, id: &str) -> Option<usize> {
        let hash = self.hash32(id.as_bytes());
        let Self { slots, index, ids, .. } = self;
        index
            .find(spread(hash), |b| b.hash == hash && ids.bytes(slots[b.slot as usize].id_at) == id.as_bytes())
            .map(|b| b.slot as usize)
    }

    /// The timeline of `id`.
    pub fn get(&self, id: &str) -> Option<&Timeline> {
        self.slot_of(id).map(|s| &self.slots[s])
    }

    /// The timeline of `id`, to change it.
    pub fn get_mut(&mut self, id: &str) -> Option<&mut Timeline> {
        self.slot_of(id).map(|s| &mut self.slots[s])
    }

    /// The timeline of `id`, made by `make` when there is none; says whether it was made.
    pub fn get_or_insert_with(
        &mut self,
        id: &str,
        make: impl FnOnce() -> Timeline,
    ) -> Result<(&mut Timeline, bool), TableFull> {
        if let Some(s) = self.slot_of(id) {
            return Ok((&mut self.slots[s], false));
        }
        let s = self.push(id, make())?;
        Ok((&mut self.slots[s], true))
    }

    fn push(&mut self, id: &str, mut timeline: Timeline) -> Result<usize, TableFull> {
        let slot = u32::try_from(self.slots.len()).map_err(|_| TableFull)?;
        timeline.id_at = match self.ids.push(id) {
            Ok(at) => at,
            Err(TableFull) => {
                // The arena may be full of removed ids: compact, then try once more.
                self.compact();
                self.ids.push(id)?
            }
        };
        if self.slots.len() == self.slots.capacity() {
            // Grow by an eighth (amortised O(1) still, and a large block is moved by
            // remapping its pages, not copying them), not double: at a million
            // timelines doubling would leave up to 56 MB unused.
            self.slots.reserve_exact((self.slots.len() / 8).max(MIN_GROWTH));
        }
        self.slots.push(timeline);
        let hash = self.hash32(id.as_bytes());
        self.index.insert_unique(spread(hash), Bucket { slot, hash }, rehash);
        Ok(slot as usize)
    }

    /// Removes and returns the timeline of `id`.
    pub fn remove(&mut self, id: &str) -> Option<Timeline> {
        let slot = self.slot_of(id)?;
        Some(self.remove_slot(slot))
    }

    /// Removes the timeline in `slot`; the last timeline moves into its place.
    fn remove_slot(&mut self, slot: usize) -> Timeline {
        let last = self.slots.len() - 1;
        let hash = self.hash32(self.ids.bytes(self.slots[slot].id_at));
        if let Ok(entry) = self.index.find_entry(spread(hash), |b| b.slot as usize == slot) {
            entry.remove();
        }
        if slot != last {
            let moved = self.hash32(self.ids.bytes(self.slots[last].id_at));
            if let Some(b) = self.index.find_mut(spread(moved), |b| b.slot as usize == last) {
                // `slot` came from a u32 in the index, so it fits.
                b.slot = slot as u32;
            }
        }
        let removed = self.slots.swap_remove(slot);
        self.ids.release(removed.id_at);
        self.shrink_if_sparse();
        if self.ids.worth_compacting() {
            self.compact();
        }
        removed
    }

    /// Keeps the timelines `keep` says to; returns how many were removed.
    pub fn retain(&mut self, mut keep: impl FnMut(&Timeline) -> bool) -> usize {
        let before = self.slots.len();
        let mut slot = 0;
        while slot < self.slots.len() {
            if keep(&self.slots[slot]) {
                slot += 1;
            } else {
                // The last timeline moves into `slot`: look at it next.
                self.remove_slot(slot);
            }
        }
        before - self.slots.len()
    }

    /// Every id and its timeline, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &Timeline)> {
        self.slots.iter().map(|t| (self.ids.str(t.id_at), t))
    }

    /// Every timeline, in no particular order.
    pub fn values(&self) -> impl Iterator<Item = &Timeline> {
        self.slots.iter()
    }

    /// Every id and its timeline, to change the timelines (never the ids).
    pub fn iter_mut(&mut self) -> impl Iterator<Item = (&str, &mut Timeline)> {
        let ids = &self.ids;
        self.slots.iter_mut().map(move |t| (ids.str(t.id_at), t))
    }

    /// Reserves room for `n` more timelines (bulk loads).
    pub fn reserve(&mut self, n: usize) {
        self.slots.reserve_exact(n);
        self.index.reserve(n, rehash);
    }

    /// The heap the table holds: slots and index (spare capacity included) and the
    /// arena's chunks.
    pub fn heap_bytes(&self) -> usize {
        self.slots.capacity() * std::mem::size_of::<Timeline>() + self.index.allocation_size() + self.ids.heap_bytes()
    }

    /// Gives memory back after a wave of removals: a table that held a million and now
    /// holds a thousand should not keep the million's slots.
    fn shrink_if_sparse(&mut self) {
        let len = self.slots.len();
        if self.slots.capacity() > 2 * len + MIN_GROWTH {
            self.slots.shrink_to(len + len / 4);
        }
        if self.index.capacity() > 4 * len + MIN_GROWTH {
            self.index.shrink_to(len, rehash);
        }
    }

    /// Copies the live ids into a fresh arena and repoints every timeline: the removed
    /// ones' bytes are dropped.
    fn compact(&mut self) {
        let mut fresh = IdArena::new(self.ids.max_chunks);
        let mut moved = Vec::with_capacity(self.slots.len());
        for t in &self.slots {
            match fresh.push_bytes(self.ids.bytes(t.id_at)) {
                Ok(at) => moved.push(at),
                // Cannot happen (the live ids fitted before), and if it did, the old
                // arena is still whole: keep it.
                Err(TableFull) => return,
            }
        }
        for (t, at) in self.slots.iter_mut().zip(moved) {
            t.id_at = at;
        }
        self.ids = fresh;
    }
}

/// Ids interned back to back: each a LEB128 length, then its bytes, never across two
/// chunks. An address is `chunk << 16 | offset`; an id too long for a chunk gets a chunk
/// of its own, sized for it, at offset 0.
#[derive(Debug)]
struct IdArena {
    chunks: Vec<Vec<u8>>,
    /// Bytes of ids that were released and still sit in a chunk.
    garbage: usize,
    /// Bytes of live ids (prefixes included).
    live: usize,
    max_chunks: usize,
}

impl IdArena {
    const CHUNK: usize = 1 << 16;
    /// Chunk numbers are the address's high 16 bits.
    const MAX_CHUNKS: usize = 1 << 16;

    fn new(max_chunks: usize) -> Self {
        Self { chunks: Vec::new(), garbage: 0, live: 0, max_chunks: max_chunks.min(Self::MAX_CHUNKS) }
    }

    fn push(&mut self, id: &str) -> Result<u32, TableFull> {
        self.push_bytes(id.as_bytes())
    }

    fn push_bytes(&mut self, id: &[u8]) -> Result<u32, TableFull> {
        let mut prefix = [0u8; 10];
        let prefix_len = leb128(id.len(), &mut prefix);
        let record = prefix_len + id.len();
        let fits = self.chunks.last().is_some_and(|c| c.capacity() - c.len() >= record);
        if !fits {
            if self.chunks.len() >= self.max_chunks {
                return Err(TableFull);
            }
            self.chunks.push(Vec::with_capacity(record.max(Self::CHUNK)));
        }
        let chunk_no = self.chunks.len() - 1;
        let Some(chunk) = self.chunks.last_mut() else {
            return Err(TableFull); // just pushed one: not reached
        };
        let offset = chunk.len();
        chunk.extend_from_slice(&prefix[..prefix_len]);
        chunk.extend_from_slice(id);
        self.live += record;
        // chunk_no < 2^16 (max_chunks) and offset < CHUNK = 2^16 (a long id starts a
        // chunk of its own at 0), so both fit their halves.
        Ok(((chunk_no as u32) << 16) | offset as u32)
    }

    fn record(&self, at: u32) -> (usize, &[u8]) {
        let chunk = &self.chunks[(at >> 16) as usize];
        let start = (at & 0xFFFF) as usize;
        let (len, prefix_len) = read_leb128(&chunk[start..]);
        (prefix_len + len, &chunk[start + prefix_len..start + prefix_len + len])
    }

    fn bytes(&self, at: u32) -> &[u8] {
        self.record(at).1
    }

    fn str(&self, at: u32) -> &str {
        // Every id came in as a `&str`, so this is UTF-8; the fallback is never shown.
        std::str::from_utf8(self.bytes(at)).unwrap_or("\u{fffd}")
    }

    fn release(&mut self, at: u32) {
        let (record, _) = self.record(at);
        self.live -= record;
        self.garbage += record;
    }

    /// Compacting copies every live id: worth it once released ids outweigh live ones
    /// (so each copy is paid for by as many removals) and fill a few chunks.
    fn worth_compacting(&self) -> bool {
        self.garbage > self.live && self.garbage > 4 * Self::CHUNK
    }

    fn heap_bytes(&self) -> usize {
        self.chunks.iter().map(Vec::capacity).sum::<usize>() + self.chunks.capacity() * std::mem::size_of::<Vec<u8>>()
    }
}

/// Writes `n` as LEB128 into `out`; returns how many bytes it took.
fn leb128(mut n: usize, out: &mut [u8; 10]) -> usize {
    let mut i = 0;
    loop {
        let low = (n & 0x7F) as u8;
        n >>= 7;
        if n == 0 {
            out[i] = low;
            return i + 1;
        }
        out[i] = low | 0x80;
        i += 1;
    }
}

/// Reads a LEB128 number written by [`leb128`]: (value, bytes taken).
fn read_leb128(bytes: &[u8]) -> (usize, usize) {
    let mut n = 0usize;
    for (i, b) in bytes.iter().enumerate() {
        n |= usize::from(b & 0x7F) << (7 * i);
        if b & 0x80 == 0 {
            return (n, i + 1);
        }
    }
    (n, bytes.len())
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;
    use crate::document::Phase;

    fn timeline(n: i64) -> Timeline {
        Timeline::new(n, n + 1, n + 2, n as u32, 0, Phase::PreLock, 0)
    }

    #[test]
    fn lengths_round_trip_through_leb128() {
        for n in [0, 1, 127, 128, 255, 16_383, 16_384, 65_535, 1 << 20, usize::MAX] {
            let mut buf = [0; 10];
            let len = leb128(n, &mut buf);
            assert_eq!(read_leb128(&buf[..len]), (n, len), "{n}");
        }
    }

    /// The table against a `HashMap` doing the same inserts and removals, over enough
    /// ids to grow, shrink and compact, with ids of every length (empty, multi-byte
    /// UTF-8, and longer than a chunk).
    #[test]
    fn behaves_as_a_hash_map_through_growth_removal_and_compaction() {
        let mut table = TimelineTable::new();
        let mut model: HashMap<String, i64> = HashMap::new();
        let id = |i: usize| match i % 50 {
            0 => String::new(),
            1 => "é".repeat(i % 300),
            2 if i % 1000 == 2 => "x".repeat(IdArena::CHUNK + i),
            _ => format!("{i:08x}-0000-4000-8000-{:012x}", i.wrapping_mul(2_654_435_761)),
        };
        for round in 0..3 {
            for i in 0..40_000 {
                let key = id(i + round * 7);
                let (t, created) = table.get_or_insert_with(&key, || timeline(i as i64)).unwrap();
                assert_eq!(created, !model.contains_key(&key), "{round}/{i}");
                if created {
                    model.insert(key.clone(), t.acquired_ms);
                }
                assert_eq!(table.get(&key).map(|t| t.acquired_ms), model.get(&key).copied());
            }
            // Remove most, every other way: by id and by retain.
            let doomed: Vec<String> = model.keys().filter(|k| k.len() % 3 != 0).cloned().collect();
            for k in &doomed {
                assert_eq!(table.remove(k).map(|t| t.acquired_ms), model.remove(k));
                assert!(table.remove(k).is_none());
            }
            let removed = table.retain(|t| t.acquired_ms % 2 == 0);
            let before = model.len();
            model.retain(|_, acquired| *acquired % 2 == 0);
            assert_eq!(removed, before - model.len());
            assert_eq!(table.len(), model.len());
            for (k, acquired) in &model {
                assert_eq!(table.get(k).map(|t| t.acquired_ms), Some(*acquired), "{k:.40}");
            }
            let mut seen: Vec<(String, i64)> = table.iter().map(|(k, t)| (k.to_owned(), t.acquired_ms)).collect();
            let mut expected: Vec<(String, i64)> = model.iter().map(|(k, v)| (k.clone(), *v)).collect();
            seen.sort();
            expected.sort();
            assert_eq!(seen, expected);
        }
        assert!(table.ids.garbage <= table.ids.live.max(4 * IdArena::CHUNK), "compaction keeps garbage bounded");
    }

    /// The budget of BENCHMARKS.md's "Monitor memory" (128 bytes per migration at a
    /// million, bench-measured), held here at a size the suite can afford.
    #[test]
    fn a_guid_keyed_migration_costs_under_128_bytes() {
        // 114,700 is just past the index's growth from 2^17 to 2^18 buckets, its
        // sparsest point.
        for n in [100_000usize, 114_700, 150_000] {
            let mut table = TimelineTable::new();
            for i in 0..n {
                let id = format!("{:08x}-0000-4000-8000-{:012x}", i, i.wrapping_mul(2_654_435_761));
                table.get_or_insert_with(&id, || timeline(i as i64)).unwrap();
            }
            let per = table.heap_bytes() / n;
            assert!(per <= 128, "{per} bytes per migration at {n}");
        }
    }

    #[test]
    fn memory_returns_after_a_wave_of_removals() {
        let mut table = TimelineTable::new();
        for i in 0..200_000 {
            table.get_or_insert_with(&format!("resource-{i}"), || timeline(i)).unwrap();
        }
        let full = table.heap_bytes();
        table.retain(|t| t.acquired_ms < 1_000);
        assert_eq!(table.len(), 1_000);
        let after = table.heap_bytes();
        assert!(after * 20 < full, "{after} bytes kept of {full}");
        assert!((0..1_000).all(|i| table.get(&format!("resource-{i}")).is_some()));
    }

    #[test]
    fn a_full_arena_refuses_and_changes_nothing() {
        let mut table = TimelineTable::with_arena(IdArena::new(1));
        let long = "y".repeat(IdArena::CHUNK / 2);
        table.get_or_insert_with(&long, || timeline(1)).unwrap();
        assert_eq!(table.get_or_insert_with(&"z".repeat(IdArena::CHUNK), || timeline(2)).err(), Some(TableFull));
        assert_eq!((table.len(), table.ids.chunks.len()), (1, 1), "the refusal changed nothing");
        assert_eq!(table.get_or_insert_with("another", || timeline(3)).err(), None, "room left in the chunk");
        assert_eq!(table.len(), 2);
        // Once its ids are removed, compaction makes room again.
        table.remove(&long);
        table.get_or_insert_with(&"z".repeat(IdArena::CHUNK - 16), || timeline(4)).unwrap();
        assert_eq!(table.len(), 2);
        assert!(table.get("another").is_some());
    }
}
