//! The in-memory bucket store: one TAT per key in a sharded hash table.
//!
//! Place in the path: behind [`super::RateLimiter`] with `backend = "memory"`;
//! every replica has its own buckets.
//!
//! Why not governor's keyed limiter: it holds one quota per limiter and checks
//! one key at a time, so a call needing tokens from two buckets would take the
//! first before learning the second refuses. Here every bucket of a call is
//! decided together, so a refused call takes nothing.
//!
//! Layout and locking (no global lock):
//! - 64 shards, each a `RwLock<HashTable<Cell>>`; a key's hash picks its shard.
//!   Checks take shard locks in *read* mode only, so they never wait for each
//!   other on the table; the write lock is for inserting a new key and for the
//!   janitor's sweep of one shard.
//! - A cell is the key's identity and an `AtomicU64` holding its TAT (24 bytes,
//!   no allocation per key). The identity is two independent 64-bit hashes of
//!   the key under random per-process seeds: SipHash (which also places the
//!   key in the table, and resists crafted collisions) and foldhash. Two keys
//!   would share a bucket only if both collide (odds about n² / 2¹²⁹ for n
//!   keys), which no client can arrange without the process's secret keys.
//! - One bucket (the usual case) is decided with a compare-and-swap loop: lock-free.
//! - Several buckets are decided under per-cell locks: the top bit of each TAT
//!   is a lock bit, taken in a fixed order (shard, then key), so concurrent
//!   calls cannot deadlock; all TATs are read, decided with
//!   [`gcra::admit_all`], then written (or left as they were) and released.
//!   The single-bucket path waits while a cell's lock bit is set, so the
//!   all-or-nothing decision is exact under any interleaving.
//! - Shard read locks are taken in ascending shard order, each at most once,
//!   so a waiting writer cannot close a cycle.
//!
//! - A refund compares and swaps each cell back (see [`gcra::refund`]).
//!
//! Invariants: a refused call writes nothing; a key is removed only when its
//! bucket is full (TAT ≤ now), which is the state of an absent key, so the
//! sweep never changes a decision; memory is one cell per key that was used
//! within its refill time (a bucket takes at most `burst / per_second` to fill).

use std::hash::BuildHasher;
use std::hash::RandomState;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

use hashbrown::HashTable;

use super::gcra::{self, Quota, Refund, Refusal};

/// Number of shards (a power of two).
const SHARDS: usize = 64;
/// Lock bit of a cell's TAT (TATs stay below 2^63).
const LOCKED: u64 = 1 << 63;

/// Buckets by key.
#[derive(Debug)]
pub(crate) struct MemoryStore {
    shards: Box<[Shard]>,
    /// Two independently seeded hashers: a key's identity is both hashes.
    hashers: (RandomState, foldhash::quality::RandomState),
}

/// A key's identity; `.0` is also its hash in the table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Id(u64, u64);

/// One shard, on its own cache lines.
#[derive(Debug, Default)]
#[repr(align(128))]
struct Shard {
    table: RwLock<HashTable<Cell>>,
}

#[derive(Debug)]
struct Cell {
    id: Id,
    tat: AtomicU64,
}

// === impl MemoryStore ===

impl MemoryStore {
    pub(crate) fn new() -> Self {
        Self {
            shards: (0..SHARDS).map(|_| Shard::default()).collect(),
            hashers: (
                RandomState::new(),
                foldhash::quality::RandomState::default(),
            ),
        }
    }

    fn id(&self, key: &[u8]) -> Id {
        Id(self.hashers.0.hash_one(key), self.hashers.1.hash_one(key))
    }

    /// Decides a call needing one token from each bucket `keys[i]` (shape
    /// `quotas[i]`) at `now`; takes them all or none. A key given twice is one
    /// bucket. Admitted, it answers the TAT each bucket holds after the take
    /// (what [`refund`](Self::refund) needs to give the tokens back).
    pub(crate) fn check(
        &self,
        keys: &[&[u8]],
        quotas: &[Quota],
        now: u64,
    ) -> Result<Vec<u64>, Refusal> {
        match keys {
            [] => Ok(Vec::new()),
            [key] => self.check_one(key, quotas[0], now).map(|t| vec![t]),
            _ => self.check_many(keys, quotas, now),
        }
    }

    /// Gives back the tokens a [`check`](Self::check) took, bucket by bucket
    /// ([`gcra::refund`]: exact when no other take came since, else the
    /// token stays taken); returns how many stayed taken. A cell another
    /// call holds locked is waited for, then compared.
    pub(crate) fn refund(
        &self,
        keys: &[&[u8]],
        quotas: &[Quota],
        taken: &[u64],
        now: u64,
    ) -> usize {
        let mut spent = 0;
        let mut done: Vec<Id> = Vec::with_capacity(keys.len());
        for ((key, quota), &taken) in keys.iter().zip(quotas).zip(taken) {
            let id = self.id(key);
            if done.contains(&id) {
                // One bucket named twice took one token.
                continue;
            }
            done.push(id);
            let table = read(&self.shards[shard_index(id)]);
            // A swept cell was a full bucket: nothing to give back.
            let Some(cell) = table.find(id.0, |c| c.id == id) else {
                continue;
            };
            if refund_one(&cell.tat, taken, now, *quota) == Refund::Spent {
                spent += 1;
            }
        }
        spent
    }

    /// What [`check`](Self::check) would decide at `now`, writing nothing
    /// (a key not in the store is a full bucket; nothing is inserted). A cell
    /// another call holds locked is read as it was before that call.
    pub(crate) fn peek(&self, keys: &[&[u8]], quotas: &[Quota], now: u64) -> Result<(), Refusal> {
        let mut tats: Vec<u64> = keys
            .iter()
            .map(|key| {
                let id = self.id(key);
                read(&self.shards[shard_index(id)])
                    .find(id.0, |c| c.id == id)
                    .map_or(0, |c| c.tat.load(Ordering::Acquire) & !LOCKED)
            })
            .collect();
        // The same key twice reads the same TAT twice: one bucket's verdict.
        gcra::admit_all(&mut tats, now, quotas)
    }

    fn check_one(&self, key: &[u8], quota: Quota, now: u64) -> Result<u64, Refusal> {
        let id = self.id(key);
        let shard = &self.shards[shard_index(id)];
        {
            let table = read(shard);
            if let Some(cell) = table.find(id.0, |c| c.id == id) {
                return decide_one(&cell.tat, quota, now);
            }
        }
        // A new key: insert it and decide while no one else can see it.
        let mut table = write(shard);
        let cell = match table.find_mut(id.0, |c| c.id == id) {
            Some(cell) => cell,
            None => table
                .insert_unique(id.0, Cell::new(id), |c| c.id.0)
                .into_mut(),
        };
        let tat = cell.tat.get_mut();
        match gcra::admit(*tat, now, quota) {
            Ok(next) => {
                *tat = next;
                Ok(next)
            }
            Err(retry_at) => Err(Refusal { index: 0, retry_at }),
        }
    }

    fn check_many(&self, keys: &[&[u8]], quotas: &[Quota], now: u64) -> Result<Vec<u64>, Refusal> {
        // Lock order: by shard, then by identity.
        let mut order: Vec<(usize, Id, usize)> = keys
            .iter()
            .enumerate()
            .map(|(i, k)| {
                let id = self.id(k);
                (shard_index(id), id, i)
            })
            .collect();
        order.sort_unstable();
        if order.windows(2).any(|w| w[0].1 == w[1].1) {
            // One identity twice (the same key, or a 128-bit collision): one
            // bucket, checked once; locking its cell twice would never return.
            let mut seen: Vec<Id> = Vec::with_capacity(order.len());
            let mut positions = Vec::with_capacity(order.len());
            for (i, key) in keys.iter().enumerate() {
                let id = self.id(key);
                if !seen.contains(&id) {
                    seen.push(id);
                    positions.push(i);
                }
            }
            let unique: Vec<&[u8]> = positions.iter().map(|&i| keys[i]).collect();
            let quotas: Vec<Quota> = positions.iter().map(|&i| quotas[i]).collect();
            let tats = self.check(&unique, &quotas, now).map_err(|r| Refusal {
                index: positions[r.index],
                ..r
            })?;
            // Every position answers its bucket's TAT.
            return Ok(keys
                .iter()
                .map(|k| {
                    let id = self.id(k);
                    let j = seen.iter().position(|s| *s == id).unwrap_or(0);
                    tats[j]
                })
                .collect());
        }
        let mut shards: Vec<usize> = order.iter().map(|o| o.0).collect();
        shards.dedup();

        let guards: Vec<(usize, RwLockReadGuard<'_, HashTable<Cell>>)> =
            shards.iter().map(|&s| (s, read(&self.shards[s]))).collect();
        let mut cells: Vec<&AtomicU64> = Vec::with_capacity(order.len());
        for &(s, id, _) in &order {
            let table = guards
                .iter()
                .find(|g| g.0 == s)
                .map(|g| &g.1)
                .expect("a guard for every shard in the order");
            match table.find(id.0, |c| c.id == id) {
                Some(cell) => cells.push(&cell.tat),
                None => break,
            }
        }
        if cells.len() < order.len() {
            drop(cells);
            drop(guards);
            return self.check_many_exclusive(quotas, now, &order, &shards);
        }

        // Lock every cell in order, decide, write, release.
        let mut tats = vec![0; keys.len()];
        for (cell, &(_, _, i)) in cells.iter().zip(&order) {
            tats[i] = lock(cell);
        }
        let before = tats.clone();
        let outcome = gcra::admit_all(&mut tats, now, quotas);
        for (cell, &(_, _, i)) in cells.iter().zip(&order) {
            let value = if outcome.is_ok() { tats[i] } else { before[i] };
            cell.store(value, Ordering::Release);
        }
        outcome.map(|()| tats)
    }

    /// The path for calls touching a key not yet in the store: every shard
    /// involved is write-locked (ascending), missing keys are inserted, and
    /// the decision is made with exclusive access.
    fn check_many_exclusive(
        &self,
        quotas: &[Quota],
        now: u64,
        order: &[(usize, Id, usize)],
        shards: &[usize],
    ) -> Result<Vec<u64>, Refusal> {
        let mut guards: Vec<(usize, RwLockWriteGuard<'_, HashTable<Cell>>)> = shards
            .iter()
            .map(|&s| (s, write(&self.shards[s])))
            .collect();
        let mut tats = vec![0; quotas.len()];
        for &(s, id, i) in order {
            let table = guard_mut(&mut guards, s);
            let cell = match table.find_mut(id.0, |c| c.id == id) {
                Some(cell) => cell,
                None => table
                    .insert_unique(id.0, Cell::new(id), |c| c.id.0)
                    .into_mut(),
            };
            tats[i] = *cell.tat.get_mut();
        }
        gcra::admit_all(&mut tats, now, quotas)?;
        for &(s, id, i) in order {
            let table = guard_mut(&mut guards, s);
            if let Some(cell) = table.find_mut(id.0, |c| c.id == id) {
                *cell.tat.get_mut() = tats[i];
            }
        }
        Ok(tats)
    }

    /// Removes every full bucket (TAT ≤ `now`) and returns the freed table
    /// space; returns how many keys were removed.
    pub(crate) fn sweep(&self, now: u64) -> usize {
        let mut removed = 0;
        for shard in self.shards.iter() {
            let mut table = write(shard);
            let before = table.len();
            table.retain(|c| *c.tat.get_mut() > now);
            removed += before - table.len();
            if table.capacity() > 2 * table.len() + 64 {
                table.shrink_to_fit(|c| c.id.0);
            }
        }
        removed
    }

    /// Keys held.
    pub(crate) fn len(&self) -> usize {
        self.shards.iter().map(|s| read(s).len()).sum()
    }

    /// Bytes of memory the tables hold (slots and control bytes), for figures.
    pub(crate) fn table_bytes(&self) -> usize {
        self.shards
            .iter()
            .map(|s| read(s).capacity() * (std::mem::size_of::<Cell>() + 1))
            .sum()
    }
}

/// The table uses a hash's low bits and its top 7; shards take the middle.
fn shard_index(id: Id) -> usize {
    ((id.0 >> 32) as usize) & (SHARDS - 1)
}

impl Cell {
    fn new(id: Id) -> Self {
        Self {
            id,
            tat: AtomicU64::new(0),
        }
    }
}

/// One bucket, lock-free: compare-and-swap until the TAT read is the TAT replaced.
fn decide_one(tat: &AtomicU64, quota: Quota, now: u64) -> Result<u64, Refusal> {
    let mut spins = 0;
    let mut current = tat.load(Ordering::Acquire);
    loop {
        if current & LOCKED != 0 {
            backoff(&mut spins);
            current = tat.load(Ordering::Acquire);
            continue;
        }
        let next =
            gcra::admit(current, now, quota).map_err(|retry_at| Refusal { index: 0, retry_at })?;
        match tat.compare_exchange_weak(current, next, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => return Ok(next),
            Err(actual) => current = actual,
        }
    }
}

/// One bucket's refund, lock-free: waits out a multi-bucket decision holding
/// the cell, then replaces the TAT only if it is still the one the take left.
fn refund_one(tat: &AtomicU64, taken: u64, now: u64, quota: Quota) -> Refund {
    let mut spins = 0;
    loop {
        let current = tat.load(Ordering::Acquire);
        if current & LOCKED != 0 {
            backoff(&mut spins);
            continue;
        }
        let found = gcra::refund(current, taken, now, quota);
        let Refund::Returned(back) = found else {
            return found;
        };
        if tat
            .compare_exchange_weak(current, back, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            return found;
        }
    }
}

/// Sets a cell's lock bit; returns the TAT it held.
fn lock(tat: &AtomicU64) -> u64 {
    let mut spins = 0;
    loop {
        let current = tat.load(Ordering::Relaxed);
        if current & LOCKED == 0
            && tat
                .compare_exchange_weak(
                    current,
                    current | LOCKED,
                    Ordering::Acquire,
                    Ordering::Relaxed,
                )
                .is_ok()
        {
            return current;
        }
        backoff(&mut spins);
    }
}

/// Spin briefly, then let other threads run (the lock holder may be descheduled).
fn backoff(spins: &mut u32) {
    if *spins < 32 {
        std::hint::spin_loop();
    } else {
        std::thread::yield_now();
    }
    *spins = spins.saturating_add(1);
}

fn read(shard: &Shard) -> RwLockReadGuard<'_, HashTable<Cell>> {
    shard.table.read().unwrap_or_else(PoisonError::into_inner)
}

fn write(shard: &Shard) -> RwLockWriteGuard<'_, HashTable<Cell>> {
    shard.table.write().unwrap_or_else(PoisonError::into_inner)
}

fn guard_mut<'a, 'g>(
    guards: &'a mut [(usize, RwLockWriteGuard<'g, HashTable<Cell>>)],
    shard: usize,
) -> &'a mut HashTable<Cell> {
    let position = guards
        .iter()
        .position(|g| g.0 == shard)
        .expect("a guard for every shard in the order");
    &mut guards[position].1
}
