//! The 8-way insert on x86-64, on whole cache lines with SSE2.
//!
//! Same decisions as the portable path, in fewer instructions. That matters more than it
//! seems: a claim's set usually comes from memory, and while it does the processor works ahead
//! on the next claims, as far as its reorder window reaches. The fewer instructions a claim
//! takes, the more of them are in flight at once, and the more of their memory waits overlap.

use std::arch::asm;
use std::arch::x86_64::{
    __m128i, _mm_and_si128, _mm_cmpeq_epi32, _mm_cvtsi128_si64, _mm_cvtsi64_si128,
    _mm_movemask_epi8, _mm_or_si128, _mm_packs_epi16, _mm_packs_epi32, _mm_set1_epi32,
    _mm_slli_epi32,
};
use std::sync::atomic::{AtomicU64, Ordering};

use super::set::{decide_again, find_in, verdict, write_locked, SetGuard};
use super::{Claim, CURSOR_MASK, CURSOR_SHIFT, FINGERPRINT_SHIFT, LINE_SLOTS, LOCK};

/// Bits of a half mask ([`Line::halves_equal_to`]) for the slots' lower and upper halves.
const LOWER_HALVES: u32 = 0x5555;
const UPPER_HALVES: u32 = 0xAAAA;

/// A snapshot of one set: its cache line in four SSE registers, slot `i` in the lower
/// (`i` even) or upper half of register `i / 2`.
#[derive(Clone, Copy)]
struct Line([__m128i; 4]);

impl Line {
    /// Reads the set's eight slots.
    #[inline(always)]
    fn load(set: &[AtomicU64; LINE_SLOTS]) -> Line {
        let (a, b, c, d): (__m128i, __m128i, __m128i, __m128i);
        // SAFETY: the 64 bytes read are the eight `AtomicU64`s of `set`, which `Table::set`
        // places on one 64-byte-aligned cache line, so each `movdqa` is aligned (it faults
        // otherwise, it never reads out of bounds). What the read means under concurrent
        // writes: an SSE load wider than 8 bytes may be carried out as several accesses,
        // but each aligned 8-byte part is read atomically (Intel SDM vol. 3A, 9.1.1; AMD
        // APM vol. 2, 7.3.2), so this is eight relaxed atomic loads of the slots, which is
        // what the portable path does. The asm only reads memory (`readonly`), and being
        // an asm block it is not merged with or split into other accesses by the compiler.
        // Every decision made from a stale snapshot is re-checked under the set's guard or
        // by a compare-and-swap, as in the portable path.
        unsafe {
            asm!(
                "movdqa {a}, xmmword ptr [{p}]",
                "movdqa {b}, xmmword ptr [{p} + 16]",
                "movdqa {c}, xmmword ptr [{p} + 32]",
                "movdqa {d}, xmmword ptr [{p} + 48]",
                p = in(reg) set.as_ptr(),
                a = out(xmm_reg) a,
                b = out(xmm_reg) b,
                c = out(xmm_reg) c,
                d = out(xmm_reg) d,
                options(nostack, preserves_flags, readonly),
            );
        }
        Line([a, b, c, d])
    }

    /// The set as eight words, for the rare paths.
    #[inline(always)]
    fn words(self) -> [u64; LINE_SLOTS] {
        // SAFETY: four 16-byte registers and eight 8-byte words are the same 64 bytes, and
        // every bit pattern is a valid `u64`.
        unsafe { std::mem::transmute::<[__m128i; 4], [u64; LINE_SLOTS]>(self.0) }
    }

    /// The first slot.
    #[inline(always)]
    fn first(self) -> u64 {
        // SAFETY: SSE2 is part of x86-64.
        unsafe { _mm_cvtsi128_si64(self.0[0]) as u64 }
    }

    /// A 16-bit mask of the line's 32-bit halves equal to `half`: bit `2i` for the lower
    /// half of slot `i`, bit `2i + 1` for its upper half.
    #[inline(always)]
    fn halves_equal_to(self, half: u32) -> u32 {
        // SAFETY: SSE2 is part of x86-64.
        unsafe {
            let half = _mm_set1_epi32(half as i32);
            let [a, b, c, d] = self.0.map(|v| _mm_cmpeq_epi32(v, half));
            // Each lane is all ones or all zeros, so saturating packs keep it.
            let packed = _mm_packs_epi16(_mm_packs_epi32(a, b), _mm_packs_epi32(c, d));
            _mm_movemask_epi8(packed) as u32
        }
    }

    /// A 16-bit mask of the line's 32-bit halves whose lowest bit is set, numbered as in
    /// [`Line::halves_equal_to`]; in a lower half that bit says the slot holds an entry.
    #[inline(always)]
    fn halves_with_bit_0(self) -> u32 {
        // SAFETY: SSE2 is part of x86-64.
        unsafe {
            // Bit 0 becomes the sign bit, which saturating packs keep.
            let [a, b, c, d] = self.0.map(|v| _mm_slli_epi32::<31>(v));
            let packed = _mm_packs_epi16(_mm_packs_epi32(a, b), _mm_packs_epi32(c, d));
            _mm_movemask_epi8(packed) as u32
        }
    }

    /// [`super::set::choose_victim`] for the whole line.
    #[inline(always)]
    fn choose_victim(self) -> (usize, usize) {
        let empty = !self.halves_with_bit_0() & LOWER_HALVES;
        let cursor = ((self.first() & CURSOR_MASK) >> CURSOR_SHIFT) as usize;
        let first_empty = empty.trailing_zeros() as usize / 2;
        if empty != 0 {
            (first_empty, cursor)
        } else {
            (cursor, (cursor + 1) % LINE_SLOTS)
        }
    }

    /// Whether `self` equals `before` with the guard bit set in the first slot.
    #[inline(always)]
    fn is_locked(self, before: Line) -> bool {
        // SAFETY: SSE2 is part of x86-64.
        unsafe {
            let locked = _mm_or_si128(before.0[0], _mm_cvtsi64_si128(LOCK as i64));
            let equal = |x, y| _mm_cmpeq_epi32(x, y);
            let all = _mm_and_si128(
                _mm_and_si128(equal(self.0[0], locked), equal(self.0[1], before.0[1])),
                _mm_and_si128(equal(self.0[2], before.0[2]), equal(self.0[3], before.0[3])),
            );
            _mm_movemask_epi8(all) == 0xFFFF
        }
    }
}

/// [`super::set::insert`] for one 8-way set.
#[inline(always)]
pub(super) fn insert(set: &[AtomicU64; LINE_SLOTS], fingerprint: u64, state: u64) -> Claim {
    let before = Line::load(set);
    // Screen on the upper 32 bits, which are all fingerprint: a set that holds the digest
    // shows them in the slot's upper half. A full check follows only when some slot shows
    // them: for a new digest that is 8 in 2^32.
    let upper = (fingerprint << FINGERPRINT_SHIFT >> 32) as u32;
    if before.halves_equal_to(upper) & UPPER_HALVES != 0 {
        if let Some(word) = find_in(&before.words(), fingerprint) {
            return verdict(word);
        }
    }
    let first = before.first();
    let locked = first & LOCK != 0
        || set[0]
            .compare_exchange(first, first | LOCK, Ordering::Acquire, Ordering::Relaxed)
            .is_err();
    if locked {
        // Another writer holds the set or just changed it: take the portable path, which
        // waits for the guard and looks again.
        return super::set::insert_portable(set, fingerprint, state);
    }
    // The Acquire makes every earlier holder's writes visible: if the set is as it was when
    // we looked, the digest is not in it; otherwise look again, under the guard.
    let guard = SetGuard {
        word: &set[0],
        first,
    };
    let mut decision = before.choose_victim();
    let now = Line::load(set);
    if !now.is_locked(before) {
        let mut words = now.words();
        words[0] = first;
        match decide_again(&words, fingerprint) {
            Ok(again) => decision = again,
            Err(claim) => return claim,
        }
    }
    write_locked(
        set,
        guard,
        decision,
        (fingerprint << FINGERPRINT_SHIFT) | state,
    )
}
