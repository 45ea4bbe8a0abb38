//! A fast hasher for hash maps whose keys nobody picks to collide (message IDs, set numbers).

/// Hashes with a folded 64x64->128-bit multiply per 8 bytes (as foldhash does).
///
/// For keys that neither a user nor a peer picks to collide: the message IDs in flight on an
/// NSQ connection (at most `max_in_flight`, chosen by our own nsqd) and the set numbers of a
/// Memcached batch (and of the Redis store's `IFEQ` path), where SipHash was a visible share
/// of the per-message cost. The fold matters: nsqd's IDs differ mostly in their last bytes,
/// and a plain multiply would leave the low bits that pick the bucket nearly constant.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct IdHasher;

impl std::hash::BuildHasher for IdHasher {
    type Hasher = IdHash;
    fn build_hasher(&self) -> IdHash {
        IdHash(0x243f_6a88_85a3_08d3)
    }
}

/// The hasher built by [`IdHasher`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct IdHash(u64);

impl std::hash::Hasher for IdHash {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            let full = u128::from(self.0 ^ u64::from_le_bytes(word)) * 0x9e37_79b9_7f4a_7c15_u128;
            self.0 = (full as u64) ^ ((full >> 64) as u64);
        }
    }
}
