//! A set's bytes as the store writes them without the script: the layout `set.lua`
//! describes (a 3-byte header, then 34-byte entries at fixed offsets), for the commands that
//! write a whole entry (`commit`) or a set of one entry (`create`).

use crate::dedup::Digest;

/// Bytes of an entry: slot, digest, state, time, owner.
pub(super) const ENTRY_BYTES: usize = 34;

/// Bytes of the header before the first entry: version, cursor, ways.
pub(super) const HEADER_BYTES: usize = 3;

/// An entry's state byte: claimed and in flight (its time is when the lease ends), or
/// committed (its time is the commit's with `max_age`, else 0).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(super) enum State {
    InFlight = 1,
    Done = 2,
}

/// The 0-based offset of the entry of `slot` in its set.
pub(super) fn offset(slot: u8) -> usize {
    HEADER_BYTES + ENTRY_BYTES * usize::from(slot)
}

/// The entry of `digest` in `slot`, in `state` since or until `time`, of `owner`; numbers
/// big-endian.
pub(super) fn entry(
    slot: u8,
    digest: Digest,
    state: State,
    time: u64,
    owner: u64,
) -> [u8; ENTRY_BYTES] {
    let mut entry = [0u8; ENTRY_BYTES];
    entry[0] = slot;
    entry[1..17].copy_from_slice(&digest.to_bytes());
    entry[17] = state as u8;
    entry[18..26].copy_from_slice(&time.to_be_bytes());
    entry[26..34].copy_from_slice(&owner.to_be_bytes());
    entry
}

/// The state of `entry` (34 bytes read at the offset of `slot`) when it is an entry of
/// `digest` in `slot`, and its owner; `None` for anything else.
pub(super) fn state_of(entry: &[u8], slot: u8, digest: Digest) -> Option<(State, u64)> {
    if entry.len() != ENTRY_BYTES || entry[0] != slot || entry[1..17] != digest.to_bytes() {
        return None;
    }
    let state = match entry[17] {
        1 => State::InFlight,
        2 => State::Done,
        _ => return None,
    };
    let mut owner = [0u8; 8];
    owner.copy_from_slice(&entry[26..34]);
    Some((state, u64::from_be_bytes(owner)))
}

/// Bytes of a set of one entry.
pub(super) const SET_OF_ONE_BYTES: usize = HEADER_BYTES + ENTRY_BYTES;

/// A set of `ways` ways in format `version` whose only entry is `entry`, in slot 0.
pub(super) fn set_of_one(
    version: u8,
    ways: u8,
    entry: &[u8; ENTRY_BYTES],
) -> [u8; SET_OF_ONE_BYTES] {
    let mut set = [0u8; SET_OF_ONE_BYTES];
    set[..HEADER_BYTES].copy_from_slice(&[version, 0, ways]);
    set[HEADER_BYTES..].copy_from_slice(entry);
    set
}

/// A command of `args` arguments of about `bytes` bytes in all, sized once: a pipeline of a
/// command per digest would otherwise grow each one's buffers as its arguments go in.
pub(super) fn command(name: &str, args: usize, bytes: usize) -> redis::Cmd {
    let mut cmd = redis::Cmd::with_capacity(args, bytes);
    cmd.arg(name);
    cmd
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_is_read_back_as_written() {
        let digest = Digest::from_bytes([7; 16]);
        let written = entry(3, digest, State::InFlight, 42, 0x0102_0304_0506_0708);
        assert_eq!(
            state_of(&written, 3, digest),
            Some((State::InFlight, 0x0102_0304_0506_0708))
        );
        assert_eq!(state_of(&written, 2, digest), None, "another slot");
        assert_eq!(state_of(&written[..33], 3, digest), None, "short");
        assert_eq!(state_of(&[0; ENTRY_BYTES], 0, digest), None, "empty");
        assert_eq!(offset(3), 3 + 3 * 34);
        let set = set_of_one(1, 8, &written);
        assert_eq!(&set[..3], &[1, 0, 8]);
        assert_eq!(&set[3..], &written[..]);
    }
}
