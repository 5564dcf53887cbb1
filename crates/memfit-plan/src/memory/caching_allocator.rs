//! A replay of PyTorch's CUDA caching allocator (c10/cuda/CUDACachingAllocator.cpp, one stream,
//! no memory fraction, no garbage collection, no CUDA graphs), to tell what a sequence of
//! allocations and frees leaves reserved: a recorded trace (`examples/replay_allocator.rs`,
//! traces from `scripts/measure_gpu_memory.py --trace-steps`) or a modelled step.
//!
//! The rules, as the allocator applies them:
//! - a request is rounded up to 512 B; up to 1 MiB it is served from the small pool, above from the
//!   large pool (`get_pool`);
//! - the smallest cached free block of the pool at least as large is taken, the lowest address
//!   among equals (`get_free_block`, the pool ordered by size then address);
//! - the block is split when the rest is at least 512 B (small pool) or more than 1 MiB (large
//!   pool); the request keeps the front (`should_split`, `alloc_found_block`);
//! - with no such block a segment is `cudaMalloc`ed: 2 MiB for the small pool, 20 MiB for a
//!   request under 10 MiB, else the request rounded up to 2 MiB (`get_allocation_size`);
//! - a freed block merges with its free neighbours in the same segment (`try_merge_blocks`);
//!   segments never merge, and nothing is returned to the driver (no `empty_cache`, no failed
//!   `cudaMalloc` on a card large enough).
//!
//! With `expandable_segments:True` each pool is one segment whose end is mapped on demand, 2 MiB
//! (small) or 20 MiB (large) at a time: a request no mapped free block serves extends the free
//! block at the end (or maps a new one there), so freed ranges merge across what were separate
//! allocations, and any block splits when at least 512 B remain (`try_allocate_expandable_block`,
//! `map_block`, `should_split`).

use std::collections::{BTreeMap, BTreeSet};

const MIB: u64 = 1 << 20;
const MIN_BLOCK: u64 = 512;
const SMALL_SIZE: u64 = MIB;
const SMALL_BUFFER: u64 = 2 * MIB;
const LARGE_BUFFER: u64 = 20 * MIB;
const MIN_LARGE_ALLOC: u64 = 10 * MIB;
const ROUND_LARGE: u64 = 2 * MIB;
/// The address space between two segments (or reserved for an expandable pool): larger than any
/// request, so that neighbouring addresses never cross a segment.
const SEGMENT_SPACING: u64 = 1 << 44;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pool {
    Small = 0,
    Large = 1,
}

#[derive(Debug, Clone, Copy)]
struct Block {
    size: u64,
    segment: u64,
    pool: Pool,
    allocated: bool,
}

/// What the allocator has done so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AllocatorStats {
    /// Bytes held from the driver now (`reserved_bytes.all.current`).
    pub reserved: u64,
    pub peak_reserved: u64,
    /// Bytes of live blocks (requests rounded to 512 B; `allocated_bytes.all.current`).
    pub allocated: u64,
    pub peak_allocated: u64,
    /// `cudaMalloc` calls (or, expandable, mappings) made so far.
    pub device_allocs: u64,
}

/// The allocator's state: blocks by address, free blocks per pool by (size, address).
#[derive(Debug, Default)]
pub struct CachingAllocator {
    expandable: bool,
    blocks: BTreeMap<u64, Block>,
    free: [BTreeSet<(u64, u64)>; 2],
    /// Expandable: each pool's segment start and mapped bytes.
    arenas: [Option<(u64, u64)>; 2],
    next_segment: u64,
    stats: AllocatorStats,
}

impl CachingAllocator {
    pub fn new(expandable_segments: bool) -> Self {
        Self {
            expandable: expandable_segments,
            next_segment: SEGMENT_SPACING,
            ..Self::default()
        }
    }

    pub fn stats(&self) -> AllocatorStats {
        self.stats
    }

    /// Serves a request of `bytes`; returns the block's address.
    pub fn malloc(&mut self, bytes: u64) -> u64 {
        let size = bytes.max(1).div_ceil(MIN_BLOCK) * MIN_BLOCK;
        let pool = if size <= SMALL_SIZE {
            Pool::Small
        } else {
            Pool::Large
        };
        let addr = match self.best_fit(pool, size) {
            Some(addr) => {
                self.unlist(addr);
                addr
            }
            None if self.expandable => self.extend_arena(pool, size),
            None => self.new_segment(pool, size),
        };
        self.split(addr, size);
        let block = self.blocks.get_mut(&addr).expect("block");
        block.allocated = true;
        self.stats.allocated += block.size;
        self.stats.peak_allocated = self.stats.peak_allocated.max(self.stats.allocated);
        addr
    }

    /// Frees the block at `addr` (from `malloc`), merging it with free neighbours.
    pub fn free(&mut self, addr: u64) {
        let mut block = self.blocks[&addr];
        assert!(
            block.allocated,
            "free of a block that is not allocated: {addr:#x}"
        );
        self.stats.allocated -= block.size;
        let mut start = addr;
        if let Some(next) = self.free_neighbour(addr + block.size, block.segment) {
            self.take_free(addr + block.size);
            block.size += next.size;
        }
        if let Some((&prev_addr, prev)) = self.blocks.range(..addr).next_back() {
            let prev = *prev;
            if !prev.allocated && prev.segment == block.segment && prev_addr + prev.size == addr {
                self.take_free(prev_addr);
                block.size += prev.size;
                start = prev_addr;
            }
        }
        self.blocks.remove(&addr);
        block.allocated = false;
        self.blocks.insert(start, block);
        self.free[block.pool as usize].insert((block.size, start));
    }

    fn free_neighbour(&self, addr: u64, segment: u64) -> Option<Block> {
        self.blocks
            .get(&addr)
            .filter(|b| !b.allocated && b.segment == segment)
            .copied()
    }

    /// Takes the free block at `addr` off its pool's free list (it stays a block).
    fn unlist(&mut self, addr: u64) {
        let block = self.blocks[&addr];
        self.free[block.pool as usize].remove(&(block.size, addr));
    }

    /// Removes the free block at `addr` (merged into a neighbour), free list and all.
    fn take_free(&mut self, addr: u64) {
        self.unlist(addr);
        self.blocks.remove(&addr);
    }

    /// The smallest free block of the pool that holds `size`, lowest address first. Expandable:
    /// the block at a pool's mapped end counts last, as the allocator ranks it by what it could
    /// grow to.
    fn best_fit(&self, pool: Pool, size: u64) -> Option<u64> {
        let mut fits = self.free[pool as usize]
            .range((size, 0)..)
            .map(|&(_, addr)| addr);
        match self.arenas[pool as usize] {
            Some((start, mapped)) if self.expandable => {
                let at_end = |addr: u64| addr + self.blocks[&addr].size == start + mapped;
                let first = fits.next()?;
                if at_end(first) {
                    fits.next().or(Some(first))
                } else {
                    Some(first)
                }
            }
            _ => fits.next(),
        }
    }

    /// A new segment for `size` as one free block, not on the free list (`malloc` takes it).
    fn new_segment(&mut self, pool: Pool, size: u64) -> u64 {
        let bytes = match pool {
            Pool::Small => SMALL_BUFFER,
            Pool::Large if size < MIN_LARGE_ALLOC => LARGE_BUFFER,
            Pool::Large => size.div_ceil(ROUND_LARGE) * ROUND_LARGE,
        };
        let addr = self.next_segment;
        self.next_segment += SEGMENT_SPACING;
        self.reserve(bytes);
        self.blocks.insert(
            addr,
            Block {
                size: bytes,
                segment: addr,
                pool,
                allocated: false,
            },
        );
        addr
    }

    /// Maps enough at the end of the pool's segment for `size`, joined to a free block there: one
    /// free block, not on the free list (`malloc` takes it).
    fn extend_arena(&mut self, pool: Pool, size: u64) -> u64 {
        let (start, mapped) = *self.arenas[pool as usize].get_or_insert_with(|| {
            let start = self.next_segment;
            self.next_segment += SEGMENT_SPACING;
            (start, 0)
        });
        let end = start + mapped;
        let tail = self
            .blocks
            .range(start..end)
            .next_back()
            .filter(|(a, b)| !b.allocated && **a + b.size == end)
            .map(|(a, b)| (*a, b.size));
        let (addr, have) = tail.unwrap_or((end, 0));
        let granule = if pool == Pool::Small {
            SMALL_BUFFER
        } else {
            LARGE_BUFFER
        };
        let grow = (size - have).div_ceil(granule) * granule;
        self.reserve(grow);
        self.arenas[pool as usize] = Some((start, mapped + grow));
        if tail.is_some() {
            self.take_free(addr);
        }
        self.blocks.insert(
            addr,
            Block {
                size: have + grow,
                segment: start,
                pool,
                allocated: false,
            },
        );
        addr
    }

    fn reserve(&mut self, bytes: u64) {
        self.stats.reserved += bytes;
        self.stats.peak_reserved = self.stats.peak_reserved.max(self.stats.reserved);
        self.stats.device_allocs += 1;
    }

    /// Keeps the front `size` bytes of the (free, unlisted) block at `addr` and lists the rest as
    /// a free block when the allocator would split it.
    fn split(&mut self, addr: u64, size: u64) {
        let block = self.blocks[&addr];
        let rest = block.size - size;
        let splits = match block.pool {
            Pool::Small => rest >= MIN_BLOCK,
            Pool::Large if self.expandable => rest >= MIN_BLOCK,
            Pool::Large => rest > SMALL_SIZE,
        };
        if !splits {
            return;
        }
        self.blocks.get_mut(&addr).expect("block").size = size;
        self.blocks.insert(
            addr + size,
            Block {
                size: rest,
                allocated: false,
                ..block
            },
        );
        self.free[block.pool as usize].insert((rest, addr + size));
    }
}

/// Reserved bytes at a step marker of a recorded trace: the card's (from its segment events)
/// beside the replay's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TracePoint {
    /// The marker (`step N`), or "end" after the last event.
    pub step: String,
    pub card_reserved: u64,
    pub replay_reserved: u64,
    pub card_peak: u64,
    pub replay_peak: u64,
}

/// What a trace replay found: the card's and the replay's reserved bytes at each step marker, and
/// the frees of blocks allocated before the trace began (not replayed).
#[derive(Debug, Default)]
pub struct TraceReplay {
    pub points: Vec<TracePoint>,
    pub unknown_frees: u64,
}

/// Replays a trace written by `scripts/measure_gpu_memory.py --trace-steps`: lines `step N`, or an
/// action with the address (hex) and bytes — `alloc`, `free`, `segment_alloc`, `segment_free`,
/// `segment_map`, `segment_unmap`, `oom`. An error names the line.
pub fn replay_trace(
    text: impl std::io::BufRead,
    expandable_segments: bool,
) -> Result<TraceReplay, String> {
    let mut sim = CachingAllocator::new(expandable_segments);
    let mut live = std::collections::HashMap::new();
    let (mut card, mut card_peak, mut out) = (0u64, 0u64, TraceReplay::default());
    let point = |step: &str, card: u64, card_peak: u64, sim: &CachingAllocator| TracePoint {
        step: step.to_string(),
        card_reserved: card,
        replay_reserved: sim.stats().reserved,
        card_peak,
        replay_peak: sim.stats().peak_reserved,
    };
    for (n, line) in text.lines().enumerate() {
        let line = line.map_err(|e| format!("line {}: {e}", n + 1))?;
        let bad = |what: &str| format!("line {}: {what} in {line:?}", n + 1);
        match line.split_whitespace().collect::<Vec<_>>().as_slice() {
            [] => {}
            ["step", k] => out.points.push(point(k, card, card_peak, &sim)),
            [action, addr, size] => {
                let addr = u64::from_str_radix(addr, 16).map_err(|_| bad("address"))?;
                let size: u64 = size.parse().map_err(|_| bad("bytes"))?;
                match *action {
                    "alloc" => {
                        live.insert(addr, sim.malloc(size));
                    }
                    "free" => match live.remove(&addr) {
                        Some(block) => sim.free(block),
                        None => out.unknown_frees += 1,
                    },
                    "segment_alloc" | "segment_map" => {
                        card += size;
                        card_peak = card_peak.max(card);
                    }
                    "segment_free" | "segment_unmap" => card = card.saturating_sub(size),
                    "oom" => {}
                    _ => return Err(bad("an unknown action")),
                }
            }
            _ => return Err(bad("not `step N` or `ACTION ADDR BYTES`")),
        }
    }
    out.points.push(point("end", card, card_peak, &sim));
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Requests of 10 MiB and more get a segment of their own, rounded to 2 MiB; smaller large
    /// requests share 20 MiB segments, small ones 2 MiB segments.
    #[test]
    fn segments_follow_the_allocation_sizes() {
        let mut a = CachingAllocator::new(false);
        a.malloc(12 * MIB + 1);
        assert_eq!(a.stats().reserved, 14 * MIB);
        a.malloc(3 * MIB);
        a.malloc(3 * MIB);
        assert_eq!(
            a.stats().reserved,
            34 * MIB,
            "two 3 MiB blocks share one 20 MiB segment"
        );
        a.malloc(1000);
        a.malloc(1000);
        assert_eq!(a.stats().reserved, 36 * MIB);
        assert_eq!(a.stats().device_allocs, 3);
        assert_eq!(a.stats().allocated, 12 * MIB + 512 + 6 * MIB + 2048);
    }

    /// A longer step's tensor does not fit the segments a shorter step left (segments never
    /// merge), and those segments serve anything smaller afterwards: the growth of the peak
    /// reserved when lengths vary.
    #[test]
    fn a_longer_request_needs_a_new_segment_a_shorter_one_reuses() {
        let mut a = CachingAllocator::new(false);
        let short = a.malloc(100 * MIB);
        a.free(short);
        let long = a.malloc(150 * MIB);
        assert_eq!(a.stats().reserved, 250 * MIB);
        a.free(long);
        a.malloc(120 * MIB);
        a.malloc(90 * MIB);
        assert_eq!(
            a.stats().reserved,
            250 * MIB,
            "the best fit of each is a cached segment"
        );
        assert_eq!(a.stats().peak_allocated, 210 * MIB);
    }

    /// Best fit takes the smallest block that holds the request and splits it; freeing both
    /// parts merges them back into one block that serves the whole size again.
    #[test]
    fn split_blocks_merge_back_when_freed() {
        let mut a = CachingAllocator::new(false);
        let big = a.malloc(64 * MIB);
        a.free(big);
        let front = a.malloc(40 * MIB);
        let back = a.malloc(20 * MIB);
        assert_eq!(
            a.stats().reserved,
            64 * MIB,
            "the 24 MiB rest served the 20 MiB request"
        );
        a.free(front);
        a.free(back);
        a.malloc(64 * MIB);
        assert_eq!(a.stats().reserved, 64 * MIB);
        // a rest of 1 MiB or less stays with the large block: a 12 MiB segment serves 11 MiB
        // whole, and the next large request finds nothing free
        let mut b = CachingAllocator::new(false);
        b.malloc(11 * MIB);
        b.malloc(MIB + 512);
        assert_eq!(b.stats().reserved, 32 * MIB);
        assert_eq!(b.stats().allocated, 12 * MIB + MIB + 512);
    }

    /// A block kept alive inside a cached segment (a tensor saved for backward landing in the
    /// segment a freed logits tensor left) keeps the segment from serving the next step's
    /// tensor of the same size; with expandable segments the freed ranges merge around it.
    #[test]
    fn a_pinned_segment_grows_the_pool_unless_segments_expand() {
        let growth = |expandable| {
            let mut a = CachingAllocator::new(expandable);
            let logits = a.malloc(200 * MIB);
            a.free(logits);
            let saved = a.malloc(16 * MIB);
            let before = a.stats().reserved;
            let logits = a.malloc(200 * MIB);
            a.free(logits);
            a.free(saved);
            let next = a.malloc(216 * MIB);
            a.free(next);
            a.stats().reserved - before
        };
        assert_eq!(
            growth(false),
            416 * MIB,
            "a new segment for each of the two"
        );
        assert_eq!(
            growth(true),
            20 * MIB,
            "one granule mapped past the saved tensor"
        );
    }

    /// Expandable segments map 20 MiB granules at the end of the large pool, joined to a free
    /// block there; a freed range anywhere merges with its neighbours.
    #[test]
    fn expandable_segments_map_granules_at_the_end() {
        let mut a = CachingAllocator::new(true);
        let x = a.malloc(30 * MIB);
        assert_eq!(a.stats().reserved, 40 * MIB);
        let y = a.malloc(15 * MIB);
        assert_eq!(
            a.stats().reserved,
            60 * MIB,
            "10 MiB free at the end, 20 more mapped"
        );
        a.free(x);
        a.free(y);
        a.malloc(60 * MIB);
        assert_eq!(
            a.stats().reserved,
            60 * MIB,
            "everything merged into one 60 MiB block"
        );
        assert_eq!(a.stats().device_allocs, 2);
    }

    /// A trace's allocations replayed give the reserved bytes the card's segment events say, at
    /// each step marker; a free of a block from before the trace is counted, not replayed; a
    /// malformed line is refused with its number.
    #[test]
    fn a_trace_replays_to_the_cards_segments() {
        let trace = "segment_alloc 1000 209715200\nalloc 1000 209715200\nstep 0\nfree 1000 0\n\
                     alloc 1000 16777216\nsegment_alloc 90000000 209715200\nalloc 90000000 209715200\n\
                     step 1\nfree 90000000 0\nfree 1000 0\nfree 55 0\n\
                     segment_alloc a0000000 226492416\nalloc a0000000 226492416\n";
        let r = replay_trace(trace.as_bytes(), false).unwrap();
        let at = |i: usize| (r.points[i].card_reserved, r.points[i].replay_reserved);
        assert_eq!(at(0), (200 * MIB, 200 * MIB));
        assert_eq!(at(1), (400 * MIB, 400 * MIB));
        assert_eq!(at(2), (616 * MIB, 616 * MIB));
        assert_eq!(r.points[2].step, "end");
        assert_eq!(r.unknown_frees, 1);
        let err = replay_trace("alloc 10 20\nalloc zz 20\n".as_bytes(), false).unwrap_err();
        assert!(err.starts_with("line 2: address"), "{err}");
        let err = replay_trace("free 10\n".as_bytes(), false).unwrap_err();
        assert!(err.starts_with("line 1:"), "{err}");
    }
}
