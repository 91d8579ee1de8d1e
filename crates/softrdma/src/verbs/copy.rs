//! Copy engines: the payload copies of large transfers, spread over helper threads, as a NIC
//! spreads its DMA over several engines.
//!
//! One thread copies a payload that another core wrote (the ring of a same-host lane, a
//! program's buffer) at about 12 GB/s on a 16-core Xeon, whatever the message size: the
//! bytes cross from one core's cache to another's, and one core has only so many misses in
//! flight; two threads copying halves reach about 24 GB/s (see BENCHMARKS.md, "Copy
//! engines"). So where a QP moves many bytes at once (a run of packets built into a lane's
//! ring, or a run of packets received), the data path *defers* the payload copies of the run
//! (the checks of every key, PD, bound and access flag are made at once, as before: only the
//! copies wait) and then makes them all in one [`Batch::run`], which hands a share to the
//! helper threads when the run is large. Nothing is visible meanwhile: the copies of a
//! received run are done before any other access to memory of the QP, before its ACKs and
//! completions; those of a sent run before the ring is published.
//!
//! - **Threads**: `SOFTRDMA_COPY_THREADS` helpers per process (0 turns deferral off);
//!   by default one per four CPUs, at most 4, and none on a machine of fewer than 8 CPUs
//!   (there the other side of the transfer has the other core). Started on first use.
//! - **The caller works too**: the copies are claimed one by one by whoever comes, the calling
//!   thread included, so a helper that is slow to wake costs nothing but its share; the
//!   caller returns once every copy is done. Copies whose destinations overlap (a run of
//!   WRITEs to one buffer, receives into one buffer) are claimed together and made in
//!   order by one thread, so the bytes end as if made one after the other.
//! - Runs under [`PARALLEL_MIN`] bytes are copied by the caller alone, and so are runs while
//!   the helpers prove of no use (all cores busy: see [`Pool::worth_it`]).
//! - Helpers look for work for [`SPIN`] after their last copy, yielding the processor as they
//!   look, then sleep until a run wakes them.

use crate::verbs::mr::MrLease;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// The smallest run whose copies are shared with the helpers (below it, handing work over
/// costs more than it saves).
pub(crate) const PARALLEL_MIN: usize = 128 << 10;
/// How long a helper with nothing to do looks for more before it sleeps: a stream of large
/// transfers hands it a run every few tens of µs. It yields the processor as it looks, so
/// that on a busy machine (many processes, each with its helpers) it takes no core from a
/// thread with work.
const SPIN: Duration = Duration::from_micros(50);

/// The number of helper threads: `SOFTRDMA_COPY_THREADS`, else one per four CPUs (at most
/// 4) on machines of 8 CPUs or more, else 0 (read once).
pub(crate) fn helpers() -> usize {
    static N: OnceLock<usize> = OnceLock::new();
    *N.get_or_init(|| {
        std::env::var("SOFTRDMA_COPY_THREADS")
            .ok()
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| {
                let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
                if cpus >= 8 {
                    (cpus / 4).min(4)
                } else {
                    0
                }
            })
            .min(64)
    })
}

/// What the copy engines of this process did since it started ([`copy_engines`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CopyEngineStats {
    /// Helper threads running (0: every payload copy is made on the spot, undeferred).
    pub helpers: usize,
    /// Runs of deferred copies shared with the helpers.
    pub shared_runs: u64,
    /// Copies of shared runs that helpers made (the rest their callers made).
    pub helper_copies: u64,
    /// Runs of 128 KiB or more made by their caller alone: the helpers were backing off
    /// (every core busy), or the run's copies all overlapped one another (one group, made
    /// in order: see `Batch::plan`).
    pub alone_runs: u64,
    /// Times the helpers proved of no use and the process backed off (made the next runs
    /// alone).
    pub back_offs: u64,
}

static SHARED_RUNS: AtomicU64 = AtomicU64::new(0);
static HELPER_COPIES: AtomicU64 = AtomicU64::new(0);
static ALONE_RUNS: AtomicU64 = AtomicU64::new(0);
static BACK_OFFS: AtomicU64 = AtomicU64::new(0);

/// What the copy engines of this process did since it started: the payload copies of large
/// runs of packets that helper threads share (see the README's "Copy engines";
/// `SOFTRDMA_COPY_THREADS`). Starts the helpers if they were not yet. Never fails.
pub fn copy_engines() -> CopyEngineStats {
    CopyEngineStats {
        helpers: if pool().is_some() { helpers() } else { 0 },
        shared_runs: SHARED_RUNS.load(Ordering::Relaxed),
        helper_copies: HELPER_COPIES.load(Ordering::Relaxed),
        alone_runs: ALONE_RUNS.load(Ordering::Relaxed),
        back_offs: BACK_OFFS.load(Ordering::Relaxed),
    }
}

/// Whether the data path defers payload copies to run them in batches (there are helpers,
/// and they started).
#[inline]
pub(crate) fn deferring() -> bool {
    pool().is_some()
}

/// One deferred copy: `len` bytes from `src` to `dst`, and the lease that keeps the
/// registered memory on one side of it registered until it is made.
pub(crate) struct Copy {
    dst: usize,
    src: usize,
    len: usize,
    _lease: MrLease,
}

/// The deferred copies of a run, in order.
#[derive(Default)]
pub(crate) struct Batch {
    copies: Vec<Copy>,
    bytes: usize,
    /// Room for the copies' indices sorted by destination (kept between runs).
    order: Vec<u32>,
    /// Room for each copy's group of copies whose destinations overlap (kept between runs).
    group: Vec<u32>,
}

impl Batch {
    /// Defers copying `len` bytes from `src` to `dst`.
    ///
    /// # Safety
    /// Until the batch is run or truncated past this copy, `src` must stay valid for reads
    /// and `dst` for writes of `len` bytes, and nothing else may touch `dst` (`lease` keeps
    /// the registered side registered; the other side is the caller's to keep).
    #[inline]
    pub(crate) unsafe fn push(&mut self, dst: *mut u8, src: *const u8, len: usize, lease: MrLease) {
        self.bytes += len;
        self.copies.push(Copy {
            dst: dst as usize,
            src: src as usize,
            len,
            _lease: lease,
        });
    }

    /// Copies deferred so far.
    #[inline]
    pub(crate) fn len(&self) -> usize {
        self.copies.len()
    }

    /// Forgets the copies deferred after the first `n` (a packet that is not sent after all).
    pub(crate) fn truncate(&mut self, n: usize) {
        for c in self.copies.drain(n.min(self.copies.len())..) {
            self.bytes -= c.len;
        }
    }

    /// Makes every deferred copy, with the helpers when the run is large, and empties the
    /// batch (ending its leases). Returns when all are done.
    pub(crate) fn run(&mut self) {
        self.run_on(pool());
    }

    fn run_on(&mut self, pool: Option<&Pool>) {
        if self.copies.is_empty() {
            return;
        }
        if self.bytes >= PARALLEL_MIN && self.copies.len() > 1 {
            if let Some(p) = pool {
                if p.worth_it() {
                    let (items, groups) = self.plan();
                    // (One group: every copy overlaps the next, so one thread makes them all.)
                    if groups.len() > 2 {
                        p.run(items, groups);
                        self.copies.clear();
                        self.bytes = 0;
                        return;
                    }
                }
                ALONE_RUNS.fetch_add(1, Ordering::Relaxed);
            }
        }
        for c in &self.copies {
            // SAFETY: `push`'s contract: both ranges valid, `dst` untouched by others.
            unsafe { copy(c) };
        }
        self.copies.clear();
        self.bytes = 0;
    }
}

impl Batch {
    /// The run's copies as groups that threads may make at once: copies whose destinations
    /// overlap (two WRITEs of a run to one address, two receives into one buffer), directly
    /// or through others, form one group, made by one thread in the order they were
    /// deferred, so that the bytes end as if every copy had been made in turn; a copy that
    /// overlaps none is a group of its own. Returns the copies (address, address, length),
    /// group after group, and where each group starts, with the number of copies last.
    fn plan(&mut self) -> (Vec<(usize, usize, usize)>, Vec<u32>) {
        let n = self.copies.len();
        let copies = &self.copies;
        let order = &mut self.order;
        order.clear();
        order.extend(0..n as u32);
        order.sort_unstable_by_key(|&i| copies[i as usize].dst);
        // Sweep the destinations from the lowest: a copy that starts before the end of the
        // bytes the group so far covers joins it.
        let group = &mut self.group;
        group.clear();
        group.resize(n, 0);
        let mut groups = 0u32;
        let mut end = 0usize;
        for (k, &i) in order.iter().enumerate() {
            let c = &copies[i as usize];
            if k == 0 || c.dst >= end {
                groups += 1;
                end = c.dst + c.len;
            } else {
                end = end.max(c.dst + c.len);
            }
            group[i as usize] = groups - 1;
        }
        // Where each group starts (counting sort by group, in deferral order within one).
        let mut starts = vec![0u32; groups as usize + 1];
        for &g in group.iter() {
            starts[g as usize + 1] += 1;
        }
        for g in 0..groups as usize {
            starts[g + 1] += starts[g];
        }
        let mut at: Vec<u32> = starts[..groups as usize].to_vec();
        let mut items = vec![(0, 0, 0); n];
        for (i, c) in copies.iter().enumerate() {
            let g = group[i] as usize;
            items[at[g] as usize] = (c.dst, c.src, c.len);
            at[g] += 1;
        }
        (items, starts)
    }

    /// Forgets every deferred copy without making it.
    pub(crate) fn forget(&mut self) {
        self.copies.clear();
        self.bytes = 0;
    }
}

impl Drop for Batch {
    fn drop(&mut self) {
        // Copies the data path deferred are never lost on an early return; on a panic they
        // are dropped (what they were for is abandoned, and their memory may be gone).
        if std::thread::panicking() {
            self.forget();
        } else {
            self.run();
        }
    }
}

/// # Safety
/// As [`Batch::push`].
#[inline]
unsafe fn copy(c: &Copy) {
    // SAFETY: the caller's.
    unsafe { std::ptr::copy_nonoverlapping(c.src as *const u8, c.dst as *mut u8, c.len) };
}

/// A run's copies being made: claimed a group at a time (`next`; see [`Batch::plan`]),
/// groups counted when done.
struct Job {
    /// The copies (address, address, length; borrowed from the caller, who waits for
    /// `done` to reach the number of groups before they go), group after group.
    items: Vec<(usize, usize, usize)>,
    /// Where each group of `items` starts, and their number last.
    groups: Vec<u32>,
    next: AtomicUsize,
    done: AtomicUsize,
}

impl Job {
    /// The number of groups.
    fn groups(&self) -> usize {
        self.groups.len() - 1
    }

    /// Claims groups and makes their copies, in order, until none is left; returns how many
    /// copies it made.
    fn work(&self) -> usize {
        let mut made = 0;
        loop {
            let g = self.next.fetch_add(1, Ordering::Relaxed);
            if g >= self.groups() {
                return made;
            }
            let (from, to) = (self.groups[g] as usize, self.groups[g + 1] as usize);
            for &(dst, src, len) in &self.items[from..to] {
                // SAFETY: the group is claimed once (the counter hands out each index
                // once), its copies are made in order by this thread alone, and the caller
                // of `Pool::run` keeps every range valid until `done` counts the group.
                unsafe { std::ptr::copy_nonoverlapping(src as *const u8, dst as *mut u8, len) };
            }
            made += to - from;
            self.done.fetch_add(1, Ordering::Release);
        }
    }
}

struct Pool {
    /// Runs in a row in which the helpers were of no use (see [`Pool::run`]).
    useless: AtomicUsize,
    /// Runs still to be made without the helpers (backing off).
    alone: AtomicUsize,
    /// Helpers not asleep (working or looking for work).
    awake: AtomicUsize,
    queue: Mutex<VecDeque<Arc<Job>>>,
    /// Jobs in the queue (read without the lock by spinning helpers).
    queued: AtomicUsize,
    wake: Condvar,
}

/// The process's copy engines (started on first use); `None` when there are no helpers or
/// none could start.
fn pool() -> Option<&'static Pool> {
    static POOL: OnceLock<Option<&'static Pool>> = OnceLock::new();
    *POOL.get_or_init(|| Pool::start(helpers()))
}

/// Runs in a row in which the helpers were of no use before the pool backs off.
const USELESS_RUNS: usize = 4;
/// Runs made alone when the pool backs off.
const BACK_OFF_RUNS: usize = 256;
/// A caller that waited longer than this for helpers to finish their copies found them
/// slow: they had lost their cores (many processes copy at once).
const SLOW_HELPERS: Duration = Duration::from_micros(20);

impl Pool {
    /// Whether to share the next run with the helpers: not while backing off. The helpers
    /// are of no use when, awake as the run came, the caller still made every copy itself
    /// (they did not come in time) or waited long for theirs (they lost their cores): on a
    /// machine whose cores are all busy (say sixteen processes, each with its helpers)
    /// handing work over only adds wake-ups and waits. After [`USELESS_RUNS`] such runs in a
    /// row, [`BACK_OFF_RUNS`] runs are made alone, then the helpers are tried again. (Runs
    /// that found every helper asleep, as sparse transfers do, are not judged.)
    fn worth_it(&self) -> bool {
        let a = self.alone.load(Ordering::Relaxed);
        if a == 0 {
            return true;
        }
        self.alone.store(a - 1, Ordering::Relaxed);
        false
    }

    /// Records whether the helpers were of use in a run.
    fn note(&self, useful: bool) {
        if useful {
            self.useless.store(0, Ordering::Relaxed);
        } else if self.useless.fetch_add(1, Ordering::Relaxed) + 1 >= USELESS_RUNS {
            self.useless.store(0, Ordering::Relaxed);
            self.alone.store(BACK_OFF_RUNS, Ordering::Relaxed);
            BACK_OFFS.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// A pool of `n` helper threads, which live as long as the process; `None` when none
    /// started (`n` = 0, or the threads could not be created).
    fn start(n: usize) -> Option<&'static Pool> {
        if n == 0 {
            return None;
        }
        let p: &'static Pool = Box::leak(Box::new(Pool {
            useless: AtomicUsize::new(0),
            alone: AtomicUsize::new(0),
            awake: AtomicUsize::new(0),
            queue: Mutex::new(VecDeque::new()),
            queued: AtomicUsize::new(0),
            wake: Condvar::new(),
        }));
        let mut started = 0;
        for i in 0..n {
            let ok = crate::provider::spawn_quiet(format!("softrdma-copy{i}"), move || p.helper())
                .is_ok();
            started += usize::from(ok);
        }
        (started > 0).then_some(p)
    }

    /// Makes the copies `items`, in the groups `groups` (see [`Batch::plan`]), with the
    /// helpers, the calling thread working too.
    fn run(&self, items: Vec<(usize, usize, usize)>, groups: Vec<u32>) {
        let job = Arc::new(Job {
            items,
            groups,
            next: AtomicUsize::new(0),
            done: AtomicUsize::new(0),
        });
        {
            let mut q = self.queue.lock().unwrap_or_else(|p| p.into_inner());
            q.push_back(job.clone());
            self.queued.fetch_add(1, Ordering::Release);
        }
        // (Helpers asleep when the run came cannot be judged by it: waking takes a while.)
        let judge = self.awake.load(Ordering::Relaxed) > 0;
        self.wake.notify_all();
        let mine = job.work();
        // Every group is claimed; wait for the ones helpers are making.
        let n = job.items.len();
        SHARED_RUNS.fetch_add(1, Ordering::Relaxed);
        HELPER_COPIES.fetch_add((n - mine) as u64, Ordering::Relaxed);
        let waited = Instant::now();
        let mut spins = 0u32;
        while job.done.load(Ordering::Acquire) < job.groups() {
            // (A helper making the last copies may have lost its core: let it have one.)
            spins += 1;
            if spins.is_multiple_of(64) {
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
        if judge {
            self.note(mine < n && waited.elapsed() < SLOW_HELPERS);
        }
        // Take the job out if no helper did (they take it when they find it exhausted).
        let mut q = self.queue.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(i) = q.iter().position(|j| Arc::ptr_eq(j, &job)) {
            q.remove(i);
            self.queued.fetch_sub(1, Ordering::Relaxed);
        }
    }

    fn helper(&self) {
        let mut idle_since = Instant::now();
        self.awake.fetch_add(1, Ordering::Relaxed);
        loop {
            if self.queued.load(Ordering::Acquire) > 0 {
                let job = {
                    let mut q = self.queue.lock().unwrap_or_else(|p| p.into_inner());
                    // A job whose copies are all claimed leaves the queue.
                    while q
                        .front()
                        .is_some_and(|j| j.next.load(Ordering::Relaxed) >= j.groups())
                    {
                        q.pop_front();
                        self.queued.fetch_sub(1, Ordering::Relaxed);
                    }
                    q.front().cloned()
                };
                if let Some(j) = job {
                    let _ = j.work();
                    idle_since = Instant::now();
                    continue;
                }
            }
            if idle_since.elapsed() < SPIN {
                std::thread::yield_now();
                continue;
            }
            let q = self.queue.lock().unwrap_or_else(|p| p.into_inner());
            if q.is_empty() {
                self.awake.fetch_sub(1, Ordering::Relaxed);
                drop(
                    self.wake
                        .wait_timeout(q, Duration::from_secs(1))
                        .unwrap_or_else(|p| p.into_inner()),
                );
                self.awake.fetch_add(1, Ordering::Relaxed);
            }
            idle_since = Instant::now();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verbs::mr::tests_support::lease_of;

    /// A batch of `n` copies of `len` bytes from `src` to `dst` (disjoint pieces, in order).
    fn batch(
        src: &[u8],
        dst: &mut [u8],
        len: usize,
        hold: &crate::verbs::mr::tests_support::Region,
    ) -> Batch {
        let mut b = Batch::default();
        for (i, d) in dst.chunks_mut(len).enumerate() {
            // SAFETY: both vectors outlive the batch, which runs before they are read.
            unsafe {
                b.push(
                    d.as_mut_ptr(),
                    src[i * len..].as_ptr(),
                    d.len(),
                    lease_of(hold),
                )
            };
        }
        b
    }

    #[test]
    fn every_copy_is_made_alone_or_with_helpers() {
        let region = crate::verbs::mr::tests_support::Region::new();
        let pool = Pool::start(3);
        for (size, pool) in [
            (64 << 10, None),
            (2 << 20, None),
            (2 << 20, pool),
            (100_000, pool),
        ] {
            let src: Vec<u8> = (0..size).map(|i| (i * 31 + size) as u8).collect();
            let mut dst = vec![0u8; size];
            let mut b = batch(&src, &mut dst, 32 << 10, &region);
            b.run_on(pool);
            assert_eq!(b.len(), 0);
            assert!(dst == src, "size {size}");
        }
    }

    #[test]
    fn runs_from_several_threads_at_once_stay_apart() {
        let region = std::sync::Arc::new(crate::verbs::mr::tests_support::Region::new());
        let pool = Pool::start(2);
        std::thread::scope(|s| {
            for t in 0..3u8 {
                let region = region.clone();
                s.spawn(move || {
                    for round in 0..50u8 {
                        let src = vec![t ^ round; 512 << 10];
                        let mut dst = vec![0u8; 512 << 10];
                        let mut b = batch(&src, &mut dst, 16 << 10, &region);
                        b.run_on(pool);
                        assert!(dst == src);
                    }
                });
            }
        });
    }

    #[test]
    fn copies_to_the_same_bytes_are_made_in_order() {
        let region = crate::verbs::mr::tests_support::Region::new();
        let pool = Pool::start(3);
        for round in 0..50u8 {
            let srcs: Vec<Vec<u8>> = (0..64u8).map(|i| vec![round ^ i; 32 << 10]).collect();
            let mut dst = vec![0u8; 32 << 10];
            let mut b = Batch::default();
            for s in &srcs {
                // SAFETY: the sources and the destination outlive the batch's run.
                unsafe { b.push(dst.as_mut_ptr(), s.as_ptr(), s.len(), lease_of(&region)) };
            }
            assert_eq!(b.plan().1, vec![0, 64], "one group");
            b.run_on(pool);
            assert!(dst.iter().all(|&x| x == round ^ 63), "round {round}");
        }
    }

    #[test]
    fn overlapping_copies_form_groups_made_in_order_and_the_rest_stays_parallel() {
        // Two 1 MiB WRITEs to one buffer in one run (as `perf write` or `ib_write_bw` post
        // them): 32 groups of two copies each, not one run made alone.
        let region = crate::verbs::mr::tests_support::Region::new();
        let pool = Pool::start(3);
        let piece = 32 << 10;
        for round in 0..20u8 {
            let first = vec![round; 1 << 20];
            let second: Vec<u8> = (0..1 << 20).map(|i| (i as u8) ^ round ^ 0x5a).collect();
            let mut dst = vec![0u8; 1 << 20];
            let mut b = Batch::default();
            for src in [&first, &second] {
                for (i, s) in src.chunks(piece).enumerate() {
                    // SAFETY: the sources and the destination outlive the batch's run.
                    unsafe {
                        b.push(
                            dst[i * piece..].as_mut_ptr(),
                            s.as_ptr(),
                            s.len(),
                            lease_of(&region),
                        )
                    };
                }
            }
            let (items, groups) = b.plan();
            assert_eq!(groups.len(), 33, "32 groups");
            for g in 0..32 {
                let (a, z) = (groups[g] as usize, groups[g + 1] as usize);
                assert_eq!(z - a, 2);
                // In the order they were deferred: the first WRITE's piece, then the second's.
                assert_eq!(
                    items[a].1,
                    first[items[a].0 - dst.as_ptr() as usize..].as_ptr() as usize
                );
                assert_eq!(
                    items[a + 1].1,
                    second[items[a].0 - dst.as_ptr() as usize..].as_ptr() as usize
                );
            }
            b.run_on(pool);
            assert!(dst == second, "round {round}");
        }
    }

    #[test]
    fn copies_of_random_overlaps_end_as_if_made_one_after_the_other() {
        let region = crate::verbs::mr::tests_support::Region::new();
        let pool = Pool::start(3);
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut next = move |n: usize| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed % n as u64) as usize
        };
        let size = 512 << 10;
        let src: Vec<u8> = (0..size).map(|i| (i * 7 + i / 251) as u8).collect();
        for round in 0..100 {
            let mut dst = vec![0u8; size];
            let mut want = vec![0u8; size];
            let mut b = Batch::default();
            // 8 to 40 copies of 4 to 64 KiB each, at random places (many overlap, partly).
            for _ in 0..8 + next(33) {
                let len = 4096 + next(60 << 10);
                let (d, s) = (next(size - len), next(size - len));
                want[d..d + len].copy_from_slice(&src[s..s + len]);
                // SAFETY: the source and the destination outlive the batch's run.
                unsafe {
                    b.push(
                        dst[d..].as_mut_ptr(),
                        src[s..].as_ptr(),
                        len,
                        lease_of(&region),
                    )
                };
            }
            b.run_on(pool);
            assert!(dst == want, "round {round}");
        }
    }

    #[test]
    fn copies_of_a_dropped_packet_are_forgotten_and_the_rest_made_on_drop() {
        let region = crate::verbs::mr::tests_support::Region::new();
        let src = vec![7u8; 4096];
        let mut dst = vec![0u8; 4096];
        {
            let mut b = batch(&src, &mut dst, 1024, &region);
            b.truncate(2);
            assert_eq!(b.len(), 2);
        }
        assert!(dst[..2048].iter().all(|&x| x == 7));
        assert!(dst[2048..].iter().all(|&x| x == 0));
    }
}
